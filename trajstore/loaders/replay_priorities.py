"""A replay's priorities in the store (the ``priorities`` table, :mod:`~trajstore.storage.priorities_log`): the
stored ones given back to a new replay's items, and the updates a learner gives gathered and committed in batches —
when :meth:`~trajstore.loaders.replay.Replay.commit` is called, on close, and on a thread of their own every
``interval_s`` seconds or ``updates`` updates (:class:`Committer`), so that a learner's step never waits for a
write. An update not yet committed is what a killed learner loses.
"""

from __future__ import annotations

import logging
import threading
import time
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore.errors import InputError, first_line
from trajstore.loaders.replay_items import Keys, Registry
from trajstore.storage.priorities_log import ROWS, Rows

log = logging.getLogger(__name__)


def stored(rows: Rows, registry: Registry, first: int, count: int, agents: Sequence[str] | None) -> np.ndarray:
    """The stored priority of the items of handles ``first .. first + count - 1`` (NaN where none), the rows of each
    file applied over the earlier files' (``agents``: the names of the agent codes; None for a single-agent replay,
    whose rows have no agent)."""
    prior = np.full(count, np.nan)
    for table in rows.files:
        for part in table.select(["episode_id", "agent_id", "step", "priority"]).to_batches():  # no chunks joined
            keys = Keys(_numpy(part["episode_id"], np.int64), agent_codes(part["agent_id"], agents),
                        _numpy(part["step"], np.int32))
            registry.scatter(keys, _numpy(part["priority"], np.float64), first, prior)
    return prior


def agent_codes(column: pa.ChunkedArray | pa.Array, agents: Sequence[str] | None) -> np.ndarray:
    """Each row's agent code: its index among ``agents``, -1 for another agent; a single-agent replay's
    (``agents`` None) rows without an agent 0, the others -1."""
    if agents is None:
        if column.null_count == len(column):  # (none with an agent, or all: no per-row pass)
            return np.zeros(len(column), np.int32)
        if not column.null_count:
            return np.full(len(column), -1, np.int32)
        return np.where(pc.is_null(column).to_numpy(zero_copy_only=False), 0, -1).astype(np.int32)
    found = pc.index_in(column, value_set=pa.array(list(agents), pa.string()))
    if found.null_count:
        found = found.fill_null(-1)
    return _numpy(found, np.int32)


def _numpy(column: pa.ChunkedArray | pa.Array, dtype: type) -> np.ndarray:
    """``column`` (without nulls) as a numpy array of ``dtype``, copied only where its chunks must be joined or its
    type changed."""
    return np.asarray(column.to_numpy(zero_copy_only=False), dtype)


@dataclass
class Updates:
    """Updates given: their items' keys, priorities and times (µs since the epoch), in the order given."""

    keys: Keys
    priority: np.ndarray
    time_us: np.ndarray

    def __len__(self) -> int:
        return len(self.priority)


class Pending:
    """The updates given since the last commit."""

    def __init__(self) -> None:
        self._parts: list[Updates] = []
        self.count = 0
        self.since: float | None = None  # when the oldest of them was given (time.monotonic)

    def add(self, updates: Updates) -> None:
        if not len(updates):
            return
        self._parts.append(updates)
        self.count += len(updates)
        if self.since is None:
            self.since = time.monotonic()

    def take(self) -> list[Updates]:
        parts, self._parts, self.count, self.since = self._parts, [], 0, None
        return parts

    def put_back(self, parts: list[Updates]) -> None:
        """``parts`` (taken, not committed) before the updates given since."""
        if not parts:
            return
        self._parts = parts + self._parts
        self.count += sum(len(p) for p in parts)
        self.since = time.monotonic() if self.since is None else self.since


