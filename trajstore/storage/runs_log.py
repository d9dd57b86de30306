"""The ``runs`` table (``<store>/runs/``): one row per change of a run's description, a Delta table of its own beside
``steps/``, and the one module that reads and writes its log (as :mod:`~trajstore.storage.log` is for ``steps``).

Why a table of its own (issue 47): a description kept as a property of the ``steps`` table lives in the log's
``metaData`` action, which holds every property at once, so each change rewrote every run's description (20 notes of
1 MB made a 238 MB log, 22 MB per commit, and every new writer loaded it all). Here a change is one appended row: a
commit's log entry names one small Parquet file, whatever the other runs hold.

The table follows the open-table rule: its columns mean what their names say, each column's meaning is its Delta field
comment (field metadata ``comment``, which Spark shows) and the table's description says how to read it, so another
engine reads ``<store>/runs/`` without trajstore:

- ``run_id``, ``revision``: the run and this row's number among its rows, from 1. A run's description is its row with
  the highest ``revision``, unless that row is ``deleted``;
- ``config`` (the config as JSON text), ``tags``, ``notes``: what describes the run from this change on;
- ``created``, ``trajstore_version``, ``git_commit``, ``host``: when the run was first described and by what program
  (carried from row to row);
- ``changed_at``: when this row was written; ``steps_version``: the latest version of ``steps/`` then (a reader of
  ``steps`` at version N takes the rows with ``steps_version`` <= N);
- ``deleted``: the run was deleted; its description ends here.

Rows are only ever appended. A change is planned on the table's latest version and committed as the version right
after it, never rebased: when another commit took that version, the change is planned again on what the table then
holds (so a writer adding its tags and a ``set_run`` racing it both land, neither undoing the other). Every commit
carries a marker, and a commit whose sending raised is settled from the log
(:func:`~trajstore.storage.landing.settle`) before anything is said or removed, as for the ``steps`` table.
"""

from __future__ import annotations

import json
import logging
import threading
import time
import uuid
from pathlib import Path
from typing import Callable
from urllib.parse import unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties

from trajstore.errors import CommitError, StoreDamagedError, first_line, one_line
from trajstore.retry import tries
from trajstore.storage.landing import Attempt, settle
from trajstore.storage.location import Location, explain
from trajstore.storage.log import GAP, Log, unneeded_files
from trajstore.storage.retention import DEFAULT, Retention
from trajstore.storage.table import fsync_file

log = logging.getLogger(__name__)

FOLDER = "runs"
COMMIT_RETRIES = 50  # a change's tries while other changes keep taking the version it was planned after
COMPACT_FILES = 200  # files of the table past which a change merges them (each change adds one)
DESCRIPTION = ("trajstore: one row per change of a run's description. A run's description is its row with the highest "
               "revision, unless that row is deleted; a reader of steps/ at version N takes the rows whose "
               "steps_version <= N.")


def _column(name: str, kind: pa.DataType, comment: str) -> pa.Field:
    return pa.field(name, kind, metadata={"comment": comment})


SCHEMA = pa.schema([
    _column("run_id", pa.string(), "the run this row describes (the run_id of its steps)"),
    _column("revision", pa.int64(), "this row's number among the run's rows, from 1: the highest is the description"),
    _column("config", pa.string(), "the run's config (hyperparameters, algorithm...) as JSON text of an object; "
                                   "null in a row that deletes the description"),
    _column("tags", pa.list_(pa.string()), "the run's tags"),
    _column("notes", pa.string(), "the run's notes"),
    _column("created", pa.timestamp("us", tz="UTC"), "when the run was first described"),
    _column("trajstore_version", pa.string(), "trajstore's version in the program that first described the run"),
    _column("git_commit", pa.string(), "the git commit of that program's repository (+dirty: with changes), or null"),
    _column("host", pa.string(), "the host that program ran on"),
    _column("changed_at", pa.timestamp("us", tz="UTC"), "when this row was written"),
    _column("steps_version", pa.int64(), "the latest version of steps/ when this row was written (-1: none yet)"),
    _column("deleted", pa.bool_(), "true: the run was deleted and has no description from this row on"),
])


