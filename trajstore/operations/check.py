"""Consistency check of a store: committed files readable, episodes whole and unique.

Everything is checked on one committed snapshot (one file list from the Delta log); the
episode checks are SQL ``GROUP BY`` queries over the ``steps`` view, so they run at DuckDB's
speed. Files on disk that the log does not list (a killed writer's half-written file, a
commit in progress, a staging file of a killed log write) are never read by anyone: they are
reported as orphans, not problems; :func:`remove_orphans` deletes those old enough to be
certainly abandoned.

>>> import trajstore, tempfile
>>> report = trajstore.check(trajstore.open(tempfile.mkdtemp(), create=True))
>>> report.ok, report.files, report.episodes
(True, 0, 0)
"""

from __future__ import annotations

import logging
import math
import os
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Sequence

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs
import pyarrow.parquet as pq

from trajstore import schema as sch
from trajstore.errors import InputError, StoreDamagedError, UnsupportedTableError, first_line
from trajstore.query import foreign, sql
from trajstore.query.scan import scan_steps
from trajstore.query.snapshot import Snapshot
from trajstore.storage import names
from trajstore.storage.encoding import NEXT, OBS, EncodingError, check_rows
from trajstore.storage.location import Location
from trajstore.storage.log import LOG_DIR, DataFile, display, log_leftover
from trajstore.storage.table import StepsTable

if TYPE_CHECKING:
    from trajstore.query.engine import Engine

__all__ = ["CheckReport", "PartitionFiles", "check", "remove_orphans", "removable_orphans"]

log = logging.getLogger(__name__)

MAX_LISTED = 20
CHECK_ROWS = 8192  # rows per batch read when an encoded file's structure is checked
KEY_COLUMNS = ("episode_id", "step", "terminated", "truncated")


@dataclass(frozen=True)
class PartitionFiles:
    """The committed files of one ``(run_id, env_id)`` partition: how many, how many are small (below the
    store's ``compact_small_bytes``, and more than one of them: what compaction would merge), and their bytes.
    Each file costs every query a little (its footer, its scan set-up): writers merge a partition's small files
    past ``compact_small_files``, ``trajstore compact`` merges any."""

    run_id: str
    env_id: str
    files: int
    small_files: int
    bytes: int


@dataclass
class CheckReport:
    """What :func:`check` found. ``problems`` make the store inconsistent; ``orphans`` and ``partitions`` (file
    counts, small files) are only information."""

    problems: list[str] = field(default_factory=list)
    files: int = 0
    episodes: int = 0
    steps: int = 0
    orphans: list[str] = field(default_factory=list)
    partitions: list[PartitionFiles] = field(default_factory=list)
    small_bytes: int = 0  # below this a file is small
    small_files_limit: int = 0  # writers merge a partition's small files past this many

    @property
    def small_files(self) -> int:
        return sum(p.small_files for p in self.partitions)

    @property
    def ok(self) -> bool:
        return not self.problems

    def format(self) -> str:
        """A short human-readable report: a summary line, then one line per problem."""
        status = "ok" if self.ok else f"{len(self.problems)} problem(s)"
        lines = [f"{status}: {self.files} committed files, {self.episodes} episodes, {self.steps} steps"]
        lines += [f"  problem: {p}" for p in self.problems]
        lines += self._file_lines()
        if self.orphans:
            lines.append(f"  info: {len(self.orphans)} file(s) on disk not listed by the latest version (never read; "
                         "files of older versions, deleted or compacted away, or left by a killed writer; "
                         "`trajstore vacuum` removes them once no retained version needs them), first: "
                         + ", ".join(self.orphans[:3]))
        return "\n".join(lines)

    def _file_lines(self) -> list[str]:
        if not self.partitions:
            return []
        mib = self.small_bytes / 2**20
        lines = [f"  files: {len(self.partitions)} partition(s), {self.files} files, {self.small_files} small "
                 f"(below {mib:g} MiB)"]
        busiest = sorted(self.partitions, key=lambda p: (-p.small_files, -p.files, p.run_id, p.env_id))
        for p in busiest[:MAX_LISTED]:
            lines.append(f"    run_id={p.run_id}/env_id={p.env_id}: {p.files} files, {p.small_files} small, "
                         f"{p.bytes / 2**20:.1f} MiB")
        if len(busiest) > MAX_LISTED:
            lines.append(f"    … and {len(busiest) - MAX_LISTED} more partition(s)")
        crowded = [p for p in self.partitions if self.small_files_limit and p.small_files > self.small_files_limit]
        if crowded:
            lines.append(f"  info: {len(crowded)} partition(s) hold more than {self.small_files_limit} small files: "
                         "writers merge them after their next commit there, `trajstore compact` does it now")
        return lines

    __str__ = format


