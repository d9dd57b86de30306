"""Recording Stable-Baselines3 training (the ``[sb3]`` extra): a callback that stores every step of the model's
VecEnv, for on-policy (PPO, A2C) and off-policy (DQN, SAC, TD3) algorithms alike.

SB3's VecEnvs reset an env in the step its episode ends: the observation they return there is the next
episode's first one, the true final observation is ``infos[i]["terminal_observation"]``, and a time-limit end
is ``infos[i]["TimeLimit.truncated"]`` (kept apart from termination here). The observation an action was
taken on is the model's ``_last_obs`` when the step is reported. The stored episodes are those SB3's
``Monitor`` records (``get_episode_rewards()``, ``get_episode_lengths()``).

>>> from stable_baselines3 import PPO                                          # doctest: +SKIP
>>> from stable_baselines3.common.env_util import make_vec_env
>>> model = PPO("MlpPolicy", make_vec_env("CartPole-v1", n_envs=4))
>>> with StoreCallback(store, run_id="ppo") as callback:
...     model.learn(10_000, callback=callback)
"""

from __future__ import annotations

import logging
from typing import Any, Mapping, Sequence

import numpy as np

from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.integrations.gymnasium import StepBuffer, copy_obs, frame_stack_option
from trajstore.integrations.info import check_info_keys, list_info

with needed("sb3", "trajstore.integrations.sb3"):
    from stable_baselines3.common.callbacks import BaseCallback
    from stable_baselines3.common.vec_env import VecEnvWrapper

log = logging.getLogger(__name__)


class StoreCallback(BaseCallback):
    """Stores every step of the model's training env in ``store`` under ``run_id`` (``env_id`` defaults to the
    env's spec id); pass it to ``model.learn(..., callback=...)``.

    Steps are handed to the writer ``chunk`` steps at a time and committed at the end of each ``learn()`` (and
    whenever the writer's buffer passes ``flush_bytes``). The writer stays open across ``learn()`` calls, so an
    episode that runs on into the next call (``reset_num_timesteps=False``) continues; one cut by the env's reset
    at the start of a ``learn()`` is stored as unfinished. :meth:`close` (or a ``with`` block) releases it.

    Under a ``VecNormalize`` (the outermost VecEnv wrapper), the env's own observations and rewards are stored,
    not the normalized ones the policy sees. VecNormalize replaces each final observation in the infos by its
    normalized, clipped copy, which cannot be undone exactly (``clip_obs``); so while training, the callback keeps
    a small wrapper (:class:`RawFinals`) right under the VecNormalize that holds the envs' own final observations,
    and :meth:`close` takes it away again.
    The action stored is the one the env received (clipped or rescaled into its space). ``info_keys`` names keys
    of each env's ``info`` to store as step columns (null where an info lacks one); other keywords are writer
    options or lineage values. Where the envs of a ``DummyVecEnv`` end in gymnasium's ``FrameStackObservation``,
    the stack is declared to the writer (``frame_stack={"obs": k}``: each frame stored once) unless
    ``frame_stack=`` is given.
    """

    def __init__(self, store: Any, *, run_id: str, env_id: str | None = None, chunk: int = 256,
                 info_keys: Sequence[str] = (), verbose: int = 0, **options: Any) -> None:
        super().__init__(verbose)
        self.store, self.run_id, self.env_id = store, run_id, env_id
        self.chunk, self.info_keys, self.options = chunk, check_info_keys(info_keys), options
        self.writer: Any = None
        self._buffer: StepBuffer | None = None
        self._obs: Any = None  # the env's observation the next action is taken on
        self._raw: RawFinals | None = None  # under the model's VecNormalize, if it has one
        self._seen: Any = None  # the model's _last_obs after the last step (to tell a reset env at learn())

    # --- SB3's hooks ----------------------------------------------------------------------------------------

    def _on_training_start(self) -> None:
        self._raw = self._keep_raw_finals()
        if self._buffer is None:
            self._buffer = self._open()
        elif self.model._last_obs is not self._seen:  # learn() reset the env: open episodes end unfinished
            self._buffer.push()
            self.writer.reset()
        self._obs = self._original_obs(self.model._last_obs)

    def _on_step(self) -> bool:
        if self._buffer is None:
            raise InputError("StoreCallback: on_step before on_training_start; pass the callback to model.learn()")
        new_obs, dones, infos = self.locals["new_obs"], np.asarray(self.locals["dones"], bool), self.locals["infos"]
        # the env's action: on-policy algorithms clip it into a Box (`clipped_actions`), off-policy ones
        # unscale it (`actions`); rewards are copied now, as PPO adds bootstrapped values to them in place later
        action = self.locals["clipped_actions"] if "clipped_actions" in self.locals else self.locals["actions"]
        reward = self._original_reward(self.locals["rewards"])
        obs = self._original_obs(new_obs)
        truncated = np.array([bool(d and info.get("TimeLimit.truncated", False)) for d, info in zip(dones, infos)])
        step = (self._obs, np.array(action, copy=True), reward, self._final_obs(obs, dones, infos),
                dones & ~truncated, truncated)
        self._buffer.add(step, list_info(infos, self.info_keys))
        self._obs, self._seen = obs, new_obs
        return True

    def _on_training_end(self) -> None:
        self.flush()

    # --- the writer ----------------------------------------------------------------------------------------

    def flush(self) -> None:
        """Commit every step so far: visible to readers when this returns."""
        if self.writer is not None and self._buffer is not None:
            self._buffer.push()
            self.writer.flush()

    def close(self) -> None:
        """Commit every step, close the writer and leave the model's VecNormalize as it was. Idempotent — safe to
        call multiple times."""
        if self._raw is not None:
            self._raw.remove()
            self._raw = None
        if self.writer is not None and self._buffer is not None:
            self._buffer.push()
            self.writer.close()

    def __enter__(self) -> StoreCallback:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> StepBuffer:
        env = self.training_env
        options = {**_frame_stack_option(env), **self.options}
        self.writer = self.store.writer(run_id=self.run_id, env_id=self.env_id or _spec_id(env),
                                        autoreset="same-step", observation_space=env.observation_space,
                                        action_space=env.action_space, **options)
        return StepBuffer(self.writer, chunk=self.chunk, info_keys=self.info_keys, num_envs=env.num_envs,
                          vector=True)

    # --- the env's own values under a VecNormalize ------------------------------------------------------------

    def _normalizer(self) -> Any:
        vec_normalize = self.model.get_vec_normalize_env()
        return vec_normalize if vec_normalize is not None and vec_normalize is self.training_env else None

    def _original_obs(self, obs: Any) -> Any:
        normalizer = self._normalizer()
        return copy_obs(obs) if normalizer is None else normalizer.get_original_obs()

    def _keep_raw_finals(self) -> RawFinals | None:
        """The :class:`RawFinals` right under the model's VecNormalize (put there now if it is not), or None
        without one."""
        normalizer = self._normalizer()
        if normalizer is None:
            return None
        if not isinstance(normalizer.venv, RawFinals):
            if self._raw is not None:  # the model's env was replaced (set_env): the old one is left as it was
                self._raw.remove()
            normalizer.venv = RawFinals(normalizer.venv, above=normalizer)
        return normalizer.venv

    def _original_reward(self, reward: Any) -> np.ndarray:
        normalizer = self._normalizer()
        return np.array(reward, copy=True) if normalizer is None else normalizer.get_original_reward()

    def _final_obs(self, obs: Any, dones: np.ndarray, infos: Sequence[Mapping[str, Any]]) -> Any:
        """``obs`` with the true final observation of every env whose episode ended in this step."""
        ended = [i for i in np.flatnonzero(dones).tolist() if infos[i].get("terminal_observation") is not None]
        if not ended:
            return obs
        raw = self._raw.finals if self._raw is not None and self._normalizer() is not None else None
        out = copy_obs(obs)
        for i in ended:
            final = infos[i]["terminal_observation"] if raw is None else raw[i]
            if isinstance(out, dict):
                for key in out:
                    out[key][i] = final[key]
            else:
                out[i] = final
        return out


