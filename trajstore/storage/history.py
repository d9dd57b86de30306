"""Versions of a store: the history of its log, and the version to read for ``version=N`` or ``as_of=datetime``.

Every commit of the ``steps`` log is one version. :func:`history` reads the commits themselves (one JSON file
per version under ``_delta_log``): when each was made, what it did (``create``, ``append``, ``delete``,
``compact``, ``add_column``, ``add_columns`` when a writer brought a new extra), the rows its files added and
removed and the runs it touched. :func:`resolve_version` turns ``version=``/``as_of=`` into a version number
that ``trajstore.open`` pins a read-only store to.
"""

from __future__ import annotations

import json
import re
from datetime import datetime, timezone
from typing import Any

import pyarrow as pa
import pyarrow.fs as pafs
from deltalake import DeltaTable
from deltalake.exceptions import DeltaError

from trajstore.errors import InputError, StoreNotFoundError, VersionNotFoundError
from trajstore.storage.check import missing_files
from trajstore.storage.location import explain
from trajstore.storage.table import StepsTable

LOG_DIR = "_delta_log"
COMMIT_FILE = re.compile(r"^(\d{20})\.json$")

HISTORY_SCHEMA = pa.schema([
    ("version", pa.int64()), ("timestamp", pa.timestamp("ms", tz="UTC")), ("operation", pa.string()),
    ("rows_added", pa.int64()), ("rows_removed", pa.int64()), ("files_added", pa.int64()),
    ("files_removed", pa.int64()), ("run_ids", pa.list_(pa.string())),
])


def history(table: StepsTable, *, limit: int | None = None) -> pa.Table:
    """One row per version, oldest first (the last ``limit`` with ``limit``): ``version, timestamp, operation,
    rows_added, rows_removed, files_added, files_removed, run_ids`` (the runs whose files it added or removed).
    A pinned table's history ends at its version. Rows removed count the rows of files that an earlier commit
    in the readable log added (null when that commit's file was cleaned up by a checkpoint)."""
    if limit is not None and limit < 0:
        raise InputError(f"limit: must be a number of versions >= 0, got {limit}")
    versions = _versions(table)
    rows_of: dict[str, int] = {}
    out = []
    for version in versions:
        out.append(_summary(version, _read_commit(table, version), rows_of))
    if limit is not None:
        out = out[len(out) - limit:] if limit else []
    return pa.Table.from_pylist(out, schema=HISTORY_SCHEMA)


def _versions(table: StepsTable) -> list[int]:
    selector = pafs.FileSelector(table.location.path(LOG_DIR), allow_not_found=True)
    try:
        infos = table.fs.get_file_info(selector)
    except OSError as exc:
        raise explain(exc, table.location) or exc
    found = sorted(int(m.group(1)) for i in infos if (m := COMMIT_FILE.match(i.base_name)))
    return [v for v in found if table.pinned is None or v <= table.pinned]


def _read_commit(table: StepsTable, version: int) -> list[dict[str, Any]]:
    path = table.location.path(LOG_DIR, f"{version:020d}.json")
    with table.fs.open_input_stream(path) as f:
        text = f.read().decode()
    return [json.loads(line) for line in text.splitlines() if line.strip()]


def _summary(version: int, actions: list[dict[str, Any]], rows_of: dict[str, int]) -> dict[str, Any]:
    info = next((a["commitInfo"] for a in actions if "commitInfo" in a), {})
    adds = [a["add"] for a in actions if "add" in a]
    removes = [a["remove"] for a in actions if "remove" in a]
    added = 0
    for a in adds:
        n = int(json.loads(a.get("stats") or "{}").get("numRecords", 0))
        rows_of[a["path"]] = n
        added += n
    known = [rows_of.pop(r["path"], None) for r in removes]
    removed = None if None in known else sum(n for n in known if n is not None)
    runs = {a.get("partitionValues", {}).get("run_id") for a in adds + removes}
    return {"version": version, "timestamp": datetime.fromtimestamp(info.get("timestamp", 0) / 1000, timezone.utc),
            "operation": _operation(info, actions), "rows_added": added, "rows_removed": removed,
            "files_added": len(adds), "files_removed": len(removes), "run_ids": sorted(r for r in runs if r)}


def _operation(info: dict[str, Any], actions: list[dict[str, Any]]) -> str:
    """trajstore's own name for the commit when it wrote one, else the log's operation in trajstore's words."""
    own = info.get("trajstore") or {}
    if own.get("operation"):
        return str(own["operation"])
    op = str(info.get("operation", "")).upper()
    mode = str((info.get("operationParameters") or {}).get("mode", "")).lower()
    if op.split() == ["CREATE", "TABLE"]:  # the log's name for the first commit
        return "create"
    if op == "WRITE":
        return "append" if mode == "append" else "overwrite"
    if op == "ADD COLUMN":
        return "add_columns"
    return op.lower().replace(" ", "_") or ("metadata" if any("metaData" in a for a in actions) else "unknown")


def resolve_version(table: StepsTable, *, version: int | None = None, as_of: datetime | None = None) -> int | None:
    """The version ``version=``/``as_of=`` name (None when neither is given): ``version`` checked against the
    log, ``as_of`` the latest version committed at or before that time (naive datetimes are UTC)."""
    if version is not None and as_of is not None:
        raise InputError("version/as_of: give one of them, not both")
    if version is None and as_of is None:
        return None
    latest = table.version()
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
    first = _summary(versions[0], _read_commit(table, versions[0]), {})["timestamp"]
    if when < first:
        raise InputError(f"as_of: {when.isoformat()} is before the store's first readable version "
                         f"({versions[0]}, committed {first.isoformat()})")
    dt = DeltaTable(table.uri, storage_options=table.location.storage_options)
    dt.load_as_version(when)
    version = int(dt.version())
    if version < latest:
        _check_files_kept(table, version)
    return version


def _check_files_kept(table: StepsTable, version: int) -> None:
    """Refuse an old version some of whose files a vacuum has removed (a clear 'gone', not a damaged store)."""
    gone = missing_files(table.location, StepsTable(table.location, pinned=version).files())
    if gone:
        raise VersionNotFoundError(f"version: version {version} can no longer be read: {len(gone)} of its files were "
                                   f"removed (by `trajstore vacuum`, which keeps only what versions inside its "
                                   f"retention horizon need), first: {gone[0].path}")


def _check_readable(table: StepsTable, version: int) -> None:
    try:
        DeltaTable(table.uri, version=version, storage_options=table.location.storage_options)
    except (DeltaError, OSError) as exc:
        raise InputError(f"version: version {version} can no longer be read (its log entries were cleaned up): "
                         f"{str(exc).splitlines()[0]}") from exc
