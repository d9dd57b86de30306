"""Evaluation rollouts with JAX: exactly N complete episodes, no autoreset, stored apart from training.

The semantics follow EvoRL's ``eval_rollout_episode`` and RLlib's ``sample(num_episodes=N)``:
each env plays one episode from a fresh reset and then stays frozen (its further steps are not
stored), so short episodes are not over-represented the way they are when one counts the first N
episodes to finish under autoreset. With more episodes than envs, episodes run in rounds of at
most ``num_envs``; the last round uses only the envs it needs. Nothing is left unfinished: an env
without a time limit needs ``max_episode_steps``, after which its episode is truncated.

Pass the deterministic policy (argmax, mean action) as ``policy``, EvoRL's separate
``evaluate_actions``; for a policy with a flag, ``functools.partial(policy, deterministic=True)``.
The same ``seed`` and ``params`` give the same episodes. Steps are stored with ``mode='eval'`` and the
``seed`` given, under their own ``run_id``: a run holding training steps is refused, and a run the store already
holds unless ``append=True``.

>>> import trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> result = jax_evaluate(store, "cartpole", run_id="eval", episodes=3, num_envs=2, progress=False)
>>> result.episodes, store.stats(run_id="eval").column("n_traj")[0].as_py()
(3, 3)
"""

from __future__ import annotations

import time
from typing import Any, Mapping, Sequence

from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.integrations.info import check_writer
from trajstore.rollout.background import BackgroundWriter
from trajstore.rollout.jax_host import Tally, collect, open_writer
from trajstore.rollout.jax_scan import Policy, make_scan, resolve_env
from trajstore.rollout.progress import Progress, RolloutProgress
from trajstore.rollout.sampling import RolloutResult, check_positive, check_seed, sample_until
from trajstore.rollout.target import RolloutTarget, check_run

with needed("jax", "a JAX rollout"):
    import jax
    import jax.numpy as jnp

__all__ = ["jax_evaluate"]


def jax_evaluate(store: RolloutTarget, env: Any, *, run_id: str, episodes: int, policy: Policy | None = None,
                 params: Any = None, num_envs: int = 1024, rollout_length: int = 128, seed: int = 0,
                 append: bool = False, policy_version: int | None = None, worker_id: str | None = None,
                 env_id: str | None = None, max_episode_steps: int | None = None, queue_size: int = 2,
                 progress: Progress = True, frame_stack: Mapping[str, int] | None = None,
                 info_keys: Sequence[str] = (), **lineage: Any) -> RolloutResult:
    """Store exactly ``episodes`` complete evaluation episodes of ``policy`` in ``env`` under ``run_id``.

    ``num_envs`` envs run in parallel (at most ``episodes``), scanned ``rollout_length`` steps at a
    time until every episode of the round has ended. ``max_episode_steps`` truncates episodes (it
    defaults to the env's own time limit). ``result.episode_returns``/``episode_lengths`` are the
    sums computed inside JAX. ``frame_stack`` and ``info_keys`` as for
    :func:`~trajstore.rollout.jax_loop.jax_rollout`.
    """
    check_positive("episodes", episodes)
    check_positive("num_envs", num_envs)
    env = resolve_env(env)
    limit = max_episode_steps if max_episode_steps is not None else getattr(env, "max_episode_steps", None)
    if limit is None:
        raise InputError(f"{getattr(env, 'name', 'env')} has no time limit, so an episode may never end; "
                         "give max_episode_steps=N to truncate evaluation episodes")
    check_positive("max_episode_steps", limit)
    B = min(num_envs, episodes)
    scan = make_scan(env, policy, num_envs=B, rollout_length=min(rollout_length, limit), autoreset=False,
                     time_limit=max_episode_steps, info_keys=info_keys)
    check_run(store, run_id, mode="eval", append=append)
    lineage.update(seed=check_seed(seed), mode="eval")
    if policy_version is not None:
        lineage["policy_version"] = policy_version
    opts: dict[str, Any] = {"worker_id": worker_id} if worker_id is not None else {}
    opts.update({"frame_stack": dict(frame_stack)} if frame_stack else {})
    key = jax.random.PRNGKey(seed)
    scan.compile(params, scan.init(key, jnp.ones(B, bool)))
    tally = Tally(B)
    started = time.perf_counter()
    with RolloutProgress(episodes=episodes, steps=None, enabled=progress) as bar, \
            open_writer(store, env, run_id=run_id, env_id=env_id, **opts, **lineage) as writer, \
            BackgroundWriter(writer, queue_size) as sink:
        check_writer(info_keys, writer)
        for round_ in range(-(-episodes // B)):
            n = min(B, episodes - tally.episodes)
            carry = scan.init(jax.random.fold_in(key, round_), jnp.arange(B) < n)
            collect(scan, params, carry, sink=sink, until=sample_until(min_episodes=tally.episodes + n),
                    tally=tally, bar=bar)
        sink.close()
        bar.finish(steps=tally.steps, episodes=tally.episodes)
    return tally.result(writer, started)
