"""Recording Stable-Baselines3 training with StoreCallback: the stored steps are exactly those each env took
(a log right around it), the stored episodes exactly those SB3's Monitor records, for PPO (on-policy), DQN and
SAC (off-policy), under VecNormalize, and across several learn() calls. Skipped without the [sb3] extra."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

sb3 = pytest.importorskip("stable_baselines3")

from stable_baselines3.common.env_util import make_vec_env  # noqa: E402
from stable_baselines3.common.monitor import Monitor  # noqa: E402
from stable_baselines3.common.vec_env import VecNormalize  # noqa: E402

import trajstore  # noqa: E402
from tests.integrations.steplog import StepLog, assert_same, stored  # noqa: E402
from trajstore.errors import InputError  # noqa: E402
from trajstore.integrations.sb3 import RawFinals, StoreCallback  # noqa: E402


def small() -> dict[str, Any]:
    """Small networks (a new dict each time: SB3 adds its own keys to the one it is given)."""
    return {"net_arch": [32, 32]}


def logged_vec_env(env_id: str, n_envs: int, max_episode_steps: int) -> Any:
    """SB3's VecEnv (each env in a Monitor) with a StepLog around each Monitor."""
    return make_vec_env(env_id, n_envs=n_envs, seed=0, wrapper_class=StepLog,
                        env_kwargs={"max_episode_steps": max_episode_steps})


def logs(venv: Any) -> list[StepLog]:
    return list(getattr(venv, "venv", venv).envs)


def monitor(env: Any) -> Monitor:
    while not isinstance(env, Monitor):
        env = env.env
    return env


def assert_matches_monitor_and_log(store: trajstore.Store, run_id: str, venv: Any, *, atol: float = 0.0) -> int:
    """Stored episodes per env equal the StepLog's steps and the Monitor's episodes; returns how many."""
    per_env = stored(store, run_id)
    complete = 0
    for i, log in enumerate(logs(venv)):
        assert_same(per_env[i], log.episodes(), atol=atol)
        ends = [e for e in per_env[i] if e.complete]
        assert [len(e.reward) for e in ends] == monitor(log).get_episode_lengths()
        np.testing.assert_allclose([e.reward.sum() for e in ends], monitor(log).get_episode_rewards(), rtol=1e-5)
        complete += len(ends)
    return complete


@pytest.mark.slow
def test_ppo_across_learn_calls(store: trajstore.Store) -> None:
    venv = logged_vec_env("CartPole-v1", 2, 40)
    model = sb3.PPO("MlpPolicy", venv, n_steps=32, batch_size=32, n_epochs=1, seed=0, policy_kwargs=small())
    with StoreCallback(store, run_id="ppo", policy_version=1) as callback:
        model.learn(320, callback=callback)
        assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 320  # committed by learn's end
        model.learn(192, callback=callback, reset_num_timesteps=False)  # episodes run on
        model.learn(192, callback=callback)                              # the env is reset: episodes cut
    assert assert_matches_monitor_and_log(store, "ppo", venv) >= 10
    assert store.episodes(run_id="ppo", complete=False).num_rows >= 2  # cut by the reset, and at the end
    assert store.sql("SELECT DISTINCT policy_version FROM steps").to_pylist() == [{"policy_version": 1}]


@pytest.mark.slow
@pytest.mark.parametrize("clip_obs", [2.0, 10.0])  # 10.0: VecNormalize's default
def test_ppo_under_vec_normalize_stores_the_envs_own_values_bit_for_bit(store: trajstore.Store,
                                                                         clip_obs: float) -> None:
    venv = VecNormalize(logged_vec_env("CartPole-v1", 2, 30), norm_obs=True, norm_reward=True, clip_obs=clip_obs)
    inner = venv.venv
    model = sb3.PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=0, policy_kwargs=small())
    with StoreCallback(store, run_id="norm") as callback:
        model.learn(384, callback=callback)
        assert isinstance(venv.venv, RawFinals) and venv.venv.venv is inner  # the envs' own final observations
        model.learn(128, callback=callback, reset_num_timesteps=False)
    assert venv.venv is inner  # closed: the VecNormalize as it was
    # every step exactly as the env gave it, final observations included (atol=0), whatever the clipping
    assert assert_matches_monitor_and_log(store, "norm", venv) >= 10
    if clip_obs == 2.0:  # the clipping mattered: a final observation beyond what the normalized copy keeps
        finals = [e.next_obs[-1] for log in logs(venv) for e in log.episodes() if e.complete]
        assert max(float(np.abs(venv.normalize_obs(f)).max()) for f in finals) >= clip_obs


