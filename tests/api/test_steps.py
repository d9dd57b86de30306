"""Streaming steps for training: the Arrow stream, Client.iter_batches (numpy, JAX, Arrow, shuffled), and
work stopping when the client goes away."""

from __future__ import annotations

import http.server
import socket
import threading
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pyarrow as pa
import pytest

import trajstore
import trajstore.api.routes.steps as steps_route
from tests.api.helpers import Live, serve, settings_for
from trajstore.api.app import create_app
from trajstore.remote.client import Client

COLUMNS = ["episode_id", "step", "obs", "action", "reward"]


def stored_rows(path: Path, where: str = "true") -> pa.Table:
    return trajstore.open(path).sql(f"SELECT {', '.join(COLUMNS)} FROM steps WHERE {where} ORDER BY episode_id, step")


def sort_rows(arrays: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    order = np.lexsort((arrays["step"], arrays["episode_id"]))
    return {k: v[order] for k, v in arrays.items()}


def concat(batches: list[dict[str, np.ndarray]]) -> dict[str, np.ndarray]:
    return {k: np.concatenate([b[k] for b in batches]) for k in batches[0]}


@pytest.mark.server
def test_iter_batches_yields_every_selected_step_once(live: Live, populated: Path) -> None:
    with Client(live.url) as client:
        batches = list(client.iter_batches(batch_size=100, columns=COLUMNS, run_id="alpha", env_id="CartPole-v1"))
    assert all(len(b["reward"]) == 100 for b in batches[:-1]) and 0 < len(batches[-1]["reward"]) <= 100
    got = sort_rows(concat(batches))
    expected = stored_rows(populated, "run_id = 'alpha' AND env_id = 'CartPole-v1'")
    np.testing.assert_array_equal(got["episode_id"], expected["episode_id"].to_numpy())
    np.testing.assert_array_equal(got["obs"], np.stack(expected["obs"].to_numpy(zero_copy_only=False)))
    assert got["obs"].dtype == np.float32 and got["obs"].shape[1] == 4


@pytest.mark.server
def test_filters_on_episodes_select_their_steps(live: Live, populated: Path) -> None:
    with Client(live.url) as client:
        table = pa.Table.from_batches(list(client.iter_batches(format="arrow", columns=["episode_id", "step"],
                                                               complete=True, min_return=20, run_id="beta")))
    store = trajstore.open(populated)
    ids = store.episodes(run_id="beta", complete=True, where="episode_return >= 20").column("episode_id")
    assert set(table.column("episode_id").to_pylist()) == set(ids.to_pylist())
    assert table.num_rows == sum(store.episodes(run_id="beta", complete=True, where="episode_return >= 20")
                                 .column("episode_length").to_pylist())


@pytest.mark.server
def test_shuffle_is_reproducible_from_the_seed(live: Live) -> None:
    def epoch(seed: int) -> list[np.ndarray]:
        with Client(live.url) as client:
            return [b["step"] for b in client.iter_batches(batch_size=64, columns=["episode_id", "step"],
                                                          shuffle=True, seed=seed, shuffle_buffer=256)]

    a, b, c = epoch(1), epoch(1), epoch(2)
    assert all(np.array_equal(x, y) for x, y in zip(a, b)) and len(a) == len(b)
    assert not all(np.array_equal(x, y) for x, y in zip(a, c))
    with Client(live.url) as client:
        plain = np.concatenate([b["step"] for b in client.iter_batches(batch_size=64, columns=["step"])])
    assert sorted(np.concatenate(a).tolist()) == sorted(plain.tolist())
    assert not np.array_equal(np.concatenate(a), plain)


@pytest.mark.server
def test_jax_batches(live: Live) -> None:
    jnp = pytest.importorskip("jax.numpy")
    with Client(live.url) as client:
        batch = next(client.iter_batches(batch_size=32, columns=["obs", "reward"], format="jax", run_id="beta"))
    assert isinstance(batch["obs"], type(jnp.zeros(1))) and batch["obs"].shape == (32, 4)


@pytest.mark.server
def test_stream_errors_carry_the_problem_detail(live: Live) -> None:
    with Client(live.url, retries=0) as client, pytest.raises(trajstore.RemoteError) as err:
        next(client.iter_batches(columns=["obs", "nope"]))
    assert err.value.status == 422 and "nope" in (err.value.detail or "")


class Forward(http.server.BaseHTTPRequestHandler):
    """Forwards GETs to ``upstream`` + the request's path, recording each path; the first ``failures``
    requests get a 503 instead. With ``upstream=""`` it is a forward proxy (paths are absolute URLs)."""

    failures = 0
    upstream = ""
    seen: list[str] = []

    def do_GET(self) -> None:
        cls = type(self)
        cls.seen.append(self.path)
        if cls.failures:
            cls.failures -= 1
            self.send_response(503)
            self.send_header("Content-Length", "0")
            self.end_headers()
            return
        with httpx.Client(trust_env=False) as http, http.stream("GET", cls.upstream + self.path) as upstream:
            body = upstream.read()
        self.send_response(upstream.status_code)
        self.send_header("Content-Type", upstream.headers["content-type"])
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: Any) -> None:
        pass


