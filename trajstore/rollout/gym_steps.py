"""Stepping a gymnasium vector env with a policy and handing every transition to a writer: the loop that
:func:`~trajstore.rollout.gym_loop.gym_rollout` and :func:`~trajstore.rollout.gym_evaluation.gym_evaluate`
share.

Both autoreset modes of gymnasium 1.x vector envs are handled. In next-step mode (the default)
the step after an episode ends is a reset step, not a transition, and is not stored; in
same-step mode ``next_obs`` of the last step is the true final observation from
``info["final_obs"]``. A vector env with autoreset disabled is reset here, env by env. gymnasium 1.0 (no
``AutoresetMode``, added in 1.1) has next-step vector envs only; a vector env that declares no mode is next-step.

An evaluation gives each env a number of episodes to record (:class:`EpisodeTracker`'s ``targets``): an env's
steps after its last one are not stored, though it keeps stepping with the others.
"""

from __future__ import annotations

import logging
import time
from typing import Any, Callable, Mapping, Sequence

import numpy as np

from trajstore.errors import InputError
from trajstore.integrations.gymnasium import (
    copy_obs,
    first_env,
    frame_stack_option,
    gymnasium_rewards,
    replace_rows,
    with_final_obs,
)
from trajstore.integrations.info import InfoColumns, check_writer, vector_info
from trajstore.rollout.atari import register_env
from trajstore.rollout.background import BackgroundWriter
from trajstore.rollout.progress import RolloutProgress
from trajstore.rollout.sampling import RolloutResult
from trajstore.rollout.target import RolloutTarget

log = logging.getLogger(__name__)

Policy = Callable[[Any], Any]
"""``policy(obs) -> action`` for a whole vector env: ``(B, …)`` observations in, ``(B, …)`` actions out."""

NEXT_STEP, SAME_STEP, DISABLED = "next-step", "same-step", "disabled"
CALL_BYTES = 8 * 1024 * 1024  # observations handed to the writer per call, at most (where chunk allows more)


def stack_option(venv: Any, frame_stack: Mapping[str, int] | None) -> dict[str, Any]:
    """The writer's ``frame_stack`` option: as given, or found on the first sub-env (None: not found)."""
    if frame_stack is None:
        found = frame_stack_option(first_env(venv), venv.single_observation_space)
        if found:
            log.info("frame_stack: the envs end in FrameStackObservation: storing %s", found["frame_stack"])
        return found
    return {"frame_stack": frame_stack} if frame_stack else {}


def run(store: RolloutTarget, venv: Any, reset_mode: str, until: Callable[..., bool], policy: Policy | None,
        seed: int | None, *, run_id: str, env_id: str, chunk: int, bar: RolloutProgress, lineage: dict[str, Any],
        options: dict[str, Any], info_keys: tuple[str, ...] = (), targets: np.ndarray | None = None
        ) -> RolloutResult:
    """Step ``venv`` until ``until`` holds, every step (of each env's first ``targets[i]`` episodes, when given)
    into a writer of ``run_id``/``env_id``. ``seed`` seeds the envs' first reset (env ``i`` with ``seed + i``) and
    the random actions, and is stored, as given, in the ``seed`` column (None: unseeded, no seed stored)."""
    B = venv.num_envs
    if seed is not None:
        lineage.setdefault("seed", seed)
        venv.action_space.seed(seed)
    queue_size = options.pop("queue_size")
    fresh = _fresh_arrays(venv)
    obs, _ = venv.reset(seed=seed)
    obs = obs if fresh else copy_obs(obs)
    chunk = _steps_per_call(chunk, obs)
    tracker = EpisodeTracker(B, drops_reset_steps=reset_mode == NEXT_STEP, targets=targets)
    info_columns = InfoColumns(info_keys, B)
    result = RolloutResult(run_id=run_id, env_id=env_id)
    started = time.perf_counter()
    with bar, store.writer(run_id=run_id, env_id=env_id, observation_space=venv.single_observation_space,
                           action_space=venv.single_action_space,
                           autoreset="next-step" if reset_mode == NEXT_STEP else "same-step",
                           **options, **lineage) as writer:
        check_writer(info_keys, writer)
        with BackgroundWriter(writer, queue_size, prepare=_with_info) as background:
            steps: list[tuple[Any, ...]] = []
            valids: list[np.ndarray] = []
            stop = False
            while not stop:
                action = np.asarray(policy(obs)) if policy is not None else venv.action_space.sample()
                next_obs, reward, terminated, truncated, info = venv.step(action)
                next_obs = next_obs if fresh else copy_obs(next_obs)
                final_obs = with_final_obs(next_obs, info) if reset_mode == SAME_STEP else next_obs
                steps.append((obs, action, reward, final_obs, terminated, truncated))
                if targets is not None:
                    valids.append(tracker.recording())
                if info_keys:
                    info_columns.add(vector_info(info, info_keys, B, same_step=reset_mode == SAME_STEP))
                returns, lengths = tracker.update(reward, terminated, truncated)
                result.episode_returns += returns
                result.episode_lengths += lengths
                obs = _reset_done(venv, next_obs, terminated | truncated) if reset_mode == DISABLED else next_obs
                stop = until(episodes=tracker.episodes, timesteps=tracker.steps)
                if len(steps) == chunk or stop:
                    background.put((steps, info_columns.take(), valids))  # stacked in the writer's thread
                    steps, valids = [], []
                bar.update(steps=tracker.steps, episodes=tracker.episodes, returns=returns)
        bar.finish(steps=tracker.steps, episodes=tracker.episodes)
    result.steps, result.episodes = writer.steps_written, tracker.episodes
    result.seconds = time.perf_counter() - started
    log.info("rollout %s/%s: %d steps, %d episodes in %.1fs", run_id, env_id, result.steps, result.episodes,
             result.seconds)
    return result


