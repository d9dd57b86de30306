"""Following a store as it is written: each new commit of the log, in commit order, exactly once.

:func:`new_commits` reads the log one version at a time: it asks for the JSON file of the next version only
(:meth:`StepsTable.commit_at <trajstore.storage.table.StepsTable.commit_at>`), and while there is none it waits,
doubling the wait from :data:`FIRST_WAIT` up to ``poll`` seconds, back to the shortest wait after each commit.
So an idle follower costs one small read every ``poll`` seconds, and a busy one sees each commit soon after it
lands. :class:`Commit` is what :meth:`Store.follow <trajstore.store.Store.follow>` yields for each.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Callable, Iterator

import pyarrow as pa

from trajstore.errors import InputError
from trajstore.storage.log import LogCommit
from trajstore.storage.table import StepsTable

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
    stop event does)."""
    version, wait, idle_since = since + 1, FIRST_WAIT, clock()
    while True:
        commit = table.log.commit(version)
        if commit is not None:
            yield commit
            version, wait, idle_since = version + 1, FIRST_WAIT, clock()
            continue
        if timeout is not None and clock() - idle_since >= timeout:
            return
        pause = wait if timeout is None else max(0.0, min(wait, timeout - (clock() - idle_since)))
        if sleep(pause):
            return
        wait = min(wait * 2, poll)
