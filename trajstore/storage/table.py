"""The ``steps`` table: Hive-partitioned Parquet files made visible by commits to a Delta Lake log, in a local
directory or under an ``s3://`` prefix (one code path: a :class:`~trajstore.storage.location.Location` gives
the pyarrow filesystem and the deltalake storage options).

A file is written whole first and only then added to the log in one commit, so a writer killed
mid-file leaves at most a file no reader ever lists (on S3, an upload is not an object until it completes).
Readers take the committed file list of one log version (a snapshot).
"""

from __future__ import annotations

import json
import logging
import os
import random
import threading
import time
import uuid
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Mapping, Sequence
from urllib.parse import quote, unquote

import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, Field
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from trajstore.errors import (
    CommitError,
    CommitUnknownError,
    ReadOnlyError,
    StoreAccessError,
    StoreDamagedError,
    first_line,
    one_line,
)
from trajstore.schema import PARTITION_COLUMNS, delta_schema
from trajstore.storage import names
from trajstore.storage.encoding import EncodingError, FileLayout
from trajstore.storage.landing import MARKER, Attempt, find, settle
from trajstore.storage.location import Location, explain, locate

log = logging.getLogger(__name__)

LOG_DIR = "_delta_log"
COMMIT_RETRIES = 20
APPEND_RETRIES = 100  # an append's tries while other writers keep committing first (each after a back-off)
LAYOUTS_KEPT = 200_000  # file footers kept per table (committed files never change)
FOOTER_THREADS = 8  # footers read at once from an object store
LOW_CARDINALITY = ("action", "terminated", "truncated", "env_index", "worker_id", "mode", "policy_version", "seed",
                   "env_steps", "wall_time")  # one value per time index: few in a file of many envs


@dataclass(frozen=True)
class DataFile:
    """One committed Parquet file, the partition it belongs to, and the filesystem that holds it (``path`` is a
    path in ``fs``: a local path, or ``bucket/key`` on S3)."""

    path: str
    run_id: str
    env_id: str
    rows: int
    size: int
    modified_ms: int
    min_episode_id: int | None = None  # from the commit's file statistics, when it has them
    max_episode_id: int | None = None
    fs: pafs.FileSystem = field(default_factory=pafs.LocalFileSystem, compare=False, repr=False)

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def uri(self) -> str:
        """The file as a user names it: its local path, or ``s3://bucket/key``."""
        return display(self.path, self.fs)


def display(path: str, fs: pafs.FileSystem) -> str:
    """A path of ``fs`` as a user names it: a local path as it is, an S3 one as ``s3://bucket/key``."""
    return path if isinstance(fs, pafs.LocalFileSystem) else f"s3://{path}"


@dataclass(frozen=True)
class WrittenFile:
    """A Parquet file written by :meth:`StepsTable.write` and not yet committed (``path`` in the table's
    filesystem)."""

    path: str
    action: AddAction
    schema: pa.Schema


@dataclass(frozen=True)
class LogCommit:
    """One version of the log: the data files it added, how many files it removed (a compaction or a delete
    rewrites rows that were there before: its files hold no new rows) and its commit time (ms), if recorded."""

    version: int
    added: list[DataFile]
    removed: int = 0
    timestamp_ms: int | None = None

    @property
    def new_rows(self) -> bool:
        """Whether the rows of :attr:`added` are new to the table (an append), not rewritten ones."""
        return self.removed == 0


