"""Multi-agent trust (issue 47, item 5) against a real ``trajstore serve``: ingest of agent rows whose env steps go
back or repeat, for one agent in one episode, in one request or after what the store holds, is 422 naming the agent
and the episode, and nothing is stored; agents that skip env steps are stored, and a retried request under its key
answers as before."""

from __future__ import annotations

import uuid
from typing import Any, Callable

import httpx
import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.security.conftest import auth
from tests.served import Server
from trajstore.remote.wire import ipc_bytes

pytestmark = [pytest.mark.server, pytest.mark.security]

EPISODE = 2**40 + 5  # no episode of the probed store has this id
ARROW = "application/vnd.apache.arrow.stream"


def agent_body(*given: tuple[Any, ...]) -> bytes:
    """An ingest body of one episode's agent rows in the order given, each ``(agent, step)`` or
    ``(agent, step, ended)``."""
    n = len(given)
    return ipc_bytes(pa.table({
        "episode_id": pa.array([EPISODE] * n, pa.int64()), "step": pa.array([g[1] for g in given], pa.int32()),
        "agent_id": pa.array([g[0] for g in given], pa.string()),
        "obs": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(2 * n, dtype=np.float32)), 2),
        "action": pa.array(np.zeros(n, np.int64)), "reward": pa.array(np.ones(n, np.float32)),
        "next_obs": pa.FixedSizeListArray.from_arrays(pa.array(np.arange(2 * n, dtype=np.float32) + 1), 2),
        "terminated": pa.array([len(g) > 2 and g[2] for g in given]), "truncated": pa.array([False] * n)}))


def post(live: Server, body: bytes, key: str | None = None) -> httpx.Response:
    headers = {**auth(), "Content-Type": ARROW, **({"Idempotency-Key": key} if key else {})}
    return httpx.post(f"{live.url}/runs/agents/batches", params={"env_id": "Spread-v0"}, content=body,
                      headers=headers, timeout=60)


def held(live: Server) -> tuple[int, list[tuple[str, int]]]:
    """The store's version and the stored (agent, step) rows of the episode."""
    store = trajstore.open(live.store)
    rows = store.sql(f"SELECT * FROM steps WHERE episode_id = {EPISODE}").to_pylist()  # no agent_id before any
    return store.version, sorted((r["agent_id"], r["step"]) for r in rows)


def refused(answer: httpx.Response, *needles: str) -> None:
    assert answer.status_code == 422, answer.text
    assert answer.headers["content-type"] == "application/problem+json"
    for needle in needles:
        assert needle in answer.json()["detail"], answer.json()["detail"]


def test_agent_rows_that_go_back_or_repeat_are_refused_and_nothing_is_stored(
        fresh_server: Callable[..., Server]) -> None:
    live = fresh_server()
    before = held(live)
    refused(post(live, agent_body(("agent_0", 1), ("agent_1", 0), ("agent_0", 0))),
            f"agent 'agent_0' of episode_id {EPISODE} goes from step 1 back to step 0",
            "expected strictly increasing env steps for one agent in one episode")
    refused(post(live, agent_body(("agent_0", 0), ("agent_1", 0), ("agent_1", 0))),
            f"agent 'agent_1' of episode_id {EPISODE} has step 0 more than once")
    assert held(live) == before

    stored = post(live, agent_body(("agent_0", 0), ("agent_1", 0), ("agent_0", 2), ("agent_1", 3)))  # skips steps
    assert stored.status_code == 201, stored.text
    after = held(live)
    assert after[1] == [("agent_0", 0), ("agent_0", 2), ("agent_1", 0), ("agent_1", 3)]
    for body, needle in ((agent_body(("agent_0", 1)), "agent 'agent_0' of episode_id"),
                         (agent_body(("agent_2", 1), ("agent_1", 3)), "agent 'agent_1' of episode_id")):
        refused(post(live, body), needle, "but the store holds its steps up to")
    assert held(live) == after
    assert trajstore.check(trajstore.open(live.store)).ok


def test_a_retried_agent_request_answers_as_before(fresh_server: Callable[..., Server]) -> None:
    live = fresh_server()
    body, key = agent_body(("agent_0", 0), ("agent_1", 0), ("agent_0", 1, True)), uuid.uuid4().hex
    first, again = post(live, body, key), post(live, body, key)
    assert first.status_code == 201 and not first.json()["duplicate"]
    assert again.status_code == 200 and again.json() == {"run_id": "agents", "env_id": "Spread-v0", "rows": 3,
                                                         "duplicate": True}
    assert held(live)[1] == [("agent_0", 0), ("agent_0", 1), ("agent_1", 0)]
