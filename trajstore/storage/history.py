"""Versions of a store: the history of its log, and the version to read for ``version=N`` or ``as_of=datetime``.

Every commit of the ``steps`` log is one version. :func:`history` reads the commits themselves (each version's
entry, through :class:`~trajstore.storage.log.Log`): when each was made, what it did (``create``, ``append``,
``delete``, ``compact``, ``add_column``, ``add_columns`` when a writer brought a new extra), the rows its files added
and removed and the runs it touched. :func:`resolve_version` turns ``version=``/``as_of=`` into a version number
that ``trajstore.open`` pins a read-only store to.
"""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs

from trajstore.errors import InputError, StoreDamagedError, StoreNotFoundError, VersionNotFoundError
from trajstore.storage.log import LogCommit, display
from trajstore.storage.table import StepsTable, missing_files

HISTORY_SCHEMA = pa.schema([
    ("version", pa.int64()), ("timestamp", pa.timestamp("ms", tz="UTC")), ("operation", pa.string()),
    ("rows_added", pa.int64()), ("rows_removed", pa.int64()), ("files_added", pa.int64()),
    ("files_removed", pa.int64()), ("run_ids", pa.list_(pa.string())),
])


def history(table: StepsTable, *, limit: int | None = None) -> pa.Table:
    """One row per version the log can still be read at, oldest first (the last ``limit`` with ``limit``; the first
    row is the oldest version ``trajstore.open(uri, version=N)`` reads): ``version, timestamp, operation,
    rows_added, rows_removed, files_added, files_removed, run_ids`` (the runs whose files it added or removed).
    A pinned table's history ends at its version. Rows removed count the rows of files that an earlier commit
    in the readable log added (null when that commit's file was cleaned up by a checkpoint)."""
    if limit is not None and limit < 0:
        raise InputError(f"limit: must be a number of versions >= 0, got {limit}")
    versions = _versions(table)
    rows_of: dict[str, int] = {}
    out = []
    for version in versions:
        out.append(_summary(_read_commit(table, version), rows_of))
    if limit is not None:
        out = out[len(out) - limit:] if limit else []
    return pa.Table.from_pylist(out, schema=HISTORY_SCHEMA)


def _versions(table: StepsTable) -> list[int]:
    """The versions the log can still be read at, oldest first: from its oldest checkpoint with every entry after
    it (older entries go after the log's retention, :mod:`~trajstore.storage.retention`)."""
    versions = table.log.numbers()
    oldest = table.log.oldest_readable()
    return [v for v in versions if oldest is None or v >= oldest]


def _read_commit(table: StepsTable, version: int) -> LogCommit:
    commit = table.log.commit(version)
    if commit is None:
        raise FileNotFoundError(f"{table.uri}: no log entry for version {version}")
    return commit


def _summary(commit: LogCommit, rows_of: dict[str, int]) -> dict[str, Any]:
    """One row of :func:`history` (``rows_of``: the rows of each file added earlier, by path, which the removals
    of later versions count)."""
    for f in commit.files:
        rows_of[f.path] = f.rows
    known = [rows_of.pop(path, None) for path, _ in commit.removed]
    removed = None if None in known else sum(n for n in known if n is not None)
    runs = {f.run_id for f in commit.files} | {run for _, run in commit.removed}
    when = commit.timestamp_ms or 0
    return {"version": commit.version, "timestamp": datetime.fromtimestamp(when / 1000, timezone.utc),
            "operation": commit.operation, "rows_added": sum(f.rows for f in commit.files), "rows_removed": removed,
            "files_added": len(commit.files), "files_removed": len(commit.removed),
            "run_ids": sorted(r for r in runs if r)}


def resolve_version(table: StepsTable, *, version: int | None = None, as_of: datetime | None = None) -> int | None:
    """The version ``version=``/``as_of=`` name (None when neither is given): ``version`` checked against the
    log, ``as_of`` the latest version committed at or before that time (naive datetimes are UTC)."""
    if version is not None and as_of is not None:
        raise InputError("version/as_of: give one of them, not both")
    if version is None and as_of is None:
        return None
    latest = table.log.latest_number()
    if latest < 0:
        raise StoreNotFoundError(f"version: the store at {table.location.uri} has no committed version yet")
    if version is not None:
        if isinstance(version, bool) or not isinstance(version, int):
            raise InputError(f"version: expected an integer version, got {version!r}")
        if not 0 <= version <= latest:
            raise VersionNotFoundError(f"version: must be a version of this store, 0..{latest}, got {version!r}")
        _check_readable(table, version)
        if version < latest:
            _check_files_kept(table, version)
        return version
    if not isinstance(as_of, datetime):
        raise InputError(f"as_of: expected a datetime, got {type(as_of).__name__}")
    when = as_of if as_of.tzinfo is not None else as_of.replace(tzinfo=timezone.utc)
    versions = _versions(table)
    first = _summary(_read_commit(table, versions[0]), {})["timestamp"]
    if when < first:
        raise InputError(f"as_of: {when.isoformat()} is before the store's first readable version "
                         f"({versions[0]}, committed {first.isoformat()})")
    version = table.log.number_at(when)
    if version < latest:
        _check_files_kept(table, version)
    return version