class StepsTable:
    """The Delta table at ``<store>/steps`` (``location``: a directory or an ``s3://`` prefix)."""

    def __init__(self, location: Location | str | Path, *, row_group_rows: int = 1024 * 1024,
                 pinned: int | None = None) -> None:
        self.location = locate(location)
        self.fs = self.location.fs
        self.row_group_rows = row_group_rows
        self.pinned = pinned  # a version read as it was (time travel): every read sees it, writes are refused
        self._layouts: dict[str, FileLayout] = {}
        self._layouts_lock = threading.Lock()
        self._unsure: dict[str, Attempt] = {}  # files whose commit raised, and how it was sent: it may have landed

    def writable(self, operation: str) -> None:
        """Raise :class:`ReadOnlyError` if this table is pinned to an old version."""
        if self.pinned is not None:
            raise ReadOnlyError(f"{operation}: this store is opened read-only at version {self.pinned}; open it "
                                "without version=/as_of= to change it")

    @property
    def path(self) -> Any:
        """The table's folder: a :class:`~pathlib.Path` for a local table, else its ``s3://`` URI."""
        return Path(self.location.root) if self.location.is_local else self.location.uri

    @property
    def uri(self) -> str:
        return self.location.uri

    def exists(self) -> bool:
        try:
            return DeltaTable.is_deltatable(self.uri, storage_options=self.location.storage_options)
        except OSError as exc:
            raise explain(exc, self.location) or exc

    def _open(self, version: int | None = None) -> DeltaTable:
        version = self.pinned if version is None else version
        try:
            return DeltaTable(self.uri, version=version, storage_options=self.location.storage_options)
        except TableNotFoundError:
            return None  # type: ignore[return-value]
        except (OSError, DeltaError) as exc:  # deltalake says "object store" errors either way
            raise explain(exc, self.location) or exc

    def version(self) -> int:
        dt = self._open()
        return -1 if dt is None else dt.version()

    def files(self) -> list[DataFile]:
        """The committed files of the latest version."""
        dt = self._open()
        return [] if dt is None else self._files(dt)

    def listing(self) -> tuple[int, list[DataFile]]:
        """The latest version and its committed files, from one reading of the log (the two may not come from
        two readings: a commit between them would pair a version with another version's files)."""
        dt = self._open()
        return (-1, []) if dt is None else (dt.version(), self._files(dt))

    def _files(self, dt: DeltaTable) -> list[DataFile]:
        actions = pa.table(dt.get_add_actions(flatten=True)).to_pydict()
        none = [None] * len(actions["path"])
        return [
            DataFile(self.location.path(unquote(p)), r, e, int(n or 0), int(s), int(m), lo, hi, self.fs)
            for p, r, e, n, s, m, lo, hi in zip(
                actions["path"], actions["partition.run_id"], actions["partition.env_id"],
                actions.get("num_records", [0] * len(actions["path"])), actions["size_bytes"],
                [_ms(m) for m in actions["modification_time"]],
                actions.get("min.episode_id", none), actions.get("max.episode_id", none))
        ]

    def commit_at(self, version: int) -> LogCommit | None:
        """What the commit of ``version`` did, read from its one JSON file in the log (no listing, no other
        file read); None while there is no such version yet."""
        actions = self._log_entry(version)
        return None if actions is None else self._log_commit(version, actions)

    def marker_at(self, version: int) -> str | None:
        """The marker trajstore gave the commit of ``version`` (:mod:`~trajstore.storage.landing`): its commit id,
        ``""`` for a commit without one (another tool's, or an older trajstore's); None while there is no such
        version yet."""
        actions = self._log_entry(version)
        if actions is None:
            return None
        info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
        own = info.get("trajstore")
        return str(own.get(MARKER) or "") if isinstance(own, dict) else ""

    def _log_entry(self, version: int) -> list[dict[str, Any]] | None:
        """The actions of the log's entry for ``version``; None while there is none. An entry that cannot be
        read (an object store that does not answer) raises :class:`StoreAccessError`."""
        try:
            with self.fs.open_input_stream(self.location.path(LOG_DIR, f"{version:020d}.json")) as stream:
                text = stream.read().decode()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise explain(exc, self.location) or StoreAccessError(
                f"{self.uri}: the log entry of version {version} cannot be read: {first_line(exc)}") from exc
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def _log_commit(self, version: int, actions: list[dict[str, Any]]) -> LogCommit:
        added, removed, when = [], 0, None
        for action in actions:
            if "add" in action and action["add"].get("dataChange", True):
                added.append(self._added_file(action["add"]))
            removed += "remove" in action
            when = action.get("commitInfo", {}).get("timestamp", when)
        return LogCommit(version, added, removed, when)

    def _added_file(self, add: dict[str, Any]) -> DataFile:
        stats = json.loads(add.get("stats") or "{}")
        part = add.get("partitionValues", {})
        return DataFile(self.location.path(unquote(add["path"])), part.get("run_id", ""), part.get("env_id", ""),
                        int(stats.get("numRecords") or 0), int(add.get("size") or 0),
                        int(add.get("modificationTime") or 0), stats.get("minValues", {}).get("episode_id"),
                        stats.get("maxValues", {}).get("episode_id"), self.fs)

    def size_problem(self, f: DataFile) -> str | None:
        """Why the committed file ``f`` is not what the log says, judged from its size alone (a missing file,
        one of another size), or None. Cheap: no file is opened."""
        if f.is_local:
            try:
                size = os.stat(f.path).st_size
            except FileNotFoundError:
                return f"{f.uri}: committed file is missing"
        else:
            try:
                info = self.fs.get_file_info(f.path)
            except OSError as exc:
                raise explain(exc, self.location) or exc
            if info.type == pafs.FileType.NotFound:
                return f"{f.uri}: committed file is missing"
            size = info.size
        if f.size and size != f.size:
            return f"{f.uri}: is {size} bytes, the log says {f.size}"
        return None

    def file_schema(self, env_id: str | None = None) -> pa.Schema | None:
        """The columns readers get (logical names, decoded types, fixed sizes kept) merged over the committed
        files, the newest file's first.

        With ``env_id``, over the files of that environment only: observation shapes and dtypes may differ
        between environments, never within one.
        """
        files = [f for f in self.files() if env_id is None or f.env_id == env_id]
        if not files:
            return None
        fields: dict[str, pa.Field] = {}
        ordered = sorted(zip(files, self.layouts(files)), key=lambda p: -p[0].modified_ms)
        problem = self.size_problem(ordered[0][0])  # the layouts may be known: the newest file must be there
        if problem:
            raise StoreDamagedError.of_file(ordered[0][0].uri, problem.split(": ", 1)[1],
                                            self.location.uri.rsplit("/", 1)[0])
        for _, layout in ordered:
            for column in layout.logical:
                fields.setdefault(column.name, column)
        return pa.schema(list(fields.values()))

    def layouts(self, files: Sequence[DataFile]) -> list[FileLayout]:
        """Each committed file's layout (its schema and format, from its footer), read once per file."""
        with self._layouts_lock:
            missing = list({f.path: f for f in files if f.path not in self._layouts}.values())
        if missing:
            if len(missing) > 1 and not missing[0].is_local:
                from concurrent.futures import ThreadPoolExecutor

                with ThreadPoolExecutor(FOOTER_THREADS) as pool:
                    read = list(pool.map(self._layout, missing))
            else:
                read = [self._layout(f) for f in missing]
            with self._layouts_lock:
                if len(self._layouts) + len(read) > LAYOUTS_KEPT:
                    self._layouts.clear()
                self._layouts.update((f.path, layout) for f, layout in zip(missing, read))
                known = dict(self._layouts)
        else:
            with self._layouts_lock:
                known = dict(self._layouts)
        return [known[f.path] if f.path in known else self._layout(f) for f in files]

    def _read_schema(self, f: DataFile) -> pa.Schema:
        try:
            return pq.read_schema(f.path, filesystem=self.fs)
        except (OSError, pa.ArrowException) as exc:
            access = explain(exc, self.location)
            if access is not None:
                raise access from exc
            problem = "is missing" if isinstance(exc, FileNotFoundError) else f"cannot be read ({first_line(exc)})"
            raise StoreDamagedError.of_file(f.uri, problem, self.location.uri.rsplit("/", 1)[0]) from exc

    def _layout(self, f: DataFile) -> FileLayout:
        schema = self._read_schema(f)
        try:
            return FileLayout.of(schema, where=f.uri)
        except EncodingError as exc:
            raise StoreDamagedError.of_file(f.uri, f"has an unreadable format ({exc})",
                                            self.location.uri.rsplit("/", 1)[0]) from exc

    def delta_schema(self) -> pa.Schema | None:
        """The table's schema as its log records it (array columns as variable-size lists; every column any
        commit added), with no file read; None before the first commit."""
        dt = self._open()
        return None if dt is None else pa.schema(dt.schema().to_arrow())

    # --- writing ----------------------------------------------------------------------------------

    def append(self, data: pa.Table, *, run_id: str, env_id: str) -> str:
        """Write ``data`` (without partition columns) as one Parquet file and commit it. Returns its path."""
        return self.commit(self.write(data, run_id=run_id, env_id=env_id))

    def write(self, data: pa.Table, *, run_id: str, env_id: str) -> WrittenFile:
        """First half of :meth:`append`: write ``data`` as a Parquet file that no reader sees yet."""
        self.writable("write")
        rel = f"run_id={quote(run_id, safe='')}/env_id={quote(env_id, safe='')}/part-{uuid.uuid4().hex}.parquet"
        full = self.location.path(rel)
        try:
            size = self._write_file(data, full)
        except BaseException as exc:
            self.discard([full], exc)
            if isinstance(exc, OSError):
                raise explain(exc, self.location) or exc
            raise
        action = AddAction(rel, size, {"run_id": run_id, "env_id": env_id},
                           int(time.time() * 1000), True, json.dumps(_stats(data)))
        return WrittenFile(full, action, data.schema)

    def delete(self, path: str) -> None:
        """Remove a file of the table that no commit lists (a refused or abandoned write); gone already is fine."""
        try:
            self.fs.delete_file(path)
        except FileNotFoundError:
            pass
        except OSError as exc:
            access = explain(exc, self.location)
            if access is not None:  # asking whether it is gone would wait on the same store again
                raise access from exc
            try:
                gone = self.fs.get_file_info(path).type == pafs.FileType.NotFound
            except OSError:
                gone = False
            if not gone:
                raise

    def discard(self, paths: list[str], cause: BaseException | None) -> None:
        """Clean up after a write or commit that failed with ``cause`` (None: refused, nothing committed): remove
        the files it wrote, which no commit lists. Never raises, so the cleanup cannot hide ``cause``.

        Every commit path raises only once the log says its commit did not land
        (:mod:`~trajstore.storage.landing`); the files are kept when that could not be told
        (:class:`~trajstore.errors.CommitUnknownError`) or the call was interrupted, and, on an object store,
        after any failure that came from the store itself (an error, no answer): a PUT of the log entry that got
        no answer may still be on its way, and would then need them, and asking a store that does not answer
        to delete them would only wait again. Files kept by a commit that did not land are listed by no version:
        ``trajstore check`` reports them as orphans and :func:`~trajstore.storage.check.remove_orphans` (or
        ``trajstore vacuum``) removes them."""
        keep = isinstance(cause, CommitUnknownError) or (cause is not None and not isinstance(cause, Exception))
        if paths and (keep or (not self.location.is_local and _from_store(cause))):
            log.info("%s: %d file(s) of a failed write or commit left as they are (if no version lists them, "
                     "`trajstore check` reports them as orphans)", self.uri, len(paths))
            return
        for path in paths:
            try:
                self.delete(path)
            except Exception as exc:  # noqa: BLE001 - the caller raises the error that matters
                log.warning("%s: could not remove the uncommitted file %s: %s", self.uri, path, first_line(exc))

    def reserve(self, types: Mapping[str, pa.DataType],
                logical: Mapping[str, pa.DataType] | None = None) -> dict[str, str]:
        """The physical name of each column (logical name -> the type its files hold; ``logical``: the types
        readers return, for the names' tags), resolved against the log and added to the log's schema where new,
        in a commit of its own, before any file uses it (see :mod:`~trajstore.storage.names`). Safe when several
        writers race: a lost race resolves again."""
        self.writable("write")
        last: Exception | None = None
        for attempt in range(COMMIT_RETRIES):
            dt = self._open()
            log_types = {} if dt is None else {f.name: f.type for f in pa.schema(dt.schema().to_arrow())}
            mapping, new = names.resolve(types, log_types, logical)
            if not new:
                return mapping
            try:
                if dt is None:
                    self._ensure_table(_full_schema(pa.schema([])))
                else:
                    self._add_columns(dt, new)
                    continue  # read the log again: the names must be the ones it now holds
            except StoreAccessError:
                raise
            except (OSError, DeltaError) as exc:  # another writer changed the schema first, unless the store failed
                access = explain(exc, self.location)
                if access is not None:
                    raise access from exc
                if not isinstance(exc, DeltaError):
                    raise
                last = exc
                time.sleep(0.01 * (attempt + 1))
        raise CommitError(f"the columns {sorted(types)} could not be reserved in {self.uri}: {one_line(last)}")

    def commit(self, written: WrittenFile) -> str:
        """Second half of :meth:`append`: make the file durable, then commit it. Returns its path.

        Safe to call again for the same file after it failed: a commit that raised may have landed (its answer
        lost, or it could not be told), so a second call first looks for it in every version after the one the
        first try was planned on, not only in the latest file list (a compaction may have merged the file since);
        each try carries the same marker (:mod:`~trajstore.storage.landing`)."""
        self.sync(written)
        tried = self._unsure.get(written.path)
        if tried is not None and find(self, tried) is not None:
            del self._unsure[written.path]
            return written.path
        self._commit(written)
        self._unsure.pop(written.path, None)
        return written.path

    # --- conditional commits (ingest) -------------------------------------------------------------

    def latest(self, file_schema: pa.Schema | None = None) -> DeltaTable | None:
        """The log at its latest version (None before the first commit); with ``file_schema``, the table is
        created or given the columns it lacks first, so that a commit of such a file needs no other change."""
        if file_schema is None:
            return self._open()
        self.writable("write")
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
        try:
            self._send(dt, Attempt(dt.version()), [written.action], what=f"the append of {written.action.path}",
                       metadata={"operation": "append"}, schema=_full_schema(written.schema), retries=0,
                       transaction=transaction)
        except CommitFailedError:
            return False
        except StoreAccessError:
            raise
        except Exception as exc:  # noqa: BLE001 - surfaced as a StoreAccessError or a CommitError naming the file
            raise explain(exc, self.location) or CommitError(
                f"commit of {written.action.path} to {self.uri} failed: {one_line(exc)}") from exc
        return True

    def sync(self, written: WrittenFile) -> None:
        """Make the bytes of ``written`` durable before a commit lists it (on S3 a completed upload already is)."""
        if self.location.is_local:
            fsync_file(written.path)

    def partition_files(self, run_id: str, env_id: str) -> tuple[DeltaTable | None, list[DataFile]]:
        """The latest version and the committed files of one partition in it (for a compaction's :meth:`swap`)."""
        dt = self._open()
        if dt is None:
            return None, []
        return dt, [f for f in self._files(dt) if f.run_id == run_id and f.env_id == env_id]

    def swap(self, dt: DeltaTable, removed: list[DataFile], written: list[WrittenFile], *,
             metadata: dict[str, Any]) -> int:
        """Commit, in one transaction over version ``dt``, the removal of exactly ``removed`` and the addition
        of ``written`` (a delete, a rewrite); returns the version committed. Commits appended after ``dt`` stay
        (the log rebases the commit onto them); if one of them removed a file of ``removed`` (a concurrent
        delete or compaction), the commit fails with a :class:`CommitError` and changes nothing. ``metadata``
        goes into the commit's info under ``"trajstore"`` (what :func:`trajstore.storage.history.history`
        shows)."""
        self.writable(str(metadata.get("operation", "change")))
        for w in written:
            self.sync(w)
        now = int(time.time() * 1000)
        actions: list[Any] = [RemoveAction(self.location.relative(f.path), True, now, f.size,
                                           {"run_id": f.run_id, "env_id": f.env_id}) for f in removed]
        actions += [w.action for w in written]
        table_schema = pa.schema(dt.schema().to_arrow())
        for w in written:
            table_schema = _merged(table_schema, w.schema)
        if len(table_schema) > len(dt.schema().to_arrow()):  # a rewrite that adds a column: the log's schema
            dt = self._ensure_table(table_schema)  # gains it first (a commit of its own), then the files swap
            listed = {f.path for f in self._files(dt)}
            if any(f.path not in listed for f in removed):
                raise CommitError(f"{metadata.get('operation')}: another change removed some of the files it "
                                  "read; nothing was committed")
        attempt = Attempt(dt.version())
        what = f"the {metadata.get('operation', 'change')} of {len(removed)} file(s)"
        try:
            landed = self._send(dt, attempt, actions, what=what, metadata=metadata, schema=table_schema)
        except StoreAccessError:
            raise
        except OSError as exc:
            raise explain(exc, self.location) or CommitError(f"{metadata.get('operation')} of {len(removed)} "
                                                             f"file(s) in {self.uri} was not committed: "
                                                             f"{one_line(exc)}") from exc
        except Exception as exc:  # noqa: BLE001 - a StoreAccessError, or a CommitError naming the operation
            raise explain(exc, self.location) or CommitError(
                f"{metadata.get('operation')} of {len(removed)} file(s) in {self.uri} was not committed (another "
                f"change removed some of them first?): {first_line(exc)}") from exc
        return self._version_of(attempt, landed)

    def _send(self, dt: DeltaTable, attempt: Attempt, actions: list[Any], *, what: str, metadata: dict[str, Any],
              schema: pa.Schema, mode: str = "append", partition_filters: list[Any] | None = None,
              retries: int | None = None, transaction: Transaction | None = None) -> int | None:
        """Send one commit planned on version ``dt`` (``attempt``: its base and marker; ``what``: the change, for
        messages). Returns None when it committed, or the version it landed as when sending raised after it
        landed (:func:`~trajstore.storage.landing.settle`); raises sending's own error when it did not land,
        and :class:`~trajstore.errors.CommitUnknownError` when the log cannot tell. ``retries``: how often
        deltalake may rebase it onto commits that came first (None: its default; 0: never, the caller
        retries)."""
        properties = CommitProperties(custom_metadata=attempt.metadata(metadata), max_commit_retries=retries,
                                      app_transactions=[transaction] if transaction else None)
        try:
            dt.create_write_transaction(actions, mode=mode, schema=schema, partition_by=list(PARTITION_COLUMNS),
                                        partition_filters=partition_filters, commit_properties=properties)
        except BaseException as exc:
            landed = settle(self, attempt, exc, what)
            if landed is None:
                raise
            return landed
        return None

    def _version_of(self, attempt: Attempt, landed: int | None) -> int:
        """The version ``attempt`` committed as (``landed`` if already known)."""
        version = landed if landed is not None else find(self, attempt)
        if version is None:  # it committed, so the log holds it: only a log cleaned up under us could hide it
            raise CommitError(f"{self.uri}: a commit succeeded but no version after {attempt.base} carries its id "
                              f"{attempt.marker}")
        return version

    def _write_file(self, data: pa.Table, path: str) -> int:
        """Write ``data`` as one Parquet file at ``path``; returns its size in bytes."""
        options: dict[str, Any] = {"compression": "zstd", "row_group_size": self.row_group_rows,
                                   "use_dictionary": [c for c in LOW_CARDINALITY if c in data.column_names],
                                   "write_statistics": ["episode_id", "step"]}
        if self.location.is_local:
            Path(path).parent.mkdir(parents=True, exist_ok=True)
            pq.write_table(data, path, **options)  # a native file: written without the GIL
            return os.stat(path).st_size
        buffer = pa.BufferOutputStream()  # encoded in memory, then one upload: the object appears whole or not
        pq.write_table(data, buffer, **options)
        body = buffer.getvalue()
        with self.fs.open_output_stream(path) as out:
            out.write(body)
        return body.size

    def _commit(self, written: WrittenFile) -> None:
        """Append ``written``, exactly once: each try is planned on the latest version and never rebased by
        deltalake (a rebase after a lost answer would commit the file a second time, after a compaction that
        merged it, too); a try that lost the race to another commit is looked for in the log, then made again
        on the versions since (read incrementally, as deltalake's own rebase would). The first try's base and
        marker are kept (``_unsure``) until the file is known to be committed."""
        action, full_schema = written.action, _full_schema(written.schema)
        dt = self._ensure_table(full_schema)
        attempt = self._unsure.setdefault(written.path, Attempt(dt.version()))
        last: Exception | None = None
        for i in range(APPEND_RETRIES):
            try:
                self._send(dt, attempt, [action], what=f"the append of {action.path}",
                           metadata={"operation": "append"}, schema=full_schema, retries=0)
                return
            except CommitFailedError as exc:  # another writer won the version race: read what it committed
                last = exc
                time.sleep(backoff(i))
                self._refresh(dt)
            except StoreAccessError:
                raise
            except Exception as exc:  # noqa: BLE001 - a StoreAccessError, or a CommitError naming the file
                raise explain(exc, self.location) or CommitError(
                    f"commit of {action.path} to {self.uri} failed: {one_line(exc)}") from exc
        raise CommitError(f"commit of {action.path} failed after {APPEND_RETRIES} attempts (other commits kept "
                          f"coming first): {one_line(last)}")

    def _refresh(self, dt: DeltaTable) -> None:
        """``dt`` brought to the latest version by reading the versions since (columns are only ever added:
        a file's columns the log held stay held)."""
        try:
            dt.update_incremental()
        except (OSError, DeltaError) as exc:
            raise explain(exc, self.location) or exc

    def _ensure_table(self, schema: pa.Schema) -> DeltaTable:
        """The table at its latest version, created or given the columns of ``schema`` it lacks. Safe when
        several processes (or machines) do it at once: the losers of a race read the log again."""
        last: Exception | None = None
        for attempt in range(COMMIT_RETRIES):
            try:
                return self._with_columns(schema)
            except StoreAccessError:
                raise
            except (OSError, DeltaError) as exc:  # "metadata changed": another writer won the race; read again
                access = explain(exc, self.location)  # unless the store failed or did not answer
                if access is not None:
                    raise access from exc
                if not isinstance(exc, DeltaError):
                    raise
                last = exc
                time.sleep(0.01 * (attempt + 1))
        raise CommitError(f"the table {self.uri} could not be created or given new columns: {one_line(last)}")

    def _with_columns(self, schema: pa.Schema) -> DeltaTable:
        dt = self._open()
        if dt is None:  # created with the partition columns alone, the same whoever creates it: racing creators
            try:        # (a local log lets each commit its own creation) then leave one schema, columns come after
                DeltaTable.create(self.uri, _full_schema(pa.schema([])), partition_by=list(PARTITION_COLUMNS),
                                  mode="ignore", name="steps", storage_options=self.location.storage_options)
                dt = self._open()
            except (OSError, DeltaError):  # a concurrent writer created it first, or the creation's answer was
                dt = self._open()            # lost: the log says whether the table is there
                if dt is None:
                    raise
        known = set(pa.schema(dt.schema().to_arrow()).names)
        new = [f for f in schema if f.name not in known]
        if new:
            self._add_columns(dt, new)
            dt = self._open()
        return dt

    def _add_columns(self, dt: DeltaTable, fields: list[pa.Field]) -> None:
        """Give the log's schema ``fields`` in a commit of its own. When that raises, the log says whether it
        landed anyway (the columns are there: done) before the error goes on; a log that cannot be read raises
        :class:`~trajstore.errors.CommitUnknownError`."""
        try:
            dt.alter.add_columns([Field.from_arrow(f) for f in fields])
        except Exception as exc:
            try:
                now = self._open()
            except StoreAccessError as unread:
                raise CommitUnknownError(f"{self.uri}: adding the columns {[f.name for f in fields]} to the log "
                                         f"may have been applied; the log cannot be read to tell "
                                         f"({first_line(unread)}); nothing was deleted") from exc
            held = set() if now is None else set(pa.schema(now.schema().to_arrow()).names)
            if not {f.name for f in fields} <= held:
                raise
            if isinstance(exc, CommitFailedError):  # another writer added them first
                return
            log.warning("%s: the columns %s were added to the log, though the call reported a failure after it "
                        "(%s)", self.uri, [f.name for f in fields], first_line(exc))