def files_per_partition(files: Sequence[DataFile], small_bytes: int) -> list[PartitionFiles]:
    """File counts, small files and bytes of each partition of ``files``, sorted by partition. A file is small when
    it is below ``small_bytes`` and compaction would merge it: with another such file of its partition (a
    partition's one file, as compaction leaves it, is not small however few its bytes)."""
    parts: dict[tuple[str, str], list[DataFile]] = {}
    for f in files:
        parts.setdefault((f.run_id, f.env_id), []).append(f)
    out = []
    for (run, env), fs in sorted(parts.items()):
        small = sum(f.size < small_bytes for f in fs)
        out.append(PartitionFiles(run, env, len(fs), small if small > 1 else 0, sum(f.size for f in fs)))
    return out


def check(engine: Engine, *, deep: bool = False) -> CheckReport:
    """Check one committed snapshot of the store ``engine`` reads; never raises for a damaged store, reports instead.

    Verifies that every committed file exists and is a readable Parquet file whose row count and
    size match the log and, for an encoded file, whose rows decode (every frame count and the neighbour each
    null ``next_obs`` or one-frame row stands for; with ``deep``, every column of every file is also
    decoded), that every
    episode's steps are exactly ``0..n-1``, that no episode id appears in two partitions or as two
    episodes, and that no step follows an episode's terminated/truncated step; in a multi-agent episode
    (rows with an ``agent_id``, whose key is ``(episode_id, step, agent_id)``) each agent's steps once
    (they may skip) and none after its own end. The episode checks run over the readable files only.
    """
    try:
        files = engine.files()
    except UnsupportedTableError as exc:
        return _unsupported(exc)
    except Exception as exc:  # noqa: BLE001 - a log that cannot be read is the finding
        reason = (str(exc).splitlines() or [type(exc).__name__])[0]
        log_dir = engine.table.location.uri_of(LOG_DIR)
        return CheckReport(problems=[f"the commit log {log_dir} cannot be read: {reason}"])
    report = CheckReport(files=len(files), partitions=files_per_partition(files, engine.settings.compact_small_bytes),
                         small_bytes=engine.settings.compact_small_bytes,
                         small_files_limit=engine.settings.compact_small_files)
    readable = []
    for f in files:
        problem = _check_file(engine.table, f, deep=deep)
        if problem is None:
            readable.append(f)
        else:
            report.problems.append(problem)
    _name_problems(engine, readable, report)
    _foreign_problems(engine, readable, report)
    _check_episodes(engine, readable, report)
    report.problems += _description_problems(engine)
    report.orphans = [display(i.path, engine.table.fs) for i in _orphans(engine.table.location, files)]
    return report


def _description_problems(engine: Engine) -> list[str]:
    """What is wrong with the runs' stored descriptions (:mod:`~trajstore.storage.run_config`), each naming its run;
    a ``runs`` table that cannot be read is one problem."""
    try:
        return engine.descriptions.problems()
    except Exception as exc:  # noqa: BLE001 - an unreadable runs table is the finding
        return [f"the run descriptions of {engine.uri} cannot be read: {first_line(exc)}"]


