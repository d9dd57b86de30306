"""Export to Minari: a run's episodes (or those a condition selects) as a local Minari dataset.

Each stored episode of ``T`` steps becomes a Minari episode of ``T + 1`` observations (``obs`` of every step,
then the last step's ``next_obs``) and ``T`` actions, rewards, terminations and truncations, the two flags kept
apart: the inverse of :mod:`trajstore.rollout.minari`. The spaces are the environment's when gymnasium knows
its ``env_id`` and its observations have the stored shape, else a ``Box`` of the stored shape and dtype (and
``Discrete`` actions for integer scalar actions). ``minari.load_dataset(name)`` opens the result (it is written
under ``$MINARI_DATASETS_PATH``). Needs the ``minari`` extra.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
from tqdm.auto import tqdm

from trajstore.errors import InputError
from trajstore.export.episodes import Episode, ExportResult, as_episode, episodes

if TYPE_CHECKING:
    from trajstore.store import Store


def export_minari(store: Store, dataset_id: str, *, run_id: str | Sequence[str] | None = None,
                  where: str | None = None, data_format: str = "arrow", progress: bool = False) -> ExportResult:
    """Write the episodes of ``run_id`` (selected by ``where``, a condition over the episodes view) as the
    Minari dataset ``dataset_id``; refused if it exists already. ``progress``: a bar over the episodes."""
    try:
        import minari
        from minari.data_collector import EpisodeBuffer
    except ImportError:
        raise InputError("exporting a Minari dataset needs the minari extra: pip install 'trajstore[minari]'") \
            from None
    if dataset_id in minari.list_local_datasets():
        raise InputError(f"name: a local Minari dataset {dataset_id!r} exists already; choose another id or "
                         "delete it (minari delete …)")
    eps = [as_episode(t) for t in tqdm(episodes(store, run_id=run_id, where=where), desc="export",
                                       unit="episode", disable=not progress)]
    env, obs_space, act_space = _spaces(eps)
    buffers = [EpisodeBuffer(id=i, observations=np.concatenate([e.obs, e.next_obs[-1:]]), actions=e.action,
                             rewards=e.reward.tolist(), terminations=e.terminated.tolist(),
                             truncations=e.truncated.tolist()) for i, e in enumerate(eps)]
    minari.create_dataset_from_buffers(dataset_id, buffers, env=env, observation_space=obs_space,
                                       action_space=act_space, algorithm_name="trajstore export",
                                       description=f"exported by trajstore from {store.uri} at version "
                                                   f"{store.version}", data_format=data_format)
    runs = sorted({e.run_id for e in eps})
    return ExportResult(dataset_id, len(eps), sum(len(e) for e in eps), runs, "Minari dataset")


def _spaces(eps: list[Episode]) -> tuple[Any, Any, Any]:
    """The environment (when gymnasium knows it and it fits) and the observation and action spaces."""
    import gymnasium as gym

    first = eps[0]
    envs = {e.env_id for e in eps}
    if len(envs) == 1:
        try:
            env = gym.make(first.env_id)
        except Exception:  # noqa: BLE001 - an env gymnasium does not know: spaces from the data
            env = None
        if env is not None:
            fits = env.observation_space.shape == first.obs.shape[1:]
            env.close()
            if fits:
                return first.env_id, env.observation_space, env.action_space
    obs = gym.spaces.Box(-np.inf, np.inf, shape=first.obs.shape[1:], dtype=first.obs.dtype)
    if np.issubdtype(first.action.dtype, np.integer) and first.action.ndim == 1:
        n = int(max(e.action.max() for e in eps if len(e))) + 1
        return None, obs, gym.spaces.Discrete(n)
    return None, obs, gym.spaces.Box(-np.inf, np.inf, shape=first.action.shape[1:], dtype=first.action.dtype)
