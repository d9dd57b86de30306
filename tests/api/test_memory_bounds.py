"""Every request bounded: a real ``trajstore serve`` (its resident memory and its SQL workers' read from /proc) under
the queries and loader requests that took the machine's memory (issue 20), four at once, and under a 2 GB request
body (issue 27). Each gets a 4xx naming the limit it met, the server with its workers stays under the memory those
limits allow, and it answers a normal request afterwards. Limits are set low so that every refusal comes within a
second. Answers that are not streamed (JSON pages of steps, one episode's steps) hold what fits in
``max_page_bytes``."""

from __future__ import annotations

import threading
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import gymnasium
import httpx
import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import settings_for
from tests.served import Server
from trajstore.api import pages
from trajstore.api.app import create_app
from trajstore.rollout import gym_rollout
from trajstore.store import plumbing

MiB = 1 << 20
WORKER_BYTES = 256 * MiB  # TRAJSTORE_SQL_WORKER_BYTES
LOADER_BATCH_BYTES = 32 * MiB  # TRAJSTORE_LOADER_BATCH_BYTES
CONCURRENT = 4  # TRAJSTORE_SQL_MAX_CONCURRENT
# What a worker may hold beyond its cap: private memory mapped while idle but not yet touched, and the pages of
# its libraries' code it has not run yet (both measured at ~0.1-0.2 GiB, see the module sql_worker)
WORKER_SLACK = 256 * MiB

PROBE_SQL = [
    "SELECT len(range(2000000000))",  # 16 GB list: took the server to 22.6 GB and the kernel killed it
    "SELECT len(range(20000000))",  # ~2 GB
    "SELECT count(*) FROM (SELECT unnest(range(50000000)))",  # 3.8 GB
    "SELECT md5(repeat('z', 900000000))",  # 2.0 GB
]
GROWING_SQL = [  # memory that is really filled (sorted, aggregated) until the worker's limit stops it
    "SELECT count(*) FROM (SELECT i, md5(i::VARCHAR) AS h FROM range(20000000) t(i) ORDER BY h)",
    "SELECT sum(len(l)) FROM (SELECT list(i) AS l FROM range(50000000) t(i) GROUP BY i % 4)",
    "SELECT max(s) FROM (SELECT string_agg(md5(i::VARCHAR), ',') AS s FROM range(20000000) t(i))",
    "SELECT count(DISTINCT h) FROM (SELECT md5(i::VARCHAR) AS h FROM range(20000000) t(i))",
]
PROBE_LOADERS = [
    "/sequences?length=65536&batch_size=256&pad=true",  # ~2 GB allocated per request before
    "/sequences?length=65536&batch_size=256&pad=true&columns=obs,next_obs,reward&gamma=0.99",
    "/transitions?n=1000&gamma=0.99&batch_size=1048576",
    "/sequences?length=4096&batch_size=1048576",
]


@pytest.fixture(scope="module")
def probed_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """~6.6k CartPole steps, the size of the store the probe ran on."""
    path = tmp_path_factory.mktemp("bounds") / "store"
    gym_rollout(trajstore.open(path, create=True), "CartPole-v1", run_id="probe", num_envs=4, steps=6600, seed=0,
                progress=False)
    return path


@pytest.fixture(scope="module")
def server(probed_store: Path) -> Iterator[Server]:
    # DuckDB's own limit above the worker's: the worker's is the one met
    live = Server(probed_store, sql_worker_bytes=WORKER_BYTES, sql_memory_limit="2GB", sql_timeout_s=10,
                  sql_max_concurrent=CONCURRENT, loader_batch_bytes=LOADER_BATCH_BYTES)
    try:
        live.wait_ready(CONCURRENT)
        yield live
    finally:
        live.close()