def _unsupported(exc: UnsupportedTableError) -> CheckReport:
    """The report on a version trajstore does not read (:mod:`~trajstore.storage.protocol`: a reader feature it does
    not implement, files with deletion vectors): that one problem, naming the feature, the version and what to do.
    Nothing else is checked: its files' rows are not the rows the table holds."""
    return CheckReport(problems=[str(exc)])


def remove_orphans(engine: Engine, *, older_than_s: float = 3600.0) -> list[str]:
    """Delete the orphans (see :func:`check`) last modified more than ``older_than_s`` seconds ago.

    The file list is read again just before, so a file is deleted only if the newest version of the
    log does not list it; the age guard leaves alone a file a live writer has just written and is
    about to commit. Returns the deleted paths.
    """
    removed = []
    fs = engine.table.fs
    for path in removable_orphans(engine, removed_before_s=older_than_s, written_before_s=older_than_s):
        try:
            fs.delete_file(path)
        except FileNotFoundError:  # gone meanwhile (another cleaner, or a rename into place)
            continue
        engine.table.forget(path)
        removed.append(display(path, fs))
    return removed


def removable_orphans(engine: Engine, *, removed_before_s: float, written_before_s: float) -> list[str]:
    """The files under the table that the newest version does not list and that are old enough to go (paths in
    the store's filesystem): those a commit removed (a delete, a compaction) at least ``removed_before_s``
    seconds ago (rounded up to whole hours, as the log's tombstones are read), and those no commit ever
    listed (a killed writer's) last modified at least ``written_before_s`` seconds ago."""
    for name, value in (("older_than_s", removed_before_s), ("written_before_s", written_before_s)):
        if value < 0:
            raise InputError(f"{name}: must be >= 0 seconds, got {value}")
    cutoff = time.time() - written_before_s
    removed_by_commit, removed_long_ago = _tombstones(engine, removed_before_s)
    out = []
    for info in _orphans(engine.table.location, engine.files()):
        path = info.path
        if path in removed_by_commit:  # e.g. by a compaction: its age is the commit's, not the file's
            if path not in removed_long_ago:
                continue
        elif info.mtime is None or info.mtime.timestamp() >= cutoff:
            continue
        out.append(path)
    return out


def _tombstones(engine: Engine, older_than_s: float) -> tuple[set[str], set[str]]:
    """Files a commit removed from the table (all, and those removed at least ``older_than_s`` ago, rounded
    up to whole hours as the log's tombstones are read)."""
    log = engine.table.log
    if not log.exists():
        return set(), set()
    hours = math.ceil(older_than_s / 3600)
    every = log.removed_paths(0)
    return every, every if hours == 0 else log.removed_paths(hours)


# --- files -------------------------------------------------------------------------------------------------

def _check_file(table: StepsTable, f: DataFile, *, deep: bool) -> str | None:
    """Why the committed file ``f`` cannot be read, or None."""
    info = f.fs.get_file_info(f.path)
    if info.type != pafs.FileType.File:
        return table.size_problem(f)
    size = info.size
    try:
        meta = pq.read_metadata(f.path, filesystem=f.fs)
    except Exception as exc:  # noqa: BLE001 - any failure to read the footer is the finding
        return f"{f.uri}: not a readable Parquet file ({size} bytes, the log says {f.size}): {exc}"
    if f.rows and meta.num_rows != f.rows:
        return f"{f.uri}: holds {meta.num_rows} rows, the log says {f.rows}"
    problem = table.size_problem(f)
    if problem:
        return problem
    missing = [c for c in KEY_COLUMNS if c not in meta.schema.names]
    if missing:
        return f"{f.uri}: lacks the column(s) {missing}"
    problem = _encoding_problem(table, f)
    if problem:
        return problem
    if deep:
        try:
            pq.ParquetFile(f.path, filesystem=f.fs).read()
        except Exception as exc:  # noqa: BLE001
            return f"{f.uri}: data pages cannot be decoded: {exc}"
    return None