@pytest.mark.server
def test_a_stream_is_retried_until_it_starts(live: Live, populated: Path) -> None:
    Forward.upstream, Forward.failures = live.url, 0
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward) as proxy:
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        url = f"http://127.0.0.1:{proxy.server_address[1]}"
        Forward.failures = 2
        with Client(url, retries=2, backoff=0.01) as client:
            got = concat(list(client.iter_batches(batch_size=256, columns=COLUMNS, run_id="beta")))
        assert Forward.failures == 0
        expected = stored_rows(populated, "run_id = 'beta'")
        np.testing.assert_array_equal(sort_rows(got)["episode_id"], expected["episode_id"].to_numpy())
        Forward.failures = 3
        with Client(url, retries=2, backoff=0.01) as client, pytest.raises(trajstore.RemoteError, match="503"):
            next(client.iter_batches(columns=["step"]))
        proxy.shutdown()


def test_a_stream_without_a_server_is_a_connection_error() -> None:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]  # nothing listens there once the socket is closed
    with Client(f"http://127.0.0.1:{port}", retries=1, backoff=0.01) as client, \
            pytest.raises(trajstore.RemoteError, match="Connection failed") as err:
        next(client.iter_batches())
    assert err.value.status == 0


@pytest.mark.server
def test_a_proxy_in_the_environment_carries_the_stream(live: Live, monkeypatch: pytest.MonkeyPatch) -> None:
    Forward.upstream, Forward.failures = "", 0
    with http.server.ThreadingHTTPServer(("127.0.0.1", 0), Forward) as proxy:
        threading.Thread(target=proxy.serve_forever, daemon=True).start()
        monkeypatch.setenv("HTTP_PROXY", f"http://127.0.0.1:{proxy.server_address[1]}")
        monkeypatch.delenv("NO_PROXY", raising=False)
        monkeypatch.delenv("no_proxy", raising=False)
        Forward.seen = []
        with Client(live.url) as client:
            rows = sum(len(b["step"]) for b in client.iter_batches(columns=["step"], run_id="beta"))
        assert rows > 0 and any(p.startswith(f"{live.url}/steps?") for p in Forward.seen)
        proxy.shutdown()


@pytest.mark.server
def test_a_custom_transport_carries_the_stream_too(live: Live, populated: Path) -> None:
    with Client(live.url, transport=httpx.HTTPTransport()) as client:
        got = concat(list(client.iter_batches(batch_size=100, columns=COLUMNS, env_id="Acrobot-v1")))
    expected = stored_rows(populated, "env_id = 'Acrobot-v1'")
    np.testing.assert_array_equal(sort_rows(got)["obs"], np.stack(expected["obs"].to_numpy(zero_copy_only=False)))


