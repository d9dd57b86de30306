"""Run by tests/integrations/test_min_versions.py inside the virtualenv of the declared minimum versions
(`make min-venv`: gymnasium 1.0.0, whose vector envs autoreset next-step only and which has no AutoresetMode):
a gym_rollout, both recording wrappers and a few reads, each checked against gymnasium's own
RecordEpisodeStatistics and a log around each env. Prints the installed versions of the core dependencies and the
gym extra's as one JSON line at the end.

    python -m tests.integrations.min_versions_check STORE_DIR
"""

from __future__ import annotations

import json
import re
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import gymnasium as gym
import numpy as np

import trajstore
from tests.integrations.steplog import StepLog, assert_same, stored
from trajstore.errors import InputError
from trajstore.integrations import RecordToStore, VectorRecordToStore
from trajstore.rollout import gym_rollout


def core() -> list[str]:
    """The core dependencies pyproject.toml declares and the gym extra's, by name."""
    project = tomllib.loads(Path("pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["gym"]
    return [re.match(r"[\w-]+", d).group(0) for d in deps]  # type: ignore[union-attr]


def reported_episodes(env: gym.Env, steps: int, *, reset_at: int) -> list[tuple[int, float, int]]:
    """Random steps through a vector RecordEpisodeStatistics; (env, return, length) of each episode it reports."""
    env.action_space.seed(0)
    env.reset(seed=0)
    out = []
    for t in range(steps):
        info = env.step(env.action_space.sample())[4]
        if "episode" in info:
            out += [(int(i), float(info["episode"]["r"][i]), int(info["episode"]["l"][i]))
                    for i in np.flatnonzero(info["_episode"])]
        if t == reset_at:
            env.reset()
    env.close()
    return out


def check_complete(store: trajstore.Store, run_id: str, episodes: list[tuple[int, float, int]]) -> None:
    per_env = stored(store, run_id)
    ends = [(i, float(e.reward.sum()), len(e.reward)) for i, eps in per_env.items() for e in eps if e.complete]
    assert sorted(ends) == sorted(episodes), (run_id, len(ends), len(episodes))


def main(root: str) -> None:
    store = trajstore.open(root, create=True)
    # gym_rollout: the default (next-step) mode works; the others say which gymnasium they need
    venv = gym.wrappers.vector.RecordEpisodeStatistics(gym.make_vec("CartPole-v1", 3, vectorization_mode="sync"))
    result = gym_rollout(store, venv, run_id="rollout", episodes=20, seed=0, progress=False)
    ends = store.sql("SELECT episode_return AS r, episode_length AS n FROM episodes WHERE run_id = 'rollout' "
                     "AND complete").to_pydict()
    assert 20 <= len(ends["n"]) == result.episodes < venv.return_queue.maxlen
    assert sorted(zip(ends["r"], ends["n"])) == sorted(zip(venv.return_queue, venv.length_queue))
    try:
        gym_rollout(store, "CartPole-v1", run_id="x", episodes=1, autoreset="same-step", progress=False)
        raise AssertionError("same-step was accepted on gymnasium 1.0")
    except InputError as exc:
        assert "needs gymnasium >= 1.1" in str(exc), exc

    # VectorRecordToStore on a 1.0 vector env (next-step, no autoreset_mode in its metadata)
    logged = gym.vector.SyncVectorEnv([lambda: StepLog(gym.make("CartPole-v1")) for _ in range(3)])
    env = gym.wrappers.vector.RecordEpisodeStatistics(VectorRecordToStore(logged, store, run_id="vector", chunk=16))
    episodes = reported_episodes(env, 400, reset_at=150)
    for i, sub in enumerate(logged.envs):
        assert_same(stored(store, "vector")[i], sub.episodes())
    check_complete(store, "vector", episodes)

    # RecordToStore around one env (Box actions: a store of their own)
    store = trajstore.open(f"{root}-pendulum", create=True)
    log = StepLog(gym.make("Pendulum-v1", max_episode_steps=30))
    with RecordToStore(log, store, run_id="one") as one:
        one.reset(seed=0)
        for _ in range(200):
            if any(one.step(one.action_space.sample())[2:4]):
                one.reset()
    assert_same(stored(store, "one")[0], log.episodes())

    # reads over what was written
    windows = next(store.sequences(8, columns=["obs", "reward"], pad=True, batch_size=4, run_id="one"))
    assert windows["obs"].shape == (4, 8, 3) and windows["obs"].dtype == np.float32
    assert trajstore.check(store).ok
    print(json.dumps({name: version(name) for name in core()}))


if __name__ == "__main__":
    main(sys.argv[1])
