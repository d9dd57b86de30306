"""The ``priorities`` table (``<store>/priorities/``): the priorities learners gave the items of their replays
(:mod:`~trajstore.loaders.replay`), a Delta table of its own beside ``steps/`` and ``runs/``, and the one module that
reads and writes its log (as :mod:`~trajstore.storage.log` is for ``steps`` and :mod:`~trajstore.storage.runs_log`
for ``runs``).

The table follows the open-table rule: its columns mean what their names say, each column's meaning is its Delta
field comment, and the table's description says how to read it, so another engine reads it without trajstore:

- ``replay``: the replay's name (``store.replay(priorities="name")``); the table is partitioned by it, one folder
  ``replay=<name>/`` each;
- ``episode_id``, ``step``, ``agent_id``: the item (a step, the first step of a window or of an n-step transition;
  ``agent_id`` null but in an agent's own trajectory, where ``step`` counts that agent's rows as a batch's ``start``
  does);
- ``priority``: what the learner gave (finite, >= 0); ``time``: when;
- ``version``: the version of this table the row was committed as. An item's priority is its row with the highest
  ``version``: rows are only appended, each commit holding one row per item at most.

**Commits.** A learner's updates are appended as one file per commit, planned on the table's latest version and
committed as the version right after it, never rebased (its rows carry that number): when another learner's commit
took that version, the rows are written again for the next one. So two learners updating one table both land, in
the order of their commits, and the later one's rows win for the items both updated. Every commit carries a marker
and one whose sending raised is settled from the log (:func:`~trajstore.storage.landing.settle`); a learner killed
mid-commit leaves at most a file no version lists, which :meth:`PrioritiesLog.vacuum` removes.

**Compaction.** Once a replay's folder holds :data:`COMPACT_FILES` files, its rows are merged into one file holding
the latest row of each item (the rows' own ``version`` kept), swapped for exactly the files read: commits appended
meanwhile stay, and each of their rows has a higher version than any row merged. Reading a replay's priorities
(:meth:`PrioritiesLog.rows`) applies its files in the order of their highest version, each file's rows over the
earlier ones'.
"""

from __future__ import annotations

import json
import logging
import re
import threading
import time
import uuid
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Sequence
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.dataset as ds
import pyarrow.parquet as pq
from deltalake import DeltaTable
from deltalake.exceptions import CommitFailedError, DeltaError, TableNotFoundError
from deltalake.transaction import AddAction, CommitProperties, RemoveAction

from trajstore.errors import CommitError, InputError, StoreDamagedError, VersionNotFoundError, first_line, one_line
from trajstore.retry import tries
from trajstore.storage.landing import Attempt, settle
from trajstore.storage.location import Location, explain
from trajstore.storage.log import GAP, Log, unneeded_files
from trajstore.storage.retention import DEFAULT, Retention
from trajstore.storage.table import fsync_file

log = logging.getLogger(__name__)

FOLDER = "priorities"
PARTITION = "replay"
COMMIT_RETRIES = 50  # a commit's tries while other learners' commits keep taking the version it was planned after
COMPACT_FILES = 32  # files of one replay past which a commit merges them
NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.-]{0,127}$")
DESCRIPTION = ("trajstore: the priorities learners gave the items of their replays, one row per item per commit. "
               "An item's priority is its row with the highest version.")


def _column(name: str, kind: pa.DataType, comment: str) -> pa.Field:
    return pa.field(name, kind, metadata={"comment": comment})


SCHEMA = pa.schema([
    _column(PARTITION, pa.string(), "the replay's name (store.replay(priorities=name)); a folder replay=<name>/ each"),
    _column("episode_id", pa.int64(), "the item's episode (the episode_id of its steps)"),
    _column("step", pa.int32(), "the item's first step: a step's own, a window's start, an n-step transition's t; in "
                                "an agent's own trajectory its place among that agent's rows"),
    _column("agent_id", pa.string(), "the item's agent in a multi-agent episode; null for a single-agent one"),
    _column("priority", pa.float64(), "the priority a learner gave the item (finite, >= 0)"),
    _column("time", pa.timestamp("us", tz="UTC"), "when the learner gave it"),
    _column("version", pa.int64(), "the version of priorities/ this row was committed as: an item's priority is its "
                                   "row with the highest version"),
])
ROWS = pa.schema([f for f in SCHEMA if f.name != PARTITION])  # what a file holds (the partition is its folder)


