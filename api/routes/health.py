"""Liveness and readiness.

``/health`` is 200 while the process answers, and its body says whether the store's latest version can be read
(``status`` ``degraded`` and ``problem`` saying why when it cannot: an unreadable log, a file the latest commit added
missing or of another size, a file a read found unreadable, a store that does not answer); it looks at the latest
commit's files only, so that a probe costs the same whatever the store's size. It never waits on the store for
long: the check runs on a thread of
its own, one at a time (however many probes come), and a probe waits at most :data:`LOG_TIMEOUT_S` for it, else
answers with the last check that ended and its age. A check that ended less than :data:`FRESH_S` ago answers the
next probes too (unless a read found damage since), and the service starts the first one as it starts.
``/ready`` checks every committed file, at once, and is 503 when it finds a problem.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import logging
import threading
import time
from dataclasses import dataclass
from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from trajstore.api.deps import StoreDep
from trajstore.errors import StoreAccessError, StoreDamagedError, first_line
from trajstore.store import Store, plumbing

log = logging.getLogger(__name__)
router = APIRouter(tags=["health"])


LOG_TIMEOUT_S = 0.5  # /health answers with the last check rather than wait longer for this one (a stalled store)
FRESH_S = 1.0  # a check that ended this recently answers the next probes without another


def _absent_if_none(value: Any) -> bool:
    return value is None


class Health(BaseModel):
    status: str = Field(description="ok: the process answers and the store's latest version can be read; degraded: "
                                    "it answers, but the latest version cannot be read (see problem; /ready is 503); "
                                    "checking: the first check of the store has not ended yet")
    version: int | None = Field(None, description="the log's latest version (null: no store open, the log cannot "
                                                    "be read, or it did not answer yet)")
    versions_since_checkpoint: int | None = Field(
        None, description="how many versions the log is past its last checkpoint (a reader replays them; writers "
                          "checkpoint every TRAJSTORE_CHECKPOINT_INTERVAL versions)")
    problem: str | None = Field(None, exclude_if=_absent_if_none,
                                description="why the latest version cannot be read (absent when it can)")
    checked_s_ago: float | None = Field(None, exclude_if=_absent_if_none,
                                        description="how long ago the check reported here ended, when the one "
                                                    "this probe started did not end within 0.5 s (absent "
                                                    "otherwise; a later probe reports it)")


class Ready(BaseModel):
    status: str
    store: str
    version: int
    files: int


def damage(store: Store, request_state: Any, *, newest: bool = False) -> str | None:
    """What keeps ``store``'s latest version from being read (None: nothing found): an unreadable log, committed
    files missing or of another size than the log says (``newest``: only those the latest commit added), or a
    committed file a read found unreadable (which the service keeps in ``request_state.damaged``). A store that
    does not answer raises its :class:`~trajstore.errors.StoreAccessError`."""
    problems = plumbing(store).problems(newest=newest)
    damaged: StoreDamagedError | None = getattr(request_state, "damaged", None)
    if damaged is not None and not problems and any(f.uri == damaged.path for f in store.maintain.files()):
        problems.append(str(damaged))  # a read found it unreadable, and it is still committed
    if not problems:
        return None
    more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
    return f"{problems[0]}{more}; run `trajstore check --store {store.root}` to list every damaged file"


@dataclass(frozen=True)
class Finding:
    """What one check of the store found, when it ended (:func:`time.monotonic`), and the damage reads had found
    when it began (``seen``: a later one makes it stale at once)."""

    ended: float
    seen: StoreDamagedError | None
    version: int | None = None
    behind: int | None = None
    problem: str | None = None


def check_latest(store: Store, request_state: Any) -> Finding:
    """The store's latest version and checkpoint lag, and what keeps that version from being read; never raises."""
    seen = getattr(request_state, "damaged", None)
    try:
        version, behind = plumbing(store).log_lag()
    except StoreAccessError as exc:
        return Finding(time.monotonic(), seen, problem=f"the latest version cannot be read: {exc}")
    except Exception as exc:  # noqa: BLE001 - an unreadable log is the finding
        return Finding(time.monotonic(), seen, problem=f"the latest version cannot be read: the commit log of "
                                                       f"{store.root} cannot be read: {first_line(exc)}; run "
                                                       f"`trajstore check --store {store.root}`")
    try:
        problem = damage(store, request_state, newest=True)
    except StoreAccessError as exc:
        problem = str(exc)
    except Exception as exc:
        log.warning("the store's health could not be checked", exc_info=True)
        problem = f"it could not be checked: {first_line(exc)}"
    if problem is not None:
        problem = f"version {version} cannot be read: {problem}"
    return Finding(time.monotonic(), seen, version, behind, problem)


