"""One committer for many writers of a store: the writers write their files, the committer commits them in groups.

Delta's practice for many writers of one table: each writes its data files itself, in parallel, straight into the
table's folder (local or ``s3://``), and one committer orders what they wrote into few, larger commits — N writers
that would make N commits per flush make about one, and the log grows by one entry per interval, not per writer.

>>> import multiprocessing, trajstore                                                      # doctest: +SKIP
>>> with trajstore.Committer("store", interval="250ms") as committer:                   # doctest: +SKIP
...     # in any process of this machine:
...     trajstore.open("store").writer(run_id="r", env_id="E", committer=committer.address)

A :class:`Committer` runs a :class:`~trajstore.operations.group_commit.GroupCommitter` (its thread commits at most
once per ``interval``, sooner once ``group_bytes`` wait) and the store's upkeep (compaction, checkpoints, the log's
retention) in this process, and serves it to writers of other processes at :attr:`Committer.address`
(:mod:`~trajstore.operations.handoff`). A writer of this process takes the object itself. ``trajstore.ray.rollout``
runs one in a Ray actor for its workers. The service (``trajstore serve``) is the committer of the rows remote
writers send it.
"""

from __future__ import annotations

from concurrent.futures import Future
from datetime import timedelta
from pathlib import Path
from typing import Any, Mapping, Sequence

from trajstore.durations import seconds
from trajstore.operations.group_commit import Outcome
from trajstore.operations.handoff import CommitterServer
from trajstore.storage.log import WrittenFile
from trajstore.store import Store, plumbing
from trajstore.store import open as open_store

__all__ = ["Committer"]


class Committer:
    """The one committer of ``store`` (a :class:`~trajstore.store.Store`, or its URI with ``storage_options``) for
    writers that hand it their files (``store.writer(..., committer=committer)``, or ``committer=committer.address``
    in another process): at most one commit per ``interval`` (a duration, ``"250ms"``), sooner once ``group_bytes`` of
    files wait. With ``host`` (default ``127.0.0.1``; None: this process only) it listens for writers of other
    processes on ``port`` (0: any free one). A context manager; :meth:`close` commits what waits. Idempotent —
    safe to call multiple times."""

    def __init__(self, store: Store | str | Path, *, interval: float | str | timedelta = "250ms",
                 group_bytes: int = 256 * 1024 * 1024, host: str | None = "127.0.0.1", port: int = 0,
                 storage_options: Mapping[str, Any] | None = None) -> None:
        self.store = store if isinstance(store, Store) else open_store(store, create=True,
                                                                       storage_options=storage_options)
        pipes = plumbing(self.store)
        self._upkeep = pipes.new_upkeep("committer")
        self._committer = pipes.group_committer(interval_s=seconds(interval, "interval"), group_bytes=group_bytes,
                                                upkeep=self._upkeep)
        self._server = None if host is None else CommitterServer(self._committer, host=host, port=port)
        self._closed = False

    @property
    def address(self) -> str:
        """Where writers of other processes reach it: ``trajstore+committer://HOST:PORT/KEY``."""
        if self._server is None:
            raise ValueError("this committer serves no other process (host=None)")
        return self._server.address

    @property
    def commits(self) -> int:
        """The commits it made."""
        return self._committer.commits

    @property
    def groups(self) -> list[int]:
        """How many hand-overs each of its commits held, oldest first (the last 1,000)."""
        return list(self._committer.groups)

    def commit_files(self, files: Sequence[WrittenFile]) -> Future[Outcome]:
        """Hand ``files`` (written into the store's table, not committed) to the next group."""
        return self._committer.commit_files(files)

    def commit(self, files: Sequence[WrittenFile]) -> int | None:
        """Hand ``files`` over and wait until they are committed; the version that holds them."""
        return self.commit_files(files).result().version

    def close(self) -> None:
        """Commit what waits, stop listening, finish the upkeep."""
        if self._closed:
            return
        self._closed = True
        if self._server is not None:
            self._server.close()
        self._committer.close()
        self._upkeep.close()

    def __enter__(self) -> Committer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"Committer({self.store.uri!r})"