@pytest.mark.server
def test_wide_rows_are_streamed_in_smaller_batches(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "wide", create=True, settings=trajstore.Settings(stream_batch_bytes=100_000))
    rng = np.random.default_rng(3)
    obs = rng.integers(0, 255, (30, 4, 64, 64, 3), dtype=np.uint8)  # 12 KiB frames
    with store.writer(run_id="pix", env_id="Pixels-v0") as w:
        w.add_batch({"obs": obs, "next_obs": obs, "action": rng.integers(0, 4, (30, 4)),
                     "reward": np.ones((30, 4), np.float32), "terminated": np.zeros((30, 4), bool),
                     "truncated": np.zeros((30, 4), bool)})
    for live in serve(create_app(settings_for(tmp_path / "wide"), store=store)):
        body = httpx.get(live.url + "/steps", params={"columns": ["obs"], "batch_rows": 4096}).content
        sizes = [b.num_rows for b in pa.ipc.open_stream(body)]
        assert sum(sizes) == 120 and max(sizes) <= 100_000 // (64 * 64 * 3)
        with Client(live.url) as client:
            batches = list(client.iter_batches(batch_size=50, columns=["obs"]))
        assert [len(b["obs"]) for b in batches] == [50, 50, 20]  # the client still gets the size it asked for
        got = np.concatenate([b["obs"] for b in batches])
        np.testing.assert_array_equal(got, obs.transpose(1, 0, 2, 3, 4).reshape(120, 64, 64, 3))


class CountingStreams:
    """Counts the scans the server has open and the stream pieces it produced."""

    def __init__(self) -> None:
        self.open = 0
        self.pieces = 0


@pytest.fixture
def big_live(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[tuple[Live, CountingStreams]]:
    store = trajstore.open(tmp_path / "big", create=True)
    rng = np.random.default_rng(0)
    with store.writer(run_id="big", env_id="Toy-v0") as w:
        for _ in range(20):
            w.add_batch({"obs": rng.normal(size=(500, 20, 4)).astype(np.float32),
                         "action": rng.integers(0, 2, (500, 20)), "reward": np.ones((500, 20), np.float32),
                         "next_obs": rng.normal(size=(500, 20, 4)).astype(np.float32),
                         "terminated": rng.random((500, 20)) < 0.01, "truncated": np.zeros((500, 20), bool)})
    counts = CountingStreams()
    real_scan, real_stream = trajstore.Store.scan, steps_route.ipc_pieces

    def scan(self: trajstore.Store, *args: Any, **kwargs: Any) -> pa.RecordBatchReader:
        reader = real_scan(self, *args, **kwargs)
        counts.open += 1

        def batches() -> Iterator[pa.RecordBatch]:
            try:
                yield from reader
            finally:
                reader.close()
                counts.open -= 1
        return pa.RecordBatchReader.from_batches(reader.schema, batches())

    def counted(reader: pa.RecordBatchReader) -> Iterator[bytes]:
        for piece in real_stream(reader):
            counts.pieces += 1
            yield piece

    monkeypatch.setattr(trajstore.Store, "scan", scan)
    monkeypatch.setattr(steps_route, "ipc_pieces", counted)
    app = create_app(settings_for(tmp_path / "big", stream_batch_rows=1000), store=store)
    for live in serve(app):
        yield live, counts


@pytest.mark.server
def test_stream_stops_when_the_client_disconnects(big_live: tuple[Live, CountingStreams]) -> None:
    live, counts = big_live
    with Client(live.url) as client:
        stream = client.iter_batches(batch_size=1000, columns=["obs"], format="arrow")
        next(stream)
        stream.close()  # the training loop stops early: the response is closed
    deadline = time.monotonic() + 10
    while counts.open and time.monotonic() < deadline:
        time.sleep(0.05)
    assert counts.open == 0, "the server kept reading the store after the client left"
    assert counts.pieces < 200 // 2, f"the server produced {counts.pieces} of ~200 pieces for a client that left"
