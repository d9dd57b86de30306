"""The JAX rollout worker: a jitted ``lax.scan`` over ``vmap``-ed environments, every transition into a store.

The scan (:mod:`~trajstore.rollout.jax_scan`) autoresets its environments and gives ``next_obs`` of an
episode's last step as the true final observation, so the writer runs in same-step mode and carries
each env's open episode from batch to batch: episodes crossing many scans come out whole.

Storing overlaps the rollout (:mod:`~trajstore.rollout.jax_host`): the next scan is dispatched (JAX runs
it asynchronously) before the previous batch is copied to the host once with ``jax.device_get`` and
handed to a background thread that feeds the :class:`~trajstore.write.writer.Writer`; a bounded queue
keeps memory flat.

>>> import trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> result = jax_rollout(store, "cartpole", run_id="doc", num_envs=8, rollout_length=16, episodes=5,
...                      progress=False)
>>> result.episodes >= 5
True
"""

from __future__ import annotations

import logging
import time
from typing import Any, Mapping, Sequence

from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.integrations.info import check_writer
from trajstore.rollout.background import BackgroundWriter
from trajstore.rollout.evaluate import jax_evaluate
from trajstore.rollout.jax_host import Tally, collect, open_writer
from trajstore.rollout.jax_scan import Policy, make_scan, resolve_env
from trajstore.rollout.progress import Progress, RolloutProgress
from trajstore.rollout.sampling import RolloutResult, check_seed, sample_until
from trajstore.rollout.target import Mode, RolloutTarget, check_mode, check_run

with needed("jax", "a JAX rollout"):
    import jax
    import jax.numpy as jnp

log = logging.getLogger(__name__)

__all__ = ["jax_rollout"]


def jax_rollout(store: RolloutTarget, env: Any, *, run_id: str, policy: Policy | None = None, params: Any = None,
                num_envs: int = 1024, rollout_length: int = 128, steps: int | None = None,
                episodes: int | None = None, seed: int = 0, mode: Mode = "train", append: bool = False,
                policy_version: int | None = None, worker_id: str | None = None, env_id: str | None = None,
                max_episode_steps: int | None = None, queue_size: int = 2, progress: Progress = True,
                frame_stack: Mapping[str, int] | None = None, info_keys: Sequence[str] = (),
                **lineage: Any) -> RolloutResult:
    """Roll out the JAX env ``env`` (a :class:`~trajstore.rollout.envs.JaxEnv` or a name for
    :func:`trajstore.rollout.envs.make`) into ``store`` until ``episodes``/``steps`` are reached.

    ``episodes`` counts complete episodes, ``steps`` stored steps; with both, both must be reached
    (``imitation``'s ``make_sample_until``). The stop is exact to one vector step: rows of the last
    scan after the rule is met are not stored. Episodes still running are stored, as incomplete.
    With no ``policy``, actions are uniform over the action space.

    ``mode="eval"`` runs :func:`trajstore.rollout.evaluate.jax_evaluate` instead: no autoreset and
    exactly ``episodes`` complete episodes (pass the deterministic policy as ``policy``).
    ``seed`` (as given: one key, ``jax.random.PRNGKey(seed)``, split over the envs), ``mode``, ``policy_version``
    (when given), ``worker_id`` and ``env_index`` are stored as lineage columns, as are extra keywords. A
    ``run_id`` the store already holds is refused unless ``append=True``. ``frame_stack={"obs": k}`` says the
    env's observations are stacks of their last k frames (newest last, gymnasium's ``FrameStackObservation``
    layout), so that each frame is stored once (see :meth:`trajstore.Store.writer`). ``info_keys=["is_success",
    …]`` stores those keys of the env's step ``info`` as step columns.
    """
    if mode == "eval":
        if steps is not None:
            raise InputError("mode='eval' runs exactly `episodes` complete episodes; steps= does not apply")
        if episodes is None:
            raise InputError("mode='eval': give episodes=N, the number of complete episodes to evaluate")
        return jax_evaluate(store, env, run_id=run_id, policy=policy, params=params, episodes=episodes,
                            num_envs=num_envs, rollout_length=rollout_length, seed=seed, append=append,
                            policy_version=policy_version, worker_id=worker_id, env_id=env_id,
                            max_episode_steps=max_episode_steps, queue_size=queue_size, progress=progress,
                            frame_stack=frame_stack, info_keys=info_keys, **lineage)
    check_mode(mode)
    if max_episode_steps is not None:
        raise InputError("max_episode_steps applies to mode='eval'; for training, build the env with its limit "
                         "(e.g. trajstore.rollout.envs.make('cartpole', max_episode_steps=200))")
    until = sample_until(min_timesteps=steps, min_episodes=episodes)
    env = resolve_env(env)
    scan = make_scan(env, policy, num_envs=num_envs, rollout_length=rollout_length, info_keys=info_keys)
    check_run(store, run_id, mode="train", append=append)
    max_scans = -(-steps // (num_envs * rollout_length)) if episodes is None and steps is not None else None
    lineage.update(seed=check_seed(seed), mode="train", **_optional(policy_version=policy_version))
    opts: dict[str, Any] = {"worker_id": worker_id} if worker_id is not None else {}
    opts.update({"frame_stack": dict(frame_stack)} if frame_stack else {})
    carry = scan.init(jax.random.PRNGKey(seed), jnp.ones(num_envs, bool))
    scan.compile(params, carry)
    tally = Tally(num_envs)
    started = time.perf_counter()
    with RolloutProgress(episodes=episodes, steps=steps, enabled=progress) as bar, \
            open_writer(store, env, run_id=run_id, env_id=env_id, **opts, **lineage) as writer:
        check_writer(info_keys, writer)
        with BackgroundWriter(writer, queue_size) as sink:
            collect(scan, params, carry, sink=sink, until=until, tally=tally, bar=bar, max_scans=max_scans)
        bar.finish(steps=tally.steps, episodes=tally.episodes)
    return tally.result(writer, started)


def _optional(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
