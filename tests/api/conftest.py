"""Fixtures for the service: a populated store, the app in-process, and the app behind a real uvicorn server, each
made once for the package's tests, which only read them (helpers are in ``tests/api/helpers.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import pytest
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import Live, serve, settings_for
from trajstore.api.app import create_app
from trajstore.rollout import gym_rollout


@pytest.fixture(scope="package")
def populated(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """Two runs of CartPole and one of Acrobot (another observation shape), with lineage."""
    path = tmp_path_factory.mktemp("api") / "store"
    store = trajstore.open(path, create=True)
    gym_rollout(store, "CartPole-v1", run_id="alpha", num_envs=4, episodes=40, seed=0, progress=False,
                policy_version=1)
    gym_rollout(store, "CartPole-v1", run_id="beta", num_envs=4, episodes=30, seed=1, progress=False,
                policy_version=2, mode="eval")
    gym_rollout(store, "Acrobot-v1", run_id="alpha", num_envs=2, steps=1100, seed=2, progress=False, append=True)
    return path


@pytest.fixture(scope="package")
def client(populated: Path) -> Iterator[TestClient]:
    """The app over ``populated`` in-process, shared by the tests that only read (a test that writes makes its own)."""
    with TestClient(create_app(settings_for(populated))) as c:
        yield c


@pytest.fixture(scope="package")
def live(populated: Path) -> Iterator[Live]:
    """The app over ``populated`` behind a real uvicorn server, shared by the tests that only read."""
    yield from serve(create_app(settings_for(populated)))