def test_sac_under_vec_normalize_stores_the_envs_own_values_bit_for_bit(store: trajstore.Store) -> None:
    venv = VecNormalize(logged_vec_env("Pendulum-v1", 2, 25), norm_obs=True, norm_reward=True, clip_obs=1.0)
    model = sb3.SAC("MlpPolicy", venv, learning_starts=50, batch_size=32, seed=0, policy_kwargs=small())
    with StoreCallback(store, run_id="sac-norm") as callback:
        model.learn(150, callback=callback)
    assert assert_matches_monitor_and_log(store, "sac-norm", venv) == 6  # time-limit ends, final obs exact


def test_dqn(store: trajstore.Store) -> None:
    venv = logged_vec_env("CartPole-v1", 2, 40)
    model = sb3.DQN("MlpPolicy", venv, learning_starts=100, train_freq=4, seed=0, policy_kwargs=small())
    callback = StoreCallback(store, run_id="dqn")
    model.learn(600, callback=callback)
    callback.close()
    assert assert_matches_monitor_and_log(store, "dqn", venv) >= 10


@pytest.mark.slow
def test_sac_stores_the_action_the_env_received(store: trajstore.Store) -> None:
    venv = logged_vec_env("Pendulum-v1", 1, 25)
    model = sb3.SAC("MlpPolicy", venv, learning_starts=50, batch_size=32, seed=0, policy_kwargs=small())
    with StoreCallback(store, run_id="sac") as callback:
        model.learn(150, callback=callback)
    assert assert_matches_monitor_and_log(store, "sac", venv) == 6  # time-limit ends: truncated, not terminated
    assert store.sql("SELECT sum(truncated::INT) AS t, sum(terminated::INT) AS d FROM steps").to_pylist() == \
        [{"t": 6, "d": 0}]


def test_a_training_env_without_a_spec_id_needs_env_id(store: trajstore.Store) -> None:
    from stable_baselines3.common.vec_env import DummyVecEnv

    from tests.integrations.test_gymnasium import DictEnv

    venv = DummyVecEnv([lambda: Monitor(DictEnv())])
    model = sb3.PPO("MultiInputPolicy", venv, n_steps=16, batch_size=16, n_epochs=1, policy_kwargs=small())
    with pytest.raises(InputError, match="env_id: the training env has no spec id"):
        model.learn(16, callback=StoreCallback(store, run_id="dict"))
    with StoreCallback(store, run_id="dict", env_id="Dict-v0", info_keys=["t"]) as callback:
        model.learn(48, callback=callback)
    rows = store.sql("SELECT step, t, next_obs FROM steps ORDER BY episode_id, step").to_pylist()
    assert len(rows) == 48 and all(r["t"] == r["step"] + 1 for r in rows)


def test_frame_stacked_envs_store_each_frame_once_and_read_back_exactly(store: trajstore.Store) -> None:
    import gymnasium as gym
    import pyarrow.parquet as pq

    from trajstore.storage.encoding import FileEncoding

    venv = make_vec_env("CartPole-v1", n_envs=2, seed=0, env_kwargs={"max_episode_steps": 30},
                        wrapper_class=lambda env: StepLog(gym.wrappers.FrameStackObservation(env, 4)))
    model = sb3.PPO("MlpPolicy", venv, n_steps=64, batch_size=64, n_epochs=1, seed=0, policy_kwargs=small())
    with StoreCallback(store, run_id="stacked") as callback:
        model.learn(256, callback=callback)
    assert [FileEncoding.of(pq.ParquetFile(f.path).schema_arrow.metadata).stacks for f in store.maintain.files()] \
        == [{"obs": 4}] * len(store.maintain.files())
    assert assert_matches_monitor_and_log(store, "stacked", venv) > 0


def test_info_keys_are_stored_null_where_an_envs_info_lacks_them(store: trajstore.Store) -> None:
    from stable_baselines3.common.vec_env import DummyVecEnv

    from tests.integrations.test_info_keys import SuccessEnv, assert_stored_as_reported

    venv = DummyVecEnv([lambda: Monitor(SuccessEnv()) for _ in range(2)])
    model = sb3.PPO("MlpPolicy", venv, n_steps=32, batch_size=32, n_epochs=1, seed=0, policy_kwargs=small())
    with StoreCallback(store, run_id="info", env_id="Success-v0", info_keys=["cost", "is_success"],
                       config={"algo": "ppo", "n_steps": 32}, tags=["sb3"], notes="info keys") as callback:
        model.learn(64, callback=callback)
    assert assert_stored_as_reported(store, "info") == 64
    info = store.run_info("info")
    assert (info["config"], info["tags"], info["notes"]) == ({"algo": "ppo", "n_steps": 32}, ["sb3"], "info keys")
    assert store.sql("SELECT count(is_success) AS n FROM steps")["n"][0].as_py() >= 5
