"""Ray as trajstore's engine when one machine is not enough (the ``trajstore[ray]`` extra).

:func:`read_steps` and :func:`read_episodes` read a store as Ray Datasets: only committed files, the same rows
and types as :meth:`Store.scan <trajstore.store.Store.scan>` (partition columns typed as strings, not
guessed from folder names), each read task a slice of the committed file list read with trajstore's own
scan. :func:`rollout` runs rollout workers as Ray tasks, each writing its files straight into the store with its
own ``worker_id`` and envs seeded apart, and handing them to one committer (a Ray actor holding a
:class:`~trajstore.committer.Committer`) that commits what the workers flushed in groups, one commit per
``commit_interval`` at most: 32 workers make about one commit per flush round, not 32 racing ones. One progress bar
over all of them.

Ray starts a local instance on first use unless you connected to a cluster with ``ray.init(address=…)``;
on a cluster the store must be one every node reaches (an ``s3://`` store), and its ``storage_options`` (or
the ``AWS_*`` environment of the workers) must let them in.

>>> import trajstore.ray                                                        # doctest: +SKIP
>>> trajstore.ray.rollout("s3://bucket/store", "CartPole-v1", num_workers=4,  # doctest: +SKIP
...                       episodes=1000, run_id="r")
>>> trajstore.ray.read_steps("s3://bucket/store", columns=["obs", "reward"]).count()  # doctest: +SKIP
"""

from __future__ import annotations

import math
import time
from typing import Any, Callable, Iterator, Literal, Mapping, Sequence

import numpy as np
import pyarrow as pa

from trajstore import progress_bar
from trajstore.committer import Committer
from trajstore.durations import seconds
from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.query.scan import scan_steps
from trajstore.rollout.sampling import RolloutResult, check_positive, check_seed
from trajstore.rollout.target import Mode, check_mode, check_run
from trajstore.storage.log import DataFile, WrittenFile
from trajstore.store import Store, plumbing
from trajstore.store import open as open_store

with needed("ray", "trajstore.ray"):
    import ray
    import ray.data
    from ray.data.block import BlockMetadata
    from ray.data.datasource import Datasource, ReadTask

__all__ = ["read_episodes", "read_steps", "rollout"]

Backend = Literal["gym", "jax"]
READ_BATCH_ROWS = 65_536


# --- reading -------------------------------------------------------------------------------------------


def read_steps(uri: str, *, columns: Sequence[str] | None = None, run_id: str | Sequence[str] | None = None,
               where: str | None = None, storage_options: Mapping[str, Any] | None = None) -> ray.data.Dataset:
    """The committed steps of the store at ``uri`` as a Ray Dataset, with ``columns`` (all by default), of
    ``run_id`` (one or several), of the episodes ``where`` (a condition on the ``episodes`` view) selects."""
    plan = plumbing(open_store(uri, storage_options=storage_options)).scan_plan(columns, run_id=run_id,
                                                                            where=where)
    if plan.types is not None:
        plan.types.check_one_type(plan.columns)  # environments whose columns cannot be one: named before any task runs
    return ray.data.read_datasource(_CommittedSteps(plan.files, plan.schema, plan.columns, plan.episode_ids))


def read_episodes(uri: str, *, run_id: str | Sequence[str] | None = None,
                  storage_options: Mapping[str, Any] | None = None) -> ray.data.Dataset:
    """The ``episodes`` view of the store at ``uri`` (one row per episode), of ``run_id`` if given."""
    return ray.data.from_arrow(open_store(uri, storage_options=storage_options).episodes(run_id=run_id))


class _CommittedSteps(Datasource):
    """A store's committed files as read tasks: each reads a run of consecutive files with trajstore's scan."""

    def __init__(self, files: list[DataFile], schema: pa.Schema, columns: list[str],
                 episode_ids: np.ndarray | None) -> None:
        self.files, self.schema, self.columns, self.episode_ids = files, schema, columns, episode_ids

    def estimate_inmemory_data_size(self) -> int | None:
        return sum(f.size for f in self.files) * 4  # zstd-compressed files: ~4x in memory (a guess for Ray)

    def get_read_tasks(self, parallelism: int, per_task_row_limit: int | None = None,
                       data_context: Any = None) -> list[ReadTask]:
        out = pa.schema([self.schema.field(c) for c in self.columns])
        if not self.files:
            return []
        chunk = math.ceil(len(self.files) / max(1, min(parallelism, len(self.files))))
        tasks = []
        for start in range(0, len(self.files), chunk):
            files = self.files[start:start + chunk]
            rows = sum(f.rows for f in files) if self.episode_ids is None else None
            metadata = BlockMetadata(num_rows=rows, size_bytes=sum(f.size for f in files) * 4, exec_stats=None,
                                     input_files=tuple(f.uri for f in files))
            tasks.append(ReadTask(_reader(files, self.schema, self.columns, self.episode_ids), metadata,
                                  schema=out))
        return tasks


