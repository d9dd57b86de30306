"""The hostile probe of issue 47, replayed against a real ``trajstore serve`` (a process of its own, on
127.0.0.1, with an API key and low budgets so that every refusal comes quickly).

- ``probed``: one store for the session, four runs of two tasks each described by a config (what the comparisons
  and learning curves group), and a canary file beside it that no request may read or change.
- ``server``: one ``trajstore serve`` over it for the session, for the tests that only read (or whose writes are
  refused): a test that changes the store asks for ``fresh_server`` instead.
- ``fresh_server``: a server of its own over a copy of ``probed``, for a test that writes (bad names, configs).
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import pytest

import trajstore
from tests.api.helpers import API_KEY
from tests.helpers import fingerprint
from tests.served import Server
from trajstore.rollout import gym_rollout

pytestmark = pytest.mark.security

CANARY = "canary.txt"  # beside the store: a file the server can read and write, that no request may
SECRET = "the canary's secret: 7f3a9c"
BUDGETS = {"sql_max_concurrent": 2, "sql_timeout_s": 5, "sql_worker_bytes": 512 * 1024 * 1024,
           "api_key": API_KEY}


@pytest.fixture(scope="session")
def probed(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Four runs (two algorithms, two seeds each) on CartPole and Acrobot, each run described by a config."""
    path = tmp_path_factory.mktemp("security") / "store"
    store = trajstore.open(path, create=True)
    for i, (algo, seed) in enumerate([("ppo", 0), ("ppo", 1), ("dqn", 0), ("dqn", 1)]):
        for env in ("CartPole-v1", "Acrobot-v1"):
            gym_rollout(store, env, run_id=f"{algo}-{seed}", num_envs=2, episodes=6, seed=10 * i + seed,
                        progress=False, append=True, config={"algo": algo, "seed": seed})
    (path.parent / CANARY).write_text(SECRET)
    return path


@pytest.fixture(scope="session")
def server(probed: Path) -> Iterator[Server]:
    with Server(probed, **BUDGETS) as live:
        yield live


@pytest.fixture
def fresh_server(probed: Path, tmp_path: Path) -> Iterator[Callable[..., Server]]:
    """A server of its own over a copy of ``probed`` (its path is ``server.store``), with ``BUDGETS`` and the
    settings given."""
    started: list[Server] = []

    def start(**settings: Any) -> Server:
        copy = tmp_path / f"store-{len(started)}"
        shutil.copytree(probed, copy)
        live = Server(copy, **{**BUDGETS, **settings})
        live.store = copy
        started.append(live)
        live.wait_ready(live.workers)
        return live

    yield start
    for live in started:
        live.close()


@pytest.fixture
def intact(probed: Path) -> Iterator[None]:
    """The store and the canary beside it byte for byte as before the test, checked after it."""
    before = fingerprint(probed)
    yield
    assert fingerprint(probed) == before, "a file of the store or beside it was written, changed or removed"
    assert (probed.parent / CANARY).read_text() == SECRET


def get(server: Server, path: str, **params: Any) -> httpx.Response:
    return httpx.get(server.url + path, params=params, timeout=60)


def auth() -> dict[str, str]:
    return {"Authorization": f"Bearer {API_KEY}"}