def check_name(name: object) -> str:
    """``name`` if it can name a replay's priorities, else an :class:`InputError` naming ``priorities``."""
    if not isinstance(name, str) or not NAME.match(name):
        raise InputError(f"priorities: a replay's name is 1 to 128 letters, digits, '_', '.' or '-', starting with a "
                         f"letter or a digit (or None: priorities kept in memory only); got {name!r}")
    return name


@dataclass(frozen=True)
class Rows:
    """A replay's rows at one version of the table, file by file in the order they apply (see the module): each a
    table of :data:`ROWS`, one row per item; and the highest priority of all of them (None without rows)."""

    version: int
    files: list[pa.Table]
    highest: float | None


class PrioritiesLog:
    """The ``priorities`` table at ``location`` (the ``priorities`` folder of a store)."""

    def __init__(self, location: Location, *, rule: Callable[[], Retention] | None = None) -> None:
        self.location = location
        self.entries = Log(location)  # its log entries, as the landing of a commit reads them
        self.rule = rule  # the retention a new table gets (the store's ``steps`` table's), else trajstore's default
        self._committing = threading.Lock()
        self._table: DeltaTable | None = None

    @property
    def uri(self) -> str:
        return self.location.uri

    # --- reading ---------------------------------------------------------------------------------------------

    def latest_version(self) -> int:
        """The table's latest version (-1 while there is none)."""
        table = self._latest()
        return -1 if table is None else int(table.version())

    def rows(self, name: str, version: int | None = None) -> Rows:
        """Replay ``name``'s rows at ``version`` of the table (the latest by default); a version the table does not
        have is a :class:`~trajstore.errors.VersionNotFoundError`."""
        table = self._at(version)
        if table is None:
            return Rows(-1, [], None)
        files = [f for f in self._files(table) if f.replay == name]
        tables = [self._read_file(f.path) for f in sorted(files, key=lambda f: f.highest)]
        highest = max((pc.max(t["priority"]).as_py() for t in tables if t.num_rows), default=None)
        return Rows(int(table.version()), tables, highest)

    def file_paths(self) -> list[str]:
        """The committed files of the latest version (paths in the location's filesystem), for a dataset over them."""
        table = self._latest()
        return [] if table is None else [self.location.path(f.path) for f in self._files(table)]

    def _at(self, version: int | None) -> DeltaTable | None:
        if version is None:
            return self._latest()
        if isinstance(version, bool) or not isinstance(version, (int, np.integer)) or version < 0:
            raise InputError(f"version: a version of the priorities table is a whole number >= 0, got {version!r}")
        try:
            return DeltaTable(self.uri, version=int(version), storage_options=self.location.storage_options)
        except TableNotFoundError:
            raise VersionNotFoundError(f"version: the priorities table {self.uri} has no versions yet") from None
        except (OSError, DeltaError) as exc:
            latest = self.latest_version()
            raise explain(exc, self.location) or VersionNotFoundError(
                f"version: the priorities table {self.uri} has no version {version} (its latest is {latest}): "
                f"{first_line(exc)}") from None

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

    def _files(self, table: DeltaTable) -> list[_File]:
        """The files ``table``'s version lists: path, replay, rows' highest version, size."""
        actions = pa.table(table.get_add_actions(flatten=True))
        if not actions.num_rows:
            return []
        paths = [unquote(p) for p in actions["path"].to_pylist()]
        replays = actions[f"partition.{PARTITION}"].to_pylist()
        highest = actions["max.version"].to_pylist() if "max.version" in actions.column_names else [None] * len(paths)
        sizes = actions["size_bytes"].to_pylist()
        return [_File(p, r, -1 if h is None else int(h), int(s)) for p, r, h, s in zip(paths, replays, highest, sizes)]

    def _read_file(self, path: str) -> pa.Table:
        """The rows of the file at ``path`` (relative to the table), typed as :data:`ROWS`."""
        try:
            found = pq.read_table(self.location.path(path), filesystem=self.location.fs)
        except OSError as exc:
            raise explain(exc, self.location) or StoreDamagedError(
                f"the priorities table {self.uri} cannot be read: {first_line(exc)}; run `trajstore check`",
                path=self.location.uri_of(path)) from exc
        return typed(found)

    # --- commits ---------------------------------------------------------------------------------------------

    def append(self, name: str, rows: pa.Table) -> int:
        """Commit ``rows`` (of :data:`ROWS` but ``version``; one per item) as replay ``name``'s, as the version right
        after the table's latest (planned again when another commit took it); returns that version."""
        check_name(name)
        with self._committing:  # a process's commits one at a time (they would take each other's versions)
            version = self._append(name, rows)
            self._compact_if_due(name)
            return version

    def _append(self, name: str, rows: pa.Table) -> int:
        last: Exception | None = None
        for _ in tries(COMMIT_RETRIES):
            table = self._latest()
            if table is None:
                self._create()
                continue
            planned = int(table.version()) + 1
            path, size, stats = self._write(name, with_version(rows, planned))
            try:
                landed = self._send(table, [_add(self.location.relative(path), name, size, stats)],
                                    {"operation": "priorities", "replay": name, "rows": rows.num_rows}, retries=0)
                return planned if landed is None else landed
            except CommitFailedError as exc:  # another commit took the version, and this one did not land
                last = exc
            except DeltaError as exc:
                if GAP not in str(exc):
                    raise explain(exc, self.location) or CommitError(
                        f"the priorities table {self.uri} did not take {rows.num_rows} rows of {name!r}: "
                        f"{first_line(exc)}") from exc
                last = exc
            self._remove(path)
        raise CommitError(f"the priorities table {self.uri} did not take {rows.num_rows} rows of {name!r} after "
                          f"{COMMIT_RETRIES} tries (other commits kept coming first): {one_line(last)}")

    def _send(self, table: DeltaTable, actions: list[AddAction | RemoveAction], info: dict[str, object], *,
              retries: int | None) -> int | None:
        """Send one commit planned on ``table``'s version; None when it committed, else (sending raised after it
        landed) the version it landed as. Raises sending's error when it did not land."""
        attempt = Attempt(int(table.version()))
        properties = CommitProperties(custom_metadata=attempt.metadata(info), max_commit_retries=retries)
        try:
            table.create_write_transaction(actions, mode="append", schema=SCHEMA, partition_by=[PARTITION],
                                           commit_properties=properties)
        except BaseException as exc:
            landed = settle(self.entries, attempt, exc, f"the {info['operation']} commit",
                            race=isinstance(exc, CommitFailedError))
            if landed is not None:
                return landed
            if isinstance(exc, (CommitFailedError, DeltaError)) or not isinstance(exc, OSError):
                raise
            raise explain(exc, self.location) or exc
        return None

    def _create(self) -> None:
        """Make the table (racing creators: one makes it, the others find it made)."""
        try:
            try:
                rule = DEFAULT if self.rule is None else self.rule()
                DeltaTable.create(self.uri, SCHEMA, partition_by=[PARTITION], mode="ignore", name=FOLDER,
                                  description=DESCRIPTION, configuration=rule.properties(),
                                  storage_options=self.location.storage_options)
            except (OSError, DeltaError):  # another process made it first, or the answer was lost: the log tells
                pass
            made = self._open() is not None
        except (OSError, DeltaError) as exc:
            raise explain(exc, self.location) or exc
        if not made:
            raise CommitError(f"the priorities table {self.uri} could not be created")

    def _write(self, name: str, rows: pa.Table) -> tuple[str, int, dict[str, object]]:
        """``rows`` written whole as one Parquet file in replay ``name``'s folder, sorted by item (no reader sees it
        before a commit lists it); its path, size and statistics."""
        rows = rows.cast(ROWS).sort_by([("episode_id", "ascending"), ("step", "ascending"),
                                        ("agent_id", "ascending")])
        path = self.location.path(f"{PARTITION}={name}/part-{uuid.uuid4().hex}.parquet")
        buffer = pa.BufferOutputStream()
        pq.write_table(rows, buffer, compression="zstd")
        body = buffer.getvalue()
        try:
            if self.location.is_local:
                self.location.fs.create_dir(str(Path(path).parent), recursive=True)
            with self.location.fs.open_output_stream(path) as out:
                out.write(body)
            if self.location.is_local:  # durable before a commit lists it (on S3 a completed upload already is)
                fsync_file(Path(path))
        except OSError as exc:
            raise explain(exc, self.location) or exc
        return path, body.size, _stats(rows)

    def _remove(self, path: str) -> None:
        """Remove the file of a commit the log did not take (nothing lists it)."""
        try:
            self.location.fs.delete_file(path)
        except OSError as exc:
            log.warning("%s: could not remove %s, a file no commit lists: %s", self.uri, path, first_line(exc))

    # --- rewrites: compaction, deleted episodes, vacuum -------------------------------------------------------

    def _compact_if_due(self, name: str) -> None:
        """Merge replay ``name``'s files once there are :data:`COMPACT_FILES` (see the module); a failure is only
        logged (the rows are all there)."""
        table = self._latest()
        files = [] if table is None else [f for f in self._files(table) if f.replay == name]
        if table is None or len(files) < COMPACT_FILES:
            return
        try:
            merged = latest_rows([self._read_file(f.path) for f in sorted(files, key=lambda f: f.highest)])
            path, size, stats = self._write(name, merged)
            actions: list[AddAction | RemoveAction] = [_remove_action(f) for f in files]
            actions.append(_add(self.location.relative(path), name, size, stats))
            try:
                self._send(table, actions, {"operation": "compact", "replay": name, "files": len(files)},
                           retries=None)
            except BaseException:
                self._remove(path)
                raise
        except Exception as exc:  # noqa: BLE001 - a compaction that did not happen leaves the rows as they were
            log.warning("%s: the files of replay %r were not merged: %s", self.uri, name, first_line(exc))

    def delete_episodes(self, episode_ids: np.ndarray) -> int:
        """Remove every row of ``episode_ids`` (a deleted run's episodes) from every replay, in one commit: each file
        holding some rewritten without them. Returns the rows removed."""
        ids = np.unique(np.asarray(episode_ids, np.int64))
        table = self._latest()
        if table is None or not len(ids):
            return 0
        last: Exception | None = None
        with self._committing:
            for _ in tries(COMMIT_RETRIES):
                table = self._latest()
                assert table is not None
                actions, written, removed = self._without(table, ids)
                if not actions:
                    return 0
                try:
                    self._send(table, actions, {"operation": "delete", "rows": removed}, retries=None)
                    return removed
                except (CommitFailedError, DeltaError) as exc:  # a compaction removed a file first: again
                    for path in written:
                        self._remove(path)
                    last = exc
            raise CommitError(f"the priorities table {self.uri}: the rows of {len(ids)} deleted episode(s) could not "
                              f"be removed: {one_line(last)}")

    def _without(self, table: DeltaTable, ids: np.ndarray) -> tuple[list[AddAction | RemoveAction], list[str], int]:
        """The actions replacing each file of ``table`` that holds rows of ``ids`` by a file without them."""
        actions: list[AddAction | RemoveAction] = []
        written: list[str] = []
        removed = 0
        for f in self._files(table):
            rows = self._read_file(f.path)
            gone = np.isin(rows["episode_id"].to_numpy(), ids)
            if not gone.any():
                continue
            removed += int(gone.sum())
            actions.append(_remove_action(f))
            if not gone.all():
                path, size, stats = self._write(f.replay, rows.filter(pa.array(~gone)))
                written.append(path)
                actions.append(_add(self.location.relative(path), f.replay, size, stats))
        return actions, written, removed

    def unneeded(self, older_than_s: float) -> list[str]:
        """The files no version of the last ``older_than_s`` seconds lists (merged or rewritten away, or never
        committed) and at least that old: paths in the location's filesystem, for a vacuum to remove."""
        return unneeded_files(self._latest(), self.location, older_than_s)


