"""POST /runs/{run_id}/batches committed in groups (issue 49): requests that arrive together land in one commit, each
answered once it landed, a bad one refused alone; a retry is recognised before its rows are checked to continue their
episodes; past TRAJSTORE_INGEST_PENDING_BYTES a request gets 429 with Retry-After."""

from __future__ import annotations

import contextlib
import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import pytest

import trajstore
from tests.api.helpers import API_KEY, Live, serve, settings_for
from tests.api.test_ingest import post, rows, steps_of
from trajstore.api.app import create_app
from trajstore.remote.wire import ipc_bytes

pytestmark = pytest.mark.server

HEADERS = {"Authorization": f"Bearer {API_KEY}"}


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    trajstore.open(tmp_path / "store", create=True)
    return tmp_path / "store"


@contextlib.contextmanager
def live(empty: Path, **overrides: Any) -> Iterator[Live]:
    yield from serve(create_app(settings_for(empty, **overrides)))


def appends(path: Path) -> list[int]:
    return [r["version"] for r in trajstore.open(path).history().to_pylist() if r["operation"] == "append"]


def send_all(url: str, bodies: list[tuple[bytes, str | None]]) -> list[tuple[int, Any]]:
    """Each body posted at once from a thread of its own (with its idempotency key): status and JSON, in order."""
    out: list[Any] = [None] * len(bodies)
    barrier = threading.Barrier(len(bodies))

    def send(i: int) -> None:
        with httpx.Client(base_url=url, headers=HEADERS, timeout=60) as c:
            barrier.wait()
            response = post(c, bodies[i][0], idem=bodies[i][1])
            out[i] = (response.status_code, response.json())

    threads = [threading.Thread(target=send, args=(i,)) for i in range(len(bodies))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return out


def test_requests_sent_together_land_in_one_commit_and_a_bad_one_alone_is_422(empty: Path) -> None:
    with live(empty, commit_interval=3.0) as server:
        with httpx.Client(base_url=server.url, headers=HEADERS, timeout=60) as c:
            assert post(c, ipc_bytes(steps_of(7, [0, 1, 2]))).status_code == 201  # then the next waits 3 s
        bodies = [(ipc_bytes(rows(2, first_id=100 + 10 * i)), uuid.uuid4().hex) for i in range(6)]
        bodies.append((ipc_bytes(steps_of(7, [5, 6])), uuid.uuid4().hex))  # does not continue episode 7
        started = time.monotonic()
        answers = send_all(server.url, bodies)
        took = time.monotonic() - started
    assert [code for code, _ in answers] == [201] * 6 + [422]
    assert "episode_id 7 continues at step 5, but the store holds its steps up to 2" in answers[6][1]["detail"]
    assert len(appends(empty)) == 2  # the first request's commit, then one for the six
    assert took < 30
    store = trajstore.open(empty)
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 3 + 6 * 10
    assert trajstore.check(store).ok


def test_a_retry_sent_while_its_first_try_waits_is_answered_with_it(empty: Path) -> None:
    """The issue's failure: a client whose timeout fired sends its request again while the first try is still being
    committed; the retry's rows were checked against a version that the first try then changed, and it got 422
    "continues at step 0 but the store holds up to 2". It is the same request: answered once stored, stored once."""
    first = ipc_bytes(steps_of(3, [0, 1, 2]))
    with live(empty, commit_interval=2.0) as server:
        with httpx.Client(base_url=server.url, headers=HEADERS, timeout=60) as c:
            assert post(c, ipc_bytes(rows(1, first_id=50))).status_code == 201  # the next commit waits 2 s
        answers = send_all(server.url, [(first, "a"), (first, "a")])
        with httpx.Client(base_url=server.url, headers=HEADERS, timeout=60) as c:
            assert post(c, ipc_bytes(steps_of(3, [3, 4])), idem="b").status_code == 201
            late = post(c, first, idem="a")  # and once more after later rows landed
    assert sorted(code for code, _ in answers) == [200, 201], answers
    assert late.status_code == 200 and late.json()["duplicate"], late.json()
    assert trajstore.open(empty).episode_steps(3)["step"].to_pylist() == [0, 1, 2, 3, 4]


def test_past_the_pending_bytes_a_request_gets_429_with_retry_after(empty: Path) -> None:
    body = ipc_bytes(rows(3))
    with live(empty, commit_interval=3.0, ingest_pending_bytes=1, ingest_wait_s=0.3) as server:  # one at a time
        with httpx.Client(base_url=server.url, headers=HEADERS, timeout=60) as c:
            assert post(c, ipc_bytes(rows(1, first_id=50))).status_code == 201  # the next commit waits 3 s
        waiting: list[int] = []
        holder = threading.Thread(target=lambda: waiting.append(send_all(server.url, [(body, "w")])[0][0]))
        holder.start()
        time.sleep(0.5)  # its bytes are held until its commit
        with httpx.Client(base_url=server.url, headers=HEADERS, timeout=60) as c:
            busy = post(c, ipc_bytes(rows(3, first_id=20)), idem="busy")
        holder.join()
    assert busy.status_code == 429 and int(busy.headers["retry-after"]) >= 1
    assert "TRAJSTORE_INGEST_PENDING_BYTES" in busy.json()["detail"] and "nothing of this request was stored" in \
        busy.json()["detail"]
    assert waiting == [201]  # a request alone is taken, however large
    assert trajstore.open(empty).sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 5 + 15
