"""The trajstore service: a FastAPI application over one store.

>>> from trajstore.api.app import create_app
>>> from trajstore.api.settings import ServiceSettings
>>> app = create_app(ServiceSettings(store="./trajdata"))  # doctest: +SKIP

Run it with ``trajstore serve --store PATH`` (uvicorn). The service's settings come from ``TRAJSTORE_*``
environment variables unless given, and so do the options of the store it opens (:class:`trajstore.Settings`).
"""

from __future__ import annotations

import contextlib
import logging
from typing import TYPE_CHECKING, Any, AsyncIterator

from fastapi import Depends, FastAPI

import trajstore
from trajstore.__about__ import __version__
from trajstore.api import body_limit, budgets, params, problems
from trajstore.api.dashboard import router as dashboard_router
from trajstore.api.dashboard.routes import warm as warm_dashboard
from trajstore.api.replays import Replays
from trajstore.api.routes import (
    commits,
    episodes,
    events,
    frames,
    health,
    history,
    ingest,
    replays,
    runs,
    sequences,
    sql,
    stats,
    steps,
)
from trajstore.api.settings import ServiceSettings
from trajstore.query import sql_worker
from trajstore.query.sandbox import Gate
from trajstore.store import Store, plumbing

if TYPE_CHECKING:
    import uvicorn

log = logging.getLogger(__name__)


def create_app(settings: ServiceSettings | None = None, *, store: Store | None = None,
               create: bool = False) -> FastAPI:
    """The application over ``store``, or over the store at ``settings.store`` (made there if absent only with
    ``create``: a mistyped path is an error, not a new empty store; its options from the environment)."""
    settings = settings or ServiceSettings.from_env()
    app = FastAPI(title="trajstore", version=__version__,
                  description="Episode statistics, returns, SQL and Arrow streams over stored RL trajectories.\n\n"
                              "Integers in JSON: `episode_id` is always a decimal string, and so is any other "
                              "integer beyond ±(2**53 - 1) (what a double holds exactly); every other integer is a "
                              "number. Paths and query parameters take 64-bit integers as decimal strings or "
                              "numbers. Arrow answers keep int64.",
                  responses=problems.ERROR_RESPONSES,
                  dependencies=[Depends(params.single_valued), Depends(params.version_refused),
                                Depends(budgets.request_budget)],
                  lifespan=_serving)
    app.state.settings = settings
    app.state.compute_gate = budgets.gate(settings)
    # sandboxed queries and loader streams at once, of every version the service reads
    app.state.sql_gate = Gate(settings.sql_max_concurrent)
    app.state.replays = Replays(settings)  # the replays remote learners opened (POST /replays)
    app.state.store = store or trajstore.open(settings.store, create=create)
    # ingest requests committed in groups, at most one commit per commit_interval; their bytes bounded
    app.state.committer = plumbing(app.state.store).group_committer(interval_s=settings.commit_interval,
                                                                     group_bytes=settings.commit_group_bytes)
    app.state.ingest_bytes = budgets.pending_bytes(settings)
    # POST /sql and the comparisons' bootstraps pay no process start
    sql_worker.warm(plumbing(app.state.store).settings.sql_worker_bytes,
                    settings.sql_max_concurrent + settings.compute_max_concurrent)
    health.start(app.state)  # the first probe of /health finds the store checked
    problems.install(app)
    app.add_middleware(budgets.Places, gate=app.state.compute_gate)  # a place taken before anything is parsed
    app.add_middleware(body_limit.BodyLimit, settings=settings)  # outermost: a body is refused before anything runs
    for module in (health, runs, episodes, frames, stats, steps, sql, ingest, history, events, commits, sequences,
                   replays):
        app.include_router(module.router)
    app.include_router(dashboard_router)
    return app


@contextlib.asynccontextmanager
async def _serving(app: FastAPI) -> AsyncIterator[None]:
    """What runs once the server serves ``app``, not when it is only made (``trajstore serve`` on a busy port makes
    the app and exits: a reading thread then crashed the interpreter's shutdown, SIGSEGV): the dashboard's first
    page read ahead, so a first visit finds it ready."""
    if app.state.settings.dashboard_warm:
        warm_dashboard(app.state.store)
    try:
        yield
    finally:
        app.state.committer.close()  # what waits is committed and answered before the server stops
        app.state.replays.close_all()  # their updates committed


# A request's line and headers may hold long filters (``where`` up to 10,000 characters, ``normalize`` more),
# each non-ASCII character percent-encoded as up to 12 bytes: uvicorn's 16 KiB default answers such a request
# with a bare 400 in plain text, outside the app's problem documents.
REQUEST_HEAD_BYTES = 4 * 1024 * 1024


def server_config(app: FastAPI, **options: Any) -> uvicorn.Config:
    """The uvicorn configuration ``trajstore serve`` (and the tests' live servers) run ``app`` with."""
    import uvicorn

    return uvicorn.Config(app, log_level="warning", h11_max_incomplete_event_size=REQUEST_HEAD_BYTES, **options)
