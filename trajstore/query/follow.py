"""Following a store as it is written: each new commit of the log, in commit order, exactly once.

:func:`new_commits` reads the log one version at a time: it asks for the JSON file of the next version only
(:meth:`Log.commit <trajstore.storage.log.Log.commit>`), and while there is none it waits,
doubling the wait from :data:`FIRST_WAIT` up to ``poll`` seconds, back to the shortest wait after each commit.
So an idle follower costs one small read every ``poll`` seconds, and a busy one sees each commit soon after it
lands. :func:`follow` gives each one's rows (a :class:`Commit`): the steps it appended, or the episodes it
completed; :func:`commit_rows` one commit's, which the service's ``/commits/{version}`` serves.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Callable, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore.errors import InputError
from trajstore.query import sql
from trajstore.query.filters import Names, selected
from trajstore.query.scan import scan_steps
from trajstore.query.snapshot import check_names
from trajstore.storage import protocol
from trajstore.storage.log import DataFile, LogCommit, files_holding
from trajstore.storage.table import StepsTable

if TYPE_CHECKING:
    from trajstore.query.engine import Engine

FIRST_WAIT = 0.02  # seconds: the first wait after a commit; then doubled up to `poll`


@dataclass(frozen=True)
class Commit:
    """The rows one commit added that a follower asked for: its steps, or the episodes it completed."""

    version: int
    rows: pa.Table
    runs: list[str]
    timestamp_ms: int | None = None


def check_follow(since: int | None, poll: float, timeout: float | None) -> None:
    """Raise an :class:`InputError` naming the argument when ``since``/``poll``/``timeout`` are out of range."""
    if since is not None and (isinstance(since, bool) or not isinstance(since, int) or since < -1):
        raise InputError(f"since: must be a store version >= -1 (-1: from the first commit), got {since!r}")
    if not poll > 0:
        raise InputError(f"poll: must be a positive number of seconds, got {poll!r}")
    if timeout is not None and not timeout >= 0:
        raise InputError(f"timeout: must be a number of seconds >= 0 or None (wait for ever), got {timeout!r}")


def new_commits(table: StepsTable, *, since: int, poll: float, timeout: float | None = None,
                sleep: Callable[[float], bool | None] = time.sleep,
                clock: Callable[[], float] = time.monotonic) -> Iterator[LogCommit]:
    """Every commit after version ``since``, in order, as the log gets them; stops after ``timeout`` seconds
    without a new commit (never with None), or when ``sleep`` returns True (``threading.Event.wait`` of a
    stop event does). A version whose entry the log no longer holds (removed after its retention, while later ones
    are there) is a :class:`~trajstore.errors.VersionNotFoundError` naming the oldest version it can read."""
    version, wait, idle_since = since + 1, FIRST_WAIT, clock()
    while True:
        commit = table.log.commit(version)
        if commit is not None:
            yield commit
            version, wait, idle_since = version + 1, FIRST_WAIT, clock()
            continue
        if wait == FIRST_WAIT and table.log.latest_number() > version:  # its entry went after the log's retention
            raise table.log.expired(version)
        if timeout is not None and clock() - idle_since >= timeout:
            return
        pause = wait if timeout is None else max(0.0, min(wait, timeout - (clock() - idle_since)))
        if sleep(pause):
            return
        wait = min(wait * 2, poll)


# --- the rows of each commit ----------------------------------------------------------------------------------

def follow(engine: Engine, columns: Sequence[str] | None = None, *, run_id: Names = None, env_id: Names = None,
           since: int | None = None, episodes: bool = False, poll: float = 0.5,
           timeout: float | None = None) -> Iterator[Commit]:
    """The rows of each new commit after version ``since`` (None: from now on), in commit order, exactly once: the
    commit's steps (``columns``, or all), or with ``episodes`` the ``episodes`` rows of the episodes it completed;
    commits that append none of the selected runs' rows (a compaction) are passed over."""
    check_follow(since, poll, timeout)
    pinned = engine.table.log.pinned
    if pinned is not None:
        raise InputError(f"follow: this store is opened at version {pinned}, which never changes; follow the store "
                         f"itself from that version: trajstore.open(uri).follow(since={pinned})")
    start = engine.table.log.latest_number() if since is None else since
    for commit in new_commits(engine.table, since=start, poll=poll, timeout=timeout):
        rows = _commit_rows(engine, commit, columns, run_id=run_id, env_id=env_id, episodes=episodes)
        if rows is not None:
            yield rows


def commit_rows(engine: Engine, version: int, columns: Sequence[str] | None = None, *, run_id: Names = None,
                env_id: Names = None, episodes: bool = False) -> Commit | None:
    """What :func:`follow` yields for the commit of ``version`` (``rows`` empty when it appended none of the
    selected runs' rows); None while there is no such version (for a store opened at a version, a version after
    it)."""
    if isinstance(version, bool) or not isinstance(version, int) or version < 0:
        raise InputError(f"version: must be a store version >= 0, got {version!r}")
    pinned = engine.table.log.pinned
    if pinned is not None and version > pinned:
        return None  # not committed yet, as of the version this store reads
    commit = engine.table.log.commit(version)
    if commit is None:
        return None
    found = _commit_rows(engine, commit, columns, run_id=run_id, env_id=env_id, episodes=episodes)
    return found or Commit(version, pa.table({}), [], commit.timestamp_ms)


def _commit_rows(engine: Engine, commit: LogCommit, columns: Sequence[str] | None, *, run_id: Names,
                 env_id: Names, episodes: bool) -> Commit | None:
    files = [f for f in commit.added if selected(f.run_id, run_id) and selected(f.env_id, env_id)]
    if not commit.new_rows or not files:
        return None
    marked = [f.uri for f in files if f.path in commit.marked]  # rows of them another engine deleted: never sent
    if marked:
        raise protocol.deletion_vector_error(engine.table.log.uri, commit.version, marked)
    try:
        rows = _completed_episodes(engine, files, columns) if episodes else _file_rows(engine, files, columns)
    except (OSError, pa.ArrowException) as exc:  # the commit's own files (a snapshot's errors come judged)
        raise engine.damage(exc, files, version=commit.version) or exc
    return Commit(commit.version, rows, sorted({f.run_id for f in files}), commit.timestamp_ms)


def _file_rows(engine: Engine, files: list[DataFile], columns: Sequence[str] | None) -> pa.Table:
    """Every step of ``files`` (``columns``, or all), decoded, in their own types."""
    types = engine.step_types(files)
    names = list(dict.fromkeys(columns)) if columns else types.schema.names
    check_names(names, types.schema.names, view="steps", field="columns")
    types.check_one_type(names)
    return scan_steps(files, types.schema, names, schemas=engine.file_schemas(files)).read_all()


def _completed_episodes(engine: Engine, files: list[DataFile], columns: Sequence[str] | None) -> pa.Table:
    """The ``episodes`` rows of the episodes whose last step is in ``files`` (read over every committed file that
    may hold their steps)."""
    ends = _file_rows(engine, files, ["episode_id", "terminated", "truncated"])
    done = ends.filter(pc.or_(ends["terminated"], ends["truncated"]))["episode_id"]
    ids = np.unique(done.to_numpy())
    with engine.snapshot(files_holding(engine.files(), ids), con=engine.cursor()) as snap:
        if columns:
            snap.check_columns(list(columns), view="episodes", field="columns")
        rows = snap.arrow(sql.episodes(sql.conditions(episode_id=ids), source="episodes",
                                       order_by=[("episode_id", False)], limit=None))
    return rows.select(list(columns)) if columns else rows
