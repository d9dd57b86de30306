"""What one computation may take: a time limit and a memory bound, set by whoever asks (the service, for each
request) and checked where the work is done.

The service sets a :class:`Budget` for each request (:func:`bounded`); the code that computes — a comparison's
bootstrap, a learning curve's bins, a query of the process's DuckDB — reads it with :func:`current` and checks it
between pieces of work: :meth:`Budget.check` raises :class:`~trajstore.errors.QueryTimeoutError` (408) once the time
is up, :meth:`Budget.afford` a :class:`~trajstore.errors.QueryMemoryError` (413) for a piece that would need more
memory than the bound, before it is allocated. A work of many pieces is cut into pieces that each fit
(:meth:`Budget.pieces`), so the memory it takes does not grow with what was asked (``reps``, thresholds, bins). In
your own process nothing is bounded unless you say so.

>>> with bounded(Budget(timeout_s=10, memory_bytes=1 << 20, what="compare")):
...     [len(range(*p)) for p in current().pieces(10, 300_000, hint="ask for fewer reps")]
[3, 3, 3, 1]
"""

from __future__ import annotations

import contextlib
import contextvars
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Iterator

from trajstore.errors import QueryMemoryError, QueryTimeoutError, size_text


@dataclass(frozen=True)
class Budget:
    """``timeout_s`` seconds from ``started`` and ``memory_bytes`` for any one piece of work (None: no bound);
    ``what`` names the computation in errors, ``settings`` the settings that set the bounds. With ``worker_bytes``
    a computation that can (a comparison's bootstrap) runs in a worker process whose memory is capped at that
    (:mod:`~trajstore.query.sql_worker`), killed if it outlasts the time: so it never takes the caller's memory,
    time or interpreter."""

    timeout_s: float | None = None
    memory_bytes: int | None = None
    worker_bytes: int | None = None
    what: str = "request"
    settings: tuple[str, str] = ("compute_timeout_s", "compute_memory_bytes")
    started: float = field(default_factory=time.monotonic)

    def remaining(self) -> float | None:
        """Seconds left (never below 0), or None without a time limit."""
        return None if self.timeout_s is None else max(0.0, self.started + self.timeout_s - time.monotonic())

    def passed(self) -> bool:
        left = self.remaining()
        return left is not None and left <= 0

    def check_time(self) -> None:
        """Raise :class:`QueryTimeoutError` once the time is up."""
        if self.passed():
            raise self.timeout()

    def timeout(self) -> QueryTimeoutError:
        return QueryTimeoutError(f"{self.what}: stopped at the time limit of {self.timeout_s:g} s "
                                 f"({self.settings[0]}); ask for less (fewer reps, bins or thresholds) or select "
                                 "fewer runs")

    def afford(self, nbytes: int, *, hint: str) -> None:
        """Raise :class:`QueryMemoryError` if one piece of work needs more than ``memory_bytes`` (``hint``: what
        to ask for instead)."""
        if self.memory_bytes is not None and nbytes > self.memory_bytes:
            raise QueryMemoryError(f"{self.what}: needs about {size_text(nbytes)} at once, over the limit of "
                                   f"{size_text(self.memory_bytes)} ({self.settings[1]}); {hint}")

    def pieces(self, total: int, item_bytes: int, *, hint: str, unit: int = 1) -> Iterator[tuple[int, int]]:
        """``(start, stop)`` ranges covering ``range(total)``, each of whole ``unit``s of items that together need
        at most ``memory_bytes`` (one unit if that is all that fits: its cost is checked), the time checked before
        each."""
        per_unit = max(1, item_bytes * unit)
        self.afford(per_unit, hint=hint)
        units = 1 << 62 if self.memory_bytes is None else max(1, self.memory_bytes // per_unit)
        step = units * unit
        for start in range(0, total, step):
            self.check_time()
            yield start, min(total, start + step)


_CURRENT: contextvars.ContextVar[Budget | None] = contextvars.ContextVar("trajstore_budget", default=None)
UNBOUNDED = Budget()


def current() -> Budget:
    """The budget of the computation running here (unbounded unless one was set with :func:`bounded`)."""
    return _CURRENT.get() or UNBOUNDED


def set_current(budget: Budget) -> None:
    """Make ``budget`` the current one for the rest of this context (a request's, in the service)."""
    _CURRENT.set(budget)


@contextlib.contextmanager
def interrupting(con: Any) -> Iterator[Budget]:
    """The current budget, with the DuckDB connection ``con`` interrupted from a timer when its time is up (a query
    of the process's own database, whose statement then fails: the caller raises :meth:`Budget.timeout` for any
    error once :meth:`Budget.passed`)."""
    limits = current()
    left = limits.remaining()
    timer = None if left is None else threading.Timer(left, _interrupt, (con,))
    if timer is not None:
        timer.daemon = True
        timer.start()
    try:
        yield limits
    finally:
        if timer is not None:
            timer.cancel()


def _interrupt(con: Any) -> None:
    try:
        con.interrupt()
    except Exception:  # noqa: BLE001 - the query ended and its connection closed as the timer fired
        pass


@contextlib.contextmanager
def bounded(budget: Budget) -> Iterator[Budget]:
    """``budget`` as the current one inside the ``with`` block."""
    token = _CURRENT.set(budget)
    try:
        yield budget
    finally:
        _CURRENT.reset(token)