def at_once(calls: list[Callable[[], httpx.Response]]) -> list[httpx.Response]:
    """The answers of ``calls`` made at the same time."""
    answers: list[Any] = [None] * len(calls)

    def call(i: int) -> None:
        answers[i] = calls[i]()

    threads = [threading.Thread(target=call, args=(i,)) for i in range(len(calls))]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return answers


def post_sql(url: str, query: str) -> Callable[[], httpx.Response]:
    return lambda: httpx.post(url + "/sql", json={"query": query}, timeout=60)


def get(url: str) -> Callable[[], httpx.Response]:
    return lambda: httpx.get(url, timeout=60)


@pytest.mark.server
@pytest.mark.parametrize("queries", [PROBE_SQL, GROWING_SQL], ids=["probe", "growing"])
def test_sql_past_the_workers_memory_is_413_and_the_server_stays_within_its_budget(server: Server,
                                                                                    queries: list[str]) -> None:
    budget = server.idle() + CONCURRENT * (WORKER_BYTES + WORKER_SLACK)
    server.watch(budget)
    answers = at_once([post_sql(server.url, q) for q in queries])
    assert server.proc.poll() is None, f"killed at {server.peak / MiB:.0f} MiB, over the budget"
    for query, answer in zip(queries, answers):
        assert answer.status_code == 413, (query, answer.text)
        assert answer.headers["content-type"] == "application/problem+json"
        assert "limit of 256 MiB" in answer.json()["detail"] and "sql_worker_bytes" in answer.json()["detail"]
    assert server.peak <= budget
    normal = httpx.post(server.url + "/sql", json={"query": "SELECT count(*) AS n FROM steps"}, timeout=60)
    assert normal.status_code == 200 and normal.json()["rows"] == [{"n": server.steps}]


@pytest.mark.server
def test_the_probes_loader_requests_are_refused_naming_the_limit(server: Server) -> None:
    # loader streams run in the server process (SQL workers, replaced in the background after the SQL tests
    # retired them, are not theirs to count)
    server.watch(server.idle(workers=False) + CONCURRENT * LOADER_BATCH_BYTES, workers=False)
    answers = at_once([get(server.url + path) for path in PROBE_LOADERS])
    assert server.proc.poll() is None, f"killed at {server.peak / MiB:.0f} MiB, over the budget"
    for path, answer in zip(PROBE_LOADERS, answers):
        assert answer.status_code == 422, (path, answer.text[:300])
        detail = answer.json()["detail"]
        assert "over the limit of 32 MiB" in detail and "TRAJSTORE_LOADER_BATCH_BYTES" in detail, detail
        assert "batch_size" in detail and ("length" in detail or "transitions" in detail), detail
    with httpx.stream("GET", server.url + "/sequences?length=64&batch_size=32&pad=true", timeout=60) as ok:
        assert ok.status_code == 200 and sum(len(piece) for piece in ok.iter_raw()) > 0


@pytest.mark.server
def test_loader_streams_within_the_limit_stay_within_their_memory(server: Server) -> None:
    # each batch just under the limit: 512 windows x 1024 steps x 55 bytes (columns, mask, indices) = 27.5 MiB,
    # of which 16 MiB are sent
    path = "/sequences?length=1024&batch_size=512&pad=true&stride=2"
    # one batch built, one encoded, one queued, one sent
    server.watch(server.idle(workers=False) + CONCURRENT * 4 * LOADER_BATCH_BYTES, workers=False)

    def read() -> httpx.Response:
        with httpx.stream("GET", server.url + path, timeout=120) as response:
            response.extensions["bytes"] = sum(len(piece) for piece in response.iter_raw())
        return response

    answers = at_once([read] * CONCURRENT)
    assert server.proc.poll() is None, f"killed at {server.peak / MiB:.0f} MiB, over the budget"
    assert [a.status_code for a in answers] == [200] * CONCURRENT
    assert min(a.extensions["bytes"] for a in answers) > 4 * 16 * MiB  # several batches went out
    assert httpx.get(server.url + "/stats", timeout=60).status_code == 200