class RawFinals(VecEnvWrapper):
    """A VecEnv wrapper put right under a ``VecNormalize``: it keeps the final observations of each step
    (``finals``: env index → ``infos[i]["terminal_observation"]``) as the envs gave them, before the VecNormalize
    replaces them in the infos by normalized, clipped copies. Everything else passes through unchanged."""

    def __init__(self, venv: Any, *, above: Any) -> None:
        super().__init__(venv)
        self.above = above  # the VecNormalize whose venv this is
        self.finals: dict[int, Any] = {}

    def reset(self) -> Any:
        self.finals = {}
        return self.venv.reset()

    def step_wait(self) -> Any:
        obs, rewards, dones, infos = self.venv.step_wait()
        self.finals = {int(i): copy_obs(infos[i]["terminal_observation"]) for i in np.flatnonzero(dones)
                       if infos[i].get("terminal_observation") is not None}
        return obs, rewards, dones, infos

    def remove(self) -> None:
        """Take this wrapper out from under its VecNormalize (if it is still there)."""
        if self.above.venv is self:
            self.above.venv = self.venv


def _frame_stack_option(venv: Any) -> dict[str, Any]:
    """``{"frame_stack": {"obs": k}}`` where the envs of a ``DummyVecEnv`` end in gymnasium's
    ``FrameStackObservation`` and no VecEnv wrapper around it changes the observation space (SB3's own
    ``VecFrameStack`` stacks along the last axis, which is not that layout); else nothing."""
    from stable_baselines3.common.vec_env import DummyVecEnv, VecEnvWrapper

    while isinstance(venv, VecEnvWrapper):
        if venv.observation_space != venv.venv.observation_space:
            return {}
        venv = venv.venv
    if not isinstance(venv, DummyVecEnv) or not venv.envs:
        return {}
    return frame_stack_option(venv.envs[0], venv.observation_space)


def _spec_id(venv: Any) -> str:
    spec = venv.get_attr("spec", [0])[0]
    if spec is None or not getattr(spec, "id", None):
        raise InputError("env_id: the training env has no spec id (it was not made by gymnasium.make); "
                         "pass StoreCallback(..., env_id='…')")
    return str(spec.id)