class RunsLog:
    """The ``runs`` table at ``location`` (the ``runs`` folder of a store): its rows at the latest version, read once
    per version (:meth:`rows`), and changes appended exactly once (:meth:`commit`)."""

    def __init__(self, location: Location, *, rule: Callable[[], Retention] | None = None) -> None:
        self.location = location
        self.entries = Log(location)  # its log entries, as the landing of a commit reads them
        self.rule = rule  # the retention a new table gets (the store's ``steps`` table's), else trajstore's default
        self._lock = threading.Lock()
        self._table: DeltaTable | None = None
        self._rows: tuple[int, pa.Table] | None = None
        self._files: dict[str, pa.Table] = {}  # the rows of each file of the last version read
        self._committing = threading.Lock()
        self._writing: DeltaTable | None = None  # the table as changes read it (kept at the latest between them)

    @property
    def uri(self) -> str:
        return self.location.uri

    def rows(self) -> tuple[int, pa.Table]:
        """The table's latest version (-1 while there is none) and its rows, typed as :data:`SCHEMA`."""
        with self._lock:
            table = self._latest()
            if table is None:
                return -1, SCHEMA.empty_table()
            return int(table.version()), self._rows_of(table)

    def _rows_of(self, table: DeltaTable) -> pa.Table:
        """The rows of ``table``'s version (with :attr:`_lock` held), read once per version: each file once, those
        of a version that differ from the last version read are read (a table whose protocol asks more of a reader
        than its files: by deltalake's own reader)."""
        version = int(table.version())
        if self._rows is not None and self._rows[0] == version:
            return self._rows[1]
        if table.protocol().min_reader_version > 1:
            rows, self._files = self._read(table), {}
        else:
            paths = [unquote(p) for p in pa.table(table.get_add_actions(flatten=True))["path"].to_pylist()]
            self._files = {p: self._files[p] if p in self._files else self._read_file(p) for p in paths}
            rows = pa.concat_tables([self._files[p] for p in paths]) if paths else SCHEMA.empty_table()
        self._rows = (version, rows)
        return rows

    def commit(self, plan: Callable[[pa.Table], pa.Table | None], *, what: str) -> None:
        """Append the rows ``plan(rows)`` gives (none: nothing to commit) for the table's rows at its latest version,
        as the version right after it; when another commit took that version, planned again on what the table then
        holds. ``what`` names the change in the commit's info and in errors."""
        with self._committing:  # a process's changes one at a time (they would take each other's versions)
            self._commit(plan, what)

    def _commit(self, plan: Callable[[pa.Table], pa.Table | None], what: str) -> None:
        last: Exception | None = None
        for _ in tries(COMMIT_RETRIES):
            planned = self._planned(plan)
            if planned is None:
                return
            table, added = planned
            path, size = self._write(added)
            try:
                self._send(table, path, size, added.num_rows, what)
                self._compact_if_due()
                return
            except CommitFailedError as exc:  # another change took the version, and this one did not land
                last = exc
            except DeltaError as exc:
                if GAP not in str(exc):  # (else a listing that missed another writer's entry: planned again)
                    raise explain(exc, self.location) or CommitError(
                        f"{what}: the runs table {self.uri} did not take the change: {first_line(exc)}") from exc
                last = exc
            self._remove(path)
        raise CommitError(f"{what}: the runs table {self.uri} did not take the change after {COMMIT_RETRIES} tries "
                          f"(other changes kept coming first): {one_line(last)}")

    def _planned(self, plan: Callable[[pa.Table], pa.Table | None]) -> tuple[DeltaTable, pa.Table] | None:
        """The table at its latest version and the rows ``plan`` adds to it (None: nothing to commit). The first
        change makes the table, then is planned on it at once (no race was lost: nothing to wait for)."""
        for made in (False, True):
            table = self._writable()
            with self._lock:
                rows = SCHEMA.empty_table() if table is None else self._rows_of(table)
            added = plan(rows)
            if added is None:
                return None
            if table is not None:
                return table, added
            if made:
                break
            self._create()
        raise CommitError(f"the runs table {self.uri} was made but cannot be read")

    def _send(self, table: DeltaTable, path: str, size: int, rows: int, what: str) -> None:
        """Commit the file at ``path`` (``size`` bytes, ``rows`` rows) as the version after ``table``'s; a sending that
        raised is settled from the log: done if it landed, else its error (a lost race: :class:`CommitFailedError`)."""
        attempt = Attempt(int(table.version()))
        add = AddAction(self.location.relative(path), size, {}, int(time.time() * 1000), True,
                        json.dumps({"numRecords": rows}))
        properties = CommitProperties(custom_metadata=attempt.metadata({"operation": what}), max_commit_retries=0)
        try:
            table.create_write_transaction([add], mode="append", schema=SCHEMA, partition_by=None,
                                           commit_properties=properties)
        except BaseException as exc:
            if settle(self.entries, attempt, exc, what, race=isinstance(exc, CommitFailedError)) is not None:
                return
            if isinstance(exc, (CommitFailedError, DeltaError)) or not isinstance(exc, OSError):
                raise
            raise explain(exc, self.location) or exc

    def unneeded(self, older_than_s: float) -> list[str]:
        """The files no version of the last ``older_than_s`` seconds lists (merged away by a compaction, or a lost
        race's) and at least that old: paths in the location's filesystem, for a vacuum to remove."""
        return unneeded_files(self._latest(), self.location, older_than_s)

    def _latest(self) -> DeltaTable | None:
        """The table brought to its latest version (kept between reads), or None while there is none."""
        try:
            if self._table is None:
                self._table = self._open()
            else:
                self._table.update_incremental()
        except (OSError, DeltaError) as exc:
            self._table = None
            raise explain(exc, self.location) or exc
        return self._table

    def _open(self) -> DeltaTable | None:
        try:
            return DeltaTable(self.uri, storage_options=self.location.storage_options)
        except TableNotFoundError:
            return None

    def _writable(self) -> DeltaTable | None:
        """The table at its latest version as changes read it (a handle kept between them, brought up to date), or
        None while there is none."""
        try:
            if self._writing is not None:
                self._writing.update_incremental()
            else:
                self._writing = self._open()
        except (OSError, DeltaError) as exc:
            self._writing = None
            raise explain(exc, self.location) or exc
        return self._writing

    def _create(self) -> None:
        """Make the table (racing creators: one makes it, the others find it made)."""
        try:
            try:
                rule = DEFAULT if self.rule is None else self.rule()
                DeltaTable.create(self.uri, SCHEMA, mode="ignore", name=FOLDER, description=DESCRIPTION,
                                  configuration=rule.properties(), storage_options=self.location.storage_options)
            except (OSError, DeltaError):  # another process made it first, or the answer was lost: the log tells
                pass
            made = self._open() is not None
        except (OSError, DeltaError) as exc:
            raise explain(exc, self.location) or exc
        if not made:
            raise CommitError(f"the runs table {self.uri} could not be created")

    def _read(self, table: DeltaTable) -> pa.Table:
        """Every row of ``table``'s version, typed as :data:`SCHEMA` (a column another tool left out: nulls)."""
        try:
            found = table.to_pyarrow_table()
        except (OSError, DeltaError) as exc:
            raise explain(exc, self.location) or StoreDamagedError(
                f"the runs table {self.uri} cannot be read: {first_line(exc)}; run `trajstore check`",
                path=self.uri) from exc
        return _typed(found)

    def _read_file(self, path: str) -> pa.Table:
        """The rows of the file at ``path`` (relative to the table), typed as :data:`SCHEMA`."""
        try:
            return _typed(pq.read_table(self.location.path(path), filesystem=self.location.fs))
        except OSError as exc:
            raise explain(exc, self.location) or StoreDamagedError(
                f"the runs table {self.uri} cannot be read: {first_line(exc)}; run `trajstore check`",
                path=self.location.uri_of(path)) from exc

    def _compact_if_due(self) -> None:
        """Merge the table's files once there are :data:`COMPACT_FILES` (deltalake's OPTIMIZE, which racing appends
        survive), so that a new reader reads a few files; a failure is only logged (the rows are all there)."""
        if len(self._files) < COMPACT_FILES:
            return
        try:
            table = self._open()
            if table is not None:
                table.optimize.compact(commit_properties=CommitProperties(
                    custom_metadata={"trajstore": {"operation": "compact"}}))
        except Exception as exc:  # noqa: BLE001 - a compaction that did not happen leaves the rows as they were
            log.warning("%s: its files were not merged: %s", self.uri, first_line(exc))

    def _write(self, rows: pa.Table) -> tuple[str, int]:
        """``rows`` written whole as one Parquet file in the table's folder (no reader sees it before a commit lists
        it); its path and size."""
        path = self.location.path(f"part-{uuid.uuid4().hex}.parquet")
        buffer = pa.BufferOutputStream()
        pq.write_table(rows.cast(SCHEMA), buffer, compression="zstd")
        try:
            if self.location.is_local:
                self.location.fs.create_dir(self.location.root, recursive=True)
            body = buffer.getvalue()
            with self.location.fs.open_output_stream(path) as out:
                out.write(body)
            if self.location.is_local:  # durable before a commit lists it (on S3 a completed upload already is)
                fsync_file(Path(path))
        except OSError as exc:
            raise explain(exc, self.location) or exc
        return path, body.size

    def _remove(self, path: str) -> None:
        """Remove the file of a change the log did not take (a lost race: nothing lists it)."""
        try:
            self.location.fs.delete_file(path)
        except OSError as exc:
            log.warning("%s: could not remove %s, a file no commit lists: %s", self.uri, path, first_line(exc))


def _typed(found: pa.Table) -> pa.Table:
    """``found`` (rows of the table as a file or another tool holds them) typed as :data:`SCHEMA`: a column it lacks
    as nulls, one it adds left out."""
    columns = [found[f.name].cast(f.type) if f.name in found.column_names else pa.nulls(found.num_rows, f.type)
               for f in SCHEMA]
    return pa.Table.from_arrays(columns, schema=SCHEMA)