def rows_of(parts: Sequence[Updates], agents: Sequence[str] | None) -> pa.Table:
    """The rows committing ``parts``: one per item, its last update (``version`` left to the log)."""
    episode = np.concatenate([p.keys.episode for p in parts])
    agent = np.concatenate([p.keys.agent for p in parts])
    start = np.concatenate([p.keys.start for p in parts])
    priority = np.concatenate([p.priority for p in parts])
    time_us = np.concatenate([p.time_us for p in parts])
    order = np.lexsort((np.arange(len(episode)), start, agent, episode))
    last = np.ones(len(order), bool)
    e, a, s = episode[order], agent[order], start[order]
    last[:-1] = (e[1:] != e[:-1]) | (a[1:] != a[:-1]) | (s[1:] != s[:-1])
    keep = order[last]
    names = pa.nulls(len(keep), pa.string()) if agents is None else \
        pa.array(np.asarray(agents, dtype=object)[agent[keep]], pa.string())
    fields = {f.name: f.type for f in ROWS}
    return pa.table({"episode_id": pa.array(episode[keep], fields["episode_id"]),
                     "step": pa.array(start[keep].astype(np.int32), fields["step"]), "agent_id": names,
                     "priority": pa.array(priority[keep], fields["priority"]),
                     "time": pa.array(time_us[keep], pa.int64()).cast(fields["time"])})


@dataclass(frozen=True)
class Committing:
    """When a replay commits on its own: every ``interval_s`` seconds and every ``updates`` updates (None: never by
    that rule); always on ``commit()`` and ``close()``."""

    interval_s: float | None = 5.0
    updates: int | None = 100_000

    def check_arguments(self) -> None:
        if self.interval_s is not None and not (np.isfinite(self.interval_s) and self.interval_s > 0):
            raise InputError(f"commit_interval: must be a duration > 0 (or None), got {self.interval_s!r}")
        if self.updates is not None and (isinstance(self.updates, bool) or not isinstance(self.updates, int)
                                         or self.updates < 1):
            raise InputError(f"commit_updates: must be a whole number >= 1 (or None), got {self.updates!r}")

    def due(self, pending: Pending) -> bool:
        if not pending.count:
            return False
        if self.updates is not None and pending.count >= self.updates:
            return True
        return self.interval_s is not None and pending.since is not None and \
            time.monotonic() - pending.since >= self.interval_s


class Committer:
    """A thread that calls ``flush()`` whenever ``rule`` says the pending updates are due (woken by :meth:`notify`
    after each update, else every ``interval_s``). A flush that fails is logged and tried again when due; the
    updates stay pending."""

    def __init__(self, rule: Committing, pending: Pending, lock: threading.RLock, flush: Callable[[], object]) -> None:
        self.rule, self.pending, self.lock, self.flush = rule, pending, lock, flush
        self._wake = threading.Event()
        self._stop = False
        self._thread: threading.Thread | None = None

    def notify(self) -> None:
        if self.rule.interval_s is None and self.rule.updates is None:
            return
        if self._thread is None:
            self._thread = threading.Thread(target=self._run, name="trajstore-replay-commits", daemon=True)
            self._thread.start()
        with self.lock:
            due = self.rule.updates is not None and self.pending.count >= self.rule.updates
        if due:
            self._wake.set()

    def _run(self) -> None:
        while not self._stop:
            self._wake.wait(self._timeout())
            self._wake.clear()
            if self._stop:
                return
            with self.lock:
                due = self.rule.due(self.pending)
            if due:
                try:
                    self.flush()
                except Exception as exc:  # noqa: BLE001 - kept pending: the next commit (or close) tries again
                    log.warning("replay priorities were not committed (kept for the next commit): %s",
                                first_line(exc))

    def _timeout(self) -> float | None:
        """Seconds until the oldest pending update is due by time (None: only when woken)."""
        interval = self.rule.interval_s
        if interval is None:
            return None
        with self.lock:
            since = self.pending.since
        return interval if since is None else max(0.0, interval - (time.monotonic() - since))

    def stop(self) -> None:
        self._stop = True
        self._wake.set()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join()
