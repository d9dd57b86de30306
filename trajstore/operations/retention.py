"""A store's log retention: how long the logs of its tables (``steps``, ``runs``,
``priorities``) keep their entries, shown and set.

The rule is the tables' own Delta properties (:mod:`~trajstore.storage.retention`), so every engine that maintains
them applies it: a checkpoint every ``delta.checkpointInterval`` versions, after which entries older than
``delta.logRetentionDuration`` go (writers' and the service's upkeep do it, :mod:`~trajstore.operations.upkeep`; so
does deltalake after its own commits). :func:`set_log_retention` gives every table of the store the same rule (one
commit each that changes); :func:`report` says each table's rule and the versions its log still reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from datetime import timedelta
from typing import TYPE_CHECKING

from trajstore.durations import text
from trajstore.errors import InputError
from trajstore.storage.log import Log
from trajstore.storage.retention import Retention, check_log_retention

if TYPE_CHECKING:
    from trajstore.query.engine import Engine


@dataclass(frozen=True)
class TableRetention:
    """One table's rule and what its log holds: the oldest version it can read (None: no commit yet), the latest
    version (-1: none) and its entries."""

    table: str
    rule: Retention
    oldest: int | None
    latest: int
    entries: int

    def format(self) -> str:
        held = "no versions yet" if self.oldest is None else \
            f"versions {self.oldest}..{self.latest} readable ({self.entries} log entries)"
        return f"{self.table}: {text(self.rule.log_s)} of log entries, a checkpoint every " \
               f"{self.rule.checkpoint_interval} versions; {held}"


@dataclass(frozen=True)
class RetentionReport:
    """The retention of each table of a store (``steps`` first)."""

    tables: list[TableRetention]

    @property
    def log_s(self) -> float:
        """The ``steps`` table's log retention, in seconds."""
        return self.tables[0].rule.log_s

    @property
    def checkpoint_interval(self) -> int:
        return self.tables[0].rule.checkpoint_interval

    @property
    def oldest(self) -> int | None:
        """The oldest version of ``steps`` that can still be read."""
        return self.tables[0].oldest

    def format(self) -> str:
        return "\n".join(t.format() for t in self.tables)

    __str__ = format


def _logs(engine: Engine) -> list[tuple[str, Log]]:
    return [("steps", engine.table.log), ("runs", engine.descriptions.runs.entries),
            ("priorities", engine.priorities.entries)]


def report(engine: Engine) -> RetentionReport:
    """Each table's retention rule and the versions its log still reads."""
    out = []
    for name, log in _logs(engine):
        entries = log.numbers()
        out.append(TableRetention(name, log.retention(), log.oldest_readable(), entries[-1] if entries else -1,
                                  len(entries)))
    return RetentionReport(out)


def set_log_retention(engine: Engine, log_retention: float | str | timedelta, *,
                      checkpoint_interval: int | None = None) -> RetentionReport:
    """Give every table of the store ``log_retention`` (at least a minute) and, if given, ``checkpoint_interval``
    (else each keeps its own); a store without a ``steps`` table yet gets one, made with the rule. Entries past the
    new retention go at the next checkpoint."""
    seconds = check_log_retention(log_retention)
    if checkpoint_interval is not None and (isinstance(checkpoint_interval, bool) or
                                            not isinstance(checkpoint_interval, int) or checkpoint_interval < 1):
        raise InputError(f"checkpoint_interval: must be a whole number of versions >= 1, got {checkpoint_interval!r}")
    for name, log in _logs(engine):
        interval = checkpoint_interval or log.retention().checkpoint_interval
        log.set_retention(Retention(seconds, interval), make=name == "steps")
    return report(engine)
