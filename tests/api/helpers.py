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
import uvicorn
from fastapi import FastAPI

from trajstore.settings import Settings

API_KEY = "test-key-0123456789"


def settings_for(path: Path, **overrides: Any) -> Settings:
    return Settings(**{"store": str(path), "api_key": API_KEY, **overrides})


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


def steps_batch(rng: np.random.Generator, T: int, B: int, *, p_done: float = 0.1) -> dict[str, Any]:
    return {"obs": rng.normal(size=(T, B, 4)).astype(np.float32), "action": rng.integers(0, 2, (T, B)),
            "reward": rng.uniform(0, 1, (T, B)).astype(np.float32),
            "next_obs": rng.normal(size=(T, B, 4)).astype(np.float32),
            "terminated": rng.random((T, B)) < p_done, "truncated": np.zeros((T, B), bool)}
