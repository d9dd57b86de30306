"""Evaluation rollouts with gymnasium: exactly N complete episodes, unbiased, stored apart from training.

The semantics follow Stable-Baselines3's ``evaluate_policy``: with ``B`` envs, env ``i`` is asked for
``(N + i) // B`` episodes, a target fixed up front, and its steps after its last one are not stored (it keeps
stepping with the others). Counting the first N episodes to finish across all envs instead (what
:func:`~trajstore.rollout.gym_loop.gym_rollout`'s ``episodes=`` does) would over-represent short episodes: the
envs that happen to play short ones finish more of them before the stop. Each env's episodes here are simply its
first ones from its seeded reset, whatever their lengths. Nothing is left unfinished: an env without a time limit
must end its episodes by itself.

Pass the deterministic policy (argmax, mean action) as ``policy``; for a policy with a flag,
``functools.partial(policy, deterministic=True)`` (``trajstore rollout --mode eval --policy sb3:…`` predicts
deterministically). The same ``seed`` gives the same episodes. Steps are stored with ``mode='eval'`` and the
``seed`` given, under their own ``run_id``: a run holding training steps is refused, and a run the store already
holds unless ``append=True``.

>>> import trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> result = gym_evaluate(store, "CartPole-v1", run_id="eval", episodes=5, num_envs=2, progress=False)
>>> result.episodes, store.stats(run_id="eval").column("n_traj")[0].as_py()
(5, 5)
"""

from __future__ import annotations

from typing import Any, Callable, Mapping, Sequence

import numpy as np

from trajstore.integrations.info import check_info_keys
from trajstore.rollout.gym_steps import NEXT_STEP, Policy, autoreset_mode, env_id_of, run, stack_option, vector_env
from trajstore.rollout.progress import Progress, RolloutProgress
from trajstore.rollout.sampling import RolloutResult, check_positive, sample_until
from trajstore.rollout.target import RolloutTarget, check_run

__all__ = ["episode_targets", "gym_evaluate"]


def gym_evaluate(store: RolloutTarget, env: Any, *, run_id: str, episodes: int, policy: Policy | None = None,
                 num_envs: int = 8, seed: int | None = 0, append: bool = False, env_id: str | None = None,
                 autoreset: str = NEXT_STEP, chunk: int = 256, progress: Progress = True,
                 env_kwargs: Mapping[str, Any] | None = None, wrappers: Sequence[Callable[[Any], Any]] = (),
                 frame_stack: Mapping[str, int] | None = None, queue_size: int = 2, info_keys: Sequence[str] = (),
                 **lineage: Any) -> RolloutResult:
    """Store exactly ``episodes`` complete evaluation episodes of ``policy`` in ``env`` under ``run_id``.

    ``env`` is a gymnasium id (``min(num_envs, episodes)`` envs are made) or a vector env (all its envs play,
    env ``i`` asked for ``(episodes + i) // num_envs`` of them: :func:`episode_targets`). The other arguments
    are :func:`~trajstore.rollout.gym_loop.gym_rollout`'s; extra keywords are lineage columns or describe the run.
    ``result.episode_returns``/``episode_lengths`` are the stored episodes'.
    """
    check_positive("episodes", episodes)
    info_keys = check_info_keys(info_keys)
    check_positive("chunk", chunk)
    check_run(store, run_id, mode="eval", append=append)
    venv, owned = vector_env(env, min(check_positive("num_envs", num_envs), episodes), autoreset, env_kwargs or {},
                             wrappers)
    try:
        options = stack_option(venv, frame_stack)
        return run(store, venv, autoreset_mode(venv), sample_until(min_episodes=episodes), policy, seed,
                   run_id=run_id, env_id=env_id or env_id_of(env, venv), chunk=chunk,
                   bar=RolloutProgress(episodes=episodes, steps=None, enabled=progress, desc="evaluate"),
                   lineage={**lineage, "mode": "eval"}, options={**options, "queue_size": queue_size},
                   info_keys=info_keys, targets=episode_targets(episodes, venv.num_envs))
    finally:
        if owned:
            venv.close()


def episode_targets(episodes: int, num_envs: int) -> np.ndarray:
    """How many of ``episodes`` each of ``num_envs`` envs plays: ``(episodes + i) // num_envs`` for env ``i``
    (Stable-Baselines3's ``evaluate_policy``), as even as can be, summing to ``episodes``."""
    return np.array([(episodes + i) // num_envs for i in range(num_envs)], np.int64)
