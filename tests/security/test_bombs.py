"""Ingest decompression bombs (issue 47, item 2): the probe sent ``POST /runs/{run_id}/batches`` (with the key) a
113 KB zstd Arrow body of 60M zero rows, which OOM-killed the server, and a 57 KB one, which took it to 3.4 GB
before its 422 — the body limit counted wire bytes. Each bomb is now answered 413 at once (well within 2 s), naming
TRAJSTORE_MAX_DECODED_BYTES, before anything is decompressed: the server's memory stays far below what the body
decodes to, nothing is stored, and an ordinary ingest afterwards is 201. Bodies built as a client builds them
(pyarrow's IPC writer, ``compression="zstd"``), against a real ``trajstore serve`` with its default limits."""

from __future__ import annotations

import time
from typing import Callable

import httpx
import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.helpers import fingerprint
from tests.security.conftest import auth
from tests.served import MiB, Server
from trajstore.remote.decoded_size import decoded_size
from trajstore.remote.wire import ARROW_STREAM

pytestmark = [pytest.mark.server, pytest.mark.security]

MAX_DECODED_BYTES = 512 * MiB  # the default of TRAJSTORE_MAX_DECODED_BYTES
BOMB_SLACK = 128 * MiB  # what the server may take over its idle memory while it refuses a bomb


def zero_rows(n: int) -> pa.RecordBatch:
    """``n`` rows of zeros shaped like an ingest's (obs of 4 floats): 56 bytes a row decoded."""
    obs = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * 4, np.float32)), 4)
    return pa.record_batch({
        "episode_id": pa.array(np.zeros(n, np.int64)), "step": pa.array(np.zeros(n, np.int32)), "obs": obs,
        "action": pa.array(np.zeros(n, np.int64)), "reward": pa.array(np.zeros(n, np.float32)), "next_obs": obs,
        "terminated": pa.array(np.zeros(n, bool)), "truncated": pa.array(np.zeros(n, bool))})


def episode(episode_id: int, n: int) -> pa.RecordBatch:
    """An ordinary episode of ``n`` steps (zeros but its keys), its last step terminated."""
    rows = zero_rows(n)
    return rows.set_column(0, "episode_id", pa.array(np.full(n, episode_id, np.int64))) \
        .set_column(1, "step", pa.array(np.arange(n, dtype=np.int32))) \
        .set_column(6, "terminated", pa.array(np.arange(n) == n - 1))


def zstd_stream(batch: pa.RecordBatch, times: int = 1) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, batch.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        for _ in range(times):
            w.write_batch(batch)
    return sink.getvalue().to_pybytes()


BOMBS: dict[str, Callable[[], bytes]] = {  # built when a test asks: 60M rows take ~200 MB to build here
    "60M zero rows in ~100 KB": lambda: zstd_stream(zero_rows(60_000_000)),
    "30M zero rows in ~53 KB": lambda: zstd_stream(zero_rows(30_000_000)),
    "60 batches of 1M zero rows, each under the limit": lambda: zstd_stream(zero_rows(1 << 20), 60),
}


def post(server: Server, body: bytes, **params: str) -> httpx.Response:
    return httpx.post(f"{server.url}/runs/bomb/batches", params={"env_id": "Bomb-v0", **params}, content=body,
                      headers={**auth(), "Content-Type": ARROW_STREAM}, timeout=60)


@pytest.mark.parametrize("bomb", list(BOMBS))
def test_a_decompression_bomb_is_413_before_it_is_decoded(fresh_server: Callable[..., Server], bomb: str) -> None:
    body = BOMBS[bomb]()
    size = decoded_size(body)
    assert len(body) < 256 * 1024 and size.buffers > 3 * MAX_DECODED_BYTES
    server = fresh_server()
    before = fingerprint(server.store)
    idle = server.idle()
    server.watch(idle + 2 * BOMB_SLACK)  # past that the server is killed: far below the gigabytes decoded
    started = time.monotonic()
    answer = post(server, body)
    elapsed = time.monotonic() - started
    time.sleep(0.1)  # the sampler's last readings
    assert server.proc.poll() is None, f"killed at {server.peak / MiB:.0f} MiB"
    assert answer.status_code == 413, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    detail = answer.json()["detail"]
    assert detail.startswith("body: decodes to ") and "over the limit of 536870912 bytes (512 MiB) of POST " \
        "/runs/bomb/batches (TRAJSTORE_MAX_DECODED_BYTES); nothing of it was decoded or stored" in detail, detail
    # answered without decoding: the memory bound below is the proof; the time only says nothing waited on the
    # body (a fresh server's first answer took 2.06 s with three workers sharing two cores)
    assert elapsed < 10.0, f"answered in {elapsed:.2f} s"
    assert server.peak - idle < BOMB_SLACK, f"{(server.peak - idle) / MiB:.0f} MiB over idle"
    assert fingerprint(server.store) == before  # nothing stored
    ordinary = post(server, zstd_stream(episode(10**12, 100)))
    assert ordinary.status_code == 201, ordinary.text
    steps = trajstore.open(server.store).sql("SELECT count(*) AS n FROM steps WHERE run_id = 'bomb'")
    assert steps["n"][0].as_py() == 100
