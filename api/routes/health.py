"""Liveness and readiness."""

from __future__ import annotations

import asyncio

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field

from trajstore.api.deps import StoreDep
from trajstore.errors import StoreDamagedError

router = APIRouter(tags=["health"])


LOG_TIMEOUT_S = 0.5  # /health answers without the log's figures rather than wait longer for them (a stalled store)


class Health(BaseModel):
    status: str
    version: int | None = Field(None, description="the log's latest version (null: no store open, or the log did "
                                                    "not answer within 0.5 s)")
    versions_since_checkpoint: int | None = Field(
        None, description="how many versions the log is past its last checkpoint (a reader replays them; writers "
                          "checkpoint every TRAJSTORE_CHECKPOINT_INTERVAL versions)")


class Ready(BaseModel):
    status: str
    store: str
    version: int
    files: int


@router.get("/health", summary="Liveness: the process answers; with how far the log is past its last checkpoint")
async def health(request: Request) -> Health:  # on the event loop: no worker thread needed, however busy they are
    store = getattr(request.app.state, "store", None)
    if store is None:
        return Health(status="ok")
    try:  # the log's figures on the loop's own executor, not the request threads; never longer than 0.5 s
        version, behind = await asyncio.wait_for(asyncio.to_thread(store.log_lag), LOG_TIMEOUT_S)
    except Exception:  # noqa: BLE001 - liveness answers whatever the log does (/ready reports it)
        return Health(status="ok")
    return Health(status="ok", version=version, versions_since_checkpoint=behind)


@router.get("/ready", summary="Readiness: the commit log can be read and every committed file is there, with the "
                              "size the log says (503 naming the first damaged file otherwise)")
def ready(request: Request, store: StoreDep) -> Ready:
    problems = store.health()
    files = store.files() if not problems else []
    damaged: StoreDamagedError | None = getattr(request.app.state, "damaged", None)
    if damaged is not None and any(f.uri == damaged.path for f in files):
        problems.append(str(damaged))  # a read found it unreadable, and it is still committed
    if problems:
        more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
        raise StoreDamagedError(f"{problems[0]}{more}; run `trajstore check --store {store.root}` to list every "
                                "damaged file")
    request.app.state.damaged = None
    return Ready(status="ready", store=str(store.root), version=store.version, files=len(files))
