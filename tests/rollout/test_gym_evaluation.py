"""gym_evaluate: exactly N complete episodes, each env's first ones as a plain loop over that env alone plays them
(so the short ones are not over-represented, as they are among the first N to finish), stored as mode='eval'."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import trajstore
from tests.helpers import stored_episodes
from trajstore.rollout import gym_evaluate, gym_rollout
from trajstore.rollout.gym_evaluation import episode_targets
from trajstore.store import plumbing

LONGEST = 60  # each episode's length is drawn at its reset, uniform in 1..LONGEST


class Dice(gym.Env):
    """Episodes of 1 to LONGEST steps, drawn at reset from the env's own random generator; the action is ignored,
    so a plain loop over one env plays the same episodes whatever the actions."""

    observation_space = spaces.Box(0, LONGEST, (1,), np.float32)
    action_space = spaces.Discrete(2)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t, self.length = 0, int(self.np_random.integers(1, LONGEST + 1))
        self.bonus = float(self.np_random.normal())
        return np.array([0], np.float32), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        return np.array([self.t], np.float32), 1.0 + self.bonus, self.t == self.length, False, {}


MODES = {"next-step": AutoresetMode.NEXT_STEP, "same-step": AutoresetMode.SAME_STEP,
         "disabled": AutoresetMode.DISABLED}


def dice(n: int, mode: str = "next-step") -> SyncVectorEnv:
    return SyncVectorEnv([Dice] * n, autoreset_mode=MODES[mode])


def plain_first_episodes(seed: int, counts: list[int]) -> dict[int, list[tuple[float, int]]]:
    """The reference: env i alone, reset with seed + i, then played episode after episode (reset unseeded, as a
    vector env's autoreset does): its first counts[i] episodes, ``(return, length)``."""
    out: dict[int, list[tuple[float, int]]] = {}
    for i, n in enumerate(counts):
        env, episodes = Dice(), []
        env.reset(seed=seed + i)
        while len(episodes) < n:
            ret, length, done = 0.0, 0, False
            while not done:
                _, reward, terminated, truncated, _ = env.step(0)
                ret, length, done = ret + reward, length + 1, terminated or truncated
            episodes.append((ret, length))
            env.reset()
        if n:
            out[i] = episodes
    return out


@pytest.mark.parametrize("mode", list(MODES))
def test_each_env_stores_its_first_episodes_as_a_plain_loop_plays_them(store: trajstore.Store, mode: str) -> None:
    result = gym_evaluate(store, dice(4, mode), run_id="eval", env_id="Dice-v0", episodes=10, seed=3,
                          progress=False)
    expected = plain_first_episodes(3, [2, 2, 3, 3])  # (10 + i) // 4 for env i
    stored = stored_episodes(store, "eval")
    assert stored.keys() == expected.keys()
    for i in expected:
        np.testing.assert_allclose([r for r, _ in stored[i]], [r for r, _ in expected[i]], rtol=1e-5)
        assert [n for _, n in stored[i]] == [n for _, n in expected[i]]
    assert result.episodes == 10 and sorted(result.episode_lengths) == sorted(n for e in expected.values()
                                                                              for _, n in e)
    episodes = store.episodes(run_id="eval")
    assert episodes.num_rows == 10 and all(episodes["complete"].to_pylist())  # no unfinished fragment stored
    assert result.steps == sum(episodes["episode_length"].to_pylist())


def test_short_episodes_are_not_over_represented(store: trajstore.Store) -> None:
    """64 envs, 64 episodes of 1 to 60 steps (mean 30.5): among the first 64 to finish, short episodes are
    over-represented (an env that drew a short one finishes again while the long ones run); an evaluation stores
    each env's first episode, whatever its length."""
    gym_rollout(store, dice(64), run_id="first-to-finish", env_id="Dice-v0", episodes=64, seed=1, progress=False)
    gym_evaluate(store, dice(64), run_id="eval", env_id="Dice-v0", episodes=64, seed=1, progress=False)
    lengths = {run: store.episodes(run_id=run, complete=True)["episode_length"].to_numpy()
               for run in ("first-to-finish", "eval")}
    reference = [n for eps in plain_first_episodes(1, [1] * 64).values() for _, n in eps]
    assert sorted(lengths["eval"]) == sorted(reference)
    assert abs(lengths["eval"].mean() - (1 + LONGEST) / 2) < 8  # 3.7 standard errors of a mean of 64
    assert lengths["first-to-finish"].mean() < 0.8 * lengths["eval"].mean()
    stats = store.stats(run_id="eval").to_pylist()[0]
    assert stats["n_traj"] == 64 and stats["len_mean"] == pytest.approx(np.mean(reference))


def test_exactly_n_from_an_id_in_train_and_eval_apart(store: trajstore.Store) -> None:
    result = gym_evaluate(store, "CartPole-v1", run_id="ev", episodes=7, num_envs=3, seed=5, progress=False,
                          policy_version=2)
    rows = store.sql("SELECT env_index, count(*) AS n, bool_and(complete) AS complete, list(DISTINCT mode) AS mode, "
                     "list(DISTINCT seed) AS seed, list(DISTINCT policy_version) AS pv FROM episodes "
                     "GROUP BY env_index ORDER BY env_index").to_pylist()
    assert [r["n"] for r in rows] == episode_targets(7, 3).tolist() == [2, 2, 3]
    assert all(r["complete"] and r["mode"] == ["eval"] and r["seed"] == [5] and r["pv"] == [2] for r in rows)
    assert result.episodes == 7 and result.env_id == "CartPole-v1"
    # more envs than episodes: as many envs as episodes are made, one episode each
    gym_evaluate(store, "CartPole-v1", run_id="few", episodes=2, num_envs=8, progress=False)
    assert store.sql("SELECT list(env_index ORDER BY env_index) AS e FROM episodes WHERE run_id = 'few'")[
        "e"][0].as_py() == [0, 1]


def test_gym_rollout_mode_eval_is_an_evaluation(store: trajstore.Store) -> None:
    gym_rollout(store, "CartPole-v1", run_id="e", mode="eval", episodes=5, num_envs=4, seed=1, progress=False)
    gym_evaluate(store, "CartPole-v1", run_id="same", episodes=5, num_envs=4, seed=1, progress=False)
    lengths = {run: store.episodes(run_id=run)["episode_length"].to_pylist() for run in ("e", "same")}
    assert len(lengths["e"]) == 5 and lengths["e"] == lengths["same"]
    with pytest.raises(trajstore.InputError, match="steps= does not apply"):
        gym_rollout(store, "CartPole-v1", run_id="x", mode="eval", episodes=5, steps=10, progress=False)
    with pytest.raises(trajstore.InputError, match="mode='eval': give episodes=N"):
        gym_rollout(store, "CartPole-v1", run_id="x", mode="eval", progress=False)
    with pytest.raises(trajstore.InputError, match="mode must be 'train' or 'eval', got 'test'"):
        gym_rollout(store, "CartPole-v1", run_id="x", mode="test", steps=10, progress=False)  # type: ignore[arg-type]


def test_bad_arguments_are_named(store: trajstore.Store) -> None:
    gym_rollout(store, "CartPole-v1", run_id="train", num_envs=2, steps=20, progress=False)
    with pytest.raises(trajstore.InputError, match="episodes: must be a positive integer, got 0"):
        gym_evaluate(store, "CartPole-v1", run_id="x", episodes=0, progress=False)
    with pytest.raises(trajstore.InputError, match="num_envs: must be a positive integer"):
        gym_evaluate(store, "CartPole-v1", run_id="x", episodes=3, num_envs=0, progress=False)
    with pytest.raises(trajstore.InputError, match="run 'train' already holds training"):
        gym_evaluate(store, "CartPole-v1", run_id="train", episodes=3, append=True, progress=False)
    assert plumbing(store).run_ids() == ["train"]
