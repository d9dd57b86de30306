"""The gymnasium rollout worker: parity with RecordEpisodeStatistics in both autoreset modes, true final
observations, policies, Dict observations and stop rules."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, VectorWrapper

import trajstore
from tests.helpers import stored_episodes
from trajstore.rollout import gym_rollout, sample_until

MODES = {"next-step": AutoresetMode.NEXT_STEP, "same-step": AutoresetMode.SAME_STEP}


class EpisodeLog(VectorWrapper):
    """Keeps every episode that ``RecordEpisodeStatistics`` reports, per env index, in order."""

    def __init__(self, env: Any) -> None:
        super().__init__(env)
        self.episodes: dict[int, list[tuple[float, int]]] = {i: [] for i in range(env.num_envs)}

    def step(self, actions: Any) -> Any:
        obs, reward, terminated, truncated, info = self.env.step(actions)
        if "episode" in info:
            for i in np.flatnonzero(info["_episode"]):
                self.episodes[int(i)].append((float(info["episode"]["r"][i]), int(info["episode"]["l"][i])))
        return obs, reward, terminated, truncated, info


def recorded_env(env_id: str, num_envs: int, mode: str, **kwargs: Any) -> EpisodeLog:
    venv = gym.make_vec(env_id, num_envs=num_envs, vectorization_mode="sync",
                        vector_kwargs={"autoreset_mode": MODES[mode]}, **kwargs)
    return EpisodeLog(gym.wrappers.vector.RecordEpisodeStatistics(venv))


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("env_id", ["CartPole-v1", "Pendulum-v1"])
def test_episodes_match_record_episode_statistics(store: trajstore.Store, mode: str, env_id: str) -> None:
    venv = recorded_env(env_id, 4, mode, max_episode_steps=37 if env_id == "Pendulum-v1" else None)
    result = gym_rollout(store, venv, run_id=mode, episodes=60, seed=3, progress=False)
    reported = {i: eps for i, eps in venv.episodes.items() if eps}
    stored = stored_episodes(store, mode)

    assert sum(map(len, stored.values())) == sum(map(len, reported.values())) == result.episodes >= 60
    assert stored.keys() == reported.keys()
    for i in reported:
        np.testing.assert_allclose([r for r, _ in stored[i]], [r for r, _ in reported[i]], rtol=1e-5)
        assert [n for _, n in stored[i]] == [n for _, n in reported[i]]
    stats = store.stats(run_id=mode).to_pylist()[0]
    all_reported = [e for eps in reported.values() for e in eps]
    assert stats["n_traj"] == len(all_reported)
    assert stats["return_mean"] == pytest.approx(np.mean([r for r, _ in all_reported]), rel=1e-5)
    assert stats["len_std"] == pytest.approx(np.std([n for _, n in all_reported]))


@pytest.mark.parametrize("mode", ["next-step", "same-step", "disabled"])
def test_next_obs_is_the_true_final_observation(store: trajstore.Store, mode: str) -> None:
    gym_rollout(store, "CartPole-v1", run_id="r", num_envs=3, episodes=20, seed=1, autoreset=mode,
                progress=False)
    steps = store.sql("SELECT episode_id, step, obs, next_obs, terminated, truncated FROM steps "
                      "ORDER BY episode_id, step").to_pydict()
    obs, next_obs = np.array(steps["obs"]), np.array(steps["next_obs"])
    ids, term = np.array(steps["episode_id"]), np.array(steps["terminated"])
    same_episode = ids[1:] == ids[:-1]
    # inside an episode, each step starts where the previous one ended
    np.testing.assert_array_equal(next_obs[:-1][same_episode], obs[1:][same_episode])
    # at a terminal step, next_obs is the state that failed (pole angle or cart position out of bounds)
    final = next_obs[term]
    assert len(final) >= 20
    assert np.all((np.abs(final[:, 0]) > 2.4) | (np.abs(final[:, 2]) > 0.2095))
    # and a reset observation is never stored as a terminal next_obs
    assert np.all(np.abs(obs[steps["step"] == np.zeros_like(steps["step"])]) <= 0.05)


def test_policy_callable_and_lineage(store: trajstore.Store) -> None:
    calls = []

    def always_right(obs: np.ndarray) -> np.ndarray:
        calls.append(obs.shape)
        return np.ones(len(obs), np.int64)

    gym_rollout(store, "CartPole-v1", run_id="right", num_envs=2, episodes=4, policy=always_right,
                policy_version=7, seed=11, progress=False)
    assert calls and all(shape == (2, 4) for shape in calls)
    row = store.sql("SELECT min(action) a0, max(action) a1, min(policy_version) pv, "
                    "list(DISTINCT seed ORDER BY seed) seeds, list(DISTINCT env_index ORDER BY env_index) envs "
                    "FROM steps").to_pylist()[0]
    assert row == {"a0": 1, "a1": 1, "pv": 7, "seeds": [11], "envs": [0, 1]}  # the run's seed; env i from 11 + i


def test_steps_limit_counts_stored_steps_and_keeps_running_episodes(store: trajstore.Store) -> None:
    result = gym_rollout(store, "CartPole-v1", run_id="s", num_envs=4, steps=500, seed=0, progress=False)
    n = store.sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py()
    assert n == result.steps and 500 <= n < 504
    eps = store.episodes()
    assert not all(eps.column("complete").to_pylist())  # the episodes cut by the stop are kept, unfinished
    assert store.stats().column("n_traj")[0].as_py() == result.episodes


class DictObsEnv(gym.Env):
    """A tiny env with a Dict observation and a random episode length."""

    observation_space = spaces.Dict({"pos": spaces.Box(-10, 10, (2,), np.float32),
                                     "t": spaces.Box(0, 100, (), np.int64)})
    action_space = spaces.Box(-1, 1, (2,), np.float32)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.pos, self.t = np.zeros(2, np.float32), 0
        self.limit = int(self.np_random.integers(2, 9))
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self.pos = self.pos + np.asarray(action, np.float32)
        self.t += 1
        return self._obs(), float(self.pos.sum()), self.t >= self.limit, False, {}

    def _obs(self) -> dict[str, Any]:
        return {"pos": self.pos.copy(), "t": np.array(self.t, np.int64)}


@pytest.mark.parametrize("mode", list(MODES))
def test_dict_observations_become_struct_columns(store: trajstore.Store, mode: str) -> None:
    venv = gym.vector.SyncVectorEnv([DictObsEnv] * 3, autoreset_mode=MODES[mode])
    gym_rollout(store, venv, run_id="d", env_id="DictObs-v0", episodes=10, seed=0, progress=False)
    rows = store.sql("SELECT step, obs.t AS t, next_obs.t AS next_t, terminated FROM steps").to_pylist()
    assert all(r["t"] == r["step"] and r["next_t"] == r["step"] + 1 for r in rows)
    lengths = store.episodes(complete=True).column("episode_length").to_pylist()
    assert len(lengths) >= 10 and all(2 <= n <= 8 for n in lengths)


def test_sample_until_follows_imitation() -> None:
    both = sample_until(min_timesteps=100, min_episodes=3)
    assert not both(episodes=3, timesteps=99)
    assert not both(episodes=2, timesteps=1000)
    assert both(episodes=3, timesteps=100)
    with pytest.raises(ValueError, match="min_timesteps"):
        sample_until()
    with pytest.raises(ValueError, match="min_episodes must be a positive integer"):
        sample_until(min_episodes=0)


def test_bad_env_is_refused(store: trajstore.Store) -> None:
    with pytest.raises(trajstore.InputError, match="env: gymnasium cannot make 'NoSuchEnv-v0'"):
        gym_rollout(store, "NoSuchEnv-v0", run_id="x", episodes=1, progress=False)
    assert store.maintain.files() == []


def test_a_result_prints_as_a_summary(store: trajstore.Store) -> None:
    result = gym_rollout(store, "CartPole-v1", run_id="r", num_envs=4, episodes=200, seed=0, progress=False)
    text = repr(result)
    assert text.startswith("RolloutResult(run_id='r', env_id='CartPole-v1', steps=") and "return_mean=" in text
    assert len(text) < 200  # not one number per episode


def test_a_vector_env_that_reuses_its_arrays_is_stored_exactly(store: trajstore.Store) -> None:
    from tests.integrations.steplog import StepLog, assert_same, stored

    def make() -> StepLog:
        return StepLog(gym.make("CartPole-v1", max_episode_steps=30))

    venv = gym.vector.SyncVectorEnv([make] * 3, copy=False)  # writes every step into the same arrays
    gym_rollout(store, venv, run_id="nocopy", env_id="CartPole-v1", steps=300, chunk=16, progress=False)
    got = stored(store, "nocopy")
    for i, env in enumerate(venv.envs):
        assert_same(got[i], env.episodes())
