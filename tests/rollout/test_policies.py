"""Policies named by a string (``trajstore rollout --policy``): a function of a module, called with the vector
env's observations, and a real Stable-Baselines3 checkpoint, whose stored actions are what the model predicts on
the stored observations; every bad spec is one error naming ``policy``."""

from __future__ import annotations

import logging
import sys
from pathlib import Path

import numpy as np
import pytest

import trajstore
from trajstore.rollout import gym_evaluate, gym_rollout, load_policy

POLICY_MODULE = '''
import numpy as np

calls = []

def lean(obs):
    """CartPole: push towards the side the pole leans to."""
    calls.append(np.shape(obs))
    return (obs[:, 2] > 0).astype(np.int64)

class Holder:
    def act(obs):
        return np.zeros(len(obs), np.int64)

NOT_CALLABLE = 3
'''


@pytest.fixture
def policy_module(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> str:
    """A module ``lean_policy`` importable from ``tmp_path`` (a fresh name each test: no cached import)."""
    name = f"lean_policy_{abs(hash(tmp_path)) % 10**8}"
    (tmp_path / f"{name}.py").write_text(POLICY_MODULE)
    (tmp_path / "broken_policy.py").write_text("raise RuntimeError('no GPU here')\n")
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "broken_policy", raising=False)
    return name


def sb3_checkpoint(folder: Path) -> Path:
    """A PPO model trained a few hundred steps on CartPole-v1, saved as ``folder/ppo.zip``."""
    from stable_baselines3 import PPO

    model = PPO("MlpPolicy", "CartPole-v1", n_steps=128, batch_size=64, n_epochs=2, seed=0, device="cpu")
    model.learn(256)
    model.save(folder / "ppo.zip")
    return folder / "ppo.zip"


def test_a_module_function_acts_for_the_whole_vector_env(store: trajstore.Store, policy_module: str) -> None:
    policy = load_policy(f"{policy_module}:lean")
    gym_rollout(store, "CartPole-v1", run_id="lean", num_envs=3, episodes=6, policy=policy, progress=False)
    assert set(sys.modules[policy_module].calls) == {(3, 4)}
    rows = store.sql("SELECT obs, action FROM steps").to_pydict()
    np.testing.assert_array_equal(rows["action"], (np.array(rows["obs"])[:, 2] > 0).astype(int))
    assert load_policy(f"{policy_module}:Holder.act")(np.zeros((2, 4))).tolist() == [0, 0]


@pytest.mark.parametrize("spec, message", [
    ("lean", r"^policy: expected module:function or sb3:ALGO:path.zip, got 'lean'$"),
    (":lean", r"^policy: expected module:function or sb3:ALGO:path.zip, got ':lean'$"),
    ("no_such_module_xyz:act", r"^policy: cannot import module 'no_such_module_xyz': No module named"),
    ("{module}:missing", r"^policy: {module}:missing: module '{module}' has no attribute 'missing'$"),
    ("{module}:NOT_CALLABLE", r"^policy: {module}:NOT_CALLABLE is a int, not a function of the observations$"),
    ("broken_policy:act", r"^policy: importing module 'broken_policy' failed: RuntimeError: no GPU here$"),
    ("sb3:PPO", r"^policy: expected sb3:ALGO:path.zip, ALGO one of A2C, DDPG, DQN, PPO, SAC, TD3; got 'sb3:PPO'$"),
    ("sb3:ARS:model.zip", r"^policy: expected sb3:ALGO:path.zip, ALGO one of"),
    ("sb3:PPO:{folder}/nothing.zip", r"^policy: no SB3 checkpoint at .*nothing.zip$"),
])
def test_bad_specs_are_one_error_naming_policy(policy_module: str, tmp_path: Path, spec: str, message: str) -> None:
    fill = {"module": policy_module, "folder": str(tmp_path)}
    with pytest.raises(trajstore.InputError, match=message.format(**fill)):
        load_policy(spec.format(**fill))


def test_sb3_is_for_the_gym_backend_and_needs_its_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    with pytest.raises(trajstore.InputError, match=r"^policy: sb3:PPO:m.zip is a PyTorch model for gymnasium envs; "
                                                   "use it with --backend gym$"):
        load_policy("sb3:PPO:m.zip", backend="jax")
    monkeypatch.setitem(sys.modules, "stable_baselines3", None)  # as if the extra were not installed
    with pytest.raises(trajstore.InputError, match=r"needs Stable-Baselines3: pip install 'trajstore\[sb3\]'$"):
        load_policy("sb3:PPO:m.zip")


def test_an_sb3_checkpoint_acts_as_its_model_predicts(store: trajstore.Store, tmp_path: Path) -> None:
    pytest.importorskip("stable_baselines3", reason="the [sb3] extra is not installed")
    from stable_baselines3 import PPO

    path = sb3_checkpoint(tmp_path)
    policy = load_policy(f"sb3:ppo:{path}", deterministic=True)
    gym_evaluate(store, "CartPole-v1", run_id="ppo", episodes=4, num_envs=2, policy=policy, progress=False)
    rows = store.sql("SELECT obs, action FROM steps ORDER BY episode_id, step").to_pydict()
    predicted, _ = PPO.load(path, device="cpu").predict(np.array(rows["obs"], np.float32), deterministic=True)
    assert len(rows["action"]) > 20
    np.testing.assert_array_equal(rows["action"], predicted)

    with pytest.raises(trajstore.InputError, match=r"^policy: cannot load .*ppo.zip as a DQN checkpoint: "):
        load_policy(f"sb3:DQN:{path}")
    with pytest.raises(trajstore.InputError, match=r"^policy: the PPO model .*ppo.zip does not take these "
                                                   "observations: "):
        gym_rollout(store, "Pendulum-v1", run_id="wrong", steps=10, policy=load_policy(f"sb3:PPO:{path}"),
                    progress=False)


def test_loading_an_sb3_checkpoint_warns_that_it_is_a_pickle(tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    pytest.importorskip("stable_baselines3", reason="the [sb3] extra is not installed")
    path = sb3_checkpoint(tmp_path)
    with caplog.at_level(logging.WARNING, logger="trajstore.rollout.policies"):
        load_policy(f"sb3:PPO:{path}")
    warned = [r for r in caplog.records if r.levelno == logging.WARNING]
    assert [r.getMessage() for r in warned] == [
        f"policy: {path} is a Stable-Baselines3 checkpoint, which is a pickle: loading it runs any code its author "
        "put in it. Load checkpoints only from sources you trust."]
    assert "pickle" in load_policy.__doc__ and "trust" in load_policy.__doc__
