"""Appending rows that arrive already cut into episodes (from a :class:`~trajstore.remote.writer.RemoteWriter`).

A remote writer segments its batches itself, exactly as a local :class:`~trajstore.storage.writer.Writer`
does, and sends each commit as an Arrow table of rows. :func:`validate_rows` checks those rows
against the ``steps`` schema and what the store already holds; :func:`append_rows` commits them
once per idempotency key.
"""

from __future__ import annotations

import threading
from datetime import datetime, timezone

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore import schema as sch
from trajstore.errors import InputError, SchemaMismatchError
from trajstore.storage.table import StepsTable

KEYS = {"episode_id": pa.int64(), "step": pa.int32()}
_LOCKS = [threading.Lock() for _ in range(64)]  # striped by key: a retry waits for the first attempt


def validate_rows(rows: pa.Table, stored: pa.Schema | None) -> pa.Table:
    """``rows`` checked and cast to the store's types; raises naming the first bad field."""
    present = set(rows.column_names)
    for name in sch.PARTITION_COLUMNS:
        if name in present:
            raise InputError(f"{name}: comes from the request (path or query), not from a column of the body")
    missing = [c for c in (*KEYS, *sch.TRANSITION_COLUMNS) if c not in present]
    if missing:
        raise InputError(f"{missing[0]}: missing column; rows need {[*KEYS, *sch.TRANSITION_COLUMNS]}")
    for name in rows.column_names:
        if rows[name].null_count and name in (*KEYS, *sch.TRANSITION_COLUMNS):
            raise InputError(f"{name}: {rows[name].null_count} null value(s); every row needs one")
    rows = _cast_keys(rows)
    if "wall_time" not in present:  # stamped on arrival when the sender did not
        now = pa.scalar(datetime.now(timezone.utc), pa.timestamp("us", tz="UTC"))
        rows = rows.append_column("wall_time", pa.repeat(now, rows.num_rows))
    _check_flags_and_rewards(rows)
    _check_unique_steps(rows)
    if stored is not None:
        for field in rows.schema:
            if field.name in stored.names and not sch.compatible(stored.field(field.name).type, field.type):
                raise SchemaMismatchError(f"{field.name}: the store holds {stored.field(field.name).type}, "
                                          f"got {field.type}")
        rows = _cast_to(rows, stored)
    return rows


def _cast_keys(rows: pa.Table) -> pa.Table:
    for name, t in KEYS.items():
        col = rows[name]
        if not pa.types.is_integer(col.type):
            raise InputError(f"{name}: expected integers, got {col.type}")
        if name == "step" and len(col) and pc.min(col).as_py() < 0:
            raise InputError("step: must be >= 0")
        rows = rows.set_column(rows.schema.get_field_index(name), name, col.cast(t))
    return rows


def _check_flags_and_rewards(rows: pa.Table) -> None:
    for name in ("terminated", "truncated"):
        if not pa.types.is_boolean(rows[name].type):
            raise InputError(f"{name}: expected bool, got {rows[name].type}")
    reward = rows["reward"]
    if not (pa.types.is_floating(reward.type) or pa.types.is_integer(reward.type)):
        raise InputError(f"reward: expected float32 or float64, got {reward.type}")
    values = reward.to_numpy()
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        ep, step = rows["episode_id"][i].as_py(), rows["step"][i].as_py()
        raise InputError(f"reward must be finite: got {values[i]} at row {i} (episode_id {ep}, step {step})")


def _check_unique_steps(rows: pa.Table) -> None:
    keys = rows.select(list(KEYS)).group_by(list(KEYS)).aggregate([([], "count_all")])
    dup = keys.filter(pc.greater(keys["count_all"], 1))
    if dup.num_rows:
        ep, step = dup["episode_id"][0].as_py(), dup["step"][0].as_py()
        raise InputError(f"step: episode_id {ep} has step {step} more than once")


def _cast_to(rows: pa.Table, stored: pa.Schema) -> pa.Table:
    for i, field in enumerate(rows.schema):
        if field.name in stored.names and stored.field(field.name).type != field.type:
            rows = rows.set_column(i, field.name, rows[field.name].cast(stored.field(field.name).type))
    return rows


def append_rows(table: StepsTable, rows: pa.Table, *, run_id: str, env_id: str,
                idempotency_key: str | None = None) -> tuple[str | None, bool]:
    """Commit ``rows`` once; returns ``(file, duplicate)``. A key already committed is a no-op."""
    rows = validate_rows(rows, table.file_schema())
    if idempotency_key is None:
        return table.append(rows, run_id=run_id, env_id=env_id), False
    app_id = f"trajstore-ingest:{idempotency_key}"
    with _LOCKS[hash(app_id) % len(_LOCKS)]:
        if table.has_transaction(app_id):
            return None, True
        return table.append(rows, run_id=run_id, env_id=env_id, app_id=app_id), False
