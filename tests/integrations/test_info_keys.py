"""``info_keys=[...]``: named scalars of each step's info stored as step columns by every recorder and rollout,
null at the steps whose info lacks them — checked against the infos the env itself returned, step by step."""

from __future__ import annotations

import itertools
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
from gymnasium import spaces
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import trajstore
from trajstore.errors import InputError
from trajstore.integrations import RecordToStore, VectorRecordToStore
from trajstore.rollout import gym_rollout

_ids = itertools.count(1)


class SuccessEnv(gym.Env):
    """Episodes of 2 to 9 steps; every step's info has a ``cost``, the last step's also ``is_success``. The
    observation names the episode and step (``[episode uid, t]``); every info the env returned is kept in
    :attr:`infos` under that name."""

    observation_space = spaces.Box(0, 2**40, (2,), np.int64)
    action_space = spaces.Discrete(2)
    infos: dict[tuple[int, int], dict[str, Any]] = {}

    def reset(self, *, seed: int | None = None, options: Any = None) -> Any:
        super().reset(seed=seed)
        self.uid, self.t = next(_ids), 0
        self.length = int(self.np_random.integers(2, 10))
        return self._obs(), {"cost": -1.0}  # a reset's info: never a step's

    def step(self, action: Any) -> Any:
        obs = self._obs()
        self.t += 1
        ended = self.t >= self.length
        info: dict[str, Any] = {"cost": float(self.np_random.random())}
        if ended:
            info["is_success"] = bool(self.np_random.random() < 0.5)
        SuccessEnv.infos[(int(obs[0]), int(obs[1]))] = info
        return self._obs(), 1.0, ended and self.length % 2 == 0, ended and self.length % 2 == 1, info

    def _obs(self) -> np.ndarray:
        return np.array([self.uid, self.t], np.int64)


def assert_stored_as_reported(store: trajstore.Store, run_id: str) -> int:
    """Every stored step's ``cost`` and ``is_success`` are those of the info the env returned at that step
    (``is_success`` null where it gave none); returns the number of steps."""
    rows = store.sql(f"SELECT obs, cost, is_success FROM steps WHERE run_id = '{run_id}'").to_pylist()
    assert rows
    for row in rows:
        info = SuccessEnv.infos[tuple(row["obs"])]
        assert row["cost"] == info["cost"]
        assert row["is_success"] == info.get("is_success")
    return len(rows)


def test_one_env_stores_its_info_keys_null_where_the_info_lacks_them(store: trajstore.Store) -> None:
    with RecordToStore(SuccessEnv(), store, run_id="one", env_id="Success-v0", chunk=3,
                       info_keys=["cost", "is_success"]) as env:
        env.reset(seed=0)
        for _ in range(60):
            if any(env.step(0)[2:4]):
                env.reset()
    assert assert_stored_as_reported(store, "one") == 60
    success = store.sql("SELECT last(is_success ORDER BY step) AS s, bool_or(terminated OR truncated) AS ended "
                        "FROM steps GROUP BY episode_id").to_pylist()
    assert all((r["s"] is not None) == r["ended"] for r in success)


@pytest.mark.parametrize("mode", ["next-step", "same-step"])
def test_a_vector_env_stores_each_envs_own_info_and_the_last_steps_info_in_same_step(
        store: trajstore.Store, mode: str) -> None:
    modes = {"next-step": AutoresetMode.NEXT_STEP, "same-step": AutoresetMode.SAME_STEP}
    venv = SyncVectorEnv([SuccessEnv for _ in range(3)], autoreset_mode=modes[mode])
    with VectorRecordToStore(venv, store, run_id=mode, env_id="Success-v0", chunk=4,
                             info_keys=["cost", "is_success"]) as env:
        env.reset(seed=1)
        for _ in range(50):
            env.step(env.action_space.sample())
    n = assert_stored_as_reported(store, mode)
    assert n >= 100
    ended = store.sql(f"SELECT count(*) AS n FROM steps WHERE run_id = '{mode}' AND is_success IS NOT NULL")
    assert ended["n"][0].as_py() >= 10


@pytest.mark.parametrize("mode", ["next-step", "same-step"])
def test_gym_rollout_stores_info_keys(store: trajstore.Store, mode: str) -> None:
    gym.register("trajstore-test/Success-v0", entry_point=SuccessEnv)
    try:
        gym_rollout(store, "trajstore-test/Success-v0", run_id=mode, num_envs=3, steps=120, autoreset=mode,
                    chunk=7, info_keys=["cost", "is_success"], progress=False)
    finally:
        gym.registry.pop("trajstore-test/Success-v0")
    assert assert_stored_as_reported(store, mode) >= 120
    rate = store.sql(f"SELECT avg(s::DOUBLE) AS rate FROM (SELECT last(is_success ORDER BY step) AS s FROM steps "
                     f"WHERE run_id = '{mode}' GROUP BY episode_id HAVING bool_or(terminated OR truncated))")
    assert 0.1 < rate["rate"][0].as_py() < 0.9


