"""The Delta log of the ``steps`` table (``<store>/steps/_delta_log``): the one module that reads and writes it.

Every other module sees the log through a :class:`Log` and the :class:`TableState` it reads — the table as one
version left it: the version's number, the committed files it lists (:class:`DataFile`), the table's schema as the
log records it — and never through a deltalake object: only this module imports ``deltalake``. What it holds:

- **Reading a version**: :meth:`Log.read` (the latest, or the version a read-only store is pinned to), its files and
  schema, an idempotency key's app transaction (:meth:`TableState.app_version`); the latest version's number alone
  (:meth:`Log.latest_number`), the version current at a time (:meth:`Log.number_at`).
- **Reading entries**: each version's one JSON file (:meth:`Log.entry`; :meth:`Log.commit`, a :class:`LogCommit`:
  the files it added and removed, its commit info, its operation, the id trajstore gave it), the versions there are
  (:meth:`Log.numbers`), the files commits removed (:meth:`Log.removed_paths`), the staging files a killed commit
  left (:func:`log_leftover`).
- **Checkpoints**: the last one and how far the log is past it, one written when due.
- **Commits**: the table created and given columns (:meth:`Log.ensure`, :meth:`Log.reserve`), a file appended once
  (:meth:`Log.append`, :meth:`Log.commit_after`), files removed and added at once (:meth:`Log.swap`). Every commit
  carries a marker and decides from the log whether it landed when sending it raised
  (:mod:`~trajstore.storage.landing`).
"""

from __future__ import annotations

import json
import logging
import math
import os
import re
import time
from dataclasses import dataclass, field
from datetime import datetime
from functools import cached_property
from typing import Any, Callable, Mapping, Sequence
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq
from deltalake import DeltaTable, Field
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction, Transaction

from trajstore.durations import text
from trajstore.errors import (
    CommitError,
    CommitUnknownError,
    ReadOnlyError,
    StoreAccessError,
    StoreDamagedError,
    UnsupportedTableError,
    VersionNotFoundError,
    first_line,
    one_line,
)
from trajstore.retry import tries
from trajstore.schema import PARTITION_COLUMNS, delta_schema
from trajstore.storage import names, protocol
from trajstore.storage.encoding import declarations
from trajstore.storage.landing import MARKER, Attempt, find, settle
from trajstore.storage.location import Location, explain
from trajstore.storage.retention import DEFAULT as DEFAULT_RETENTION
from trajstore.storage.retention import Retention, oldest_readable

log = logging.getLogger(__name__)

LOG_DIR = "_delta_log"
ENTRY = re.compile(r"^(\d{20})\.json$")  # one version's entry in LOG_DIR
CHECKPOINT = re.compile(r"^(\d{20})\.checkpoint(?:\.\d+\.\d+)?\.parquet$")  # a checkpoint (or one of its parts)
COMMIT_RETRIES = 20  # a schema change's tries while other writers change it first
APPEND_RETRIES = 100  # an append's tries while other writers keep committing first (each after a back-off)
UNSURE_KEPT = 10_000  # appends that raised, remembered until they are sent again
LISTING_RETRIES = 12  # reads of the log while its listing misses an entry another writer was making (~1 s in all)
GAP = "Expected contiguous commit files"  # deltalake's error for a log listed with a version missing
# deltalake's errors for a log file gone between its listing and its read: removed by a clean-up behind a newer
# checkpoint than the listing saw (a checkpoint's parquet, or the entries it stands for)
CLEANED_UP = re.compile(r"_delta_log/\d{20}\.(?:json|checkpoint[.\w-]*\.parquet) not found"
                        r"|File not found: \S*_delta_log/\d{20}\.|didn't find any checkpoints")
MARKED_STEP = 100  # versions whose entries are read to carry "no deletion vector" forward (more: deltalake is asked)


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
    data_change: bool = field(default=True, compare=False, repr=False)  # False: an OPTIMIZE's rewrite of rows

    @property
    def is_local(self) -> bool:
        return isinstance(self.fs, pafs.LocalFileSystem)

    @property
    def uri(self) -> str:
        """The file as a user names it: its local path, or ``s3://bucket/key``."""
        return display(self.path, self.fs)


def log_leftover(location: Location, path: str) -> bool | None:
    """Whether ``path`` (a file under the table folder at ``location``) is a file of the log a killed commit left:
    a staging file (delta-rs writes ``<name>#<n>`` or ``*.tmp`` and links or renames it into place) — True; a file
    of the log itself — False; None when it is not in the log at all (a data file)."""
    if location.relative(path).split("/", 1)[0] != LOG_DIR:
        return None
    name = path.rsplit("/", 1)[-1]
    return "#" in name or name.endswith(".tmp")


def display(path: str, fs: pafs.FileSystem) -> str:
    """A path of ``fs`` as a user names it: a local path as it is, an S3 one as ``s3://bucket/key``."""
    return path if isinstance(fs, pafs.LocalFileSystem) else f"s3://{path}"


def unneeded_files(table: DeltaTable | None, location: Location, older_than_s: float) -> list[str]:
    """The files of the Delta table ``table`` (at ``location``) that no version of the last ``older_than_s`` seconds
    lists (merged or rewritten away, or never committed) and at least that old, as deltalake's vacuum finds them:
    paths in the location's filesystem, for a vacuum to remove. The ``runs`` and ``priorities`` tables' rule."""
    if table is None:
        return []
    try:
        found = table.vacuum(retention_hours=max(0, math.ceil(older_than_s / 3600)), dry_run=True,
                             enforce_retention_duration=False)
    except (OSError, DeltaError) as exc:
        raise explain(exc, location) or exc
    return [location.normalized(unquote(p)) for p in found]


