"""Every request's budget (see :mod:`trajstore.query.budget`).

- Every request gets a time limit for what it computes (``request_timeout_s``): its queries of the process's
  DuckDB are interrupted past it, 408.
- The routes that compute per request — comparisons, performance profiles, learning curves across seeds
  (``/curves/groups``, and ``/curves`` with ``by=``), whose
  bootstraps grow with ``reps``, thresholds, bins and groups — each take one of ``compute_max_concurrent`` places
  from the first to the last byte of their work (429 with ``Retry-After`` when none is free: nothing waits, so a
  burst of them never holds the threads a cheap ``/stats`` or ``/health`` needs), their own time limit
  (``compute_timeout_s``, 408) and a memory bound for any one block of their work (``compute_memory_bytes``, 413
  before it is allocated).
  Their bootstraps run in the SQL worker processes (:mod:`trajstore.query.sql_worker`), capped in memory at
  ``sql_worker_bytes`` and killed past their time, so they never take the service's memory or its interpreter's
  time from a cheap request. A request refused for want of a place is refused before any of it is parsed.
- ``POST /sql`` and the loader streams have the sandbox's own budgets (:mod:`trajstore.api.routes.sql`).
- Ingest requests (``POST /runs/{run_id}/batches``) hold their body and their rows from arrival until their group's
  commit answers them (:mod:`trajstore.operations.group_commit`): :class:`PendingBytes` counts those bytes against
  ``ingest_pending_bytes``; a request that does not fit waits up to ``ingest_wait_s`` for room (nothing of it read
  meanwhile), then gets 429 with ``Retry-After``. A request larger than the bound alone is taken when nothing else
  is held.
"""

from __future__ import annotations

import asyncio
import contextlib
import math
import threading
import time
from typing import AsyncIterator
from urllib.parse import parse_qs

from fastapi import Request
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trajstore.api.problems import problem
from trajstore.api.settings import ServiceSettings
from trajstore.errors import IngestBusyError, QueryBusyError, size_text
from trajstore.query import budget
from trajstore.query.sandbox import Gate
from trajstore.store import plumbing


def gate(settings: ServiceSettings) -> Gate:
    """The places of the routes that compute per request."""
    return Gate(settings.compute_max_concurrent, holds="comparisons or learning curves across seeds",
                setting="compute_max_concurrent")


async def request_budget(request: Request) -> None:
    """Every request: a time limit for what it computes."""
    settings = request.app.state.settings
    budget.set_current(budget.Budget(timeout_s=settings.request_timeout_s, what=_route(request),
                                     settings=("request_timeout_s", "compute_memory_bytes")))


COMPUTED = frozenset({"/compare", "/compare/scores", "/compare/improvement", "/compare/profile", "/curves/groups"})
GROUPED = "/curves"  # computes per request when asked for groups of runs (by=): learning curves across seeds


def computes(scope: Scope) -> bool:
    """Whether the request of ``scope`` goes to a route that computes per request: one of :data:`COMPUTED`, or
    :data:`GROUPED` with ``by=``."""
    if scope["path"] in COMPUTED:
        return True
    query = parse_qs(scope.get("query_string", b"").decode("latin-1"), keep_blank_values=True)
    return scope["path"] == GROUPED and "by" in query


class Places:
    """ASGI middleware: a request to a route of :data:`COMPUTED` takes a place of ``gate`` before anything of it is
    read or parsed (a burst of them costs the service next to nothing to refuse), and gives it back once its
    answer is sent; with none free it is answered 429 with ``Retry-After`` at once."""

    def __init__(self, app: ASGIApp, gate: Gate) -> None:
        self.app, self.gate = app, gate

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http" or not computes(scope):
            await self.app(scope, receive, send)
            return
        try:
            slot = self.gate.take(scope["path"])
        except QueryBusyError as exc:
            answer = problem(429, str(exc), request=Request(scope), headers={"Retry-After": str(exc.retry_after_s)},
                             error=QueryBusyError)
            await answer(scope, receive, send)
            return

        async def sending(message: Message) -> None:
            if message["type"] == "http.response.body" and not message.get("more_body"):
                slot.release()  # before its last bytes go: a client that asks again once answered finds it free
            await send(message)

        try:
            await self.app(scope, receive, sending)
        finally:
            slot.release()


