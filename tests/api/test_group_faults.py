"""Exactly once under faults (issue 49), with group commit: a group commit whose answer is lost (SeaweedFS behind the
lost-answer proxy), the service SIGKILLed while requests wait for their group and the clients retry, a client killed
after sending. Every acknowledged step is stored once, every unacknowledged one once after its retry, and ``trajstore
check`` finds nothing wrong."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

import trajstore
from tests import seaweed
from tests.api.helpers import API_KEY, serve
from tests.api.test_ingest import post, steps_of
from tests.lost_answer import LostAnswerProxy
from tests.served import Server
from tests.storage.test_landing import assert_exactly_once, proxied
from trajstore.api.app import create_app
from trajstore.api.settings import ServiceSettings
from trajstore.remote.wire import ipc_bytes
from trajstore.settings import Settings

pytestmark = [pytest.mark.server, pytest.mark.slow]

HEADERS = {"Authorization": f"Bearer {API_KEY}"}
CLIENTS = 6
REQUESTS = 4  # per client: episode c, steps 4r..4r+3


def body(client: int, request: int) -> bytes:
    return ipc_bytes(steps_of(client, list(range(4 * request, 4 * request + 4)), end=request == REQUESTS - 1))


def sender(where: str | list[str], client: int, acked: list[tuple[int, int]], timeout: float = 60,
           numbered: bool = False) -> None:
    """One client sending its requests in order to the service at ``where`` (a URL, or a list whose first item is
    the current one), each retried under its key until it is acknowledged; a 4xx fails the test. ``numbered``: one
    key for the client, its requests numbered (as a ``RemoteWriter`` sends them), else a key per request."""
    for r in range(REQUESTS):
        deadline = time.monotonic() + 120
        while True:
            url = where if isinstance(where, str) else where[0]
            try:
                with httpx.Client(base_url=url, headers=HEADERS, timeout=timeout) as c:
                    response = post(c, body(client, r), idem=f"c{client}" if numbered else f"c{client}-r{r}",
                                    number=r if numbered else None)
                if response.status_code in (200, 201):
                    acked.append((client, r))
                    break
                assert response.status_code >= 500, response.text  # never a 4xx for a retry
            except httpx.TransportError:
                pass
            assert time.monotonic() < deadline, f"client {client} request {r} was never acknowledged"
            time.sleep(0.2)


@pytest.fixture
def proxy(s3: seaweed.SeaweedFS) -> Iterator[LostAnswerProxy]:
    host, port = s3.endpoint.removeprefix("http://").split(":")
    p = LostAnswerProxy((host, int(port))).start()
    yield p
    p.stop()


@pytest.mark.s3
@pytest.mark.parametrize("numbered", [False, True], ids=["key-per-request", "numbered"])
def test_a_group_commit_whose_answer_is_lost_stores_every_request_once(s3: seaweed.SeaweedFS,
                                                                      proxy: LostAnswerProxy, numbered: bool) -> None:
    uri = f"s3://{s3.bucket()}/store"
    direct = trajstore.open(uri, create=True, storage_options=s3.storage_options)
    settings = ServiceSettings(store=uri, api_key=API_KEY, commit_interval=0.3)
    served = trajstore.open(uri, storage_options=proxied(s3, proxy), settings=Settings(checkpoint_interval=0))
    live = serve(create_app(settings, store=served))
    url = next(live).url
    acked: list[tuple[int, int]] = []
    try:
        with httpx.Client(base_url=url, headers=HEADERS, timeout=60) as c:
            assert post(c, ipc_bytes(steps_of(99, [0])), idem="warm").status_code == 201
        proxy.swallow(count=2)  # the next two group commits land and their answers are lost
        threads = [threading.Thread(target=sender, args=(url, i, acked, 60, numbered)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        next(live, None)
    assert proxy.swallowed and sorted(acked) == [(c, r) for c in range(CLIENTS) for r in range(REQUESTS)]
    groups = [r for r in direct.history().to_pylist() if r["operation"] == "append"]
    assert len(groups) < CLIENTS * REQUESTS  # grouped
    assert_exactly_once(direct, 1 + CLIENTS * REQUESTS * 4)


@pytest.mark.parametrize("numbered", [False, True], ids=["key-per-request", "numbered"])
def test_the_service_killed_while_requests_wait_stores_each_once_after_the_retries(tmp_path: Path,
                                                                                   numbered: bool) -> None:
    path = tmp_path / "store"
    trajstore.open(path, create=True)
    settings: dict[str, Any] = {"api_key": API_KEY, "commit_interval": "1500ms", "sql_max_concurrent": 1}
    server = Server(path, **settings)
    server.wait_ready(1)
    where, acked = [server.url], []  # type: ignore[var-annotated]
    threads = [threading.Thread(target=sender, args=(where, i, acked, 5, numbered)) for i in range(CLIENTS)]
    try:
        for t in threads:
            t.start()
        deadline = time.monotonic() + 60
        while not acked and time.monotonic() < deadline:  # some requests acknowledged, others waiting for their group
            time.sleep(0.02)
        os.killpg(server.proc.pid, signal.SIGKILL)
        server.proc.wait(10)
        before = list(acked)
        server = Server(path, **settings)  # started again (on another port, where the clients go next)
        server.wait_ready(1)
        where[0] = server.url
        for t in threads:
            t.join()
    finally:
        server.close()
    assert 0 < len(before) < CLIENTS * REQUESTS  # killed with requests acknowledged and others waiting
    assert sorted(acked) == [(c, r) for c in range(CLIENTS) for r in range(REQUESTS)]
    assert_exactly_once(trajstore.open(path), CLIENTS * REQUESTS * 4)


def test_a_client_killed_after_sending_is_stored_once_after_its_retry(tmp_path: Path) -> None:
    path = tmp_path / "store"
    trajstore.open(path, create=True)
    with Server(path, api_key=API_KEY, commit_interval="2s", sql_max_concurrent=1) as server:
        with httpx.Client(base_url=server.url, headers=HEADERS, timeout=60) as c:
            assert post(c, ipc_bytes(steps_of(99, [0])), idem="warm").status_code == 201  # the next waits 2 s
        script = ("import sys, httpx; from tests.api.test_group_faults import body, HEADERS; "
                  "httpx.post(sys.argv[1] + '/runs/r1/batches', params={'env_id': 'Toy-v0'}, content=body(0, 0), "
                  "headers={**HEADERS, 'Content-Type': 'application/vnd.apache.arrow.stream', "
                  "'Idempotency-Key': 'c0-r0'}, timeout=60)")
        env = {**os.environ, "PYTHONPATH": str(Path.cwd())}
        client = subprocess.Popen([sys.executable, "-c", script, server.url], env=env)
        time.sleep(1.0)  # sent, waiting for its group
        client.send_signal(signal.SIGKILL)
        assert client.wait(10) == -9
        acked: list[tuple[int, int]] = []
        sender(server.url, 0, acked)  # the retry, then the rest of the episode
    assert acked == [(0, r) for r in range(REQUESTS)]
    assert_exactly_once(trajstore.open(path), 1 + REQUESTS * 4)
