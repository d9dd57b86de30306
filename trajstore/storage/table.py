"""The ``steps`` table: Hive-partitioned Parquet files made visible by commits to a Delta Lake log.

A file is written whole first and only then added to the log in one commit, so a writer killed
mid-file leaves at most a file no reader ever lists. Readers take the committed file list of one
log version (a snapshot) and hand it to DuckDB.
"""

from __future__ import annotations

import json
import logging
import os
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.parquet as pq
from deltalake import DeltaTable, Field
from deltalake.exceptions import CommitFailedError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, Transaction

from trajstore.errors import CommitError, StoreDamagedError, first_line
from trajstore.schema import PARTITION_COLUMNS

log = logging.getLogger(__name__)

COMMIT_RETRIES = 20
LOW_CARDINALITY = ("action", "terminated", "truncated", "env_index", "worker_id", "mode", "policy_version", "seed",
                   "env_steps", "wall_time")  # one value per time index: few in a file of many envs


@dataclass(frozen=True)
class DataFile:
    """One committed Parquet file and the partition it belongs to."""

    path: str
    run_id: str
    env_id: str
    rows: int
    size: int
    modified_ms: int
    min_episode_id: int | None = None  # from the commit's file statistics, when it has them
    max_episode_id: int | None = None


@dataclass(frozen=True)
class WrittenFile:
    """A Parquet file written by :meth:`StepsTable.write` and not yet committed."""

    path: Path
    action: AddAction
    schema: pa.Schema