async def compute_budget(request: Request) -> None:
    """A route of :data:`COMPUTED` (its place taken by :class:`Places`): its time limit and memory bound, its
    bootstrap in a worker process capped at ``sql_worker_bytes``."""
    settings = request.app.state.settings
    budget.set_current(budget.Budget(timeout_s=settings.compute_timeout_s, memory_bytes=settings.compute_memory_bytes,
                                     worker_bytes=plumbing(request.app.state.store).settings.sql_worker_bytes,
                                     what=_route(request)))


async def grouped_budget(request: Request) -> None:
    """:data:`GROUPED`'s budget: that of a route of :data:`COMPUTED` when it groups runs (``by=``), else the
    request's own."""
    if "by" in request.query_params:
        await compute_budget(request)


def _route(request: Request) -> str:
    return getattr(request.scope.get("route"), "path", request.url.path)


class PendingBytes:
    """The bytes ingest requests hold, at most ``limit``: :meth:`held` takes a request's share, waiting up to
    ``wait_s`` for room (then :class:`~trajstore.errors.IngestBusyError`, 429 with ``Retry-After``), and gives it
    back when the request is answered."""

    POLL_S = 0.01  # how often a waiting request looks for room (a few looks per commit interval)

    def __init__(self, limit: int, wait_s: float, *, retry_after_s: float = 1.0) -> None:
        self.limit, self.wait_s = limit, wait_s
        self.retry_after_s = max(1, math.ceil(retry_after_s))
        self.used = 0
        self.peak = 0
        self._lock = threading.Lock()

    def _take(self, n: int, own: int) -> bool:
        with self._lock:
            if self.used > own and self.used + n > self.limit:  # a request alone is taken, however large
                return False
            self.used += n
            self.peak = max(self.peak, self.used)
            return True

    def give(self, n: int) -> None:
        with self._lock:
            self.used -= n

    async def take(self, n: int, what: str, *, own: int = 0) -> None:
        """Take ``n`` bytes for ``what`` (a request's body, its rows; ``own``: what the request holds already),
        waiting for room up to ``wait_s``."""
        deadline = time.monotonic() + self.wait_s
        wait = self.POLL_S
        while not self._take(n, own):
            if time.monotonic() >= deadline:
                raise IngestBusyError(f"{what}: the service holds {size_text(self.used)} of ingest requests waiting "
                                      f"for their commit, its limit is {size_text(self.limit)} "
                                      "(TRAJSTORE_INGEST_PENDING_BYTES); nothing of this request was stored: send it "
                                      f"again after {self.retry_after_s} s", retry_after_s=self.retry_after_s)
            await asyncio.sleep(wait)
            wait = min(wait * 2, 0.1)

    @contextlib.asynccontextmanager
    async def held(self) -> AsyncIterator[PendingBytes.Share]:
        """A request's share: bytes taken with ``share.take(n, what)``, all given back when the block ends."""
        share = PendingBytes.Share(self)
        try:
            yield share
        finally:
            self.give(share.bytes)

    class Share:
        """The bytes one request holds."""

        def __init__(self, pending: PendingBytes) -> None:
            self.pending, self.bytes = pending, 0

        async def take(self, n: int, what: str) -> None:
            await self.pending.take(n, what, own=self.bytes)
            self.bytes += n


def pending_bytes(settings: ServiceSettings) -> PendingBytes:
    """The ingest requests' byte budget of one service."""
    return PendingBytes(settings.ingest_pending_bytes, settings.ingest_wait_s,
                        retry_after_s=max(1.0, 4 * settings.commit_interval))
