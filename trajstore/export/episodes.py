"""The episodes an export writes, one at a time: their steps in order, as numpy arrays."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError

if TYPE_CHECKING:
    from trajstore.store import Store

COLUMNS = ("episode_id", "step", "obs", "next_obs", "action", "reward", "terminated", "truncated")


@dataclass
class Episode:
    """One stored episode: ids, then ``(T, …)`` arrays of its steps in order."""

    run_id: str
    env_id: str
    episode_id: int
    obs: np.ndarray
    next_obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    def __len__(self) -> int:
        return len(self.reward)


@dataclass
class ExportResult:
    """What an export wrote: where, how many episodes and steps, from which runs."""

    target: str
    episodes: int = 0
    steps: int = 0
    runs: list[str] = field(default_factory=list)
    kind: str = ""

    def format(self) -> str:
        return (f"exported {self.episodes} episode(s), {self.steps} step(s) of run(s) {', '.join(self.runs)} "
                f"as {self.kind} {self.target}")

    __str__ = format


def episodes(store: Store, *, run_id: str | Sequence[str] | None = None, where: str | None = None) -> list[pa.Table]:
    """The selected episodes' steps, one table per episode in ``episode_id`` order (flat array observations)."""
    runs = [run_id] if isinstance(run_id, str) else list(run_id or [])
    missing = [r for r in runs if r not in store.run_ids()]
    if missing:
        from trajstore.errors import RunNotFoundError

        raise RunNotFoundError(f"run_id: no run {', '.join(map(repr, missing))} in {store.uri}; its runs: "
                               f"{', '.join(store.run_ids()) or 'none yet'}")
    table = store.scan(["run_id", "env_id", *COLUMNS], run_id=runs or None, where=where).read_all()
    if table.num_rows == 0:
        raise InputError(f"run_id/where: nothing to export from {store.uri} (run_id={run_id!r}, where={where!r})")
    for name in ("obs", "action"):
        t = table.schema.field(name).type
        if pa.types.is_struct(t):
            raise InputError(f"{name}: Dict observation/action spaces (struct columns) are not exported yet")
    table = table.sort_by([("episode_id", "ascending"), ("step", "ascending")])
    ids = table["episode_id"].to_numpy()
    cuts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1], True])
    return [table.slice(a, b - a) for a, b in zip(cuts[:-1], cuts[1:])]


def as_episode(steps: pa.Table) -> Episode:
    """One episode's table as numpy arrays (observations ``(T, *shape)``)."""
    return Episode(steps["run_id"][0].as_py(), steps["env_id"][0].as_py(), steps["episode_id"][0].as_py(),
                   _array(steps["obs"]), _array(steps["next_obs"]), _array(steps["action"]),
                   steps["reward"].to_numpy(), steps["terminated"].to_numpy(zero_copy_only=False),
                   steps["truncated"].to_numpy(zero_copy_only=False))


def _array(column: pa.ChunkedArray | pa.Array) -> Any:
    """A column as a numpy array; fixed-size lists (nested for images) as ``(n, *shape)``."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    if pa.types.is_fixed_size_list(arr.type):
        inner = _array(arr.flatten())
        return inner.reshape(len(arr), arr.type.list_size, *inner.shape[1:])
    if pa.types.is_list(arr.type) or pa.types.is_large_list(arr.type):
        return np.stack([np.asarray(v) for v in arr.to_pylist()]) if len(arr) else np.zeros((0,))
    return arr.to_numpy(zero_copy_only=False)
