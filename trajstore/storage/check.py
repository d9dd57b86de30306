"""Consistency check of a store: committed files readable, episodes whole and unique.

Everything is checked on one committed snapshot (one file list from the Delta log); the
episode checks are SQL ``GROUP BY`` queries over the ``steps`` view, so they run at DuckDB's
speed. Files on disk that the log does not list (a killed writer's half-written file, a
commit in progress, a staging file of a killed log write) are never read by anyone: they are
reported as orphans, not problems; :func:`remove_orphans` deletes those old enough to be
certainly abandoned.

>>> import trajstore, tempfile
>>> from trajstore.storage.check import check
>>> report = check(trajstore.open(tempfile.mkdtemp(), create=True))
>>> report.ok, report.files, report.episodes
(True, 0, 0)
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Sequence

import duckdb
import pyarrow.parquet as pq

from trajstore.errors import InputError, StoreDamagedError
from trajstore.query import sql
from trajstore.query.snapshot import Snapshot
from trajstore.storage.table import DataFile, StepsTable

if TYPE_CHECKING:
    from trajstore.store import Store

__all__ = ["CheckReport", "check", "remove_orphans"]

log = logging.getLogger(__name__)

MAX_LISTED = 20
KEY_COLUMNS = ("episode_id", "step", "terminated", "truncated")
LOG_DIR = "_delta_log"

@dataclass
class CheckReport:
    """What :func:`check` found. ``problems`` make the store inconsistent; ``orphans`` are only information."""

    problems: list[str] = field(default_factory=list)
    files: int = 0
    episodes: int = 0
    steps: int = 0
    orphans: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        """A short human-readable report: a summary line, then one line per problem."""
        status = "ok" if self.ok else f"{len(self.problems)} problem(s)"
        lines = [f"{status}: {self.files} committed files, {self.episodes} episodes, {self.steps} steps"]
        lines += [f"  problem: {p}" for p in self.problems]
        if self.orphans:
            lines.append(f"  info: {len(self.orphans)} file(s) on disk not listed by the log (never read; "
                         "e.g. left by a killed writer), first: " + ", ".join(self.orphans[:3]))
        return "\n".join(lines)

    __str__ = format


def check(store: Store, *, deep: bool = False) -> CheckReport:
    """Check one committed snapshot of ``store``; never raises for a damaged store, reports instead.

    Verifies that every committed file exists and is a readable Parquet file whose row count and
    size match the log (with ``deep``, every column of every file is also decoded), that every
    episode's steps are exactly ``0..n-1``, that no episode id appears in two partitions or as two
    episodes, and that no step follows an episode's terminated/truncated step. The episode checks
    run over the readable files only.
    """
    try:
        files = store.files()
    except Exception as exc:  # noqa: BLE001 - a log that cannot be read is the finding
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        return CheckReport(problems=[f"the commit log {store.table.path / LOG_DIR} cannot be read: {reason}"])
    report = CheckReport(files=len(files))
    readable = []
    for f in files:
        problem = _check_file(store.table, f, deep=deep)
        if problem is None:
            readable.append(f)
        else:
            report.problems.append(problem)
    _check_episodes(readable, report)
    report.orphans = _orphans(store.table.path, files)
    return report


def remove_orphans(store: Store, *, older_than_s: float = 3600.0) -> list[str]:
    """Delete the orphans (see :func:`check`) last modified more than ``older_than_s`` seconds ago.

    The file list is read again just before, so a file is deleted only if the newest version of the
    log does not list it; the age guard leaves alone a file a live writer has just written and is
    about to commit. Returns the deleted paths.
    """
    if older_than_s < 0:
        raise InputError(f"older_than_s: must be >= 0 seconds, got {older_than_s}")
    cutoff = time.time() - older_than_s
    removed_by_commit, removed_long_ago = _tombstones(store, older_than_s)
    removed = []
    for path in _orphans(store.table.path, store.files()):
        try:
            if path in removed_by_commit:  # e.g. by a compaction: its age is the commit's, not the file's
                if path not in removed_long_ago:
                    continue
            elif os.path.getmtime(path) >= cutoff:
                continue
            os.unlink(path)
            removed.append(path)
        except FileNotFoundError:  # gone meanwhile (another cleaner, or a rename into place)
            continue
    return removed


def _tombstones(store: Store, older_than_s: float) -> tuple[set[str], set[str]]:
    """Files a commit removed from the table (all, and those removed at least ``older_than_s`` ago, rounded
    up to whole hours as the log's tombstones are read)."""
    if not store.table.exists():
        return set(), set()
    from urllib.parse import unquote

    from deltalake import DeltaTable

    dt = DeltaTable(str(store.table.path))

    def removed(hours: int) -> set[str]:
        paths = dt.vacuum(retention_hours=hours, dry_run=True, enforce_retention_duration=False)
        return {os.path.normpath(str(store.table.path / unquote(p))) for p in paths}

    hours = math.ceil(older_than_s / 3600)
    every = removed(0)
    return every, every if hours == 0 else removed(hours)


# --- files -------------------------------------------------------------------------------------------------

def _check_file(table: StepsTable, f: DataFile, *, deep: bool) -> str | None:
    """Why the committed file ``f`` cannot be read, or None."""
    if not os.path.isfile(f.path):
        return table.size_problem(f)
    size = os.path.getsize(f.path)
    try:
        meta = pq.read_metadata(f.path)
    except Exception as exc:  # noqa: BLE001 - any failure to read the footer is the finding
        return f"{f.path}: not a readable Parquet file ({size} bytes, the log says {f.size}): {exc}"
    if f.rows and meta.num_rows != f.rows:
        return f"{f.path}: holds {meta.num_rows} rows, the log says {f.rows}"
    problem = table.size_problem(f)
    if problem:
        return problem
    missing = [c for c in KEY_COLUMNS if c not in meta.schema.names]
    if missing:
        return f"{f.path}: lacks the column(s) {missing}"
    if deep:
        try:
            pq.read_table(f.path)
        except Exception as exc:  # noqa: BLE001
            return f"{f.path}: data pages cannot be decoded: {exc}"
    return None


def _orphans(table_path: Path, committed: Sequence[DataFile]) -> list[str]:
    """Files under the table folder that the snapshot does not list, and staging files a killed commit
    left in the log (delta-rs writes ``<name>#<n>`` and links or renames it into place)."""
    listed = {os.path.normpath(f.path) for f in committed}
    found = []
    for folder, dirs, names in os.walk(table_path):
        dirs.sort()
        in_log = Path(folder).relative_to(table_path).parts[:1] == (LOG_DIR,)
        for name in sorted(names):
            path = os.path.normpath(os.path.join(folder, name))
            if ("#" in name or name.endswith(".tmp")) if in_log else path not in listed:
                found.append(path)
    return found


# --- episodes ----------------------------------------------------------------------------------------------

def _check_episodes(files: list[DataFile], report: CheckReport) -> None:
    snap = _scan(files)
    if isinstance(snap, Exception):
        snap = _scan(_decodable(files, report))
    if isinstance(snap, Exception):
        report.problems.append(f"the episode checks could not read the committed files: {snap}")
        return
    with snap:
        report.episodes, report.steps = snap.con.execute(sql.CHECK_TOTALS).fetchone()
        _episode_defects(snap.con, report)
        _shared_ids(snap.con, report)


def _scan(files: list[DataFile]) -> Snapshot | Exception:
    """A snapshot over ``files`` holding the ``check_episodes`` table, or the error reading them."""
    snap: Snapshot | None = None
    try:
        snap = Snapshot(files)
        snap.con.execute(sql.CHECK_EPISODES)
        return snap
    except (duckdb.Error, StoreDamagedError) as exc:
        log.info("episode scan over %d files failed, reading them one by one: %s", len(files), exc)
        if snap is not None:
            snap.close()
        return exc


def _decodable(files: list[DataFile], report: CheckReport) -> list[DataFile]:
    """After a failed scan, the files whose key columns decode; the others are reported."""
    good = []
    for f in files:
        try:
            pq.read_table(f.path, columns=list(KEY_COLUMNS))
            good.append(f)
        except Exception as err:  # noqa: BLE001
            report.problems.append(f"{f.path}: data pages cannot be decoded: {err}")
    return good


def _episode_defects(con: duckdb.DuckDBPyConnection, report: CheckReport) -> None:
    total = con.execute(sql.CHECK_DEFECT_COUNT).fetchone()[0]
    rows = con.execute(sql.check_defects(MAX_LISTED)).fetchall()
    for run_id, env_id, episode_id, n_rows, n_steps, n_distinct, first, last, starts, end in rows:
        where = f"episode {episode_id} (run_id={run_id!r}, env_id={env_id!r})"
        key = {"run": run_id, "env": env_id, "id": episode_id}
        if episode_id is None:
            report.problems.append(f"{n_rows} step rows in run_id={run_id!r}, env_id={env_id!r} have no episode_id")
            continue
        defects = []
        if n_steps < n_rows:
            defects.append(f"{n_rows - n_steps} rows have no step")
        if starts > 1:
            defects.append(f"step 0 occurs {starts} times (two episodes share this id, or its rows were "
                           "committed twice)")
        if n_distinct < n_steps:
            defects.append(f"{n_steps - n_distinct} duplicate step rows ({_duplicates(con, key)})")
        if n_distinct and (first != 0 or last != n_distinct - 1):
            defects.append(f"steps are not contiguous from 0: {n_distinct} distinct steps in {first}..{last}, "
                           f"missing {_missing(con, key)}")
        if end is not None and end < last:
            defects.append(f"steps up to {last} follow its end (terminated/truncated) at step {end}")
        report.problems.append(f"{where}: " + "; ".join(defects))
    if total > len(rows):
        report.problems.append(f"... and {total - len(rows)} more episodes with step defects")


def _duplicates(con: duckdb.DuckDBPyConnection, key: dict[str, object]) -> str:
    return "steps " + _ranges(con, sql.CHECK_DUPLICATE_RANGES, key)


def _missing(con: duckdb.DuckDBPyConnection, key: dict[str, object]) -> str:
    return "steps " + _ranges(con, sql.CHECK_MISSING_RANGES, key)


def _ranges(con: duckdb.DuckDBPyConnection, query: str, key: dict[str, object], limit: int = 5) -> str:
    """``"2..4, 9"`` from a query of ``(lo, hi, ranges)`` rows (at most ``limit`` ranges listed): computed
    in SQL, in memory bounded by the episode's stored rows whatever its step values."""
    rows = con.execute(query, {**key, "limit": limit}).fetchall()
    if not rows:
        return "none"
    parts = [f"{lo}..{hi}" if hi > lo else f"{lo}" for lo, hi, _ in rows]
    more = rows[0][2] - len(rows)
    return ", ".join(parts) + (f", … ({more} more ranges)" if more > 0 else "")


def _shared_ids(con: duckdb.DuckDBPyConnection, report: CheckReport) -> None:
    total = con.execute(sql.CHECK_SHARED_COUNT).fetchone()[0]
    for episode_id, parts in con.execute(sql.check_shared(MAX_LISTED)).fetchall():
        report.problems.append(f"episode {episode_id} appears in {len(parts)} partitions (run_id/env_id): "
                               + ", ".join(parts))
    if total > MAX_LISTED:
        report.problems.append(f"... and {total - MAX_LISTED} more episode ids shared between partitions")
