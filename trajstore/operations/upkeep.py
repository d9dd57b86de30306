"""Upkeep as writers go: after their commits, writers merge the small files of the partitions they wrote and
checkpoint the log, so that a store stays fast after thousands of small commits with no daemon to run.

Every query pays for each committed file (its footer, its scan set-up) and, without a checkpoint, for each log
version since the last one. An :class:`Upkeep` is told of each commit (:meth:`Upkeep.wrote`, which only marks
the partition and returns) and works on a thread of its own, never on the caller's ``add_batch``/``flush`` path:

- a partition holding more than ``compact_small_files`` files below ``compact_small_bytes`` has those files merged
  (:func:`compact_small`, by the one compaction, :func:`~trajstore.operations.compact.compact_partition`): the rows
  of each format's small files, ordered by ``(episode_id, step)``, written as files of up to
  ``compact_target_bytes``, and committed by :meth:`Log.swap <trajstore.storage.log.Log.swap>` removing exactly the
  files read. Files another writer appends
  meanwhile stay; when two compactions race, the first commit wins and the other finds its files gone and is
  skipped (its new files deleted), as is one that meets a delete, an ``add_column`` or a vacuum that removed them.
  Only committed files are read, never a writer's in-flight one. A compaction killed before its commit leaves
  at most files no version lists (orphans: ``trajstore vacuum`` removes them); killed after it, it is done.
- once the log is ``checkpoint_interval`` versions past its last checkpoint (deltalake writes one on its own at
  every 100th version, but not for a version taken by a schema commit or a swap, and only every 100), a
  checkpoint is written (``DeltaTable.create_checkpoint``), so that opening the log reads one Parquet file and
  fewer than ``checkpoint_interval`` commits. Every commit past the checkpoint costs each open ~0.3 ms; a
  checkpoint of a log with 10,000 versions (its removed files kept as tombstones for a week) costs ~0.1 s once,
  off the writers' path: 25 keeps an open within a few ms of a freshly checkpointed log (at 100 an aged store
  took 2× as long to open as a compacted one, docs/benchmarks.md). Removing old log files stays vacuum's business.
"""

from __future__ import annotations

import logging
import threading
import warnings
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from trajstore.errors import CommitError
from trajstore.operations.compact import Compaction, compact_partition
from trajstore.storage.log import DataFile
from trajstore.storage.table import StepsTable

if TYPE_CHECKING:
    from trajstore.settings import Settings

log = logging.getLogger(__name__)

KEPT = 1_000  # compactions and errors an Upkeep remembers: a service's runs for days, compacting every few seconds


@dataclass(frozen=True)
class CompactionPolicy:
    """When upkeep acts: more than ``small_files`` files below ``small_bytes`` in a partition (0: never compact),
    merged into files of up to ``target_bytes``; a checkpoint every ``checkpoint_interval`` versions (0: never)."""

    small_files: int = 8
    small_bytes: int = 16 * 1024 * 1024
    target_bytes: int = 128 * 1024 * 1024
    checkpoint_interval: int = 25

    @classmethod
    def of(cls, settings: Settings) -> CompactionPolicy:
        return cls(settings.compact_small_files, settings.compact_small_bytes, settings.compact_target_bytes,
                   settings.checkpoint_interval)

    @property
    def active(self) -> bool:
        return self.small_files > 0 or self.checkpoint_interval > 0


class Upkeep:
    """One background thread that compacts the partitions it is told were written to and checkpoints the log.

    :meth:`wrote` never waits; notices that arrive while the thread works are folded into its next round.
    :meth:`close` finishes the round in progress and the partitions still marked (a short-lived writer compacts
    too), then ends the thread. Idempotent — safe to call multiple times.
    """

    def __init__(self, table: StepsTable, policy: CompactionPolicy) -> None:
        self.table, self.policy = table, policy
        # the latest KEPT compactions it committed and failures it logged and went on after (upkeep never fails a
        # writer), oldest first
        self.compactions: deque[Compaction] = deque(maxlen=KEPT)
        self.errors: deque[str] = deque(maxlen=KEPT)
        self._dirty: set[tuple[str, str]] = set()
        self._wake = threading.Condition()
        self._closing = False
        self._thread: threading.Thread | None = None

    def wrote(self, run_id: str, env_id: str) -> None:
        """A commit added a file to ``run_id``/``env_id``: look at it (and the log) on the upkeep thread."""
        if not self.policy.active:
            return
        with self._wake:
            if self._closing:
                return
            self._dirty.add((run_id, env_id))
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name="trajstore-upkeep", daemon=True)
                self._thread.start()
            self._wake.notify()

    def close(self) -> None:
        """Finish what was marked, then stop the thread."""
        with self._wake:
            self._closing = True
            self._wake.notify()
            thread = self._thread
        if thread is not None:
            thread.join()

    def _run(self) -> None:
        while True:
            with self._wake:
                while not self._dirty and not self._closing:
                    self._wake.wait()
                todo, self._dirty = sorted(self._dirty), set()
                if not todo and self._closing:
                    return
            self._round(todo)

    def _round(self, partitions: list[tuple[str, str]]) -> None:
        try:
            for run_id, env_id in partitions:
                done = compact_small(self.table, run_id, env_id, self.policy)
                if done is not None:
                    self.compactions.append(done)
            if self.policy.checkpoint_interval > 0:
                self.table.log.checkpoint_if_due(self.policy.checkpoint_interval)
        except Exception as exc:  # noqa: BLE001 - upkeep is an optimization: log it, the writer goes on
            self.errors.append(f"{type(exc).__name__}: {exc}")
            log.warning("upkeep of %s failed (the store is unchanged by it): %s", self.table.uri, exc)


def small_files(files: list[DataFile], small_bytes: int) -> list[DataFile]:
    """The files of ``files`` below ``small_bytes``."""
    return [f for f in files if f.size < small_bytes]


def compact_small(table: StepsTable, run_id: str, env_id: str, policy: CompactionPolicy) -> Compaction | None:
    """Merge the small files of one partition (:func:`~trajstore.operations.compact.compact_partition`) if it holds
    more than ``policy.small_files`` of them; None when there was nothing to do or another change removed some of
    them first (nothing committed then)."""
    if policy.small_files <= 0:
        return None
    state = table.log.read()
    small = [] if state is None else small_files(state.partition(run_id, env_id), policy.small_bytes)
    if state is None or len(small) <= policy.small_files:
        return None
    try:
        done = compact_partition(table, state, small, target_bytes=policy.target_bytes, auto=True)
    except CommitError as exc:
        log.info("compaction of run_id=%s/env_id=%s skipped: %s", run_id, env_id, exc)
        return None
    return done if done.files_removed else None


def __getattr__(name: str) -> Any:
    """``Policy``, the name :class:`CompactionPolicy` had until trajstore 0.1 (in an RL library a policy is the
    agent's): still importable for one release, with a :class:`DeprecationWarning` naming the new one."""
    if name == "Policy":
        warnings.warn("trajstore.operations.upkeep.Policy is deprecated: use CompactionPolicy (the same class); "
                      "the old name goes in the next release", DeprecationWarning, stacklevel=2)
        return CompactionPolicy
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