@pytest.mark.server
def test_loader_streams_share_the_sql_gate(server: Server) -> None:
    path = server.url + "/sequences?length=256&batch_size=512&pad=true&stride=1"  # many batches: a long stream
    with httpx.Client(timeout=60) as http:
        held = [http.stream("GET", path) for _ in range(CONCURRENT)]
        opened = [h.__enter__() for h in held]  # each read no further than its head: its stream waits
        try:
            assert [r.status_code for r in opened] == [200] * CONCURRENT
            busy = httpx.get(path, timeout=60)
            assert busy.status_code == 429 and busy.headers["retry-after"] == "1"
            assert "sequences: 4 SQL queries or loader streams" in busy.json()["detail"]
            assert "sql_max_concurrent" in busy.json()["detail"]
            sql = httpx.post(server.url + "/sql", json={"query": "SELECT 1 AS x"}, timeout=60)
            assert sql.status_code == 429
        finally:
            for h in held:
                h.__exit__(None, None, None)
    deadline = time.monotonic() + 20
    while (answer := httpx.post(server.url + "/sql", json={"query": "SELECT 1 AS x"}, timeout=60)).status_code == 429:
        assert time.monotonic() < deadline, "the places of the closed streams were not given back"
        time.sleep(0.1)
    assert answer.status_code == 200 and answer.json()["rows"] == [{"x": 1}]


# --- request bodies: refused before they are read (issue 27) ----------------------------------------------------

BIG_BODY = 2 << 30  # a 1.5 GB POST /sql body took the server's processes to 5.9 GB before its 422, 2 GB past 6.2 GB
BODY_SLACK = 64 * MiB  # what the server may grow by while it refuses one