class StepsTable:
    """The Delta table at ``<store>/steps``."""

    def __init__(self, path: Path, *, row_group_rows: int = 1024 * 1024) -> None:
        self.path = Path(path)
        self.row_group_rows = row_group_rows

    def exists(self) -> bool:
        return DeltaTable.is_deltatable(str(self.path))

    def _open(self) -> DeltaTable:
        try:
            return DeltaTable(str(self.path))
        except TableNotFoundError:
            return None  # type: ignore[return-value]

    def version(self) -> int:
        dt = self._open()
        return -1 if dt is None else dt.version()

    def files(self) -> list[DataFile]:
        """The committed files of the latest version."""
        dt = self._open()
        return [] if dt is None else self._files(dt)

    def _files(self, dt: DeltaTable) -> list[DataFile]:
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
        none = [None] * len(actions["path"])
        return [
            DataFile(str(self.path / unquote(p)), r, e, int(n or 0), int(s), int(m), lo, hi)
            for p, r, e, n, s, m, lo, hi in zip(
                actions["path"], actions["partition.run_id"], actions["partition.env_id"],
                actions.get("num_records", [0] * len(actions["path"])), actions["size_bytes"],
                [_ms(m) for m in actions["modification_time"]],
                actions.get("min.episode_id", none), actions.get("max.episode_id", none))
        ]

    def size_problem(self, f: DataFile) -> str | None:
        """Why the committed file ``f`` is not what the log says, judged from its size alone (a missing file,
        one of another size), or None. Cheap: no file is opened."""
        try:
            size = os.stat(f.path).st_size
        except FileNotFoundError:
            return f"{f.path}: committed file is missing"
        if f.size and size != f.size:
            return f"{f.path}: is {size} bytes, the log says {f.size}"
        return None

    def file_schema(self, env_id: str | None = None) -> pa.Schema | None:
        """The Arrow schema of the stored columns (fixed sizes kept) merged over committed files.

        With ``env_id``, over the files of that environment only: observation shapes may differ
        between environments (the log records them as lists), never within one.
        """
        files = [f for f in self.files() if env_id is None or f.env_id == env_id]
        if not files:
            return None
        newest = max(files, key=lambda f: f.modified_ms)
        schema = self._read_schema(newest)
        table_fields = {f.name for f in pa.schema(self._open().schema().to_arrow())}
        missing = table_fields - set(schema.names) - set(PARTITION_COLUMNS)
        for f in files:
            if not missing:
                break
            other = self._read_schema(f)
            for name in list(missing):
                if name in other.names:
                    schema = schema.append(other.field(name))
                    missing.discard(name)
        return schema

    def _read_schema(self, f: DataFile) -> pa.Schema:
        try:
            return pq.read_schema(f.path)
        except (OSError, pa.ArrowException) as exc:
            problem = "is missing" if isinstance(exc, FileNotFoundError) else f"cannot be read ({first_line(exc)})"
            raise StoreDamagedError.of_file(f.path, problem, str(self.path.parent)) from exc

    # --- writing ----------------------------------------------------------------------------------

    def append(self, data: pa.Table, *, run_id: str, env_id: str) -> str:
        """Write ``data`` (without partition columns) as one Parquet file and commit it. Returns its path."""
        return self.commit(self.write(data, run_id=run_id, env_id=env_id))

    def write(self, data: pa.Table, *, run_id: str, env_id: str) -> WrittenFile:
        """First half of :meth:`append`: write ``data`` as a Parquet file that no reader sees yet."""
        rel = f"run_id={quote(run_id, safe='')}/env_id={quote(env_id, safe='')}/part-{uuid.uuid4().hex}.parquet"
        full = self.path / rel
        full.parent.mkdir(parents=True, exist_ok=True)
        try:
            self._write_file(data, full)
        except BaseException:
            full.unlink(missing_ok=True)
            raise
        action = AddAction(rel, full.stat().st_size, {"run_id": run_id, "env_id": env_id},
                           int(time.time() * 1000), True, json.dumps(_stats(data)))
        return WrittenFile(full, action, data.schema)

    def commit(self, written: WrittenFile) -> str:
        """Second half of :meth:`append`: sync the file to disk, then commit it. Returns its path."""
        _fsync(written.path)
        self._commit(written.action, written.schema)
        return str(written.path)

    # --- conditional commits (ingest) -------------------------------------------------------------

    def latest(self, file_schema: pa.Schema | None = None) -> DeltaTable | None:
        """The log at its latest version (None before the first commit); with ``file_schema``, the table is
        created or given the columns it lacks first, so that a commit of such a file needs no other change."""
        if file_schema is None:
            return self._open()
        return self._ensure_table(_full_schema(file_schema))

    def files_at(self, dt: DeltaTable) -> list[DataFile]:
        """The committed files of the version ``dt`` was read at."""
        return self._files(dt)

    def commit_after(self, dt: DeltaTable, written: WrittenFile, *, transaction: Transaction | None = None) -> bool:
        """Commit ``written`` as the version right after ``dt``'s, with the app ``transaction`` if given, or not
        at all: False when another commit took that version first (read the log again, then retry).

        Unlike :meth:`commit`, never rebases onto newer commits: what the caller checked against ``dt`` still
        holds when the commit succeeds. ``written`` must be synced (:meth:`sync`).
        """
        properties = CommitProperties(max_commit_retries=0, app_transactions=[transaction] if transaction else None)
        try:
            dt.create_write_transaction([written.action], mode="append", schema=_full_schema(written.schema),
                                        partition_by=list(PARTITION_COLUMNS), commit_properties=properties)
        except CommitFailedError:
            return False
        except Exception as exc:  # noqa: BLE001 - surfaced as a CommitError naming the file
            raise CommitError(f"commit of {written.action.path} to {self.path} failed: {exc}") from exc
        return True

    @staticmethod
    def sync(written: WrittenFile) -> None:
        """Make the bytes of ``written`` durable before a commit lists it."""
        _fsync(written.path)

    def partition_files(self, run_id: str, env_id: str) -> tuple[DeltaTable | None, list[DataFile]]:
        """The latest version and the committed files of one partition in it (for :meth:`replace`)."""
        dt = self._open()
        if dt is None:
            return None, []
        return dt, [f for f in self._files(dt) if f.run_id == run_id and f.env_id == env_id]

    def replace(self, dt: DeltaTable, written: list[WrittenFile], *, run_id: str, env_id: str) -> None:
        """Commit ``written`` in place of every file the partition had in version ``dt`` (a compaction).

        Files appended to the partition after ``dt`` stay; if another commit removed files of ``dt``
        meanwhile (a concurrent compaction), the commit fails with :class:`CommitError` and changes nothing.
        """
        for w in written:
            _fsync(w.path)
        table_schema = pa.schema(dt.schema().to_arrow())  # every column stays in the table's schema
        try:
            dt.create_write_transaction([w.action for w in written], mode="overwrite", schema=table_schema,
                                        partition_by=list(PARTITION_COLUMNS),
                                        partition_filters=[("run_id", "=", run_id), ("env_id", "=", env_id)])
        except Exception as exc:  # noqa: BLE001 - surfaced as a CommitError naming the partition
            raise CommitError(f"compaction of run_id={run_id}/env_id={env_id} was not committed: {exc}") from exc

    def _write_file(self, data: pa.Table, path: Path) -> None:
        dictionary = [c for c in LOW_CARDINALITY if c in data.column_names]
        pq.write_table(data, str(path), compression="zstd", use_dictionary=dictionary,  # native file: no GIL
                       row_group_size=self.row_group_rows, write_statistics=["episode_id", "step"])

    def _commit(self, action: AddAction, file_schema: pa.Schema) -> None:
        full_schema = _full_schema(file_schema)
        last: Exception | None = None
        for attempt in range(COMMIT_RETRIES):
            try:
                dt = self._ensure_table(full_schema)
                dt.create_write_transaction([action], mode="append", schema=full_schema,
                                            partition_by=list(PARTITION_COLUMNS))
                return
            except CommitFailedError as exc:  # another writer won the version race: read the log again
                last = exc
                time.sleep(0.01 * (attempt + 1))
            except Exception as exc:  # noqa: BLE001 - surfaced as a CommitError naming the file
                raise CommitError(f"commit of {action.path} to {self.path} failed: {exc}") from exc
        raise CommitError(f"commit of {action.path} failed after {COMMIT_RETRIES} attempts: {last}")

    def _ensure_table(self, schema: pa.Schema) -> DeltaTable:
        dt = self._open()
        if dt is None:
            try:
                return DeltaTable.create(str(self.path), schema, partition_by=list(PARTITION_COLUMNS),
                                         mode="ignore", name="steps")
            except Exception:  # noqa: BLE001 - a concurrent writer created it first
                dt = DeltaTable(str(self.path))
        known = set(pa.schema(dt.schema().to_arrow()).names)
        new = [f for f in schema if f.name not in known]
        if new:
            dt.alter.add_columns([Field.from_arrow(f) for f in new])
            dt = DeltaTable(str(self.path))
        return dt


def _full_schema(file_schema: pa.Schema) -> pa.Schema:
    """The table's schema for a file's: the partition columns first."""
    return pa.schema([pa.field(c, pa.string()) for c in PARTITION_COLUMNS] + list(file_schema))


def _fsync(path: Path) -> None:
    fd = os.open(path, os.O_RDWR)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _ms(value: object) -> int:
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1000)  # type: ignore[union-attr]
    return int(value or 0)  # type: ignore[call-overload]


def _stats(data: pa.Table) -> dict[str, object]:
    stats: dict[str, object] = {"numRecords": data.num_rows}
    cols = [c for c in ("episode_id", "step") if c in data.column_names]
    if data.num_rows and cols:
        import pyarrow.compute as pc

        stats["minValues"] = {c: pc.min(data[c]).as_py() for c in cols}
        stats["maxValues"] = {c: pc.max(data[c]).as_py() for c in cols}
        stats["nullCount"] = {c: 0 for c in cols}
    return stats