def test_a_key_no_step_reported_reads_as_null_and_clashes_are_refused(store: trajstore.Store) -> None:
    with RecordToStore(SuccessEnv(), store, run_id="r", env_id="Success-v0", info_keys=["never"]) as env:
        env.reset(seed=0)
        for _ in range(5):
            env.step(0)
    assert store.sql("SELECT count(*) AS n FROM steps").to_pylist() == [{"n": 5}]
    with pytest.raises(InputError, match="info_keys: 'episode_id' is a step column of its own"):
        gym_rollout(store, "CartPole-v1", run_id="x", steps=10, info_keys=["episode_id"], progress=False)
    with pytest.raises(InputError, match="'seed' is also given as a lineage value"):
        gym_rollout(store, "CartPole-v1", run_id="x", steps=10, info_keys=["seed"], progress=False)
    assert store.sql("SELECT count(*) AS n FROM steps").to_pylist() == [{"n": 5}]  # nothing of them stored


class ArrayInfoEnv(SuccessEnv):
    """A ``cost`` of two values, only at an episode's last step."""

    def step(self, action: Any) -> Any:
        obs, reward, terminated, truncated, info = super().step(action)
        return obs, reward, terminated, truncated, ({"cost": np.ones(2)} if terminated or truncated else {})


def test_an_array_info_value_some_steps_lack_is_refused_by_name(store: trajstore.Store) -> None:
    env = RecordToStore(ArrayInfoEnv(), store, run_id="r", env_id="Success-v0", info_keys=["cost"], chunk=100)
    env.reset(seed=0)
    for _ in range(20):
        if any(env.step(0)[2:4]):
            env.reset()
    with pytest.raises(InputError, match="info_keys: 'cost' holds arrays of shape \\(2,\\)"):
        env.close()


def walk_env() -> Any:
    """A JAX walk: the state is the position, +1 or -1 a step; ``info["pos"]`` the new position and
    ``info["is_success"]`` whether it reached +3 (the episode's end; -3 ends it too)."""
    import jax.numpy as jnp

    from trajstore.rollout.envs import FunctionalAdapter

    def step(state: Any, action: Any, key: Any) -> Any:
        pos = state + 2 * action - 1
        return pos, jnp.array([pos], jnp.float32), -1.0, jnp.abs(pos) >= 3, {"pos": pos, "is_success": pos >= 3}

    return FunctionalAdapter(lambda key: (jnp.int32(0), jnp.zeros(1, jnp.float32)), step,
                             spaces.Box(-9, 9, (1,), np.float32), spaces.Discrete(2), 20, "walk")


@pytest.mark.parametrize("mode", ["train", "eval"])
def test_jax_rollouts_store_info_keys(store: trajstore.Store, mode: str) -> None:
    from trajstore.rollout import jax_rollout

    jax_rollout(store, walk_env(), run_id=mode, mode=mode, num_envs=8, rollout_length=16, episodes=20,
                info_keys=["pos", "is_success"], progress=False)
    rows = store.sql(f"SELECT next_obs, pos, is_success, terminated FROM steps WHERE run_id = '{mode}'").to_pylist()
    assert rows and all(r["pos"] == r["next_obs"][0] for r in rows)  # the info of that very step
    assert all(r["is_success"] == (r["pos"] >= 3) for r in rows)
    assert {r["is_success"] for r in rows if r["terminated"]} == {True, False}
    with pytest.raises(InputError, match="info_keys: the env's step info has no 'nope'"):
        jax_rollout(store, walk_env(), run_id="x", num_envs=8, rollout_length=16, episodes=1, info_keys=["nope"],
                    progress=False)


@pytest.mark.parametrize(("keys", "message"), [
    ([""], r"info_keys: expected a list of info keys \(strings\)"),
    (["Reward"], r"info_keys: 'Reward' cannot be a column name: it differs only in case from 'reward'"),
    (["a b"], r"info_keys: 'a b' cannot be a column name: it holds ' '"),
    (["lives", "Lives"], r"info_keys: 'Lives' and 'lives' \(given beside it\) differ only in case"),
    (["Mode"], r"info_keys: 'Mode' cannot be a column name: it differs only in case from the step column 'mode'"),
])
def test_info_keys_no_engine_holds_are_refused_before_a_step(store: trajstore.Store, keys: list[str],
                                                            message: str) -> None:
    """The names every write path refuses (issue 47), by recorders and rollouts alike, before anything is stored."""
    with pytest.raises(InputError, match=message):
        RecordToStore(SuccessEnv(), store, run_id="r", env_id="Success-v0", info_keys=keys)
    with pytest.raises(InputError, match=message):
        gym_rollout(store, "CartPole-v1", run_id="x", steps=10, info_keys=keys, progress=False)
    with pytest.raises(InputError, match=r"info_keys: 'ALGO' and 'algo' \(a column already there\)"):
        gym_rollout(store, "CartPole-v1", run_id="x", steps=10, info_keys=["ALGO"], algo="ppo", progress=False)
    assert store.maintain.files() == []
