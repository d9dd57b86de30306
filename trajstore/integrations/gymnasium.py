"""Recording where users step their envs: gymnasium wrappers that store every step they see.

:class:`RecordToStore` wraps one env, :class:`VectorRecordToStore` a vector env. Each step is stored as the
writer takes it (the observation the action was taken on, the action, reward, next observation, terminated,
truncated), episodes as the user steps them; steps are collected and handed to the writer as one time-major
``(T, B, …)`` batch every ``chunk`` steps, and the writer commits them when its buffer passes ``flush_bytes``,
on :meth:`flush` and on ``close()``. The stored episodes are the ones gymnasium's ``RecordEpisodeStatistics``
reports around them.

>>> import gymnasium as gym, tempfile, trajstore
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> with RecordToStore(gym.make("CartPole-v1"), store, run_id="doc") as env:
...     obs, info = env.reset(seed=0)
...     for _ in range(100):
...         obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
...         if terminated or truncated:
...             obs, info = env.reset()
>>> store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
100
"""

from __future__ import annotations

import logging
from typing import Any, Literal, Mapping, Sequence

import numpy as np

from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.integrations.info import InfoColumns, Values, check_info_keys, check_writer, env_info, vector_info
from trajstore.write.writer import Writer

with needed("gym", "a gymnasium rollout or recorder (gym_rollout, RecordToStore)"):
    import gymnasium as gym

log = logging.getLogger(__name__)

NEXT_STEP, SAME_STEP, DISABLED = "next-step", "same-step", "disabled"
FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def gymnasium_rewards(reward: Any) -> np.ndarray:
    """Rewards as gymnasium hands them over (Python floats, float64 arrays: whatever precision the env computed them
    in) as the step schema's float32, what rollouts and recorders store; a writer keeps float64 rewards only where
    its caller gives them as such. One past float32's range becomes infinity, which the writer refuses."""
    with np.errstate(over="ignore"):
        return np.asarray(reward).astype(np.float32, copy=False)


class StepBuffer:
    """Steps of one (vector) env as they come, handed to ``writer`` as one time-major batch every ``chunk``
    steps (one ``add_batch`` call, not one per step). Each step is ``(B, …)`` for a vector env (``vector``), one
    env's values otherwise; ``info_keys`` names info keys stored as step columns (see
    :mod:`~trajstore.integrations.info`), their values given to :meth:`add` as read from the step's info."""

    def __init__(self, writer: Writer, *, chunk: int, info_keys: Sequence[str], num_envs: int,
                 vector: bool) -> None:
        if not isinstance(chunk, int) or isinstance(chunk, bool) or chunk < 1:
            raise InputError(f"chunk: must be a positive number of steps, got {chunk!r}")
        self.writer, self.chunk, self.vector = writer, chunk, vector
        self.info = InfoColumns(info_keys, num_envs)
        check_writer(self.info.keys, writer)
        self._steps: list[tuple[Any, ...]] = []

    @property
    def info_keys(self) -> tuple[str, ...]:
        return self.info.keys

    def add(self, step: tuple[Any, ...], info: Values) -> None:
        self._steps.append(step)
        if self.info.keys:
            self.info.add(info)
        if len(self._steps) >= self.chunk:
            self.push()

    def push(self) -> None:
        """Hand the collected steps to the writer as one ``(T, B, …)`` batch."""
        if not self._steps:
            return
        single = not self.vector
        batch = {name: _stack([s[i] for s in self._steps], env_axis=single) for i, name in enumerate(FIELDS)}
        batch["reward"] = gymnasium_rewards(batch["reward"])
        columns = self.info.take()
        if columns:
            batch["extras"] = columns
        self._steps = []
        self.writer.add_batch(batch)  # refused whole (the writer's error) if a step is invalid, e.g. a NaN reward


class Recording:
    """What both recorders share: the writer they hand their steps to and the buffer of steps not handed yet."""

    writer: Any
    writer_closed: bool
    _buffer: StepBuffer

    def flush(self) -> None:
        """Commit every step so far: visible to readers when this returns."""
        self._buffer.push()
        self.writer.flush()

    def close(self, **kwargs: Any) -> None:
        """Commit every step and close the writer, then the env. Idempotent — safe to call multiple times."""
        try:
            if not self.writer_closed:
                self._buffer.push()
                self.writer.close()
        finally:
            self.writer_closed = True
            super().close(**kwargs)  # type: ignore[misc]  # the env wrapper's, next in the recorder's MRO

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> Literal[False]:
        self.close()
        return False  # an error in the block propagates


