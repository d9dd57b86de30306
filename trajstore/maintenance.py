"""``store.maintain``: what keeps a store's table in shape, grouped apart from the researcher's reads.

The table is a Delta table other engines read and maintain too (see "The open-table rule"), and these are the
changes and checks of the table as a whole that a maintainer runs (by hand, or on a schedule), as deltalake
groups ``dt.optimize.compact()`` and ``dt.alter.add_columns()``: deleting episodes, deriving a column, compacting,
vacuuming old versions' files, checking the files and the episodes, and describing the stored columns to another
engine. Each method makes one call into its module of :mod:`trajstore.operations` (or the query layer), with the
read engine of the store that made it.

>>> import trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> store.maintain.check().ok
True
"""

from __future__ import annotations

from datetime import timedelta
from typing import TYPE_CHECKING, Any, Callable

import pyarrow as pa

from trajstore.errors import InputError
from trajstore.operations import add_column as add_column_op
from trajstore.operations import check as check_op
from trajstore.operations import compact as compact_op
from trajstore.operations import delete as delete_op
from trajstore.operations import retention as retention_op
from trajstore.operations import vacuum as vacuum_op
from trajstore.query import spark_sql
from trajstore.query.engine import Engine
from trajstore.query.filters import Names, names_of
from trajstore.query.snapshot import decoding_sql
from trajstore.query.sql import Where
from trajstore.schema import describe

if TYPE_CHECKING:
    from trajstore.loaders.layout_store import LayoutStore
    from trajstore.operations.add_column import AddColumnReport
    from trajstore.operations.check import CheckReport
    from trajstore.operations.compact import CompactReport
    from trajstore.operations.delete import DeleteReport
    from trajstore.operations.retention import RetentionReport
    from trajstore.operations.vacuum import VacuumReport
    from trajstore.storage.log import DataFile