def files_holding(files: Sequence[DataFile], episode_ids: np.ndarray) -> list[DataFile]:
    """The files of ``files`` that may hold steps of one of the sorted unique ``episode_ids``, judged by the
    episode_id range the log records for each file (a file without one may hold any)."""
    return [f for f in files if _may_hold(f, episode_ids)]


def _may_hold(f: DataFile, ids: np.ndarray) -> bool:
    """Whether ``f``'s logged episode_id range contains one of the sorted ``ids`` (true when not logged)."""
    if f.min_episode_id is None or f.max_episode_id is None:
        return True
    i = int(np.searchsorted(ids, f.min_episode_id))
    return i < len(ids) and ids[i] <= f.max_episode_id


@dataclass(frozen=True)
class WrittenFile:
    """A Parquet file written whole and made durable, not committed yet: ``path`` in the table's filesystem,
    ``relative`` to the table, its partition, size, time and statistics (the commit's ``add`` action), its
    schema."""

    path: str
    relative: str
    run_id: str
    env_id: str
    size: int
    modified_ms: int
    stats: dict[str, Any]
    schema: pa.Schema


@dataclass(frozen=True)
class LogCommit:
    """One version of the log as its entry says: every file it added (``files``; those whose rows changed the
    table's data are :attr:`added`), the files it removed (their paths and runs: a compaction or a delete rewrites
    rows that were there before, so its files hold no new rows), its commit info, and whether it changed the
    table's metadata (a schema change)."""

    version: int
    files: list[DataFile]
    removed: list[tuple[str, str]] = field(default_factory=list)  # (path in the table's filesystem, run_id)
    info: dict[str, Any] = field(default_factory=dict)
    metadata: bool = False
    marked: frozenset[str] = frozenset()  # the paths of the files it added with a deletion vector (another engine's)
    apps: Mapping[str, int] = field(default_factory=dict)  # the app transactions it recorded: id -> version

    @property
    def added(self) -> list[DataFile]:
        """The files it added whose rows change the table's data (not the rewrites of an OPTIMIZE)."""
        return [f for f in self.files if f.data_change]

    @property
    def new_rows(self) -> bool:
        """Whether the rows of :attr:`added` are new to the table (an append), not rewritten ones."""
        return not self.removed

    @property
    def timestamp_ms(self) -> int | None:
        """When it was committed (ms since the epoch), if its commit info says."""
        when = self.info.get("timestamp")
        return None if when is None else int(when)

    @property
    def marker(self) -> str:
        """The id trajstore gave it (:mod:`~trajstore.storage.landing`); ``""`` for a commit without one (another
        tool's, an older trajstore's)."""
        own = self.info.get("trajstore")
        return str(own.get(MARKER) or "") if isinstance(own, dict) else ""

    @property
    def operation(self) -> str:
        """trajstore's own name for the commit when it wrote one, else the log's operation in trajstore's words
        (``create``, ``append``, ``overwrite``, ``add_columns``, …)."""
        own = self.info.get("trajstore") or {}
        if isinstance(own, dict) and own.get("operation"):
            return str(own["operation"])
        op = str(self.info.get("operation", "")).upper()
        mode = str((self.info.get("operationParameters") or {}).get("mode", "")).lower()
        if op.split() == ["CREATE", "TABLE"]:  # the log's name for the first commit
            return "create"
        if op == "WRITE":
            return "append" if mode == "append" else "overwrite"
        if op == "ADD COLUMN":
            return "add_columns"
        return op.lower().replace(" ", "_") or ("metadata" if self.metadata else "unknown")


class TableState:
    """The table as one version of the log left it: its ``number``, the files it lists, its schema. A change
    planned on what it read commits over it (:meth:`Log.swap`, :meth:`Log.commit_after`)."""

    def __init__(self, log: Log, table: DeltaTable) -> None:
        self._log, self._table = log, table
        self.number: int = table.version()

    def __repr__(self) -> str:
        return f"TableState({self.number} of {self._log.uri!r})"

    @cached_property
    def files(self) -> list[DataFile]:
        """The committed files of this version."""
        actions = pa.table(self._table.get_add_actions(flatten=True)).to_pydict()
        none = [None] * len(actions["path"])
        location = self._log.location
        return [
            DataFile(location.path(unquote(p)), r, e, int(n or 0), int(s), int(m), lo, hi, location.fs)
            for p, r, e, n, s, m, lo, hi in zip(
                actions["path"], actions["partition.run_id"], actions["partition.env_id"],
                actions.get("num_records", [0] * len(actions["path"])), actions["size_bytes"],
                [_ms(m) for m in actions["modification_time"]],
                actions.get("min.episode_id", none), actions.get("max.episode_id", none))
        ]

    @cached_property
    def schema(self) -> pa.Schema:
        """The table's schema as the log records it (array columns as variable-size lists; every column any
        commit added)."""
        return pa.schema(self._table.schema().to_arrow())

    @cached_property
    def schema_key(self) -> bytes:
        """:attr:`schema` as bytes (Arrow IPC, its fields' declarations included): equal for versions whose
        schemas are equal, a key for what is made from it."""
        return self.schema.serialize().to_pybytes()

    @cached_property
    def declarations(self) -> dict[str, dict[str, Any] | None]:
        """Every column of the schema -> what it declares it stores (its field metadata; see
        :func:`~trajstore.storage.encoding.declaration`), or None."""
        return declarations(self.schema)

    @cached_property
    def properties(self) -> dict[str, str]:
        """The table's properties (its Delta ``configuration``) at this version."""
        return dict(self._table.metadata().configuration)

    def partition(self, run_id: str, env_id: str) -> list[DataFile]:
        """The committed files of one ``(run_id, env_id)`` partition."""
        return [f for f in self.files if f.run_id == run_id and f.env_id == env_id]

    def app_version(self, app_id: str) -> int | None:
        """The version the app transaction ``app_id`` last recorded (an idempotency key's digest), or None."""
        return self._table.transaction_version(app_id)


