"""``RemoteStore`` for the rows of agents: an ``AgentWriter`` over a real service stores what it stores locally, its
episodes cut across ingest requests agent by agent (agents skipping env steps and leaving, as knights_archers_zombies'
do); an agent's step back after a flush is refused by the writer and nothing of it is sent."""

from __future__ import annotations

import ssl
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.api.helpers import API_KEY, Live, serve, settings_for
from trajstore.api.app import create_app
from trajstore.remote.client import Client
from trajstore.remote.writer import RemoteStore
from trajstore.write.agents import AgentWriter

pytestmark = pytest.mark.server  # the tiers: tests/tiers.py

AGENTS = ["knight_0", "archer_0", "archer_1"]
ROWS = ("SELECT agent_id, step, obs, action, reward, next_obs, terminated, truncated, env_steps, "
        "min(env_steps) OVER (PARTITION BY episode_id) AS episode_start FROM steps ORDER BY episode_start, agent_id, "
        "step")


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    trajstore.open(tmp_path / "served", create=True)
    yield from serve(create_app(settings_for(tmp_path / "served")))


def row(rng: np.random.Generator, *, end: bool = False) -> tuple[Any, ...]:
    return (rng.normal(size=3).astype(np.float32), int(rng.integers(4)), float(rng.normal()),
            rng.normal(size=3).astype(np.float32), end, False)


def play(store: Any, *, seed: int) -> None:
    """Two episodes, flushed every few env steps: not every agent acts at every step, archer_1 joins at step 2
    and is killed at step 5, the others end at step 8."""
    rng = np.random.default_rng(seed)
    with AgentWriter(store, run_id="kaz", env_id="Kaz-v0", agents=AGENTS) as w:
        for _ in range(2):
            for step in range(9):
                acting = [a for i, a in enumerate(AGENTS) if (step + i) % 3 or a == "knight_0"]
                acting = [a for a in acting if a != "archer_1" or 2 <= step <= 5]
                w.add(step, {a: row(rng, end=step == 8 or (a == "archer_1" and step == 5)) for a in acting})
                if step % 3 == 2:
                    w.flush()
            w.end_episode()


def test_an_agent_writer_over_a_remote_store_stores_what_it_stores_locally(tmp_path: Path, live: Live) -> None:
    local = trajstore.open(tmp_path / "local", create=True)
    play(local, seed=1)
    with RemoteStore(live.url, api_key=API_KEY) as remote:
        play(remote, seed=1)
    served = trajstore.open(tmp_path / "served")
    assert len(served.maintain.files()) == len(local.maintain.files()) == 6  # a request per flush
    assert served.sql(ROWS).equals(local.sql(ROWS))
    assert served.sql("SELECT agent_id, count(*) AS n FROM steps GROUP BY 1 ORDER BY 1").to_pylist() == [
        {"agent_id": "archer_0", "n": 12}, {"agent_id": "archer_1", "n": 6}, {"agent_id": "knight_0", "n": 18}]
    assert trajstore.check(served).ok


def test_a_step_back_after_a_flush_is_refused_before_anything_is_sent(tmp_path: Path, live: Live) -> None:
    rng = np.random.default_rng(0)
    with RemoteStore(live.url, api_key=API_KEY) as remote:
        with AgentWriter(remote, run_id="kaz", env_id="Kaz-v0", agents=AGENTS) as w:
            w.add(0, {"knight_0": row(rng), "archer_0": row(rng)})
            w.add(1, {"knight_0": row(rng)})
            w.flush()
            with pytest.raises(trajstore.InputError, match="agent 'knight_0' .* acted at env step 1; got step 1, "
                                                           "the same step again"):
                w.add(1, {"archer_0": row(rng), "knight_0": row(rng)})
    served = trajstore.open(tmp_path / "served")
    steps = served.sql("SELECT agent_id, step FROM steps ORDER BY 1, 2")
    assert steps.equals(pa.table({"agent_id": ["archer_0", "knight_0", "knight_0"], "step": pa.array([0, 0, 1],
                                                                                                      pa.int32())}))


def test_the_clients_of_a_process_share_one_tls_context() -> None:
    """Each httpx client loaded the certificates into a TLS context of its own, ~20 ms of CPU: 1,000 actors'
    RemoteWriters in one process spent 20 s on it. The clients of a process, of http:// and https:// services alike,
    share one."""
    plain, secure = Client("http://127.0.0.1:1"), Client("https://trajstore.invalid")
    try:
        contexts = [c._http._transport._pool._ssl_context for c in (plain, secure)]  # httpx's, through httpcore
        assert isinstance(contexts[0], ssl.SSLContext) and contexts[0] is contexts[1]
        assert contexts[0].verify_mode == ssl.CERT_REQUIRED and contexts[0].check_hostname  # still verified
    finally:
        plain.close()
        secure.close()
