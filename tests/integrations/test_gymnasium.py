"""Recording where users step their envs: RecordToStore (one env) and VectorRecordToStore (a vector env, every
autoreset mode) store exactly the steps the env took — checked against a log kept right around each env — and
the episodes gymnasium's RecordEpisodeStatistics reports around them; resets by hand leave unfinished episodes."""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import trajstore
from tests.integrations.steplog import StepLog, assert_same, stored
from trajstore.errors import InputError
from trajstore.integrations import RecordToStore, VectorRecordToStore

LIMITS = {"CartPole-v1": 60, "Pendulum-v1": 37}  # short time limits: truncated and terminated ends both occur
MODES = {"next-step": AutoresetMode.NEXT_STEP, "same-step": AutoresetMode.SAME_STEP,
         "disabled": AutoresetMode.DISABLED}


def logged_env(env_id: str) -> StepLog:
    return StepLog(gym.make(env_id, max_episode_steps=LIMITS[env_id]))


def reported(info: dict[str, Any], num_envs: int) -> list[tuple[int, float, int]]:
    """The (env, return, length) of every episode a vector RecordEpisodeStatistics reported in ``info``."""
    if "episode" not in info:
        return []
    return [(int(i), float(info["episode"]["r"][i]), int(info["episode"]["l"][i]))
            for i in np.flatnonzero(info["_episode"])]


def complete_episodes(store: trajstore.Store, run_id: str) -> dict[int, list[tuple[float, int]]]:
    return {env: [(float(e.reward.sum()), len(e.reward)) for e in eps if e.complete]
            for env, eps in stored(store, run_id).items()}


@pytest.mark.parametrize("env_id", list(LIMITS))
def test_one_env_stores_the_steps_it_took_and_the_episodes_record_episode_statistics_reports(
        store: trajstore.Store, env_id: str) -> None:
    log = logged_env(env_id)
    env = gym.wrappers.RecordEpisodeStatistics(RecordToStore(log, store, run_id="one", chunk=32))
    rng = np.random.default_rng(0)
    env.action_space.seed(0)
    env.reset(seed=0)
    episodes, cuts = [], 0
    for _ in range(1500):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        if terminated or truncated:
            episodes.append((info["episode"]["r"], info["episode"]["l"]))
            env.reset()
        elif rng.random() < 0.01:  # a reset by hand, mid-episode
            cuts += 1
            env.reset()
    env.close()

    got = stored(store, "one")[0]
    assert_same(got, log.episodes())
    ends = complete_episodes(store, "one")[0]
    assert [n for _, n in ends] == [n for _, n in episodes] and len(episodes) >= 10
    np.testing.assert_allclose([r for r, _ in ends], [r for r, _ in episodes], rtol=1e-5)
    unfinished = store.episodes(run_id="one", complete=False)
    # every cut, and the episode running at the end if any
    assert unfinished.num_rows == sum(not e.complete for e in log.episodes()) >= cuts >= 2
    assert store.stats(run_id="one")["n_traj"][0].as_py() == len(episodes)


def run_vector(venv: Any, store: trajstore.Store, run_id: str, *, steps: int, seed: int = 0,
               resets: bool = True) -> list[tuple[int, float, int]]:
    """Steps ``RecordEpisodeStatistics(VectorRecordToStore(venv))`` with random actions, with a reset of every
    env and one of some envs by hand along the way; returns the episodes RecordEpisodeStatistics reported."""
    env = gym.wrappers.vector.RecordEpisodeStatistics(VectorRecordToStore(venv, store, run_id=run_id, chunk=16))
    disabled = env.metadata["autoreset_mode"] == AutoresetMode.DISABLED
    env.action_space.seed(seed)
    env.reset(seed=seed)
    out = []
    for t in range(steps):
        _, _, terminated, truncated, info = env.step(env.action_space.sample())
        out += reported(info, env.num_envs)
        done = terminated | truncated
        if disabled and done.any():
            env.reset(options={"reset_mask": done})
        if resets and t == steps // 3:
            env.reset()
        if resets and t == 2 * steps // 3:
            env.reset(options={"reset_mask": np.arange(env.num_envs) % 2 == 0})
    env.close()
    return out


@pytest.mark.parametrize("mode", list(MODES))
@pytest.mark.parametrize("env_id", list(LIMITS))
def test_vector_env_stores_the_steps_it_took_and_the_episodes_record_episode_statistics_reports(
        store: trajstore.Store, env_id: str, mode: str) -> None:
    venv = SyncVectorEnv([lambda: logged_env(env_id) for _ in range(3)], autoreset_mode=MODES[mode])
    episodes = run_vector(venv, store, mode, steps=400)

    per_env = stored(store, mode)
    for i, sub in enumerate(venv.envs):
        assert_same(per_env[i], sub.episodes())
    ends = complete_episodes(store, mode)
    assert sum(map(len, ends.values())) == len(episodes) >= 15
    for i in ends:
        mine = [(r, n) for env, r, n in episodes if env == i]
        assert [n for _, n in ends[i]] == [n for _, n in mine]
        np.testing.assert_allclose([r for r, _ in ends[i]], [r for r, _ in mine], rtol=1e-5)
    # the envs cut by the two resets by hand: stored unfinished, never merged into the next episode
    assert store.episodes(run_id=mode, complete=False).num_rows >= 3 + 2