def _reader(files: list[DataFile], schema: pa.Schema, columns: list[str],
            ids: np.ndarray | None) -> Callable[[], Iterator[pa.Table]]:
    def read() -> Iterator[pa.Table]:
        reader = scan_steps(files, schema, columns, episode_ids=ids, batch_size=READ_BATCH_ROWS)
        for batch in reader:
            yield pa.Table.from_batches([batch])
    return read


# --- rollouts ------------------------------------------------------------------------------------------


def rollout(uri: str, env: Any, *, num_workers: int, backend: Backend = "gym", episodes: int | None = None,
            steps: int | None = None, run_id: str, seed: int = 0, num_envs: int = 8, policy: Any = None,
            params: Any = None, mode: Mode = "train", append: bool = False,
            storage_options: Mapping[str, Any] | None = None, progress: bool = True,
            commit_interval: float | str = "250ms", **lineage: Any) -> RolloutResult:
    """Roll out ``env`` with ``num_workers`` Ray tasks, each writing its episodes straight into the store at
    ``uri`` (created if absent) as ``worker_id="ray-<i>"``; returns when every worker has committed.

    ``episodes`` and ``steps`` are totals, split as evenly as possible across the workers (each one's share
    follows :func:`~trajstore.rollout.sample_until`'s rule; with ``mode="eval"``, each worker evaluates exactly
    its share of ``episodes``). Worker ``i``'s envs start from seed ``seed + i * num_envs`` (gym: env ``j`` from
    that ``+ j``; JAX: the key of ``seed + i``), so the same ``seed`` stores the same episodes on every run; every
    row stores ``seed`` as given (``worker_id`` and ``env_index`` tell the envs apart) and ``mode``.
    ``backend="gym"`` runs a gymnasium vector env (``policy(obs) -> actions``), ``"jax"`` a pure-JAX env under
    ``lax.scan`` (``policy(params, obs, key)``). A ``run_id`` the store already holds is refused (checked once,
    here) unless ``append=True``. Extra keywords are lineage columns. The workers' files are committed by one
    committer actor, at most once per ``commit_interval`` (a duration); a worker's flush returns once its files are
    committed, and a worker that dies before leaves files no version lists (``trajstore vacuum`` removes them).
    """
    check_positive("num_workers", num_workers)
    check_positive("num_envs", num_envs)
    seed = check_seed(seed)
    if backend not in ("gym", "jax"):
        raise InputError(f"backend: must be 'gym' or 'jax', got {backend!r}")
    if episodes is None and steps is None:
        raise InputError("rollout: give episodes=N or steps=N (totals over all workers), or both")
    if mode == "eval" and (episodes is None or steps is not None):
        raise InputError("mode='eval' runs exactly `episodes` complete episodes: give episodes=N and no steps=")
    store = open_store(uri, create=True, storage_options=storage_options)  # one clear error here, not one a worker
    check_run(store, run_id, mode=check_mode(mode), append=append)  # once: then the workers add to the run
    lineage["mode"] = mode
    shares = [(_share(episodes, num_workers, i), _share(steps, num_workers, i)) for i in range(num_workers)]
    counter = _Progress.remote(num_workers)  # type: ignore[attr-defined]
    committer = _Committer.options(max_concurrency=num_workers + 2, num_cpus=0).remote(  # type: ignore[attr-defined]
        uri, dict(storage_options or {}), seconds(commit_interval, "commit_interval"))
    started = time.perf_counter()
    try:
        futures = [_worker.remote(uri, dict(storage_options or {}), env, backend, i, e, s,  # type: ignore[call-arg]
                                  run_id, seed, num_envs, policy, params, lineage, counter, committer)  # see _worker
                   for i, (e, s) in enumerate(shares) if (e is None or e > 0) and (s is None or s > 0)]
        results = _wait(futures, counter, total=episodes if episodes is not None else steps,
                        by_episodes=episodes is not None, show=progress)
    finally:
        ray.get(committer.close.remote())
        ray.kill(committer)
    return _merged(results, run_id, time.perf_counter() - started)