def _steps_per_call(chunk: int, obs: Any) -> int:
    """``chunk``, or fewer steps where their observations would pass ``CALL_BYTES``: steps kept for the writer
    are new arrays each, and fewer of them in flight keep the memory they come from warm (measured on Breakout:
    half the system time of 256 steps a call)."""
    return max(1, min(chunk, CALL_BYTES // max(_nbytes(obs), 1)))


def _nbytes(value: Any) -> int:
    return sum(map(_nbytes, value.values())) if isinstance(value, Mapping) else np.asarray(value).nbytes


def _fresh_arrays(venv: Any) -> bool:
    """Whether ``venv`` hands out new observation arrays every step (a vector env made with ``copy=False``
    writes each step into the same ones: those are copied here, as the steps are kept until stacked)."""
    return getattr(getattr(venv, "unwrapped", venv), "copy", True) is not False


class EpisodeTracker:
    """Returns and lengths of the episodes a vector env finishes, counted as the writer stores them.

    With ``targets`` (episodes per env), only each env's first ``targets[i]`` episodes count, and
    :meth:`recording` says which envs are still within theirs (the steps to store)."""

    def __init__(self, num_envs: int, *, drops_reset_steps: bool, targets: np.ndarray | None = None) -> None:
        self.drops_reset_steps = drops_reset_steps
        self.targets = None if targets is None else np.asarray(targets, np.int64)
        self.done_per_env = np.zeros(num_envs, np.int64)
        self.ret = np.zeros(num_envs, np.float64)
        self.len = np.zeros(num_envs, np.int64)
        self.after_done = np.zeros(num_envs, bool)
        self.episodes = 0
        self.steps = 0

    def recording(self) -> np.ndarray:
        """Per env, whether its next step is one of the episodes it records."""
        if self.targets is None:
            return np.ones(len(self.ret), bool)
        return self.done_per_env < self.targets

    def update(self, reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray) -> tuple[list, list]:
        real = ~self.after_done if self.drops_reset_steps else np.ones_like(self.after_done)
        real &= self.recording()
        done = (np.asarray(terminated) | np.asarray(truncated)) & real
        self.ret += np.where(real, reward, 0.0)
        self.len += real
        self.steps += int(real.sum())
        returns, lengths = self.ret[done].tolist(), self.len[done].tolist()
        self.episodes += len(returns)
        self.done_per_env += done
        self.ret[done], self.len[done] = 0.0, 0
        self.after_done = done
        return returns, lengths


def vector_env(env: Any, num_envs: int, autoreset: str, env_kwargs: Mapping[str, Any],
               wrappers: Sequence[Callable[[Any], Any]]) -> tuple[Any, bool]:
    """``env`` as a vector env, and whether it was made here (and is to be closed here): a vector env as it is,
    or ``num_envs`` synchronous envs made from a gymnasium id (``ALE/…`` ids register ale-py's envs first)."""
    import gymnasium as gym
    from gymnasium.vector import VectorEnv

    if isinstance(env, VectorEnv):
        if wrappers:
            raise InputError("wrappers: apply to envs made from a gymnasium id; wrap the envs of a vector env "
                             "where you make it")
        return env, False
    if not isinstance(env, str):
        raise InputError(f"env must be a gymnasium id or a gymnasium.vector.VectorEnv, got {type(env).__name__}")
    if not isinstance(num_envs, int) or num_envs < 1:
        raise InputError(f"num_envs must be a positive integer, got {num_envs!r}")
    register_env(env)
    try:
        venv = gym.make_vec(env, num_envs=num_envs, vectorization_mode="sync",
                            vector_kwargs=_autoreset_kwargs(autoreset), wrappers=list(wrappers) or None,
                            **env_kwargs)
    except gym.error.Error as exc:
        raise InputError(f"env: gymnasium cannot make {env!r}: {exc}") from None
    return venv, True


def _autoreset_kwargs(autoreset: str) -> dict[str, Any]:
    """The vector env's keyword for ``autoreset``. gymnasium 1.0 has no ``AutoresetMode`` (added in 1.1): its
    vector envs always autoreset next-step, so that is the only mode it can give."""
    if autoreset not in (NEXT_STEP, SAME_STEP, DISABLED):
        raise InputError(f"autoreset must be one of {[NEXT_STEP, SAME_STEP, DISABLED]}, got {autoreset!r}")
    try:
        from gymnasium.vector import AutoresetMode
    except ImportError:
        if autoreset != NEXT_STEP:
            import gymnasium

            raise InputError(f"autoreset={autoreset!r} needs gymnasium >= 1.1; gymnasium {gymnasium.__version__} "
                             f"vector envs autoreset {NEXT_STEP!r} only") from None
        return {}
    modes = {NEXT_STEP: AutoresetMode.NEXT_STEP, SAME_STEP: AutoresetMode.SAME_STEP,
             DISABLED: AutoresetMode.DISABLED}
    return {"autoreset_mode": modes[autoreset]}


def autoreset_mode(venv: Any) -> str:
    """The vector env's autoreset mode; next-step where it declares none (every vector env of gymnasium 1.0)."""
    mode = getattr(venv.metadata.get("autoreset_mode"), "value", venv.metadata.get("autoreset_mode"))
    return {"NextStep": NEXT_STEP, "SameStep": SAME_STEP, "Disabled": DISABLED}.get(str(mode), NEXT_STEP)


def env_id_of(env: Any, venv: Any) -> str:
    """The env id to store: a gymnasium id without the module gymnasium imports first (``ale_py:ALE/Breakout-v5``
    is ``ALE/Breakout-v5``), or the vector env's spec id."""
    if isinstance(env, str):
        return env.rpartition(":")[2]
    spec = getattr(venv, "spec", None) or getattr(getattr(venv, "unwrapped", None), "spec", None)
    if spec is None or not getattr(spec, "id", None):
        raise InputError("env_id: this vector env has no spec id; pass env_id='…'")
    return str(spec.id)


def _reset_done(venv: Any, next_obs: Any, done: np.ndarray) -> Any:
    """Autoreset disabled: reset the envs whose episode ended and use their first observation."""
    if not np.any(done):
        return next_obs
    reset_obs, _ = venv.reset(options={"reset_mask": np.asarray(done)})
    envs = np.flatnonzero(done)
    return replace_rows(next_obs, envs, [_row(reset_obs, int(i)) for i in envs])


def _row(batch: Any, i: int) -> Any:
    return {k: _row(v, i) for k, v in batch.items()} if isinstance(batch, Mapping) else batch[i]


def time_major(steps: list[tuple[Any, ...]]) -> dict[str, Any]:
    """Vector-env steps ``(obs, action, reward, next_obs, terminated, truncated)`` as one ``(T, B, …)`` batch.

    Where each step's ``next_obs`` is the very array the next step's ``obs`` is (next-step autoreset: no array
    replaced), observations are stacked once, ``T + 1`` of them, and ``obs``/``next_obs`` are two views of it.
    """
    names = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
    if all(steps[t][3] is steps[t + 1][0] for t in range(len(steps) - 1)):
        both = _stack([s[0] for s in steps] + [steps[-1][3]])
        views = {"obs": _slice(both, slice(None, -1)), "next_obs": _slice(both, slice(1, None))}
        return {name: views[name] if name in views else _stack([s[i] for s in steps]) for i, name in enumerate(names)}
    return {name: _stack([s[i] for s in steps]) for i, name in enumerate(names)}


def _with_info(item: tuple[list[tuple[Any, ...]], dict[str, Any], list[np.ndarray]]) -> dict[str, Any]:
    """Steps, their info columns and which of them to store (all when none are said) as one ``(T, B, …)``
    batch."""
    steps, columns, valids = item
    batch = time_major(steps)
    batch["reward"] = gymnasium_rewards(batch["reward"])
    if columns:
        batch["extras"] = columns
    if valids:
        batch["valid"] = np.stack(valids)
    return batch


def _slice(value: Any, index: slice) -> Any:
    return {k: _slice(v, index) for k, v in value.items()} if isinstance(value, Mapping) else value[index]


def _stack(items: list[Any]) -> Any:
    if isinstance(items[0], Mapping):
        return {k: _stack([it[k] for it in items]) for k in items[0]}
    return np.stack([np.asarray(it) for it in items])