@pytest.mark.server
@pytest.mark.parametrize("declared", [False, True], ids=["chunked", "content-length"])
def test_a_2_gb_body_is_refused_unread_and_the_server_stays_within_its_memory(server: Server,
                                                                               declared: bool) -> None:
    idle = server.idle()
    server.watch(idle + BODY_SLACK)
    sent = 0

    def body() -> Iterator[bytes]:  # 2 GiB made 1 MiB at a time: the test holds one piece
        nonlocal sent
        piece = b"x" * MiB
        for _ in range(BIG_BODY // MiB):
            sent += len(piece)
            yield piece

    headers = {"Content-Type": "application/json", **({"Content-Length": str(BIG_BODY)} if declared else {})}
    started = time.monotonic()
    refused = httpx.post(server.url + "/sql", content=body(), headers=headers, timeout=120)
    took = time.monotonic() - started
    assert server.proc.poll() is None, f"killed at {server.peak / MiB:.0f} MiB, over the budget"
    grown = max(server.peak, server.rss()) - idle
    assert refused.status_code == 413 and refused.headers["content-type"] == "application/problem+json"
    detail = refused.json()["detail"]
    assert "the limit of 1048576 bytes (1 MiB) of POST /sql (TRAJSTORE_SQL_MAX_BODY_BYTES)" in detail, detail
    assert ("Content-Length of 2147483648 bytes" in detail) == declared
    assert sent < BIG_BODY // 4 and took < 30, (sent, took)  # the connection was closed: the rest was never sent
    assert grown < BODY_SLACK, f"the server grew by {grown / MiB:.0f} MiB"
    normal = httpx.post(server.url + "/sql", json={"query": "SELECT count(*) AS n FROM steps"}, timeout=60)
    assert normal.status_code == 200 and normal.json()["rows"] == [{"n": server.steps}]


# --- answers that are not streamed: as many rows as fit in max_page_bytes -------------------------------------


@pytest.fixture(scope="module")
def pixel_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """One episode of 200 steps of 4 x 84 x 84 uint8 frames (28 KiB a step, as obs and as next_obs)."""
    path = tmp_path_factory.mktemp("pixels") / "store"
    rng = np.random.default_rng(0)
    frames = rng.integers(0, 255, (200, 1, 4, 84, 84), dtype=np.uint8)
    done = np.zeros((200, 1), bool)
    done[-1] = True
    space = gymnasium.spaces.Box(0, 255, (4, 84, 84), np.uint8)  # so that frames stay uint8
    with trajstore.open(path, create=True).writer(run_id="pixels", env_id="Pix-v0", observation_space=space) as w:
        w.add_batch({"obs": frames, "action": np.zeros((200, 1), np.int64), "reward": np.ones((200, 1), np.float32),
                     "next_obs": frames, "terminated": done, "truncated": np.zeros((200, 1), bool)})
    return path


@pytest.mark.slow
def test_a_json_page_of_wide_rows_holds_what_fits_in_max_page_bytes(pixel_store: Path) -> None:
    store = trajstore.open(pixel_store)
    with TestClient(create_app(settings_for(pixel_store, max_page_bytes=MiB))) as client:
        page = client.get("/steps", params={"format": "json", "limit": 1000, "columns": "step,obs"}).json()
        fits = MiB // (4 * 84 * 84 + 4)  # obs and step
        assert page["limit"] == len(page["items"]) == fits and page["next_cursor"]
        expected = plumbing(store).steps_page(["step", "obs"], limit=fits).to_pylist()
        assert [r["step"] for r in page["items"]] == [r["step"] for r in expected]
        assert page["items"][-1]["obs"] == expected[-1]["obs"]
        rest = client.get("/steps", params={"format": "json", "limit": 1000, "columns": "step",
                                            "cursor": page["next_cursor"]}).json()
        assert rest["items"][0]["step"] == fits  # narrow rows: a whole page again, after the cursor
        assert rest["limit"] == 1000 and len(rest["items"]) == 200 - fits


def test_an_episode_past_max_page_bytes_is_413_naming_the_streams(pixel_store: Path) -> None:
    episode = trajstore.open(pixel_store).episodes()["episode_id"][0].as_py()
    with TestClient(create_app(settings_for(pixel_store, max_page_bytes=MiB))) as client:
        for headers in ({}, {"Accept": "application/vnd.apache.arrow.stream"}):
            refused = client.get(f"/episodes/{episode}/steps", headers=headers)
            assert refused.status_code == 413 and refused.headers["content-type"] == "application/problem+json"
            detail = refused.json()["detail"]
            assert "max_page_bytes" in detail and f"GET /steps?episode_id={episode}" in detail, detail
        narrow = client.get(f"/episodes/{episode}/steps", params={"columns": "reward"}).json()
        assert [s["step"] for s in narrow["steps"]] == list(range(200))  # a narrow column: whole, as before
    with TestClient(create_app(settings_for(pixel_store))) as client:  # the default (8 MiB) holds its frames
        whole = client.get(f"/episodes/{episode}/steps", params={"columns": "obs"},
                           headers={"Accept": "application/vnd.apache.arrow.stream"})
        assert whole.status_code == 200 and pa.ipc.open_stream(whole.content).read_all().num_rows == 200


def test_row_bytes_are_the_decoded_sizes(probed_store: Path, pixel_store: Path) -> None:
    cartpole, pixels = trajstore.open(probed_store), trajstore.open(pixel_store)
    assert pages.row_bytes(cartpole, ["obs"]) == 16 and pages.row_bytes(cartpole, ["obs", "action", "reward"]) == 28
    assert pages.row_bytes(pixels, ["obs", "terminated"]) == 4 * 84 * 84 + 1
    worker = cartpole.sql("SELECT avg(length(worker_id)) AS n FROM steps")["n"][0].as_py()
    assert worker <= pages.row_bytes(cartpole, ["worker_id"]) <= pages.VARYING_BYTES  # a short string
    assert pages.row_bytes(cartpole, []) > pages.row_bytes(cartpole, ["obs", "next_obs", "worker_id"])
