"""``AgentWriter``: each agent's env steps in one episode strictly increase, also across flushes (a step back or the
same step again is refused naming the agent and the episode, and nothing of that call is stored); agents may skip
env steps, act at steps other agents used, and start again in the next episode."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import trajstore
from trajstore.write.agents import AgentWriter

AGENTS = ["a_0", "a_1"]


def row(value: float, *, end: bool = False) -> tuple[Any, ...]:
    """One agent's row whose observation and reward are ``value`` (so that stored rows can be told apart)."""
    obs = np.full(2, value, np.float32)
    return obs, 0, value, obs + 1, end, False


def stored(store: trajstore.Store) -> list[tuple[str, int, float]]:
    """``(agent_id, step, reward)`` of every stored row, by episode (in writing order), agent and step."""
    rows = store.sql("SELECT agent_id, step, reward FROM steps ORDER BY env_steps, agent_id, step").to_pylist()
    return [(r["agent_id"], r["step"], r["reward"]) for r in rows]


@pytest.mark.parametrize("steps, what", [((1, 0), "a step back"), ((0, 0), "the same step again")])
def test_an_agents_env_steps_that_go_back_or_repeat_are_refused(store: trajstore.Store, steps: tuple[int, int],
                                                                 what: str) -> None:
    with AgentWriter(store, run_id="r", env_id="Pair-v0", agents=AGENTS) as w:
        w.add(steps[0], {"a_0": row(1.0)})
        episode = w.episode_id
        message = (rf"step: agent 'a_0' of episode {episode} acted at env step {steps[0]}; got step {steps[1]}, "
                   rf"{what}: expected strictly increasing env steps for one agent in one episode")
        with pytest.raises(trajstore.InputError, match=message):
            w.add(steps[1], {"a_1": row(2.0), "a_0": row(2.0)})  # a_1's first step: nothing of the call is kept
    assert stored(store) == [("a_0", steps[0], 1.0)]


def test_the_last_step_of_each_agent_is_kept_across_flushes(store: trajstore.Store) -> None:
    with AgentWriter(store, run_id="r", env_id="Pair-v0", agents=AGENTS) as w:
        w.add(0, {"a_0": row(1.0), "a_1": row(1.0)})
        w.add(3, {"a_0": row(2.0)})
        w.flush()
        assert len(store.maintain.files()) == 1
        for step in (3, 2):
            with pytest.raises(trajstore.InputError, match=r"agent 'a_0' .* acted at env step 3; got step "
                                                           rf"{step}.*a step after 3; it may skip steps"):
                w.add(step, {"a_0": row(3.0)})
        w.add(2, {"a_1": row(4.0, end=True)})  # another agent: after its own last step, 0
        w.add(4, {"a_0": row(5.0, end=True)})
        w.end_episode()
    assert stored(store) == [("a_0", 0, 1.0), ("a_1", 0, 1.0), ("a_1", 2, 4.0), ("a_0", 3, 2.0), ("a_0", 4, 5.0)]
    assert trajstore.check(store).ok


def test_agents_may_skip_env_steps_and_start_again_in_the_next_episode(store: trajstore.Store) -> None:
    """Agents that do not act at some steps, join late or leave (knights_archers_zombies' agents die)."""
    with AgentWriter(store, run_id="r", env_id="Pair-v0", agents=AGENTS) as w:
        w.add(0, {"a_0": row(1.0)})
        w.add(2, {"a_0": row(2.0), "a_1": row(2.0)})
        w.add(5, {"a_0": row(3.0, end=True), "a_1": row(3.0, end=True)})
        w.end_episode()
        w.add(0, {"a_0": row(4.0, end=True), "a_1": row(4.0, end=True)})
        w.end_episode()
        assert w.episodes_completed == 2
    assert stored(store) == [("a_0", 0, 1.0), ("a_0", 2, 2.0), ("a_1", 2, 2.0), ("a_0", 5, 3.0), ("a_1", 5, 3.0),
                             ("a_0", 0, 4.0), ("a_1", 0, 4.0)]
    lengths = store.sql("SELECT agent_id, agent_length FROM agent_episodes ORDER BY env_steps, agent_id")
    assert lengths.column("agent_length").to_pylist() == [3, 2, 1, 1]
    assert trajstore.check(store).ok