def _encoding_problem(table: StepsTable, f: DataFile) -> str | None:
    """Why the rows of an encoded file do not decode (its format, frame counts, where a null ``next_obs`` or a
    one-frame row lacks the neighbour it stands for), or None. Reads the key and observation columns; decodes
    no frame."""
    try:
        stored = table.schemas([f])[0]
    except StoreDamagedError as exc:
        return f"{f.uri}: {exc}"
    fmt = stored.format
    if not fmt.encoded or OBS not in stored.logical.names or fmt.foreign:  # another tool's: see _foreign_problems
        return None
    names = [n for n in ("episode_id", "step", OBS, NEXT) if n in stored.logical.names]
    try:
        parquet = pq.ParquetFile(f.path, filesystem=f.fs)
        batches = (pa.record_batch(b.columns, names=names) for b in
                   parquet.iter_batches(columns=[fmt.physical(n) for n in names], batch_size=CHECK_ROWS))
        check_rows(batches, fmt, stored.logical.field(OBS).type, where=f.uri)
    except EncodingError as exc:
        return f"{exc} (its encoding is broken: readers cannot decode it)"
    except Exception as exc:  # noqa: BLE001 - any failure to read is the finding
        return f"{f.uri}: data pages cannot be decoded: {exc}"
    return None


def _name_problems(engine: Engine, files: list[DataFile], report: CheckReport) -> None:
    """Each stored column users gave whose name breaks the rule every write path now checks
    (:func:`~trajstore.storage.names.name_problem`; written before names were checked, or by another tool), or
    that differs only in case from another: named once, with the runs holding it and what to do."""
    try:
        schemas = engine.table.schemas(files)
    except StoreDamagedError:
        return  # reported per file
    own = {c["name"] for c in sch.step_columns()} | set(sch.lineage_columns())
    runs: dict[str, set[str]] = {}
    for f, stored in zip(files, schemas):
        for name in stored.logical.names:
            if name not in own:
                runs.setdefault(name, set()).add(f.run_id)
    cases: dict[str, list[str]] = {}
    for name in sorted(runs):
        cases.setdefault(name.lower(), []).append(name)
    for name, holders in sorted(runs.items()):
        others = [n for n in cases[name.lower()] if n != name]
        problem = names.name_problem(name) or (f"it differs only in case from {others[0]!r}" if others else None)
        if problem is not None:
            report.problems.append(_name_finding(name, problem, sorted(holders)))


def _name_finding(name: str, problem: str, runs: list[str]) -> str:
    """A column of a bad name: the runs holding it, what readers do with it, and what to do."""
    shown = ", ".join(runs[:3]) + (f" and {len(runs) - 3} more" if len(runs) > 3 else "")
    read = ("readers leave it out of the steps view, as DuckDB cannot hold an empty name (its values stay in the "
            "runs' files, which pyarrow.parquet reads)") if not names.readable(name) else \
        "other engines of the table (Spark, Delta) refuse such a name"
    return (f"column {name!r} of run(s) {shown} has a name no write path takes any more: {problem}; {read}. "
            f"Copy what you need of it, then delete those runs (`trajstore delete --run {runs[0]} --yes`, or "
            f"store.maintain.delete(run_id={runs[0]!r})) and write them again with a valid name")


