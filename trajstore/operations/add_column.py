"""Derived columns: a value per stored step (a shaped reward, a relabelled goal) written into the files.

:func:`add_column` computes ``name`` one ``(run_id, env_id)`` partition at a time (an episode never leaves its
partition, so window expressions over whole episodes see every step), from DuckDB SQL over the ``steps`` view
or from a Python function of the partition's steps; rewrites the files holding the rows that get a value with
the new column added; and swaps them in with one commit
(:meth:`Log.swap <trajstore.storage.log.Log.swap>`), just after a commit that gives the log's schema the column
(until the swap, and if it fails, the column reads as null). Afterwards
the column is a stored column like any extra: ``steps`` in SQL, scans, stats ``by=``, REST. Rows that get no
value (outside ``where``, a condition over ``episodes``, and ``steps_where``, a condition over ``steps``, or
appended while it ran) read as null. Older versions keep reading the old files.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trajstore.errors import InputError, QueryError, caller_sql_error
from trajstore.operations.delete import check_episodes_condition
from trajstore.query import sql
from trajstore.query.sql import Where
from trajstore.storage.log import DataFile, WrittenFile, files_holding
from trajstore.storage.names import check_column_name, check_distinct

if TYPE_CHECKING:
    from trajstore.query.engine import Engine

ROW = "__trajstore_row"


@dataclass
class AddColumnReport:
    """What :func:`add_column` wrote: the column and its type, rows given a value, files rewritten, version."""

    name: str
    type: pa.DataType | None = None
    rows: int = 0
    files_rewritten: int = 0
    version: int | None = None

    def format(self) -> str:
        return (f"added column {self.name!r} ({self.type}): {self.rows} row(s) in {self.files_rewritten} rewritten "
                f"file(s)" + (f", version {self.version}" if self.version is not None else ""))

    __str__ = format


def add_column(engine: Engine, name: str, expression: str | Callable[[pa.Table], Any], *,
               where: Where | None = None, steps_where: str | None = None) -> AddColumnReport:
    """Write the derived column ``name`` (see the module's description); one commit."""
    engine.table.log.writable("add_column")
    state = engine.table.log.read()
    files = [] if state is None else state.files
    _check_name(engine, name, files)
    if not (isinstance(expression, str) and expression.strip()) and not callable(expression):
        raise InputError(f"expression: expected DuckDB SQL over steps or a function of a pyarrow Table, got "
                         f"{expression!r}")
    report = AddColumnReport(name)
    partitions: dict[tuple[str, str], list[DataFile]] = {}
    for f in files:
        partitions.setdefault((f.run_id, f.env_id), []).append(f)
    removed: list[DataFile] = []
    written: list[WrittenFile] = []
    try:
        for part in sorted(partitions):
            values = _values(engine, partitions[part], expression, where, steps_where)
            if values.num_rows == 0:
                continue
            report.type = report.type or values["value"].type
            values = values.set_column(2, "value", _cast(values["value"], report.type, name))
            report.rows += values.num_rows
            _rewrite(engine, partitions[part], values, name, removed, written)
        report.files_rewritten = len(written)
        if written:
            report.version = engine.table.log.swap(state, removed, written, metadata={  # type: ignore[arg-type]
                "operation": "add_column", "column": name, "rows": report.rows})
    except BaseException as exc:
        engine.table.discard([w.path for w in written], exc)
        raise
    return report


def _check_name(engine: Engine, name: str, files: list[DataFile]) -> None:
    """Refuse a ``name`` no column users give can take (:func:`~trajstore.storage.names.check_column_name`), a
    column of the views already, or one that differs only in case from one of them or from a column of the table's
    schema (those of files since deleted too)."""
    with engine.snapshot(files) as snap:
        known = snap.step_columns + snap.columns("episodes")
    if name in known:
        raise InputError(f"name: {name!r} is already a column of steps or episodes; choose another name")
    check_column_name(name, field="name")
    check_distinct([name], [*known, *engine.table.column_names()], field="name")


def _values(engine: Engine, files: list[DataFile], expression: Any, where: Where | None,
            steps_where: str | None) -> pa.Table:
    """``(episode_id, step, value)`` for one partition's rows that get a value."""
    condition = sql.chosen_steps(where, steps_where)
    with engine.snapshot(files) as snap:
        check_episodes_condition(snap, where)
        try:
            if isinstance(expression, str):
                out = snap.arrow(sql.derived_values(expression, condition))
                return out.rename_columns(["episode_id", "step", "value"])
            rows = snap.arrow(sql.ordered_steps(condition))
        except QueryError as exc:
            field = "expression" if isinstance(expression, str) else "where" if where else "steps_where"
            raise caller_sql_error(exc, field, f"expression {expression!r} over the steps view, where {where!r} "
                                              f"over episodes, steps_where {steps_where!r} over steps") from None
    value = expression(rows)
    arr = value.combine_chunks() if isinstance(value, pa.ChunkedArray) else pa.array(np.asarray(value)) \
        if not isinstance(value, pa.Array) else value
    if len(arr) != rows.num_rows:
        raise InputError(f"expression: the function returned {len(arr)} values for a table of {rows.num_rows} "
                         "rows; return one value per row")
    return pa.table({"episode_id": rows["episode_id"], "step": rows["step"], "value": arr})


def _cast(values: pa.ChunkedArray, to: pa.DataType, name: str) -> pa.ChunkedArray:
    if values.type == to:
        return values
    try:
        return values.cast(to)
    except (pa.ArrowInvalid, pa.ArrowNotImplementedError) as exc:
        raise InputError(f"expression: column {name!r} is {to} in one partition and {values.type} in another, "
                         f"which do not convert: {exc}") from None


def _rewrite(engine: Engine, files: list[DataFile], values: pa.Table, name: str, removed: list[DataFile],
             written: list[WrittenFile]) -> None:
    """Each file of ``files`` holding a row of ``values``, written again with the column ``name``."""
    ids = np.unique(values["episode_id"].to_numpy())
    for f in files_holding(files, ids):
        data = pq.ParquetFile(f.path, filesystem=f.fs).read()  # no partition columns from the path
        keyed = data.select(["episode_id", "step"]).append_column(ROW, pa.array(np.arange(data.num_rows)))
        joined = keyed.join(values, ["episode_id", "step"], join_type="left outer").sort_by(ROW)
        if joined["value"].null_count == data.num_rows:
            continue
        removed.append(f)
        written.append(engine.table.write(data.append_column(name, joined["value"]), run_id=f.run_id,
                                         env_id=f.env_id))