def reference_rows(calls: list[tuple[int, dict[str, tuple[Any, ...]]] | None]) -> list[dict[str, Any]]:
    """The rows an ``AgentWriter`` stores for ``calls`` (``(step, rows)`` of :meth:`AgentWriter.add`, None for
    ``end_episode``), by a plain loop over them: episodes numbered in order, ``env_steps`` counting the env steps
    of the episodes before."""
    out, episode, base, length = [], 0, 0, 0
    for call in calls:
        if call is None:
            episode, base, length = episode + 1, base + length, 0
            continue
        step, rows = call
        for agent, (obs, action, reward, next_obs, terminated, truncated) in rows.items():
            out.append({"episode": episode, "agent_id": agent, "step": step, "obs": obs.tolist(), "action": action,
                        "reward": float(np.float32(reward)), "next_obs": next_obs.tolist(),
                        "terminated": bool(terminated), "truncated": bool(truncated), "env_steps": base + step + 1,
                        "env_index": 2})
        length = max(length, step + 1)
    return sorted(out, key=lambda r: (r["episode"], r["agent_id"], r["step"]))


def test_the_stored_rows_are_those_of_a_plain_reference(store: trajstore.Store,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    """Rows buffered lane by lane and handed over a few at a time (here every 5 rows, and at a flush mid-episode)
    are stored as a plain loop over the calls says: agents that skip steps, end early, act at steps others did not."""
    monkeypatch.setattr("trajstore.write.agents.ROWS_PER_CALL", 5)
    rng = np.random.default_rng(7)
    agents = ["a_0", "a_1", "a_2"]
    calls: list[tuple[int, dict[str, tuple[Any, ...]]] | None] = []
    for _ in range(6):
        ends = {a: int(rng.integers(2, 9)) for a in agents}
        for step in range(9):
            acting = {a for a in agents if step <= ends[a] and rng.random() < 0.8}
            if acting:
                calls.append((step, {a: (rng.normal(size=3).astype(np.float32), int(rng.integers(5)),
                                         float(rng.normal()), rng.normal(size=3).astype(np.float32),
                                         step == ends[a], False) for a in sorted(acting)}))
            for a in acting:
                if step == ends[a]:
                    ends[a] = -1  # ended: acts no more this episode
        calls.append(None)
    with AgentWriter(store, run_id="r", env_id="Trio-v0", agents=agents, env_index=2) as w:
        for i, call in enumerate(calls):
            if call is None:
                w.end_episode()
            else:
                w.add(*call)
            if i == len(calls) // 2:
                w.flush()
    got = store.sql("SELECT episode_id, agent_id, step, obs, action, reward, next_obs, terminated, truncated, "
                    "env_steps, env_index FROM steps ORDER BY episode_id, agent_id, step").to_pylist()
    order = {e: i for i, e in enumerate(sorted({r["episode_id"] for r in got},
                                               key=lambda e: min(r["env_steps"] for r in got if r["episode_id"] == e)))}
    for r in got:
        r["episode"] = order[r.pop("episode_id")]
        r["obs"], r["next_obs"] = np.float32(r["obs"]).tolist(), np.float32(r["next_obs"]).tolist()
    assert sorted(got, key=lambda r: (r["episode"], r["agent_id"], r["step"])) == reference_rows(calls)
    assert trajstore.check(store).ok


def test_rows_of_wide_observations_are_handed_over_by_their_bytes(store: trajstore.Store) -> None:
    """Rows wait for their writer up to ``ROWS_PER_CALL`` rows or about ``BYTES_PER_CALL`` bytes of values, whichever
    comes first: 80 rows of 512 KB (a 256 KB obs and next_obs) are handed over every ~31 rows, not held all."""
    from trajstore.write import agents as module

    obs = np.zeros(65536, np.float32)
    with AgentWriter(store, run_id="r", env_id="Wide-v0", agents=["solo"]) as w:
        for t in range(80):
            w.add(t, {"solo": (obs, 0, 1.0, obs, t == 79, False)})
        kind = w._kinds[0]
        assert kind.limit == module.BYTES_PER_CALL // (64 + 2 * obs.nbytes + 4 * 8)
        assert kind.count == 80 % kind.limit
    assert store.sql("SELECT count(*) AS n, sum(reward) AS r FROM steps").to_pylist() == [{"n": 80, "r": 80.0}]
