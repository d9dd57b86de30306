"""Commits announced to every listener: one watcher thread per store, fanned out to bounded queues.

The watcher follows the store's log with :func:`~trajstore.query.follow.new_commits` (it reads the next
version's JSON file only, backing off while nothing lands) and runs only while someone listens: the first
subscriber starts it, the last one to leave stops it. While the store fails or does not answer, the watcher
waits and reads the log again from where it was, so no commit is missed when the store is back; nothing that
waits on the store runs on the event loop. Each subscriber has an ``asyncio`` queue of at most
:data:`QUEUE_SIZE` announcements; one that falls that far behind loses the oldest and is told to reload
(``"lagged": true``). A subscriber is removed as soon as its stream ends, so a client that disconnects leaves
nothing behind.
"""

from __future__ import annotations

import asyncio
import logging
import threading
from dataclasses import asdict, dataclass
from typing import Any

from trajstore.errors import StoreAccessError
from trajstore.storage.log import LogCommit
from trajstore.store import Store, plumbing

log = logging.getLogger(__name__)

QUEUE_SIZE = 64
POLL_S = 0.25  # the longest wait between two looks at the log while it is idle
RETRY_S = 2.0  # the wait before reading the log again after the store failed or did not answer


@dataclass(frozen=True)
class Announcement:
    """One commit: its version, the runs it touched, the rows it added (0 for a compaction, which rewrites)."""

    version: int
    runs: list[str]
    rows_added: int
    files_added: int
    files_removed: int
    lagged: bool = False

    @classmethod
    def of(cls, commit: LogCommit) -> Announcement:
        rows = sum(f.rows for f in commit.added) if commit.new_rows else 0
        return cls(commit.version, sorted({f.run_id for f in commit.added}), rows, len(commit.added),
                   len(commit.removed))

    def as_dict(self) -> dict[str, Any]:
        return asdict(self)


class Subscriber:
    """One listener's queue; ``put`` drops the oldest announcement when the queue is full."""

    def __init__(self) -> None:
        self.queue: asyncio.Queue[Announcement] = asyncio.Queue(QUEUE_SIZE)

    def put(self, item: Announcement) -> None:
        if self.queue.full():
            self.queue.get_nowait()
            item = Announcement(**{**item.as_dict(), "lagged": True})
        self.queue.put_nowait(item)


class CommitHub:
    """The announcements of one store's commits, for any number of subscribers of one event loop."""

    def __init__(self, store: Store, *, poll: float = POLL_S) -> None:
        self.store, self.poll = store, poll
        self._subscribers: set[Subscriber] = set()
        self._lock = threading.Lock()
        self._stop: threading.Event | None = None
        self._thread: threading.Thread | None = None

    @property
    def subscribers(self) -> int:
        return len(self._subscribers)

    @property
    def watching(self) -> bool:
        return self._thread is not None and self._thread.is_alive()

    async def subscribe(self) -> Subscriber:
        """A new subscriber (from the event loop); starts the watcher, from the store's version, if it was not
        running. The version is read on a worker thread: a store that does not answer never blocks the loop
        (the error, a :class:`~trajstore.errors.StoreAccessError`, is raised here and nothing is subscribed)."""
        sub = Subscriber()
        loop = asyncio.get_running_loop()
        with self._lock:
            self._subscribers.add(sub)
            running = self._stop is not None
        if running:
            return sub
        try:
            since = await asyncio.to_thread(lambda: self.store.version)
        except BaseException:
            self.unsubscribe(sub)
            raise
        with self._lock:  # unless another subscriber started it meanwhile (from a version read before)
            if self._stop is None and sub in self._subscribers:
                self._stop = threading.Event()
                self._thread = threading.Thread(target=self._watch, args=(loop, self._stop, since),
                                                name="trajstore-commits", daemon=True)
                self._thread.start()
        return sub

    def unsubscribe(self, sub: Subscriber) -> None:
        """Remove ``sub``; the watcher stops with the last one."""
        with self._lock:
            self._subscribers.discard(sub)
            if not self._subscribers and self._stop is not None:
                self._stop.set()
                self._stop = None

    def _watch(self, loop: asyncio.AbstractEventLoop, stop: threading.Event, since: int) -> None:
        try:
            while not stop.is_set():
                try:
                    for commit in plumbing(self.store).new_commits(since=since, poll=self.poll, sleep=stop.wait):
                        if stop.is_set():
                            return
                        loop.call_soon_threadsafe(self._fan_out, Announcement.of(commit))
                        since = commit.version
                    return  # stopped: the last subscriber left
                except StoreAccessError as exc:  # the store fails or does not answer: the same version again
                    log.warning("%s; reading the commit log again in %g s", exc, RETRY_S)
                    stop.wait(RETRY_S)
        except RuntimeError:  # the loop closed: the server is shutting down
            return
        except Exception:
            log.exception("watching the commit log of %s failed", self.store.uri)
            with self._lock:
                if self._stop is stop:
                    self._stop = None

    def _fan_out(self, item: Announcement) -> None:
        for sub in list(self._subscribers):
            sub.put(item)