def _share(total: int | None, workers: int, i: int) -> int | None:
    return None if total is None else total // workers + (1 if i < total % workers else 0)


@ray.remote
class _Progress:
    """The counts of every worker, for the driver's progress bar."""

    def __init__(self, workers: int) -> None:
        self.counts = [(0, 0)] * workers

    def report(self, worker: int, steps: int, episodes: int) -> None:
        self.counts[worker] = (steps, episodes)

    def totals(self) -> tuple[int, int]:
        return sum(c[0] for c in self.counts), sum(c[1] for c in self.counts)


@ray.remote
class _Committer:
    """The one committer of a rollout's workers: their files, committed in groups (threaded: the workers' hand-overs
    wait together for the next group)."""

    def __init__(self, uri: str, storage_options: dict[str, Any], interval_s: float) -> None:
        self.committer = Committer(uri, interval=interval_s, host=None, storage_options=storage_options or None)

    def commit(self, files: list[WrittenFile]) -> int | None:
        return self.committer.commit(files)

    def close(self) -> list[int]:
        self.committer.close()
        return self.committer.groups


class _HandedToActor:
    """A worker's way to the committer actor: ``commit(files)`` returns once they are committed."""

    def __init__(self, actor: Any) -> None:
        self.actor = actor

    def commit(self, files: list[WrittenFile]) -> None:
        ray.get(self.actor.commit.remote(list(files)))


@ray.remote  # type: ignore[arg-type]  # ray's types know remote functions of at most 9 arguments
def _worker(uri: str, storage_options: dict[str, Any], env: Any, backend: Backend, index: int,
            episodes: int | None, steps: int | None, run_id: str, seed: int, num_envs: int, policy: Any,
            params: Any, lineage: dict[str, Any], counter: Any, committer: Any) -> RolloutResult:
    store = _RunSeed(open_store(uri, create=True, storage_options=storage_options or None), seed,
                     _HandedToActor(committer))

    def report(s: int, e: int) -> None:
        counter.report.remote(index, s, e)

    worker_seed = seed + (index if backend == "jax" else index * num_envs)
    options = dict(run_id=run_id, num_envs=num_envs, episodes=episodes, steps=steps, seed=worker_seed,
                   policy=policy, append=True, progress=report, worker_id=f"ray-{index}", **lineage)
    if backend == "jax":
        from trajstore.rollout.jax_loop import jax_rollout

        return jax_rollout(store, env, params=params, **options)
    from trajstore.rollout.gym_loop import gym_rollout

    return gym_rollout(store, env, **options)


class _RunSeed:
    """A worker's store, whose writers record the run's ``seed`` (the worker's envs start from one derived from
    it), so that every row of a run has the seed it was given, and hand their files to the rollout's committer."""

    def __init__(self, store: Store, seed: int, committer: Any = None) -> None:
        self.store, self.seed, self.root, self.committer = store, seed, store.root, committer

    def writer(self, **options: Any) -> Any:
        return self.store.writer(**{**options, "seed": self.seed, "committer": self.committer})

    def runs(self) -> pa.Table:
        return self.store.runs()

    def sql(self, query: str) -> pa.Table:
        return self.store.sql(query)


def _wait(futures: list[Any], counter: Any, *, total: int | None, by_episodes: bool,
          show: bool) -> list[RolloutResult]:
    pending, done = list(futures), []
    with progress_bar.bar(total=total, unit="ep" if by_episodes else "step", desc=f"rollout x{len(futures)}",
                          enabled=show, unit_scale=not by_episodes) as bar:
        while pending:
            ready, pending = ray.wait(pending, num_returns=len(pending), timeout=0.5)
            done += ray.get(ready)
            steps, episodes = ray.get(counter.totals.remote())
            bar.n = episodes if by_episodes else steps
            bar.set_postfix({"steps": f"{steps:,}", "episodes": episodes, "workers left": len(pending)},
                            refresh=True)
    return done


def _merged(results: list[RolloutResult], run_id: str, seconds: float) -> RolloutResult:
    env_ids = sorted({r.env_id for r in results})
    out = RolloutResult(run_id=run_id, env_id=",".join(env_ids), seconds=seconds)
    for r in results:
        out.steps += r.steps
        out.episodes += r.episodes
        out.episode_returns = [*out.episode_returns, *np.asarray(r.episode_returns).tolist()]
        out.episode_lengths = [*out.episode_lengths, *np.asarray(r.episode_lengths).tolist()]
    return out