def _foreign_problems(engine: Engine, files: list[DataFile], report: CheckReport) -> None:
    """Decode every observation of each partition holding a file another tool wrote, as readers would (their
    rows may be in any order and file, see :mod:`~trajstore.query.foreign`); what fails is a problem."""
    try:
        schemas = engine.table.schemas(files)
    except StoreDamagedError:
        return  # reported per file
    parts = {(files[i].run_id, files[i].env_id) for i in foreign.foreign(schemas)}
    for run_id, env_id in sorted(parts):
        chosen = [f for f in files if (f.run_id, f.env_id) == (run_id, env_id)]
        try:
            types = engine.step_types(chosen)
            columns = [c for c in ("episode_id", "step", OBS, NEXT) if c in types.schema.names]
            reader = scan_steps(chosen, types.schema, columns, schemas=engine.file_schemas(chosen))
            for _ in reader:
                pass
        except Exception as exc:  # noqa: BLE001 - any failure to read back is the finding
            report.problems.append(f"run_id={run_id}/env_id={env_id}: another tool's changes cannot be read back: "
                                   f"{first_line(exc)}")


def _orphans(location: Location, committed: Sequence[DataFile]) -> list[pafs.FileInfo]:
    """Files under the table folder that the snapshot does not list, and staging files a killed commit
    left in the log (delta-rs writes ``<name>#<n>`` and links or renames it into place), sorted by path."""
    listed = {location.normalized(f.path) if location.is_local else f.path for f in committed}
    selector = pafs.FileSelector(location.root, recursive=True, allow_not_found=True)
    found = []
    for info in sorted(location.fs.get_file_info(selector), key=lambda i: i.path):
        if info.type != pafs.FileType.File:
            continue
        path = os.path.normpath(info.path) if location.is_local else info.path
        leftover = log_leftover(location, path)
        if leftover if leftover is not None else path not in listed:
            found.append(pafs.FileInfo(path, info.type, mtime=info.mtime, size=info.size))
    return found


# --- episodes ----------------------------------------------------------------------------------------------

def _check_episodes(engine: Engine, files: list[DataFile], report: CheckReport) -> None:
    snap = _scan(engine, files)
    if isinstance(snap, Exception):
        snap = _scan(engine, _decodable(files, report))
    if isinstance(snap, Exception):
        report.problems.append(f"the episode checks could not read the committed files: {snap}")
        return
    with snap:
        report.episodes, report.steps = snap.con.execute(sql.CHECK_TOTALS).fetchall()[0]
        _episode_defects(snap.con, report, agents=snap.agents)
        _mixed_episodes(snap.con, report)
        _shared_ids(snap.con, report)


def _scan(engine: Engine, files: list[DataFile]) -> Snapshot | Exception:
    """A snapshot over ``files`` holding the ``check_episodes`` table, or the error reading them."""
    snap: Snapshot | None = None
    try:
        snap = engine.snapshot(files, copies=False)  # the store's own bytes, not this machine's copies
        snap.con.execute(sql.check_episodes(agents=snap.agents))
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
            pq.ParquetFile(f.path, filesystem=f.fs).read(columns=list(KEY_COLUMNS))
            good.append(f)
        except Exception as err:  # noqa: BLE001
            report.problems.append(f"{f.uri}: data pages cannot be decoded: {err}")
    return good


@dataclass(frozen=True)
class _Steps:
    """One row of the ``check_episodes`` table: the step counts of an episode (or of one agent of it)."""

    rows: int
    steps: int  # rows with a step
    distinct: int
    first: int | None
    last: int | None
    starts: int  # rows at step 0
    end: int | None  # the first step that ended it


def _episode_defects(con: duckdb.DuckDBPyConnection, report: CheckReport, *, agents: bool) -> None:
    """The episodes whose steps are not whole and unique: each single-agent episode's steps ``0..n-1`` once,
    each agent's of a multi-agent episode once (``(episode_id, step, agent_id)`` its rows' key; an agent's env
    steps may skip, as :class:`~trajstore.write.agents.AgentWriter` writes them); none after an end."""
    total = con.execute(sql.CHECK_DEFECT_COUNT).fetchall()[0][0]
    rows = con.execute(sql.check_defects(MAX_LISTED)).fetchall()
    for run_id, env_id, episode_id, agent_id, *counts in rows:
        c = _Steps(*counts)
        if episode_id is None:
            report.problems.append(f"{c.rows} step rows in run_id={run_id!r}, env_id={env_id!r} have no episode_id")
            continue
        where = f"episode {episode_id} (run_id={run_id!r}, env_id={env_id!r})"
        key = {"run": run_id, "env": env_id, "id": episode_id, **({"agent": agent_id} if agents else {})}
        if agent_id is None:
            report.problems.append(f"{where}: " + "; ".join(_step_defects(con, key, c, agents=agents)))
        else:
            report.problems.append(f"{where}, agent {agent_id!r}: " + "; ".join(_agent_defects(con, key, c)))
    if total > len(rows):
        which = "episodes (or agents of one)" if agents else "episodes"
        report.problems.append(f"... and {total - len(rows)} more {which} with step defects")