def backoff(attempt: int) -> float:
    """Seconds to wait before try ``attempt + 1`` of something that lost a race: doubling from 2 ms up to 0.2 s,
    jittered so that racing writers spread out."""
    return min(0.2, 0.002 * 2 ** attempt) * random.uniform(0.5, 1.5)


def _from_store(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or an error it was raised from) came from the store's side: an object store that failed
    or did not answer, a disk that failed; then whether a commit under way landed is unknown."""
    while exc is not None:
        if isinstance(exc, OSError) and not isinstance(exc, FileNotFoundError):
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def _full_schema(file_schema: pa.Schema) -> pa.Schema:
    """The table's schema (as the Delta log records it) for a file's: the partition columns first."""
    stored = [f for f in delta_schema(file_schema) if f.name not in PARTITION_COLUMNS]
    return pa.schema([pa.field(c, pa.string()) for c in PARTITION_COLUMNS] + stored)


def _merged(table_schema: pa.Schema, file_schema: pa.Schema) -> pa.Schema:
    """``table_schema`` with the columns of ``file_schema`` it lacks appended (nullable, as the log records them)."""
    known = set(table_schema.names)
    return pa.schema(list(table_schema) + [f for f in delta_schema(file_schema) if f.name not in known])


def fsync_file(path: Path) -> None:
    """``path``'s bytes flushed to disk."""
    fd = os.open(path, os.O_RDONLY)
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
