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

    With no ``policy``, actions are sampled from the action space (seeded with ``seed``).
    ``episodes`` counts complete episodes, ``steps`` stored steps; with both, both must be reached: at least
    that many, as every env runs on until the stop. Episodes still running at the stop are stored too, as
    incomplete. ``mode="eval"`` runs :func:`~trajstore.rollout.gym_evaluation.gym_evaluate` instead: exactly
    ``episodes`` complete episodes, without the bias towards short ones (pass the deterministic policy).

    Every row stores ``mode`` and ``seed`` (as given; env ``i`` starts from ``seed + i``; ``seed=None`` seeds
    nothing and stores none). A ``run_id`` the store already holds is refused unless ``append=True``. Extra keywords
    (``policy_version=``, ``config=``, …) are stored as lineage columns or describe the run. ``wrappers`` wrap
    each env made from an id (gymnasium's ``make_vec(wrappers=…)``; :func:`trajstore.rollout.atari.dqn_preprocessing`
    gives Atari's); ``ALE/…`` ids register ale-py's games first. ``info_keys=["is_success", …]`` stores those
    keys of each step's info as step columns (null at steps whose info lacks one; see
    :mod:`~trajstore.integrations.info`).

    ``frame_stack={"obs": k}`` says the observations are stacks of their last k frames (gymnasium's
    ``FrameStackObservation`` layout), so that each frame is stored once (see :meth:`Store.writer`). Left out,
    it is found where the sub-envs are reachable (a synchronous vector env) and end in ``FrameStackObservation``;
    ``frame_stack={}`` stores whole observations.

    The envs are stepped in this thread; ``chunk`` steps at a time (fewer where their observations pass 8 MiB)
    are stacked, checked and handed to the writer in another (at most ``queue_size`` chunks wait), so storing
    overlaps stepping.
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
