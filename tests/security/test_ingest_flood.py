"""Ingest flooded (issue 49): many clients sending at once into a real ``trajstore serve`` whose bound on the bytes
of requests waiting for their commit (``ingest_pending_bytes``) is small: the requests past it get 429 with
``Retry-After`` within ``ingest_wait_s``, each acknowledged request is stored once, nothing refused is stored, and
the service's memory stays within its bound."""

from __future__ import annotations

import threading
from pathlib import Path

import httpx
import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.security.conftest import API_KEY
from tests.served import MiB, Server
from trajstore.remote.wire import ipc_bytes

pytestmark = [pytest.mark.server, pytest.mark.security]

CLIENTS = 24


def episode(episode_id: int, n: int = 2000) -> bytes:
    steps = np.arange(n)
    return ipc_bytes(pa.table({
        "episode_id": pa.array(np.full(n, episode_id), pa.int64()), "step": pa.array(steps, pa.int32()),
        "obs": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * 64, np.float32)), 64),
        "action": pa.array(np.zeros(n, np.int64)), "reward": pa.array(np.ones(n, np.float32)),
        "next_obs": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * 64, np.float32)), 64),
        "terminated": pa.array(steps == n - 1), "truncated": pa.array(np.zeros(n, bool))}))


def test_a_flood_past_the_pending_bytes_is_429_and_the_memory_stays_bounded(tmp_path: Path) -> None:
    path = tmp_path / "store"
    trajstore.open(path, create=True)
    body = episode(0)
    with Server(path, api_key=API_KEY, sql_max_concurrent=1, commit_interval="1s",
                ingest_pending_bytes=4 * len(body), ingest_wait_s=0.5) as server:
        idle = server.rss(workers=False)
        answers: list[tuple[int, int, str | None]] = []
        barrier = threading.Barrier(CLIENTS)

        def send(i: int) -> None:
            with httpx.Client(base_url=server.url, timeout=60) as c:
                barrier.wait()
                r = c.post("/runs/flood/batches", params={"env_id": "E"}, content=episode(i),
                           headers={"Authorization": f"Bearer {API_KEY}", "Idempotency-Key": f"k{i}",
                                    "Content-Type": "application/vnd.apache.arrow.stream"})
                answers.append((i, r.status_code, r.headers.get("retry-after")))

        server.watch(idle + 1024 * MiB, workers=False)
        threads = [threading.Thread(target=send, args=(i,)) for i in range(CLIENTS)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        peak = server.peak
        assert server.proc.poll() is None
    codes = sorted(code for _, code, _ in answers)
    assert set(codes) <= {201, 429} and 201 in codes and 429 in codes, codes
    assert all(int(after) >= 1 for _, code, after in answers if code == 429)
    stored = trajstore.open(path).sql("SELECT DISTINCT episode_id FROM steps")["episode_id"].to_pylist()
    assert sorted(stored) == sorted(i for i, code, _ in answers if code == 201)
    assert peak - idle < 1024 * MiB
    assert trajstore.check(trajstore.open(path)).ok
