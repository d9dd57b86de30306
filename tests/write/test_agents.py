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