def test_a_last_step_keeps_the_true_final_observation(store: trajstore.Store) -> None:
    for mode in ("next-step", "same-step"):
        venv = gym.make_vec("CartPole-v1", num_envs=4, vectorization_mode="sync",
                            vector_kwargs={"autoreset_mode": MODES[mode]})
        run_vector(venv, store, mode, steps=300, resets=False)
        steps = store.sql(f"SELECT next_obs FROM steps WHERE run_id = '{mode}' AND terminated").to_pydict()
        final = np.array(steps["next_obs"])
        assert len(final) >= 10  # the state that failed: pole angle or cart position out of bounds
        assert np.all((np.abs(final[:, 0]) > 2.4) | (np.abs(final[:, 2]) > 0.2095))


class DictEnv(gym.Env):
    """Dict observations (a position and a velocity), episodes of 3 to 7 steps."""

    observation_space = spaces.Dict({"pos": spaces.Box(-10, 10, (2,), np.float32),
                                     "vel": spaces.Box(-1, 1, (1,), np.float32)})
    action_space = spaces.Discrete(3)

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.t, self.pos = 0, self.np_random.normal(size=2).astype(np.float32)
        return self._obs(), {}

    def step(self, action: Any) -> Any:
        self.t += 1
        self.pos = self.pos + np.float32(action - 1)
        return self._obs(), 1.0, self.t >= 3 and self.np_random.random() < 0.3, self.t >= 7, {"t": self.t}

    def _obs(self) -> dict[str, np.ndarray]:
        return {"pos": self.pos.copy(), "vel": np.full(1, self.t / 10, np.float32)}


def test_dict_observations_and_info_keys(store: trajstore.Store) -> None:
    venv = SyncVectorEnv([DictEnv for _ in range(2)], autoreset_mode=AutoresetMode.SAME_STEP)
    with VectorRecordToStore(venv, store, run_id="dict", env_id="Dict-v0", info_keys=["t"], chunk=5) as env:
        env.reset(seed=1)
        for _ in range(40):
            env.step(env.action_space.sample())
    rows = store.sql("SELECT step, next_obs, terminated, truncated, t FROM steps WHERE run_id = 'dict' "
                     "ORDER BY env_index, episode_id, step").to_pylist()
    assert len(rows) == 80
    assert all(r["t"] == r["step"] + 1 for r in rows)  # the env's own step counter, from its info
    last = [r for r in rows if r["terminated"] or r["truncated"]]
    assert last and all(r["next_obs"]["vel"] == pytest.approx([r["t"] / 10]) for r in last)  # true final obs


def test_flush_makes_the_steps_visible_and_close_is_idempotent(store: trajstore.Store) -> None:
    env = RecordToStore(gym.make("CartPole-v1"), store, run_id="live", chunk=1000, policy_version=7)
    env.reset(seed=0)
    for _ in range(10):
        if any(env.step(0)[2:4]):
            env.reset()
    env.flush()
    assert store.sql("SELECT count(*) AS n, min(policy_version) AS v FROM steps").to_pylist() == [{"n": 10, "v": 7}]
    env.step(1)
    env.close()
    env.close()
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 11


def test_frame_stacks_are_stored_as_stepped(store: trajstore.Store) -> None:
    log = StepLog(gym.wrappers.FrameStackObservation(gym.make("CartPole-v1", max_episode_steps=20), 4))
    with RecordToStore(log, store, run_id="stack", chunk=7) as env:
        env.reset(seed=2)
        for _ in range(90):
            if any(env.step(env.action_space.sample())[2:4]):
                env.reset()
    assert_same(stored(store, "stack")[0], log.episodes())


def test_mistakes_are_named(store: trajstore.Store) -> None:
    env = RecordToStore(gym.make("CartPole-v1"), store, run_id="bad")
    with pytest.raises(InputError, match="step: call reset"):
        env.step(0)
    with pytest.raises(InputError, match="info_keys: 'reward' is a step column of its own"):
        RecordToStore(gym.make("CartPole-v1"), store, run_id="bad", info_keys=["reward"])
    with pytest.raises(InputError, match="info_keys: expected a list of info keys"):
        RecordToStore(gym.make("CartPole-v1"), store, run_id="bad", info_keys="is_success")
    with pytest.raises(InputError, match="env_id: this env has no spec id"):
        RecordToStore(DictEnv(), store, run_id="bad")
    with pytest.raises(InputError, match="chunk"):
        VectorRecordToStore(gym.make_vec("CartPole-v1", 2), store, run_id="bad", chunk=0)


def test_a_frame_stack_is_declared_where_the_writer_takes_it() -> None:
    import inspect

    from trajstore.integrations.gymnasium import frame_stack_option
    from trajstore.write.writer import Writer

    takes = "frame_stack" in inspect.signature(Writer.__init__).parameters  # the storage format's option
    stacked = gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 4)
    outside = gym.wrappers.RecordEpisodeStatistics(stacked)  # leaves the observations as they are
    assert frame_stack_option(outside, outside.observation_space) == ({"frame_stack": {"obs": 4}} if takes else {})
    flat = gym.wrappers.FlattenObservation(stacked)  # changes them: no stack of 4 frames along the first axis
    assert frame_stack_option(flat, flat.observation_space) == {}
    assert frame_stack_option(gym.make("CartPole-v1"), stacked.observation_space) == {}