class Maintenance:
    """The maintenance of one store (``store.maintain``): changes of its table as a whole, checks, and what another
    engine needs to read it. Made by the :class:`~trajstore.store.Store`; one per store."""

    def __init__(self, engine: Engine, layouts: LayoutStore) -> None:
        self._engine, self._layouts = engine, layouts

    def __repr__(self) -> str:
        return f"Maintenance({self._engine.uri!r})"

    # --- checks -----------------------------------------------------------------------------------------------

    def check(self, *, deep: bool = False) -> CheckReport:
        """Check one committed version: committed files readable, episodes whole and unique; orphan files and small
        files reported. Never raises for a damaged store, reports instead (see :mod:`trajstore.operations.check`).
        ``trajstore.check(store)`` and ``trajstore check`` are this."""
        return check_op.check(self._engine, deep=deep)

    def files(self) -> list[DataFile]:
        """The committed Parquet files of the version this store reads."""
        return self._engine.files()

    # --- changes ----------------------------------------------------------------------------------------------

    def delete(self, *, run_id: Names = None, where: Where | None = None, steps_where: str | None = None,
               dry_run: bool = False) -> DeleteReport:
        """Delete whole episodes in one commit: every episode of ``run_id``, and/or every episode ``where`` (a
        condition over ``episodes``, as for every reader) selects, and/or every episode whose steps
        ``steps_where`` (a condition over ``steps``) all select; refused if ``steps_where`` selects part of an
        episode. Returns what was deleted (see :mod:`trajstore.operations.delete`). Deleting a whole run
        (``run_id`` alone) also ends its description."""
        report = delete_op.delete(self._engine, run_id=run_id, where=where, steps_where=steps_where,
                                  dry_run=dry_run)
        if run_id is not None and not where and not steps_where and not dry_run:
            self._engine.descriptions.forget(names_of(run_id))
        return report

    def add_column(self, name: str, expression: str | Callable[[pa.Table], Any], *, where: Where | None = None,
                   steps_where: str | None = None) -> AddColumnReport:
        """Write a derived column ``name`` into the stored steps, in one commit: ``expression`` is DuckDB SQL over
        the steps' columns (``"reward * 0.5 + 0.1"``) or a function of a pyarrow Table of a file's steps returning
        an array. With ``where`` (a condition over ``episodes``) only the steps of those episodes, with
        ``steps_where`` (a condition over ``steps``) only those steps get a value, the others null (see
        :mod:`trajstore.operations.add_column`)."""
        return add_column_op.add_column(self._engine, name, expression, where=where, steps_where=steps_where)

    def compact(self, *, run_id: Names = None, env_id: Names = None, target_bytes: int = compact_op.TARGET_BYTES,
                progress: bool = True) -> CompactReport:
        """Rewrite the partitions (of ``run_id``/``env_id``, or all) whose files could be fewer, one commit each
        (see :mod:`trajstore.operations.compact`); writers also do it as they go."""
        return compact_op.compact(self._engine, run_id=run_id, env_id=env_id, target_bytes=target_bytes,
                                  progress=progress)

    def vacuum(self, *, older_than: float | str | timedelta = "7d", dry_run: bool = False) -> VacuumReport:
        """Delete the files no version committed within ``older_than`` (seconds, a timedelta, or ``"7d"``,
        ``"12h"``, ``"30m"``) needs: files deleted or compacted away before then, and files no commit ever listed
        (see :mod:`trajstore.operations.vacuum`). With ``dry_run``, only list them."""
        return vacuum_op.vacuum(self._engine, self._layouts, older_than=older_than, dry_run=dry_run)

    def log_retention(self, log_retention: float | str | timedelta | None = None, *,
                      checkpoint_interval: int | None = None) -> RetentionReport:
        """Each table's log retention and checkpoint interval, and the versions its log still reads; given
        ``log_retention`` (``"7d"``, ``"1h"``, at least a minute) and/or ``checkpoint_interval`` (versions), first set
        them on every table of the store: the Delta table properties ``delta.logRetentionDuration`` /
        ``delta.checkpointInterval``, which other engines honour too (one commit per table that changes). A version
        older than the retention can no longer be read (see :mod:`trajstore.operations.retention`)."""
        if log_retention is None and checkpoint_interval is None:
            return retention_op.report(self._engine)
        kept = retention_op.report(self._engine).log_s if log_retention is None else log_retention
        return retention_op.set_log_retention(self._engine, kept, checkpoint_interval=checkpoint_interval)

    def remove_orphans(self, *, older_than_s: float = 3600.0) -> list[str]:
        """Delete the files no version lists that are at least ``older_than_s`` old (see
        :func:`trajstore.operations.check.remove_orphans`); returns them."""
        return check_op.remove_orphans(self._engine, older_than_s=older_than_s)

    # --- the table as other engines see it ------------------------------------------------------------------------

    def stored_columns(self) -> list[dict[str, Any]]:
        """The Delta table's columns as stored: ``name``, ``type`` (as the log records it) and, where a column is
        not simply its field's values under its field's name, ``declared`` (what it holds: its field, how it is
        stored, its type; see :func:`~trajstore.storage.encoding.declaration`)."""
        state = self._engine.table.log.read()
        if state is None:
            return []
        return [{"name": f.name, "type": describe(f.type), "declared": state.declarations.get(f.name)}
                for f in state.schema]

    def decoding_sql(self, *, source: str = "stored_steps", dialect: str = "duckdb") -> str:
        """SQL that decodes this version's stored columns into the steps trajstore's readers give, for another
        engine to run unchanged over the relation ``source`` (the table's stored rows): DuckDB's (see
        :func:`~trajstore.query.snapshot.decoding_sql`) or, with ``dialect="spark"``, Spark SQL's (see
        :mod:`~trajstore.query.spark_sql`)."""
        if dialect not in ("duckdb", "spark"):
            raise InputError(f"dialect: expected 'duckdb' or 'spark', got {dialect!r}")
        files = self._engine.files()
        if dialect == "spark":
            return spark_sql.decoding_sql(files, self._engine.file_schemas(files), source=source)
        return decoding_sql(files, self._engine.file_schemas(files), source=source)
