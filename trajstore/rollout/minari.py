"""Importing Minari datasets: every episode of a local Minari dataset into a store, with a progress bar.

Minari (the Farama Foundation's offline-RL format) keeps an episode as ``T + 1`` observations and ``T``
actions, rewards, terminations and truncations. Each episode becomes ``T`` rows of ``steps``:
``obs = observations[:-1]``, ``next_obs = observations[1:]``, the two flags kept apart. An episode
whose last step has neither flag (its collector stopped mid-episode) is stored incomplete and never
merged with the next one. The dataset's spaces give the column types (Dict spaces become structs).
Needs the ``minari`` extra (``pip install 'trajstore[minari]'``).

>>> result = import_minari(store, "cartpole/random-v0")  # doctest: +SKIP
>>> store.stats(run_id=result.run_id)                     # doctest: +SKIP
"""

from __future__ import annotations

import time
from typing import Any

import numpy as np

from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.rollout.progress import RolloutProgress
from trajstore.rollout.sampling import RolloutResult
from trajstore.rollout.target import RolloutTarget


def import_minari(store: RolloutTarget, dataset: Any, *, run_id: str | None = None, env_id: str | None = None,
                  progress: bool = True) -> RolloutResult:
    """Store every episode of ``dataset`` (a Minari dataset id or a loaded ``MinariDataset``).

    ``run_id`` defaults to the dataset id (``/`` becomes ``-``), ``env_id`` to the id of the
    environment the dataset was collected in. Returns what was stored; ``episodes`` counts the
    complete ones.
    """
    with needed("minari", "importing a Minari dataset"):
        import minari
    if isinstance(dataset, str):
        try:
            dataset = minari.load_dataset(dataset)
        except (FileNotFoundError, ValueError):
            local = sorted(minari.list_local_datasets()) or "none"
            raise InputError(f"dataset: no local Minari dataset {dataset!r}; download it first (`minari download "
                             f"{dataset}`) or give one of the local ones: {local}") from None
    name = dataset.spec.dataset_id.replace("/", "-")
    env_spec = dataset.spec.env_spec
    result = RolloutResult(run_id=run_id or name, env_id=env_id or (env_spec.id if env_spec is not None else name))
    start = time.perf_counter()
    imported = 0
    with RolloutProgress(episodes=dataset.total_episodes, steps=None, enabled=progress, desc="import") as bar, \
            store.writer(run_id=result.run_id, env_id=result.env_id, observation_space=dataset.observation_space,
                         action_space=dataset.action_space) as writer:
        for episode in dataset.iterate_episodes():
            T = len(episode.rewards)
            if T:
                writer.add_batch(_batch(episode, T))
                writer.reset([0])  # the episode ends here, with or without a flag
            imported += 1
            result.steps += T
            if T and (episode.terminations[-1] or episode.truncations[-1]):
                result.episodes += 1
                result.episode_returns.append(float(np.sum(episode.rewards)))
                result.episode_lengths.append(T)
            bar.update(steps=result.steps, episodes=imported, returns=result.episode_returns[-1:])
        bar.finish(steps=result.steps, episodes=imported)
    result.seconds = time.perf_counter() - start
    return result


def _batch(episode: Any, T: int) -> dict[str, Any]:
    """One Minari episode as a time-major batch of one environment: ``(T, 1, …)``."""
    return {"obs": _steps(episode.observations, 0, T), "next_obs": _steps(episode.observations, 1, T + 1),
            "action": _steps(episode.actions, 0, T), "reward": np.asarray(episode.rewards)[:, None],
            "terminated": np.asarray(episode.terminations, bool)[:, None],
            "truncated": np.asarray(episode.truncations, bool)[:, None]}


def _steps(value: Any, start: int, stop: int) -> Any:
    if isinstance(value, dict):
        return {k: _steps(v, start, stop) for k, v in value.items()}
    return np.asarray(value)[start:stop, None]
