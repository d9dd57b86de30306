"""The gymnasium rollout worker: a vector env stepped with a policy, every transition into a store (the loop
itself is :mod:`~trajstore.rollout.gym_steps`).

Every row stores ``mode='train'`` and the ``seed`` given (env ``i`` of the vector env starts from ``seed + i``;
``env_index`` tells the envs apart). A run the store already holds is refused unless ``append=True``.

>>> import trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> result = gym_rollout(store, "CartPole-v1", run_id="doc", num_envs=2, episodes=3, progress=False)
>>> result.episodes >= 3
True
"""

from __future__ import annotations

import logging
from typing import Any, Callable, Mapping, Sequence

from trajstore.errors import InputError
from trajstore.integrations.info import check_info_keys
from trajstore.rollout.gym_evaluation import gym_evaluate
from trajstore.rollout.gym_steps import NEXT_STEP, Policy, autoreset_mode, env_id_of, run, stack_option, vector_env
from trajstore.rollout.progress import Progress, RolloutProgress
from trajstore.rollout.sampling import RolloutResult, sample_until
from trajstore.rollout.target import Mode, RolloutTarget, check_mode, check_run

log = logging.getLogger(__name__)

__all__ = ["Policy", "gym_rollout"]


def gym_rollout(store: RolloutTarget, env: Any, *, run_id: str, num_envs: int = 8, policy: Policy | None = None,
                episodes: int | None = None, steps: int | None = None, seed: int | None = 0, mode: Mode = "train",
                append: bool = False, env_id: str | None = None, autoreset: str = NEXT_STEP, chunk: int = 256,
                progress: Progress = True, env_kwargs: Mapping[str, Any] | None = None,
                wrappers: Sequence[Callable[[Any], Any]] = (), frame_stack: Mapping[str, int] | None = None,
                queue_size: int = 2, info_keys: Sequence[str] = (), **lineage: Any) -> RolloutResult:
    """Roll out ``env`` (a gymnasium id or a vector env) into ``store`` until ``episodes``/``steps`` are reached.

    With no ``policy``, actions are sampled from the action space (seeded with ``seed``). ``episodes`` counts complete
    episodes, ``steps`` stored steps; with both, both must be reached: at least that many, as every env runs on until
    the stop. Episodes still running at the stop are stored too, as incomplete. ``mode="eval"`` runs
    :func:`~trajstore.rollout.gym_evaluation.gym_evaluate` instead: exactly ``episodes`` complete episodes, without
    the bias towards short ones (pass the deterministic policy).

    Every row stores ``mode`` and ``seed`` (as given; env ``i`` starts from ``seed + i``; ``seed=None`` seeds nothing
    and stores none). Both of gymnasium's autoreset modes are handled: the stored episodes are the ones
    ``RecordEpisodeStatistics`` reports, and ``next_obs`` of a last step is the true final observation.

    The envs are stepped in this thread; ``chunk`` steps at a time (fewer where their observations pass 8 MiB) are
    stacked, checked and handed to the writer in another (at most ``queue_size`` chunks wait), so storing overlaps
    stepping.

    Args:
        store: A :class:`~trajstore.Store`, or a :class:`~trajstore.RemoteStore` to write through a service.
        env: A gymnasium id (``"CartPole-v1"``; ``ALE/…`` ids register ale-py's games first) or a vector env.
        run_id: The run to write; refused if the store holds it, unless ``append``.
        num_envs: Envs of the vector env made from an id.
        policy: ``(num_envs, …)`` observations in, their actions out; random actions without it.
        episodes: Stop once this many episodes are complete.
        steps: Stop once this many steps are stored.
        seed: The seed of env 0 (env ``i`` gets ``seed + i``) and of the random actions.
        mode: ``"train"``, or ``"eval"`` for exactly ``episodes`` complete episodes.
        append: Add to a run the store already holds.
        env_id: The stored environment id; the env's own id by default.
        autoreset: The autoreset mode of a vector env made from an id (``"next-step"`` or ``"same-step"``).
        chunk: Steps stepped before they are handed to the writer.
        progress: Show a progress bar (steps/s, episodes, the latest mean return); False turns it off.
        env_kwargs: Keywords for ``gymnasium.make_vec`` of an id.
        wrappers: Wrap each env made from an id (:func:`trajstore.rollout.atari.dqn_preprocessing` gives Atari's).
        frame_stack: ``{"obs": k}``: the observations are stacks of their last k frames, each frame stored once (see
            :meth:`Store.writer`). Left out, it is found where the sub-envs end in ``FrameStackObservation``;
            ``{}`` stores whole observations.
        queue_size: Chunks waiting for the writer at most.
        info_keys: Keys of each step's info stored as step columns (null at steps whose info lacks one; see
            :mod:`~trajstore.integrations.info`).
        **lineage: Stored as lineage columns (``policy_version=3``), or describe the run (``config=``, ``tags=``,
            ``notes=``).

    Returns:
        A :class:`~trajstore.rollout.sampling.RolloutResult`: ``run_id``, ``env_id``, the ``steps`` stored, the
        complete ``episodes``, ``seconds``, and each complete episode's return and length (``episode_returns``,
        ``episode_lengths``).

    Raises:
        InputError: Neither ``episodes`` nor ``steps`` given, a ``run_id`` the store already holds without
            ``append``, ``steps`` with ``mode="eval"``, or another argument out of range.
        ReadOnlyError: The store was opened at a version.

    Examples:
        >>> from trajstore.rollout import gym_rollout
        >>> store = trajstore.open("./trajdata", create=True)
        >>> result = gym_rollout(store, "CartPole-v1", run_id="demo", num_envs=2, episodes=10, seed=0, progress=False)
        >>> result.episodes, store.stats(run_id="demo")["n_traj"][0].as_py()
        (10, 10)
        >>> lean = gym_rollout(store, "CartPole-v1", run_id="lean", policy=lambda obs: (obs[:, 2] > 0).astype(int),
        ...                    steps=1_000, progress=False, config={"policy": "lean"})
        >>> lean.steps >= 1_000
        True
    """
    if check_mode(mode) == "eval":
        if steps is not None:
            raise InputError("mode='eval' runs exactly `episodes` complete episodes; steps= does not apply")
        if episodes is None:
            raise InputError("mode='eval': give episodes=N, the number of complete episodes to evaluate")
        return gym_evaluate(store, env, run_id=run_id, episodes=episodes, policy=policy, num_envs=num_envs,
                            seed=seed, append=append, env_id=env_id, autoreset=autoreset, chunk=chunk,
                            progress=progress, env_kwargs=env_kwargs, wrappers=wrappers, frame_stack=frame_stack,
                            queue_size=queue_size, info_keys=info_keys, **lineage)
    until = sample_until(min_timesteps=steps, min_episodes=episodes)
    info_keys = check_info_keys(info_keys)
    if chunk < 1:
        raise InputError(f"chunk must be a positive number of steps, got {chunk}")
    check_run(store, run_id, mode="train", append=append)
    venv, owned = vector_env(env, num_envs, autoreset, env_kwargs or {}, wrappers)
    try:
        options = stack_option(venv, frame_stack)
        return run(store, venv, autoreset_mode(venv), until, policy, seed, run_id=run_id,
                   env_id=env_id or env_id_of(env, venv), chunk=chunk,
                   bar=RolloutProgress(episodes=episodes, steps=steps, enabled=progress),
                   lineage={**lineage, "mode": "train"}, options={**options, "queue_size": queue_size},
                   info_keys=info_keys)
    finally:
        if owned:
            venv.close()