class Log:
    """The Delta log of the table at ``location`` (the ``steps`` folder); ``pinned``: the version a read-only
    store reads (every read sees it, every change is refused)."""

    def __init__(self, location: Location, *, pinned: int | None = None) -> None:
        self.location = location
        self.pinned = pinned
        self.properties = DEFAULT_RETENTION.properties()  # what a table made by this log is given
        self._unsure: dict[str, Attempt] = {}  # appends that raised, and how they were sent: they may have landed
        self._unmarked = -1  # the newest version read whose files carry no deletion vector

    @property
    def uri(self) -> str:
        return self.location.uri

    def writable(self, operation: str) -> None:
        """Raise :class:`ReadOnlyError` if this log is pinned to a version."""
        if self.pinned is not None:
            raise ReadOnlyError(f"{operation}: this store is opened read-only at version {self.pinned}; open it "
                                "without version=/as_of= to change it")

    # --- reading ---------------------------------------------------------------------------------------------

    def exists(self) -> bool:
        try:
            return DeltaTable.is_deltatable(self.uri, storage_options=self.location.storage_options)
        except OSError as exc:
            raise explain(exc, self.location) or exc

    def read(self, number: int | None = None) -> TableState | None:
        """The table as version ``number`` left it (default: the pinned or the latest version); None before the first
        commit. A version whose entries cannot be read raises :class:`VersionNotFoundError` (one asked for by number:
        cleaned up) or :class:`StoreDamagedError` (the latest); one that needs a reader feature trajstore does not
        implement, or whose files carry deletion vectors, :class:`~trajstore.errors.UnsupportedTableError`
        (:mod:`~trajstore.storage.protocol`): every read checks the version it reads."""
        table = self._version(number)
        if table is None:
            return None
        self._check_protocol(table)
        return TableState(self, table)

    def _version(self, number: int | None) -> DeltaTable | None:
        """The log at version ``number`` (:meth:`read`, unchecked against the protocol); None before the first
        commit."""
        number = self.pinned if number is None else number
        try:
            table = self._open(number)
        except DeltaError as exc:
            refusal = self._refused_protocol(number)  # deltalake's own refusal of a protocol it does not read
            if refusal is not None:
                raise refusal from exc
            if number is not None:  # a removed version too: not found (404), not bad input
                raise self.expired(number, first_line(exc)) from exc
            raise StoreDamagedError(f"the commit log of {self.uri} cannot be read: {first_line(exc)}",
                                    path=self.location.uri_of(LOG_DIR)) from exc
        if table is None and number is not None:
            raise self.expired(number)
        return table

    def expired(self, number: int, cause: str | None = None) -> VersionNotFoundError:
        """The error for a read of version ``number`` whose log entries are gone: the log's retention and the
        oldest version it can still read."""
        try:
            oldest, kept = self.oldest_readable(), f"{text(self.retention().log_s)} of entries"
        except Exception:  # noqa: BLE001 - the error says what it can
            oldest, kept = None, "the entries of its retention"
        since = "" if oldest is None else f"; the oldest version it can read is {oldest} (`trajstore history` " \
                                          "lists them)"
        said = "" if cause is None or oldest is not None else f": {cause}"
        return VersionNotFoundError(f"version: version {number} can no longer be read (its log entries were cleaned "
                                    f"up): the log keeps {kept} (`trajstore retention`){since}{said}")

    def newest_entry(self) -> tuple[int, int, int, int] | None:
        """The newest version's entry of a log on a local disk, as (number, inode, mtime in ns, size), without
        opening the log: a version read before is still the latest while its entry is still the newest (an entry
        is written once, whole, and never changed; a later commit, or a table made again in the folder, makes
        another). None for a pinned log, one not on a local disk, or one that cannot be listed."""
        if self.pinned is not None or not self.location.is_local:
            return None
        try:
            with os.scandir(self.location.path(LOG_DIR)) as entries:
                newest = max((e for e in entries if ENTRY.match(e.name)), key=lambda e: e.name, default=None)
            if newest is None:
                return None
            found = newest.stat()
        except OSError:
            return None
        return int(newest.name[:20]), found.st_ino, found.st_mtime_ns, found.st_size

    def latest_number(self) -> int:
        """The number of the version :meth:`read` gives (-1 before the first commit), whether trajstore can read that
        version or not (the number alone: :meth:`read` says)."""
        try:
            table = self._version(None)
        except UnsupportedTableError as exc:  # one deltalake cannot open either: its refusal names it
            if exc.version is None:
                raise
            return exc.version
        return -1 if table is None else int(table.version())

    def _check_protocol(self, table: DeltaTable) -> None:
        """Raise :class:`~trajstore.errors.UnsupportedTableError` if the version ``table`` holds needs a reader
        feature trajstore does not implement or a committed file of it carries a deletion vector
        (:mod:`~trajstore.storage.protocol`)."""
        number, found = int(table.version()), table.protocol()
        features = protocol.refused(found.min_reader_version, found.reader_features, table.metadata().configuration)
        if features:
            raise protocol.feature_error(self.uri, number, found.min_reader_version, features)
        marked = self._marked(table, number)
        if marked:
            raise protocol.deletion_vector_error(self.uri, number, marked)

    def _marked(self, table: DeltaTable, number: int) -> list[str]:
        """The committed files of version ``number`` (``table``) that carry a deletion vector, as a user names
        them. Each version is looked at once: the newest one known to have none is carried forward by the entries
        of the versions after it (none adds a file with a deletion vector: none still has one); any other version
        is asked of deltalake, which lists every live file's deletion vector."""
        if number == self._unmarked or self._unmarked_since(self._unmarked, number):
            self._unmarked = max(self._unmarked, number)
            return []
        try:
            paths = pa.table(table.deletion_vectors()).column("filepath").to_pylist()
        except (OSError, DeltaError) as exc:  # they exist (only files with one are read), and cannot be read
            raise explain(exc, self.location) or protocol.deletion_vector_error(
                self.uri, number, [], cause=first_line(exc)) from exc
        if not paths:
            self._unmarked = max(self._unmarked, number)
        return [unquote(p.removeprefix("file://")) for p in paths]

    def _refused_protocol(self, number: int | None) -> UnsupportedTableError | None:
        """The refusal of version ``number`` (None: the latest) that deltalake could not open, when the newest
        ``protocol`` action of the log's last entries up to it needs what trajstore does not read (and the newest
        ``metaData`` says the column mapping mode); None otherwise (the log is damaged, or the actions are in a
        checkpoint)."""
        versions = [v for v in self.numbers() if number is None or v <= number]
        try:
            found, properties = self._newest_protocol(versions[-MARKED_STEP:])
            reader = int(found.get("minReaderVersion") or 1) if found is not None else 1
            features = protocol.refused(reader, found.get("readerFeatures"), properties) if found is not None else {}
        except (ValueError, TypeError, AttributeError):  # an entry that is no JSON, a malformed action: damage
            return None
        return protocol.feature_error(self.uri, versions[-1], reader, features) if features else None

    def _newest_protocol(self, versions: Sequence[int]) -> tuple[dict[str, Any] | None, dict[str, str]]:
        """The newest ``protocol`` action of the entries of ``versions`` (None: none has one) and the table
        properties of the newest ``metaData`` action among them."""
        found: dict[str, Any] | None = None
        properties: dict[str, str] | None = None
        for version in reversed(versions):
            for action in self.entry(version) or []:
                found = action["protocol"] if found is None and "protocol" in action else found
                if properties is None and "metaData" in action:
                    properties = dict(action["metaData"].get("configuration") or {})
            if found is not None and properties is not None:
                break
        return found, properties or {}

    def _unmarked_since(self, unmarked: int, number: int) -> bool:
        """Whether no version after ``unmarked`` (one whose files carry no deletion vector) up to ``number`` added
        a file with one, as their entries say (False when one cannot be read, or they are too many to read)."""
        if unmarked < 0 or not unmarked < number <= unmarked + MARKED_STEP:
            return False
        for version in range(unmarked + 1, number + 1):
            actions = self.entry(version)
            if actions is None or any((a.get("add") or {}).get("deletionVector") for a in actions):
                return False
        return True

    def number_at(self, when: datetime) -> int:
        """The latest version committed at or before ``when`` (timezone-aware); deltalake's error for a time before
        the first version."""
        table = self._open(None)
        if table is None:
            raise VersionNotFoundError(f"as_of: the store at {self.uri} has no committed version yet")
        table.load_as_version(when)
        return int(table.version())

    def check_readable(self, number: int) -> None:
        """Raise :class:`VersionNotFoundError` if version ``number``'s log entries were cleaned up."""
        self.read(number)

    def numbers(self) -> list[int]:
        """The versions whose entries the log holds, oldest first (up to the pinned one)."""
        selector = pafs.FileSelector(self.location.path(LOG_DIR), allow_not_found=True)
        try:
            infos = self.location.fs.get_file_info(selector)
        except OSError as exc:
            raise explain(exc, self.location) or exc
        found = sorted(int(m.group(1)) for i in infos if (m := ENTRY.match(i.base_name)))
        return [v for v in found if self.pinned is None or v <= self.pinned]

    def checkpoints(self) -> list[int]:
        """The versions of the log's checkpoints, oldest first."""
        selector = pafs.FileSelector(self.location.path(LOG_DIR), allow_not_found=True)
        try:
            infos = self.location.fs.get_file_info(selector)
        except OSError as exc:
            raise explain(exc, self.location) or exc
        return sorted({int(m.group(1)) for i in infos if (m := CHECKPOINT.match(i.base_name))})

    def oldest_readable(self) -> int | None:
        """The oldest version the log can still be read at (older entries were removed after its retention,
        behind a checkpoint); None before the first commit."""
        return oldest_readable(self.numbers(), self.checkpoints())

    def retention(self) -> Retention:
        """The log's retention rule, as the latest version's table properties say (Delta's defaults where they do
        not; the rule a new table gets before there is one)."""
        table = self._open(None)
        if table is None:
            return Retention.of(self.properties)
        return Retention.of(dict(table.metadata().configuration))

    def set_retention(self, rule: Retention, *, make: bool = True) -> None:
        """Give the table the properties of ``rule`` (with ``make``, made with them when there is none yet; else
        they are what this log makes it with), in a commit of its own when they change; racing changes: the last one
        is kept, and a change whose answer was lost is judged by reading the properties again."""
        self.writable("set_log_retention")
        wanted = rule.properties()
        self.properties = {**self.properties, **wanted}
        last: Exception | None = None
        for _ in tries(COMMIT_RETRIES):
            table = self._open(None)
            if table is None:
                if not make:
                    return
                self._ensure(_full_schema(pa.schema([])))
                continue
            if {k: v for k, v in table.metadata().configuration.items() if k in wanted} == wanted:
                return
            try:
                table.alter.set_table_properties(wanted, raise_if_not_exists=False)
            except StoreAccessError:
                raise
            except (OSError, DeltaError) as exc:  # another commit came first, or the answer was lost: read again
                last = self._lost_race(exc)
        raise CommitError(f"the retention of {self.uri} could not be set: {one_line(last)}")

    def has_entry(self, number: int) -> bool:
        """Whether version ``number``'s entry is in the log (one look at one file, none read)."""
        try:
            info = self.location.fs.get_file_info(self.location.path(LOG_DIR, f"{number:020d}.json"))
        except OSError as exc:
            raise explain(exc, self.location) or exc
        return info.type == pafs.FileType.File

    def entry(self, number: int) -> list[dict[str, Any]] | None:
        """The actions of version ``number``'s entry; None while there is none. An entry that cannot be read (an
        object store that does not answer) raises :class:`StoreAccessError`."""
        try:
            with self.location.fs.open_input_stream(self.location.path(LOG_DIR, f"{number:020d}.json")) as stream:
                text = stream.read().decode()
        except FileNotFoundError:
            return None
        except OSError as exc:
            raise explain(exc, self.location) or StoreAccessError(
                f"{self.uri}: the log entry of version {number} cannot be read: {first_line(exc)}") from exc
        return [json.loads(line) for line in text.splitlines() if line.strip()]

    def commit(self, number: int) -> LogCommit | None:
        """What the commit of version ``number`` did, from its one entry (no listing, no other file read); None
        while there is no such version yet."""
        actions = self.entry(number)
        if actions is None:
            return None
        files, removed, info, metadata, marked, apps = [], [], {}, False, set(), {}
        for action in actions:
            if "add" in action:
                files.append(self._added_file(action["add"]))
                if action["add"].get("deletionVector"):
                    marked.add(files[-1].path)
            elif "remove" in action:
                gone = action["remove"]
                removed.append((self.location.path(unquote(gone["path"])),
                                (gone.get("partitionValues") or {}).get("run_id", "")))
            elif "commitInfo" in action:
                info = action["commitInfo"]
            elif "txn" in action:
                apps[str(action["txn"].get("appId"))] = int(action["txn"].get("version") or 0)
            metadata = metadata or "metaData" in action
        return LogCommit(number, files, removed, info, metadata, frozenset(marked), apps)

    def app_transactions(self, number: int) -> dict[str, tuple[int, int | None]] | None:
        """Every app transaction (idempotency key) version ``number`` holds: id -> (version, ``lastUpdated`` in ms),
        read whole from the log's own files, the last checkpoint at or before it (its ``txn`` actions) and every
        entry since. None where the log cannot be read so (a multi-part or V2 checkpoint, one newer than
        ``number``, an entry gone): ask :meth:`TableState.app_version` then. Transactions past the table's
        ``delta.setTransactionRetentionDuration`` are in it (the caller leaves them out, as Delta does)."""
        apps: dict[str, tuple[int, int | None]] = {}
        try:
            with self.location.fs.open_input_stream(self.location.path(LOG_DIR, "_last_checkpoint")) as f:
                last = json.loads(f.read().decode())
        except FileNotFoundError:
            last = None
        except (OSError, ValueError):
            return None
        start = 0
        if last is not None:
            if not isinstance(last, dict) or not isinstance(last.get("version"), int) or last["version"] > number \
                    or last.get("parts") or last.get("v2Checkpoint"):
                return None
            start = last["version"] + 1
            try:
                with self.location.fs.open_input_file(
                        self.location.path(LOG_DIR, f"{last['version']:020d}.checkpoint.parquet")) as f:
                    txns = pq.read_table(f, columns=["txn"])["txn"].drop_null().to_pylist()
            except (OSError, pa.ArrowException, KeyError):
                return None
            for txn in txns:
                apps[str(txn["appId"])] = (int(txn["version"]), txn.get("lastUpdated"))
        for version in range(start, number + 1):
            actions = self.entry(version)
            if actions is None:
                return None
            for action in actions:
                if "txn" in action:
                    txn = action["txn"]
                    apps[str(txn.get("appId"))] = (int(txn.get("version") or 0), txn.get("lastUpdated"))
        return apps

    def added_in(self, path: str) -> int | None:
        """The version whose commit added the file at ``path`` (newest first; None when the readable log does not
        say: a checkpoint replaced its entry)."""
        for number in reversed(self.numbers()):
            commit = self.commit(number)
            if commit is not None and any(f.path == path for f in commit.files):
                return number
        return None

    def marker(self, number: int) -> str | None:
        """The marker trajstore gave the commit of version ``number`` (:attr:`LogCommit.marker`); None while there
        is no such version yet."""
        commit = self.commit(number)
        return None if commit is None else commit.marker

    def removed_paths(self, hours: int) -> set[str]:
        """The files (paths in the table's filesystem) that commits at least ``hours`` ago removed from the table
        (the log's tombstones)."""
        table = self._open(None)
        if table is None:
            return set()
        paths = table.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False)
        return {self.location.normalized(unquote(p)) for p in paths}

    def _added_file(self, add: dict[str, Any]) -> DataFile:
        stats = json.loads(add.get("stats") or "{}")
        part = add.get("partitionValues", {})
        return DataFile(self.location.path(unquote(add["path"])), part.get("run_id", ""), part.get("env_id", ""),
                        int(stats.get("numRecords") or 0), int(add.get("size") or 0),
                        int(add.get("modificationTime") or 0), stats.get("minValues", {}).get("episode_id"),
                        stats.get("maxValues", {}).get("episode_id"), self.location.fs,
                        bool(add.get("dataChange", True)))

    def _open(self, number: int | None) -> DeltaTable | None:
        try:
            return self._listed(lambda: DeltaTable(self.uri, version=number,
                                                   storage_options=self.location.storage_options))
        except TableNotFoundError:
            return None
        except (OSError, DeltaError) as exc:  # deltalake says "object store" errors either way
            raise explain(exc, self.location) or exc

    def _listed(self, read: Callable[[], Any]) -> Any:
        """``read()`` (a read of the log: an open, an update), made again after a back-off while its listing misses
        a version (:func:`_listing_race`); a version still missing after ~1 s is damage to the log."""
        last: DeltaError | None = None
        for _ in tries(LISTING_RETRIES):
            try:
                return read()
            except DeltaError as exc:
                if not _listing_race(exc):
                    raise
                last = exc
        if last is not None and GAP not in str(last):  # a file the log names still missing: not a race
            raise last
        listed = " and ".join(re.findall(r"\bversion: (\d+)", str(last))[:2])
        listed = f"versions {listed}" if listed else "two versions"
        raise StoreDamagedError(f"the commit log of {self.uri} lists {listed} but not those between them (listed "
                                f"{LISTING_RETRIES} times over ~1 s): a log entry is missing; run `trajstore check`",
                                path=self.location.uri_of(LOG_DIR)) from last

    # --- checkpoints -----------------------------------------------------------------------------------------

    def last_checkpoint(self) -> int | None:
        """The version of the log's last checkpoint (from ``_last_checkpoint``), None if it has none."""
        try:
            with self.location.fs.open_input_stream(self.location.path(LOG_DIR, "_last_checkpoint")) as f:
                return int(json.loads(f.read().decode())["version"])
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def versions_since_checkpoint(self, number: int | None = None) -> int:
        """How many versions the log is past its last checkpoint (all of them, counted from version 0, without
        one); ``number``: the latest version, if known."""
        number = self.latest_number() if number is None else number
        last = self.last_checkpoint()
        return max(0, number - (-1 if last is None else last))

    def checkpoint_if_due(self, interval: int | None = None) -> int | None:
        """Write a checkpoint of the latest version if the log is ``interval`` (None: as often as the table's
        ``delta.checkpointInterval`` says) or more versions past its last one, then remove the entries behind it that
        are older than the table's log retention; returns the version checkpointed, or None. Two processes doing it
        at once write the same file."""
        table = self._open(None)
        if table is None:
            return None
        due = Retention.of(dict(table.metadata().configuration)).checkpoint_interval if interval is None else interval
        if self.versions_since_checkpoint(table.version()) < due:
            return None
        table.create_checkpoint()
        log.info("checkpointed %s at version %d", self.uri, table.version())
        self.clean_up(table)
        return int(table.version())

    def clean_up(self, table: DeltaTable | None = None) -> None:
        """Remove the log entries older than the table's retention that a checkpoint stands for (deltalake's
        ``cleanup_metadata``: what every Delta engine does after a checkpoint)."""
        table = table or self._open(None)
        if table is not None:
            table.cleanup_metadata()

    # --- commits ---------------------------------------------------------------------------------------------

    def ensure(self, physical: pa.Schema) -> TableState:
        """The latest version, the table created or given the columns of ``physical`` (a file's own schema) it lacks
        first (a commit
        of its own), so that a commit of such a file needs no other change. Safe when several processes (or
        machines) do it at once: the losers of a race read the log again."""
        self.writable("write")
        return TableState(self, self._ensure(_full_schema(physical)))

    def reserve(self, types: Mapping[str, pa.DataType], logical: Mapping[str, pa.DataType] | None = None,
                declared: Mapping[str, Mapping[str, Any] | None] | None = None, *,
                known: TableState | None = None) -> dict[str, str]:
        """The physical name of each column (name -> the type its files hold; ``logical``: the types readers
        return, for the names' tags; ``declared``: what each declares it holds, in its field metadata), resolved
        against the log and added to the log's schema where new, in a commit of its own, before any file uses it
        (see :mod:`~trajstore.storage.names`). Safe when several writers race: a lost race resolves again.
        ``known``: a version already read, whose schema answers when it holds every column (columns are only ever
        added: a later version resolves them alike), without reading the log."""
        self.writable("write")
        if known is not None:
            mapping, new = names.resolve(types, {f.name: f.type for f in known.schema}, logical, declared=declared,
                                         log_declared=known.declarations)
            if not new:
                return mapping
        last: Exception | None = None
        for _ in tries(COMMIT_RETRIES):
            try:
                reserved = self._reserved(types, logical, declared)
            except StoreAccessError:
                raise
            except (OSError, DeltaError) as exc:  # another commit came first: read the log again
                last = self._lost_race(exc)
                continue
            if reserved is not None:
                return reserved
        raise CommitError(f"the columns {sorted(types)} could not be reserved in {self.uri}: {one_line(last)}")

    def _reserved(self, types: Mapping[str, pa.DataType], logical: Mapping[str, pa.DataType] | None,
                  declared: Mapping[str, Mapping[str, Any] | None] | None) -> dict[str, str] | None:
        """One try of :meth:`reserve`: the names resolved against the latest version, the table created and given
        the new columns first where needed, each step reading the log again at once (only a lost race waits before
        the next try); None when another writer's columns changed the names meanwhile (try again)."""
        table = self._open(None)
        for step in range(3):  # (the table made,) the columns added, the names resolved on what the log holds
            schema = pa.schema([]) if table is None else pa.schema(table.schema().to_arrow())
            mapping, new = names.resolve(types, {f.name: f.type for f in schema}, logical, declared=declared,
                                         log_declared=declarations(schema))
            if not new:
                return mapping
            if step == 2:
                return None
            if table is None:
                table = self._ensure(_full_schema(pa.schema([])))
            else:
                self._add_columns(table, new)
                table = self._open(None)
        return None

    def _lost_race(self, exc: OSError | DeltaError) -> DeltaError:
        """``exc``, raised by a commit of a schema or properties change, if it says another commit came first (the
        caller tries again on the latest version); the store's own failure (:func:`explain`) or any other error is
        raised."""
        access = explain(exc, self.location)
        if access is not None:
            raise access from exc
        if not isinstance(exc, DeltaError):
            raise exc
        return exc

    def append(self, written: WrittenFile) -> None:
        """Commit ``written``, exactly once: each try is planned on the latest version and never rebased by
        deltalake (a rebase after a lost answer would commit the file a second time, after a compaction that
        merged it, too); a try that lost the race to another commit is looked for in the log, then made again
        on the versions since (read incrementally, as deltalake's own rebase would).

        Safe to call again for the same file after it raised: the first try's base and marker are kept until the
        file is known to be committed, and a second call first looks for it in every version after that base, not
        only in the latest file list (a compaction may have merged the file since)."""
        self.writable("write")
        tried = self._unsure.get(written.path)
        if tried is not None and find(self, tried) is not None:
            del self._unsure[written.path]
            return
        full_schema = _full_schema(written.schema)
        table = self._ensure(full_schema)
        attempt = self._unsure.setdefault(written.path, Attempt(table.version()))
        while len(self._unsure) > UNSURE_KEPT:  # files given up on are never sent again: the oldest go
            del self._unsure[next(iter(self._unsure))]
        what = f"the append of {written.relative}"
        last: Exception | None = None
        for i in tries(APPEND_RETRIES):
            try:
                if i:  # another writer won the version race: read what it committed
                    self._refresh(table)
                self._send(table, attempt, [_add_action(written)], what=what, metadata={"operation": "append"},
                           schema=full_schema, retries=0)
                del self._unsure[written.path]
                return
            except CommitFailedError as exc:
                last = exc
            except StoreAccessError:
                raise
            except Exception as exc:
                if not _listing_race(exc):  # it did not land (settle looked): the log is read again, then retried
                    raise explain(exc, self.location) or CommitError(
                        f"commit of {written.relative} to {self.uri} failed: {one_line(exc)}") from exc
                last = exc
        raise CommitError(f"commit of {written.relative} failed after {APPEND_RETRIES} attempts (other commits "
                          f"kept coming first): {one_line(last)}")

    def commit_after(self, state: TableState, written: WrittenFile, *, app: tuple[str, int] | None = None) -> bool:
        """Commit ``written`` as the version right after ``state``'s, recording the app transaction ``app`` (its
        id and version) if given, or not at all: False when another commit took that version first (read the log
        again, then retry). Never rebases onto newer commits: what the caller checked against ``state`` still
        holds when the commit succeeds."""
        return self.commit_group(state, [written], [] if app is None else [app])

    def commit_group(self, state: TableState, written: Sequence[WrittenFile], apps: Sequence[tuple[str, int]] = (),
                     *, metadata: dict[str, Any] | None = None) -> bool:
        """Commit every file of ``written`` and every app transaction of ``apps`` (an id and a version each: the
        idempotency keys of the requests the files hold, each its own ``txn`` action, stamped with the time so that
        the table's ``delta.setTransactionRetentionDuration`` applies) as the version right after ``state``'s, in
        one commit, or not at all: False when another commit took that version first (read the log again, then
        retry). Never rebases onto newer commits: what the caller checked against ``state`` still holds when the
        commit succeeds. The table must hold the files' columns already (:meth:`ensure`)."""
        self.writable("write")
        now = int(time.time() * 1000)
        transactions = [Transaction(app_id, version, now) for app_id, version in apps]
        schema = pa.schema(state._table.schema().to_arrow())
        for w in written:
            schema = _merged(schema, w.schema)
        what = f"the append of {written[0].relative}" if len(written) == 1 else \
            f"the append of {len(written)} files ({written[0].relative}, …)"
        try:
            self._send(state._table, Attempt(state.number), [_add_action(w) for w in written], what=what,
                       metadata=metadata or {"operation": "append"}, schema=schema, retries=0,
                       transactions=transactions)
        except CommitFailedError:
            return False
        except StoreAccessError:
            raise
        except Exception as exc:
            if _listing_race(exc):  # it did not land: as for a lost race, the caller reads the log again
                return False
            raise explain(exc, self.location) or CommitError(f"{what} to {self.uri} failed: {one_line(exc)}") from exc
        return True

    def swap(self, state: TableState, removed: list[DataFile], written: list[WrittenFile], *,
             metadata: dict[str, Any]) -> int | None:
        """Commit, in one transaction over the table ``state``, the removal of exactly ``removed`` and the addition of
        ``written`` (a compaction, a delete, a rewrite); returns the version committed (None, rarely, when the change
        is known to be committed but its version cannot be read back). Commits appended after
        ``state`` stay (the log rebases the commit onto them); if one of them removed a file of ``removed``
        (a concurrent delete or compaction), the commit fails with a :class:`CommitError` and changes nothing.
        ``metadata`` goes into the commit's info under ``"trajstore"`` (what
        :func:`trajstore.storage.history.history` shows)."""
        operation = str(metadata.get("operation", "change"))
        self.writable(operation)
        table = state._table
        now = int(time.time() * 1000)
        actions: list[Any] = [RemoveAction(self.location.relative(f.path), True, now, f.size,
                                           {"run_id": f.run_id, "env_id": f.env_id}) for f in removed]
        actions += [_add_action(w) for w in written]
        table_schema = pa.schema(table.schema().to_arrow())
        for w in written:
            table_schema = _merged(table_schema, w.schema)
        if len(table_schema) > len(table.schema().to_arrow()):  # a rewrite that adds a column: the log's schema
            table = self._ensure(table_schema)  # gains it first (a commit of its own), then the files swap
            listed = {f.path for f in TableState(self, table).files}
            if any(f.path not in listed for f in removed):
                raise CommitError(f"{operation}: another change removed some of the files it read; nothing was "
                                  "committed")
        attempt = Attempt(table.version())
        for i in tries(LISTING_RETRIES):
            try:
                landed = self._send(table, attempt, actions, what=f"the {operation} of {len(removed)} file(s)",
                                    metadata=metadata, schema=table_schema)
                break
            except StoreAccessError:
                raise
            except OSError as exc:
                raise explain(exc, self.location) or CommitError(
                    f"{operation} of {len(removed)} file(s) in {self.uri} was not committed: {one_line(exc)}") from exc
            except Exception as exc:
                if _listing_race(exc) and i < LISTING_RETRIES - 1:  # its rebase listed the log as another commit
                    continue                                        # was made, and it did not land: sent again
                raise explain(exc, self.location) or CommitError(
                    f"{operation} of {len(removed)} file(s) in {self.uri} was not committed (another change "
                    f"removed some of them first?): {first_line(exc)}") from exc
        if landed is not None:
            return landed
        try:  # it committed: which version it took is for the report alone, and never fails the change
            return find(self, attempt)
        except CommitUnknownError as exc:
            log.warning("%s: the %s was committed, but its version could not be read back: %s", self.uri,
                        operation, first_line(exc))
            return None

    def _send(self, table: DeltaTable, attempt: Attempt, actions: list[Any], *, what: str, metadata: dict[str, Any],
              schema: pa.Schema, retries: int | None = None,
              transactions: Sequence[Transaction] = ()) -> int | None:
        """Send one commit planned on ``table``'s version (``attempt``: its base and marker; ``what``: the change,
        for messages). Returns None when it committed, or the version it landed as when sending raised after it
        landed (:func:`~trajstore.storage.landing.settle`); raises sending's own error when it did not land, and
        :class:`~trajstore.errors.CommitUnknownError` when the log cannot tell. ``retries``: how often deltalake
        may rebase it onto commits that came first (None: its default; 0: never, the caller retries)."""
        properties = CommitProperties(custom_metadata=attempt.metadata(metadata), max_commit_retries=retries,
                                      app_transactions=list(transactions) or None)
        try:
            table.create_write_transaction(actions, mode="append", schema=schema,
                                           partition_by=list(PARTITION_COLUMNS), commit_properties=properties)
        except BaseException as exc:
            landed = settle(self, attempt, exc, what, race=isinstance(exc, CommitFailedError))
            if landed is None:
                raise
            return landed
        return None

    def advanced(self, state: TableState) -> TableState:
        """The latest version, read from ``state`` on (the versions since, incrementally); ``state`` must be the
        caller's own (its table is brought forward: what it had cached is read again from the new state)."""
        table = state._table
        self._refresh(table)
        self._check_protocol(table)
        return TableState(self, table)

    def _refresh(self, table: DeltaTable) -> None:
        """``table`` brought to the latest version by reading the versions since (columns are only ever added:
        a file's columns the log held stay held)."""
        try:
            self._listed(table.update_incremental)
        except (OSError, DeltaError) as exc:
            raise explain(exc, self.location) or exc

    def _ensure(self, schema: pa.Schema) -> DeltaTable:
        """The table at its latest version, created or given the columns of the log schema ``schema`` it lacks."""
        last: Exception | None = None
        for _ in tries(COMMIT_RETRIES):
            try:
                return self._with_columns(schema)
            except StoreAccessError:
                raise
            except (OSError, DeltaError) as exc:  # another commit came first: read the log again
                last = self._lost_race(exc)
        raise CommitError(f"the table {self.uri} could not be created or given new columns: {one_line(last)}")

    def _with_columns(self, schema: pa.Schema) -> DeltaTable:
        table = self._open(None)
        if table is None:  # created with the partition columns alone, the same whoever creates it: racing creators
            try:           # (a local log lets each commit its own creation) then leave one schema, columns after
                DeltaTable.create(self.uri, _full_schema(pa.schema([])), partition_by=list(PARTITION_COLUMNS),
                                  mode="ignore", name="steps", configuration=self.properties,
                                  storage_options=self.location.storage_options)
                table = self._open(None)
            except (OSError, DeltaError):  # a concurrent writer created it first, or the creation's answer was
                table = self._open(None)     # lost: the log says whether the table is there
                if table is None:
                    raise
            assert table is not None
        known = set(pa.schema(table.schema().to_arrow()).names)
        new = [f for f in schema if f.name not in known]
        if new:
            self._add_columns(table, new)
            table = self._open(None)
            assert table is not None
        return table

    def _add_columns(self, table: DeltaTable, fields: list[pa.Field]) -> None:
        """Give the log's schema ``fields`` in a commit of its own. When that raises, the log says whether it
        landed anyway (the columns are there: done) before the error goes on; a log that cannot be read raises
        :class:`~trajstore.errors.CommitUnknownError`."""
        try:
            table.alter.add_columns([Field.from_arrow(f) for f in fields])
        except Exception as exc:
            try:
                now = self._open(None)
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


