"""Fixtures for the service: a populated store, the app in-process, and the app behind a real uvicorn server."""

from __future__ import annotations

import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest
import uvicorn
from fastapi import FastAPI
from fastapi.testclient import TestClient

import trajstore
from trajstore.api.app import create_app
from trajstore.rollout import gym_rollout
from trajstore.settings import Settings

API_KEY = "test-key-0123456789"


@pytest.fixture(scope="package")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs of CartPole and one of Acrobot (another observation shape), with lineage."""
    path = tmp_path_factory.mktemp("api") / "store"
    store = trajstore.open(path, create=True)
    gym_rollout(store, "CartPole-v1", run_id="alpha", num_envs=4, episodes=40, seed=0, progress=False,
                policy_version=1)
    gym_rollout(store, "CartPole-v1", run_id="beta", num_envs=4, episodes=30, seed=1, progress=False,
                policy_version=2, mode="eval")
    gym_rollout(store, "Acrobot-v1", run_id="alpha", num_envs=2, steps=1100, seed=2, progress=False)
    return path


def settings_for(path: Path, **overrides: Any) -> Settings:
    return Settings(**{"store": str(path), "api_key": API_KEY, **overrides})


@pytest.fixture
def client(populated: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(populated))) as c:
        yield c


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
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning"))
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


@pytest.fixture
def live(populated: Path) -> Iterator[Live]:
    yield from serve(create_app(settings_for(populated)))


def steps_batch(rng: np.random.Generator, T: int, B: int, *, p_done: float = 0.1) -> dict[str, Any]:
    return {"obs": rng.normal(size=(T, B, 4)).astype(np.float32), "action": rng.integers(0, 2, (T, B)),
            "reward": rng.uniform(0, 1, (T, B)).astype(np.float32),
            "next_obs": rng.normal(size=(T, B, 4)).astype(np.float32),
            "terminated": rng.random((T, B)) < p_done, "truncated": np.zeros((T, B), bool)}
