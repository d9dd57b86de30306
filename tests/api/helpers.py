"""Helpers for the service's tests: settings with an API key, the app behind a real uvicorn server, batches."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pyarrow as pa
import uvicorn
from fastapi import FastAPI

import trajstore
from trajstore.api.app import server_config
from trajstore.api.settings import ServiceSettings
from trajstore.store import plumbing

API_KEY = "test-key-0123456789"


def settings_for(path: Path, **overrides: Any) -> ServiceSettings:
    """The service's settings over the store at ``path``, with an API key and without the dashboard's read-ahead (a
    thread reading six queries' worth of the store as each app starts, which a test of other routes never asks for
    and which held a fresh app's first request ~2 s; tests/api/dashboard/test_routes.py checks the read-ahead)."""
    return ServiceSettings(**{"store": str(path), "api_key": API_KEY, "dashboard_warm": False, **overrides})


@dataclass
class Live:
    url: str
    app: FastAPI


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def serve(app: FastAPI) -> Iterator[Live]:
    """``app`` behind a real uvicorn server on 127.0.0.1, stopped afterwards."""
    port = free_port()
    server = uvicorn.Server(server_config(app, host="127.0.0.1", port=port))
    thread = threading.Thread(target=server.run, daemon=True)
    thread.start()
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 20
    while True:
        try:
            if httpx.get(url + "/health", timeout=1).status_code == 200:
                break
        except httpx.TransportError:
            pass
        if time.monotonic() > deadline:
            raise RuntimeError("uvicorn did not start")
        time.sleep(0.05)
    try:
        yield Live(url, app)
    finally:
        server.should_exit = True
        thread.join(10)


def steps_batch(rng: np.random.Generator, T: int, B: int, *, p_done: float = 0.1) -> dict[str, Any]:
    return {"obs": rng.normal(size=(T, B, 4)).astype(np.float32), "action": rng.integers(0, 2, (T, B)),
            "reward": rng.uniform(0, 1, (T, B)).astype(np.float32),
            "next_obs": rng.normal(size=(T, B, 4)).astype(np.float32),
            "terminated": rng.random((T, B)) < p_done, "truncated": np.zeros((T, B), bool)}


# Two episode ids one apart above 2**62: one double (float(ID_A) == float(ID_B)), so a reader of JSON numbers as doubles
# (JavaScript's JSON.parse, jq) would read both as one.
ID_A, ID_B = 2**62 + 1, 2**62 + 2  # one double: float(ID_A) == float(ID_B)
LENGTHS = {ID_A: 3, ID_B: 5}
SEED = 2**60 + 3  # a lineage value past 2**53
VERSIONS = {ID_A: 7, ID_B: 2**60 + 5}  # policy_version: a number for ID_A, past 2**53 for ID_B


def episode_rows(episode_id: int, length: int) -> pa.Table:
    steps = np.arange(length)
    return pa.table({
        "episode_id": pa.array([episode_id] * length, pa.int64()), "step": pa.array(steps, pa.int32()),
        "obs": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(length * 2, dtype=np.float32)), 2),
        "action": pa.array(np.zeros(length, np.int64)),
        "reward": pa.array(np.full(length, 1.0 if episode_id == ID_A else 2.0, np.float32)),
        "next_obs": pa.FixedSizeListArray.from_arrays(pa.array(np.ones(length * 2, np.float32)), 2),
        "terminated": pa.array(steps == length - 1), "truncated": pa.array(np.zeros(length, bool)),
        "seed": pa.array([SEED] * length, pa.int64()),
        "policy_version": pa.array([VERSIONS[episode_id]] * length, pa.int64()),
    })


def write_adjacent_ids(path: Path) -> trajstore.Store:
    """A store with the episodes ``ID_A`` and ``ID_B`` (complete, 3 and 5 steps), ingested with their own ids."""
    store = trajstore.open(path, create=True)
    plumbing(store).ingest(pa.concat_tables([episode_rows(ID_A, LENGTHS[ID_A]), episode_rows(ID_B, LENGTHS[ID_B])]),
                 run_id="big-ids", env_id="Toy-v0")
    return store
