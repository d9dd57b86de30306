"""Helpers for the storage tests: rows as a remote writer sends them (already cut into episodes), stores of two
runs written in many small files, and a column of a name no write path takes any more, planted as a writer
committed it before names were checked."""

from __future__ import annotations

import tempfile
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

import trajstore
from tests.helpers import make_batch, steps_table


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


def plant_column(store: trajstore.Store, name: str, *, run_id: str = "old", env_id: str = "E", seed: int = 0) -> int:
    """Commit a file of ``run_id`` holding an extra column called ``name`` as a writer did before names were
    checked (the probe of issue 47): through the table's own API under the writers' checks (the column reserved in
    the log, the file written, then committed), into a store holding steps of ``make_batch``'s kind. The file is a
    real writer's, with its column renamed. Returns its rows (every value of the column is 1.0)."""
    with tempfile.TemporaryDirectory() as scratch:
        other = trajstore.open(scratch, create=True)
        with other.writer(run_id=run_id, env_id=env_id) as w:
            w.add_batch(make_batch(np.random.default_rng(seed), 6, 2, extras={"planted": np.ones((6, 2), np.float32)}))
        (written,) = other.maintain.files()
        data = pq.read_table(written.path)
    data = data.rename_columns([name if n == "planted" else n for n in data.column_names]).replace_schema_metadata(
        data.schema.metadata)  # the footer's format (its stored names) kept
    steps_table(store).reserve({name: pa.float32()})
    steps_table(store).commit(steps_table(store).write(data, run_id=run_id, env_id=env_id))
    return data.num_rows
