"""Helpers for the storage tests: rows as a remote writer sends them (already cut into episodes), and stores
of two runs written in many small files."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa

import trajstore
from tests.helpers import make_batch


def rows(n: int = 4, episode_id: int = 7, **change: Any) -> pa.Table:
    """Steps ``0..n-1`` of one episode, terminated at the last; ``change`` replaces columns (None drops one)."""
    cols: dict[str, Any] = {
        "episode_id": pa.array([episode_id] * n, pa.int64()), "step": pa.array(range(n), pa.int32()),
        "obs": pa.array([[0.0, 1.0]] * n, pa.list_(pa.float32(), 2)), "action": pa.array([1] * n, pa.int64()),
        "reward": pa.array([1.0] * n, pa.float32()), "next_obs": pa.array([[1.0, 0.0]] * n, pa.list_(pa.float32(), 2)),
        "terminated": pa.array([False] * (n - 1) + [True]), "truncated": pa.array([False] * n)}
    for name, value in change.items():
        if value is None:
            cols.pop(name)
        else:
            cols[name] = value
    return pa.table(cols)


def episode(steps: list[int], episode_id: int = 7, *, end: bool = False) -> pa.Table:
    """Rows of one episode at ``steps`` (in that order); the last one terminated with ``end``."""
    n = len(steps)
    return rows(n, episode_id, step=pa.array(steps, pa.int64()), terminated=pa.array([False] * (n - 1) + [end]))


def fill_two_runs(store: trajstore.Store, *, seed: int, batches: int, steps: int, envs: int) -> None:
    """Runs ``a`` and ``b`` of env ``E``, each ``batches`` batches of ``(steps, envs)``, one file per batch."""
    rng = np.random.default_rng(seed)
    for run in ("a", "b"):
        with store.writer(run_id=run, env_id="E", flush_bytes=1, upkeep=None) as w:  # no merging
            for _ in range(batches):
                w.add_batch(make_batch(rng, steps, envs))