def dataset(location: Location, paths: Sequence[str]) -> ds.Dataset:
    """The rows of the files ``paths`` (the table's, in ``location``'s filesystem) as one pyarrow dataset of
    :data:`SCHEMA`: what the ``priorities`` SQL view reads (a file's ``replay`` from its folder's name)."""
    if not paths:
        return ds.dataset([], format="parquet", schema=SCHEMA)
    partitioning = ds.partitioning(pa.schema([SCHEMA.field(PARTITION)]), flavor="hive")
    return ds.dataset(list(paths), format="parquet", filesystem=location.fs, schema=SCHEMA,
                      partitioning=partitioning, partition_base_dir=location.root)


@dataclass(frozen=True)
class _File:
    path: str  # relative to the table
    replay: str
    highest: int  # the highest version of its rows
    size: int


def typed(found: pa.Table) -> pa.Table:
    """``found`` (a file's rows as trajstore or another tool wrote them) typed as :data:`ROWS`: a column it lacks as
    nulls, one it adds left out."""
    columns = [found[f.name].cast(f.type) if f.name in found.column_names else pa.nulls(found.num_rows, f.type)
               for f in ROWS]
    return pa.Table.from_arrays(columns, schema=ROWS)


def with_version(rows: pa.Table, version: int) -> pa.Table:
    """``rows`` with ``version`` set to ``version`` in each."""
    names = [n for n in rows.column_names if n != "version"]
    return pa.table([*(rows[n] for n in names), pa.repeat(pa.scalar(version, pa.int64()), rows.num_rows)],
                    names=[*names, "version"])