class RecordToStore(Recording, gym.Wrapper):
    """Stores every step of ``env`` in ``store`` under ``run_id`` (``env_id`` defaults to the env's spec id).

    A ``reset()`` before the episode ended leaves that episode stored as unfinished; the next step starts a
    new one. ``info_keys`` names keys of each step's ``info`` to store as step columns (null at steps whose info
    lacks one, see :mod:`~trajstore.integrations.info`); other keywords are writer options (``flush_bytes=``,
    ``worker_id=``) or lineage values (``policy_version=``, ``seed=``, ``mode=``).
    Where ``env`` ends in gymnasium's ``FrameStackObservation``, the stack is declared to the writer
    (``frame_stack={"obs": k}``) if the writer takes that option. :meth:`flush` makes the steps so far visible
    to readers; ``close()`` does too and closes ``env``.
    """

    def __init__(self, env: gym.Env, store: Any, *, run_id: str, env_id: str | None = None, chunk: int = 256,
                 info_keys: Sequence[str] = (), **options: Any) -> None:
        super().__init__(env)
        self.writer_closed = False
        info_keys = check_info_keys(info_keys)
        options = {**frame_stack_option(env, env.observation_space), **options}
        self.writer = store.writer(run_id=run_id, env_id=env_id or spec_id(env), autoreset="same-step",
                                   observation_space=env.observation_space, action_space=env.action_space,
                                   **options)
        self._buffer = StepBuffer(self.writer, chunk=chunk, info_keys=info_keys, num_envs=1, vector=False)
        self._obs: Any = None
        self._open = False  # an episode was stepped and has not ended

    def reset(self, *, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[Any, dict]:
        obs, info = self.env.reset(seed=seed, options=options)
        if self._open:  # cut before it ended: stored as unfinished, never merged with the next one
            self._buffer.push()
            self.writer.reset([0])
        self._obs, self._open = copy_obs(obs), False
        return obs, info

    def step(self, action: Any) -> tuple[Any, Any, bool, bool, dict]:
        if self._obs is None:
            raise InputError("step: call reset() before the first step (the observation it returns is the one "
                             "the first action is taken on)")
        next_obs, reward, terminated, truncated, info = self.env.step(action)
        kept = copy_obs(next_obs)
        self._buffer.add((self._obs, np.array(action, copy=True), reward, kept, terminated, truncated),
                         env_info(info, self._buffer.info_keys))
        self._obs, self._open = kept, not (terminated or truncated)
        return next_obs, reward, terminated, truncated, info


class VectorRecordToStore(Recording, gym.vector.VectorWrapper):
    """Stores every step of the vector env ``env`` in ``store`` under ``run_id``, in either autoreset mode.

    Next-step (gymnasium's default, and the only mode of gymnasium 1.0): the step after an episode ended is a
    reset step, not a transition, and is not stored. Same-step: ``next_obs`` of a last step is the true final
    observation, ``info["final_obs"]``. Autoreset disabled: reset ended envs with ``reset(options={"reset_mask":
    …})``. A reset of an env whose episode had not ended leaves that episode stored as unfinished. Options as for
    :class:`RecordToStore`; ``env_index`` is each step's env in the vector env.
    """

    def __init__(self, env: gym.vector.VectorEnv, store: Any, *, run_id: str, env_id: str | None = None,
                 chunk: int = 256, info_keys: Sequence[str] = (), **options: Any) -> None:
        super().__init__(env)
        info_keys = check_info_keys(info_keys)
        self.mode = autoreset_mode(env)
        options = {**frame_stack_option(first_env(env), env.single_observation_space), **options}
        self.writer = store.writer(run_id=run_id, env_id=env_id or spec_id(env),
                                   autoreset=NEXT_STEP if self.mode == NEXT_STEP else SAME_STEP,
                                   observation_space=env.single_observation_space,
                                   action_space=env.single_action_space, **options)
        self._buffer = StepBuffer(self.writer, chunk=chunk, info_keys=info_keys, num_envs=env.num_envs, vector=True)
        self._obs: Any = None
        self._ended = np.zeros(env.num_envs, bool)  # whose episode ended at the last step
        self.writer_closed = False

    def reset(self, *, seed: int | list[int | None] | None = None,
              options: dict[str, Any] | None = None) -> tuple[Any, dict[str, Any]]:
        mask = np.ones(self.num_envs, bool) if options is None or "reset_mask" not in options else \
            np.array(options["reset_mask"], bool)
        # a copy down: gymnasium's vector envs pop reset_mask from the dict, which wrappers outside this one
        # (RecordEpisodeStatistics) read after
        obs, info = self.env.reset(seed=seed,  # type: ignore[arg-type]  # VectorEnv.reset declares int | None only
                                   options=None if options is None else dict(options))
        if self._obs is not None:
            self._restart(mask)
        self._obs = copy_obs(obs)
        return obs, info

    def _restart(self, mask: np.ndarray) -> None:
        """Envs reset by hand start new episodes; an episode that had not ended stays unfinished. In next-step
        mode every reset env is told to the writer (its next step is a transition, not gymnasium's reset step);
        otherwise only those cut mid-episode (an ended episode is followed by a new one anyway)."""
        cut = mask if self.mode == NEXT_STEP else mask & ~self._ended
        if cut.any():
            self._buffer.push()
            self.writer.reset(np.flatnonzero(cut))
        self._ended &= ~mask

    def step(self, actions: Any) -> tuple[Any, Any, Any, Any, dict[str, Any]]:
        if self._obs is None:
            raise InputError("step: call reset() before the first step (the observations it returns are the ones "
                             "the first actions are taken on)")
        next_obs, reward, terminated, truncated, info = self.env.step(actions)
        kept = copy_obs(next_obs)
        final = with_final_obs(kept, info) if self.mode == SAME_STEP else kept
        term, trunc = np.array(terminated, bool), np.array(truncated, bool)
        values = vector_info(info, self._buffer.info_keys, self.num_envs, same_step=self.mode == SAME_STEP)
        self._buffer.add((self._obs, np.array(actions, copy=True), np.array(reward, copy=True), final, term, trunc),
                         values)
        self._obs, self._ended = kept, term | trunc
        return next_obs, reward, terminated, truncated, info


def autoreset_mode(venv: gym.vector.VectorEnv) -> str:
    """``venv``'s autoreset mode: ``metadata["autoreset_mode"]`` (gymnasium ≥ 1.1), next-step where it declares
    none (every vector env of gymnasium 1.0, which has no ``AutoresetMode``)."""
    mode = venv.metadata.get("autoreset_mode")
    name = str(getattr(mode, "value", mode))
    return {"NextStep": NEXT_STEP, "SameStep": SAME_STEP, "Disabled": DISABLED}.get(name, NEXT_STEP)


def spec_id(env: Any) -> str:
    """The gymnasium id ``env`` was made with (for a vector env without one, its first sub-env's)."""
    spec = getattr(env, "spec", None) or getattr(getattr(env, "unwrapped", None), "spec", None)
    if spec is None and isinstance(env, gym.vector.VectorEnv) and first_env(env) is not None:
        return spec_id(first_env(env))
    if spec is None or not getattr(spec, "id", None):
        raise InputError("env_id: this env has no spec id (it was not made by gymnasium.make); pass env_id='…'")
    return str(spec.id)


def frame_stack_option(env: Any, space: Any) -> dict[str, Any]:
    """``{"frame_stack": {"obs": k}}`` where the observations of ``env`` are those of gymnasium's
    ``FrameStackObservation`` of ``k`` frames (wrappers around it leave them as they are); else nothing."""
    while isinstance(env, gym.Wrapper) and not isinstance(env, gym.wrappers.FrameStackObservation):
        if env.observation_space != env.env.observation_space:  # this wrapper changes the observations
            return {}
        env = env.env
    k = getattr(env, "stack_size", None) if isinstance(env, gym.wrappers.FrameStackObservation) else None
    if k is None or not isinstance(space, gym.spaces.Box) or not space.shape or space.shape[0] != k:
        return {}
    return {"frame_stack": {"obs": int(k)}}


def first_env(venv: Any) -> Any:
    """The first sub-env of a synchronous vector env (to look at its wrappers); None if not reachable."""
    envs = getattr(getattr(venv, "unwrapped", venv), "envs", None)
    return envs[0] if envs else None


def with_final_obs(next_obs: Any, info: Mapping[str, Any]) -> Any:
    """Same-step autoreset: ``next_obs`` with the true final observation where an episode ended."""
    mask = info.get("_final_obs")
    if mask is None or not np.any(mask):
        return next_obs
    envs = np.flatnonzero(mask)
    return replace_rows(next_obs, envs, [info["final_obs"][i] for i in envs])


def replace_rows(batch: Any, envs: np.ndarray, rows: list[Any]) -> Any:
    """A copy of the vector batch ``batch`` (an array, or a dict of them) with row ``envs[i]`` set to ``rows[i]``."""
    if isinstance(batch, Mapping):
        return {k: replace_rows(v, envs, [r[k] for r in rows]) for k, v in batch.items()}
    out = np.array(batch, copy=True)
    out[envs] = np.stack([np.asarray(r) for r in rows])
    return out


def copy_obs(x: Any) -> Any:
    """A copy of an observation (envs may hand out one array and write the next step into it)."""
    if isinstance(x, np.ndarray):
        return x.copy()
    if isinstance(x, dict):
        return {k: copy_obs(v) for k, v in x.items()}
    return np.array(x, copy=True)


def _stack(items: list[Any], *, env_axis: bool = False) -> Any:
    """``T`` steps as one ``(T, …)`` array per leaf; ``env_axis``: steps of one env, given an env axis of 1."""
    if isinstance(items[0], dict):
        return {k: _stack([it[k] for it in items], env_axis=env_axis) for k in items[0]}
    out = np.stack(items) if isinstance(items[0], np.ndarray) else np.asarray(items)
    return out[:, None] if env_axis else out