def _add_action(written: WrittenFile) -> AddAction:
    return AddAction(written.relative, written.size, {"run_id": written.run_id, "env_id": written.env_id},
                     written.modified_ms, True, json.dumps(written.stats))


def _full_schema(physical: pa.Schema) -> pa.Schema:
    """The table's schema (as the Delta log records it) for a file's: the partition columns first."""
    stored = [f for f in delta_schema(physical) if f.name not in PARTITION_COLUMNS]
    return pa.schema([pa.field(c, pa.string()) for c in PARTITION_COLUMNS] + stored)


def _merged(table_schema: pa.Schema, physical: pa.Schema) -> pa.Schema:
    """``table_schema`` with the columns of ``physical`` (a file's own schema) it lacks appended (nullable, as the log
    records them)."""
    known = set(table_schema.names)
    return pa.schema(list(table_schema) + [f for f in delta_schema(physical) if f.name not in known])


def _ms(value: object) -> int:
    if hasattr(value, "timestamp"):
        return int(value.timestamp() * 1000)  # type: ignore[union-attr]
    return int(value or 0)  # type: ignore[call-overload]


def _listing_race(exc: BaseException) -> bool:
    """Whether ``exc`` is deltalake finding a version missing between two it listed in the log, or a log file it
    listed gone when it read it. Each version's entry is made whole (put if absent) and none after the last
    checkpoint is removed, so while other writers commit the first is a listing that missed an entry made as it ran
    (a directory listing need not show those), not damage; the second, a clean-up (after a newer checkpoint than the
    listing saw) removing the older checkpoint and entries as they were read. Reading the log again finds the
    entry, or the newer checkpoint."""
    return isinstance(exc, DeltaError) and (GAP in str(exc) or CLEANED_UP.search(str(exc)) is not None)