def latest_rows(files: Sequence[pa.Table]) -> pa.Table:
    """The rows of ``files`` (each one row per item, in the order they apply) reduced to each item's last: its row of
    the highest version (the later file's on a tie)."""
    if not files:
        return ROWS.empty_table()
    rows = pa.concat_tables(files)
    agent = rows["agent_id"].combine_chunks().dictionary_encode()
    code = agent.indices.to_numpy(zero_copy_only=False).astype(np.int64) if agent.null_count == 0 else \
        agent.indices.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)
    episode, step = rows["episode_id"].to_numpy(), rows["step"].to_numpy()
    version, order_in = rows["version"].to_numpy(), np.arange(rows.num_rows)
    order = np.lexsort((order_in, version, code, step, episode))  # an item's rows together, its last one last
    keys = (episode[order], step[order], code[order])
    last = np.ones(len(order), bool)
    last[:-1] = (keys[0][1:] != keys[0][:-1]) | (keys[1][1:] != keys[1][:-1]) | (keys[2][1:] != keys[2][:-1])
    return rows.take(pa.array(order[last]))


def _stats(rows: pa.Table) -> dict[str, object]:
    stats: dict[str, object] = {"numRecords": rows.num_rows}
    if rows.num_rows:
        bounds = {c: pc.min_max(rows[c]) for c in ("episode_id", "version")}
        stats["minValues"] = {c: b["min"].as_py() for c, b in bounds.items()}
        stats["maxValues"] = {c: b["max"].as_py() for c, b in bounds.items()}
        stats["nullCount"] = {c: rows[c].null_count for c in ("episode_id", "version")}
    return stats


def _add(relative: str, name: str, size: int, stats: dict[str, object]) -> AddAction:
    return AddAction(relative, size, {PARTITION: name}, int(time.time() * 1000), True, json.dumps(stats))


def _remove_action(f: _File) -> RemoveAction:
    return RemoveAction(f.path, True, int(time.time() * 1000), f.size, {PARTITION: f.replay})