def _check_files_kept(table: StepsTable, version: int) -> None:
    """Refuse an old version some of whose files a vacuum has removed (a clear 'gone', not a damaged store)."""
    gone = missing_files(table.location, StepsTable(table.location, pinned=version).files())
    if gone:
        latest = {f.path for f in StepsTable(table.location).files()}
        gone = [f for f in gone if f.path not in latest]  # a file the latest version needs too is damage
    if gone:
        raise removed_version(table, [f.path for f in gone], version=version)


def vacuumed(table: StepsTable, path: str, *, version: int | None) -> VersionNotFoundError | None:
    """The error for a read of ``version`` (None: the latest version when the read began) that failed on its
    committed file ``path`` (in the table's filesystem) because a vacuum removed it: the file is gone and the
    latest version no longer lists it, so only older versions needed it and the store is not damaged. None when
    the file is there (unreadable) or the latest version still lists it: the store is damaged."""
    if table.fs.get_file_info(path).type != pafs.FileType.NotFound:
        return None
    if any(f.path == path for f in StepsTable(table.location).files()):
        return None
    return removed_version(table, [path], version=version)


def removed_version(table: StepsTable, paths: list[str], *, version: int | None) -> VersionNotFoundError:
    """A :class:`VersionNotFoundError` for ``version`` (None: the version a read began at) whose committed files
    ``paths`` a vacuum deleted: which version removed (the last of) them from the store, and when, and so which
    versions do not need them."""
    latest = StepsTable(table.location).log.latest_number()
    uri = display(paths[0], table.fs)
    what = f"its file {uri}" if len(paths) == 1 else f"{len(paths)} of its files (first: {uri})"
    removal = _removal(table, set(paths), known=version, latest=latest)
    removed, after = "", f"the latest version, {latest}, does not need {'it' if len(paths) == 1 else 'them'}"
    if removal is not None:
        at, when, operation = removal
        which = "version" if len(paths) == 1 else "versions up to"
        removed = f", which {which} {at} ({operation}, {when.isoformat(timespec='seconds')}) had removed from the store"
        if at < latest:
            after = f"versions {at} to {latest} do not need {'it' if len(paths) == 1 else 'them'}"
    if version is None:
        return VersionNotFoundError(f"version: the version this read began at can no longer be read: `trajstore "
                                    f"vacuum` deleted {what} while the read used it{removed}; the store is not "
                                    f"damaged: read again (the latest version is {latest})")
    return VersionNotFoundError(f"version: version {version} can no longer be read: `trajstore vacuum` deleted "
                                f"{what}{removed}; the store is not damaged: {after} (`trajstore history` lists "
                                "the versions)")


def _removal(table: StepsTable, paths: set[str], *, known: int | None,
             latest: int) -> tuple[int, datetime, str] | None:
    """The version whose commit removed the last of ``paths`` from the table, with its time and operation: the
    first version after ``known`` (a version listing them all; None: found by stepping back from the latest) that
    lists none of them, by bisection (a file, once removed, is never listed again). None when the log no longer
    tells."""
    def lists(v: int) -> bool:
        return any(f.path in paths for f in StepsTable(table.location, pinned=v).files())

    try:
        hi, lo, step = latest, known, 1
        if lists(hi):
            return None
        while lo is None:  # the read began at some version before the latest: step back until one lists it
            candidate = max(hi - step, 0)
            if lists(candidate):
                lo = candidate
            elif candidate == 0:
                return None
            else:
                hi, step = candidate, step * 2
        while hi - lo > 1:
            mid = (lo + hi) // 2
            lo, hi = (mid, hi) if lists(mid) else (lo, mid)
        summary = _summary(_read_commit(table, hi), {})
    except (VersionNotFoundError, StoreDamagedError, OSError):  # a version whose log entries were cleaned up
        return None
    return hi, summary["timestamp"], summary["operation"]


def _check_readable(table: StepsTable, version: int) -> None:
    table.log.check_readable(version)