def _step_defects(con: duckdb.DuckDBPyConnection, key: dict[str, object], c: _Steps, *, agents: bool) -> list[str]:
    """What is wrong with the steps of one single-agent episode."""
    defects = []
    if c.steps < c.rows:
        defects.append(f"{c.rows - c.steps} rows have no step")
    if c.starts > 1:
        defects.append(f"step 0 occurs {c.starts} times (two episodes share this id, or its rows were "
                       "committed twice)")
    if c.distinct < c.steps:
        defects.append(f"{c.steps - c.distinct} duplicate step rows ({_duplicates(con, key, agents)})")
    if c.distinct and (c.first != 0 or c.last != c.distinct - 1):
        defects.append(f"steps are not contiguous from 0: {c.distinct} distinct steps in {c.first}..{c.last}, "
                       f"missing {_missing(con, key, agents)}")
    if c.end is not None and c.last is not None and c.end < c.last:
        defects.append(f"steps up to {c.last} follow its end (terminated/truncated) at step {c.end}")
    return defects


def _agent_defects(con: duckdb.DuckDBPyConnection, key: dict[str, object], c: _Steps) -> list[str]:
    """What is wrong with the rows of one agent of a multi-agent episode (its env steps may skip)."""
    defects = []
    if c.steps < c.rows:
        defects.append(f"{c.rows - c.steps} rows have no step")
    if c.distinct < c.steps:
        defects.append(f"{c.steps - c.distinct} duplicate step rows of this agent ({_duplicates(con, key, True)}; "
                       "its rows were committed twice, or two episodes share this id)")
    if c.end is not None and c.last is not None and c.end < c.last:
        defects.append(f"its steps up to {c.last} follow its end (terminated/truncated) at step {c.end}")
    return defects


def _duplicates(con: duckdb.DuckDBPyConnection, key: dict[str, object], agents: bool) -> str:
    return "steps " + _ranges(con, sql.check_duplicate_ranges(agents=agents), key)


def _missing(con: duckdb.DuckDBPyConnection, key: dict[str, object], agents: bool) -> str:
    return "steps " + _ranges(con, sql.check_missing_ranges(agents=agents), key)


def _mixed_episodes(con: duckdb.DuckDBPyConnection, report: CheckReport) -> None:
    """Episodes holding single-agent rows (``agent_id`` null) beside the rows of agents: no writer makes them."""
    for run_id, env_id, episode_id in con.execute(sql.check_mixed(MAX_LISTED)).fetchall():
        report.problems.append(f"episode {episode_id} (run_id={run_id!r}, env_id={env_id!r}): holds single-agent "
                               "rows (agent_id null) beside the rows of agents; an episode is one or the other")


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
    total = con.execute(sql.CHECK_SHARED_COUNT).fetchall()[0][0]
    for episode_id, parts in con.execute(sql.check_shared(MAX_LISTED)).fetchall():
        report.problems.append(f"episode {episode_id} appears in {len(parts)} partitions (run_id/env_id): "
                               + ", ".join(parts))
    if total > MAX_LISTED:
        report.problems.append(f"... and {total - MAX_LISTED} more episode ids shared between partitions")