class Checks:
    """One check of the store at a time, on a thread of its own, and the last one that ended. A service starts
    the first one as it starts (:func:`start`), so that its first probe rarely finds it still under way."""

    def __init__(self) -> None:
        self.last: Finding | None = None
        self._running: concurrent.futures.Future[Finding] | None = None
        self._lock = threading.Lock()

    def current(self, store: Store, request_state: Any) -> concurrent.futures.Future[Finding]:
        """The check under way, or a new one (the last one when it ended less than :data:`FRESH_S` ago and no read
        has found damage since it began)."""
        with self._lock:
            if self._running is not None and (not self._running.done() or self._fresh(request_state)):
                return self._running
            future: concurrent.futures.Future[Finding] = concurrent.futures.Future()
            future.set_running_or_notify_cancel()  # a probe that stops waiting cannot cancel it
            self._running = future

        def run() -> None:
            finding = check_latest(store, request_state)
            self.last = finding
            future.set_result(finding)

        # not a daemon: an exit waits for it rather than stop it inside deltalake (which crashes the process); said
        # outright, as a thread started from a daemon thread is a daemon unless told
        threading.Thread(target=run, name="trajstore-health", daemon=False).start()
        return future

    def _fresh(self, request_state: Any) -> bool:
        last = self.last
        return last is not None and time.monotonic() - last.ended < FRESH_S and \
            getattr(request_state, "damaged", None) is last.seen


def checks_of(state: Any) -> Checks:
    """The :class:`Checks` of an application (its ``state``)."""
    return state.__dict__.setdefault("health_checks", Checks())


def start(state: Any) -> None:
    """Start the first check of an application's store (``state.store``) in the background."""
    if getattr(state, "store", None) is not None:
        checks_of(state).current(state.store, state)


@router.get("/health", summary="Liveness: the process answers; whether the store's latest version can be read, and "
                               "how far the log is past its last checkpoint")
async def health(request: Request) -> Health:  # on the event loop: no worker thread needed, however busy they are
    state = request.app.state
    store = getattr(state, "store", None)
    if store is None:
        return Health(status="ok")
    checks = checks_of(state)
    running = checks.current(store, state)
    finding: Finding | None
    try:
        finding, age = await asyncio.wait_for(asyncio.wrap_future(running), LOG_TIMEOUT_S), None
    except TimeoutError:
        finding = checks.last
        if finding is None:
            return Health(status="checking")
        age = round(time.monotonic() - finding.ended, 3)
    return Health(status="ok" if finding.problem is None else "degraded", version=finding.version,
                  versions_since_checkpoint=finding.behind, problem=finding.problem, checked_s_ago=age)


@router.get("/ready", summary="Readiness: the commit log can be read and every committed file is there, with the "
                              "size the log says (503 naming the first damaged file otherwise)")
def ready(request: Request, store: StoreDep) -> Ready:
    problem = damage(store, request.app.state)
    if problem is not None:
        raise StoreDamagedError(problem)
    request.app.state.damaged = None
    return Ready(status="ready", store=str(store.root), version=store.version, files=len(store.maintain.files()))
