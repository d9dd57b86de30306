"""How long a table's log keeps what it holds: the Delta table properties that say so, read and written as durations.

A Delta log gets one entry per version. Kept for ever, it grows with every commit, and on a local disk every open
lists the whole log folder (~5 µs an entry: 20,000 entries cost ~0.1 s per open). Delta's own rule bounds
it, and every engine that maintains a Delta table applies the rule from the table's properties:

- ``delta.logRetentionDuration``: how long an entry is kept (Delta's default: 30 days). An entry older than that,
  and behind a checkpoint, may be removed; its version can no longer be read (``trajstore.open(uri, version=N)``,
  ``as_of=``, ``follow(since=N)``);
- ``delta.checkpointInterval``: a checkpoint (the whole state in one Parquet file) every so many versions (Delta's
  default: 100), which is what lets older entries go and what an open reads instead of them;
- ``delta.setTransactionRetentionDuration``: how long an app transaction (an ingest request's idempotency key) is
  kept; trajstore sets it to the log's retention, so a retry is recognised as long as the log holds its version (and
  after that, rows that continue a stored episode are still refused as not continuing it);
- ``delta.deletedFileRetentionDuration``: how long a checkpoint keeps the ``remove`` tombstone of a file a
  compaction or a delete replaced, and the horizon other engines' vacuum keeps such files for (Delta's default: 7
  days). trajstore sets it to the log's retention too: a file removed longer ago than that is needed by no version
  the log can still read, and a store compacted thousands of times would otherwise carry each of those tombstones in
  every checkpoint for a week (3,000 small commits under a 10-minute retention left 3,340 tombstones, and deltalake
  opened the table in 32 ms against 5 ms for a fresh store of the same rows; 7 ms once they went). A longer log
  retention keeps the files as long, so another engine's vacuum never takes a file a readable version lists.

trajstore's defaults for a new table (:data:`DEFAULT`): a 7-day retention — vacuum's default horizon, so every
version one can read still has its files, and a week for a learner or a reproduction to pin a version — and a
checkpoint every 25 versions, what writers' upkeep already wrote (an open then replays at most 24 entries).
A store fed without a pause at a service's commit interval (4 commits/s) holds ~2.4 M entries a week: such a store
takes a retention of hours (``store.set_log_retention("1h")``, ``trajstore retention --log 1h``).

>>> interval_text(604800.0), interval_text(5400.0), interval_seconds("interval 2 hours")
('interval 7 days', 'interval 90 minutes', 7200.0)
>>> Retention.of({}).log_s / 86400, Retention.of({}).checkpoint_interval
(30.0, 100)
>>> oldest_readable([9, 10, 11, 12], [4, 9])
9
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import timedelta
from typing import Mapping, Sequence

from trajstore.durations import seconds, text
from trajstore.errors import InputError

LOG_RETENTION = "delta.logRetentionDuration"
CHECKPOINT_INTERVAL = "delta.checkpointInterval"
TXN_RETENTION = "delta.setTransactionRetentionDuration"
TOMBSTONE_RETENTION = "delta.deletedFileRetentionDuration"
DELTA_LOG_RETENTION_S = 30 * 86400.0  # what Delta assumes when a table does not say
DELTA_CHECKPOINT_INTERVAL = 100
MINIMUM_S = 60.0  # shorter, a lost answer's commit or a follower a minute behind could not be told from the log
INTERVAL = re.compile(r"^\s*interval\s+(\d+(?:\.\d*)?)\s*([a-z]+?)s?\s*$", re.IGNORECASE)
UNITS = {"nanosecond": 1e-9, "microsecond": 1e-6, "millisecond": 1e-3, "second": 1.0, "minute": 60.0,
         "hour": 3600.0, "day": 86400.0, "week": 7 * 86400.0}


@dataclass(frozen=True)
class Retention:
    """A table's retention rule: ``log_s`` seconds of log entries, a checkpoint every ``checkpoint_interval``
    versions."""

    log_s: float
    checkpoint_interval: int

    @classmethod
    def of(cls, properties: Mapping[str, str]) -> Retention:
        """The rule a table's properties say (Delta's defaults where they say nothing or cannot be read)."""
        try:
            log_s = interval_seconds(properties[LOG_RETENTION])
        except (KeyError, InputError):
            log_s = DELTA_LOG_RETENTION_S
        try:
            interval = max(1, int(properties[CHECKPOINT_INTERVAL]))
        except (KeyError, ValueError):
            interval = DELTA_CHECKPOINT_INTERVAL
        return cls(log_s, interval)

    def properties(self) -> dict[str, str]:
        """The table properties that state this rule (the idempotency keys and removed files' tombstones kept as
        long as the log)."""
        kept = interval_text(self.log_s)
        return {LOG_RETENTION: kept, CHECKPOINT_INTERVAL: str(self.checkpoint_interval), TXN_RETENTION: kept,
                TOMBSTONE_RETENTION: kept}

    def describe(self) -> str:
        return f"{text(self.log_s)} of log entries, a checkpoint every {self.checkpoint_interval} versions"


DEFAULT = Retention(7 * 86400.0, 25)


def check_log_retention(value: float | str | timedelta, field: str = "log_retention") -> float:
    """Seconds of a log retention given by a user (``"7d"``, ``"1h"``, a timedelta, seconds), at least
    :data:`MINIMUM_S`; an :class:`InputError` naming ``field`` otherwise."""
    out = seconds(value, field)
    if out < MINIMUM_S:
        raise InputError(f"{field}: must be at least {text(MINIMUM_S)} (a retried commit and a follower are told "
                         f"from the log entries it keeps), got {value!r}")
    return out


def interval_text(value: float) -> str:
    """``value`` seconds as a Delta interval (``"interval 7 days"``), in the largest whole unit."""
    for unit in ("week", "day", "hour", "minute", "second"):
        size = UNITS[unit]
        if value >= size and value % size == 0 and unit != "week":
            return f"interval {int(value // size)} {unit}s"
    return f"interval {int(round(value * 1000))} milliseconds"


def interval_seconds(value: str) -> float:
    """Seconds of a Delta interval (``"interval 30 days"``); an :class:`InputError` for anything else."""
    m = INTERVAL.match(str(value))
    if m is None or m.group(2).lower() not in UNITS:
        raise InputError(f"{LOG_RETENTION}: expected a Delta interval such as 'interval 7 days', got {value!r}")
    return float(m.group(1)) * UNITS[m.group(2).lower()]


def oldest_readable(entries: Sequence[int], checkpoints: Sequence[int]) -> int | None:
    """The oldest version a log can be read at, from the versions of its entries (``NNN.json``, sorted) and of
    its checkpoints: version 0 while its entry is there, else the oldest checkpoint with every entry after it; None
    for a log with no entry."""
    if not entries:
        return None
    start = len(entries) - 1  # the first entry of the last unbroken run of entries (the log is read from there)
    while start > 0 and entries[start - 1] == entries[start] - 1:
        start -= 1
    if entries[start] == 0:
        return 0
    found = [c for c in checkpoints if entries[start] - 1 <= c <= entries[-1]]
    return min(found) if found else entries[start]
