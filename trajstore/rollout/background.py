"""Feeding a writer from a thread of its own, so that the thread that steps the environments (a gymnasium
vector env, or the JAX scan's host side) never waits for array copies, checks or Parquet encoding."""

from __future__ import annotations

import logging
import queue
import threading
from typing import Any, Callable

from trajstore.errors import InputError
from trajstore.write.writer import Writer

log = logging.getLogger(__name__)


class BackgroundWriter:
    """Feeds host batches to a writer from its own thread through a bounded queue.

    ``prepare`` (run in that thread) turns what is put into the writer's ``(T, B, …)`` batch, e.g. stacks a
    list of vector-env steps, so that the thread that steps the envs never copies their observations.
    ``put`` blocks while ``depth`` batches wait, so a slow writer slows the rollout instead of
    letting memory grow. An error in the writer thread is raised by the next ``put`` or by ``close``.
    """

    def __init__(self, writer: Writer, depth: int = 2, *, prepare: Callable[[Any], Any] | None = None) -> None:
        if not isinstance(depth, int) or depth < 1:
            raise InputError(f"queue_size must be a positive integer, got {depth!r}")
        self.writer = writer
        self.prepare = prepare
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="trajstore-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            if self._error is None:  # after an error, keep draining so that put() never blocks for ever
                try:
                    self.writer.add_batch(batch if self.prepare is None else self.prepare(batch))
                except BaseException as exc:  # noqa: BLE001 - handed to the rollout thread
                    self._error = exc

    def put(self, batch: Any) -> None:
        self._raise()
        self._queue.put(batch)

    def close(self, *, raise_error: bool = True) -> None:
        """Wait until every queued batch is written. Idempotent — safe to call multiple times."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if raise_error:
            self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        self.close(raise_error=exc_type is None)
