"""The plain reference the recording integrations are checked against: what each env itself was given and gave,
logged step by step by a wrapper right around it, and the same read back from a store. No pytest here: the
gymnasium 1.0 check (gym10_check.py) runs it in a virtualenv of its own."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import gymnasium as gym
import numpy as np

import trajstore


@dataclass
class Episode:
    """One episode's steps as arrays (``obs`` is ``(n, …)``, …) and whether it ended."""

    obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    next_obs: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    @property
    def complete(self) -> bool:
        return bool(self.terminated[-1] or self.truncated[-1])


class StepLog(gym.Wrapper):
    """Logs every step the env takes (the observation the action was taken on, the action, reward, next
    observation, flags); each reset starts a new episode, so one cut by a reset stays apart."""

    def __init__(self, env: gym.Env) -> None:
        super().__init__(env)
        self.steps: list[list[tuple[Any, ...]]] = []
        self._obs: Any = None

    def reset(self, **kwargs: Any) -> Any:
        obs, info = self.env.reset(**kwargs)
        self._obs = np.array(obs, copy=True)
        self.steps.append([])
        return obs, info

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps[-1].append((self._obs, np.array(action, copy=True), reward, np.array(obs, copy=True),
                               terminated, truncated))
        self._obs = np.array(obs, copy=True)
        return obs, reward, terminated, truncated, info

    def episodes(self) -> list[Episode]:
        return [Episode(*(np.array([s[i] for s in steps]) for i in range(6))) for steps in self.steps if steps]


def stored(store: trajstore.Store, run_id: str) -> dict[int, list[Episode]]:
    """The stored episodes of ``run_id`` per env index, in the order they started."""
    names = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
    rows = store.sql(f"SELECT env_index, episode_id, {', '.join(names)} FROM steps WHERE run_id = '{run_id}' "
                     "ORDER BY env_index, episode_id, step").to_pydict()
    env, ids = np.array(rows["env_index"]), np.array(rows["episode_id"])
    starts = np.r_[0, np.flatnonzero((env[1:] != env[:-1]) | (ids[1:] != ids[:-1])) + 1, len(ids)]
    columns = {name: np.array(rows[name]) for name in names}
    out: dict[int, list[Episode]] = {}
    for a, b in zip(starts[:-1], starts[1:]):
        out.setdefault(int(env[a]), []).append(Episode(*(columns[name][a:b] for name in names)))
    return out


def assert_same(got: list[Episode], logged: list[Episode], *, atol: float = 0.0) -> None:
    """Stored episodes equal the logged ones: same count, boundaries, flags, and values (as the store keeps
    them: rewards as float32; ``atol`` for observations that went through a lossy round trip)."""
    assert [len(e.reward) for e in got] == [len(e.reward) for e in logged]
    assert [e.complete for e in got] == [e.complete for e in logged]
    for g, e in zip(got, logged):
        np.testing.assert_array_equal(g.terminated, e.terminated)
        np.testing.assert_array_equal(g.truncated, e.truncated)
        np.testing.assert_array_equal(g.reward, e.reward.astype(np.float32))
        np.testing.assert_array_equal(g.action.reshape(e.action.shape), e.action)
        for name in ("obs", "next_obs"):
            np.testing.assert_allclose(getattr(g, name), getattr(e, name), rtol=0, atol=atol, err_msg=name)
