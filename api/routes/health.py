"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter, Request
from pydantic import BaseModel

from trajstore.api.deps import StoreDep
from trajstore.errors import StoreDamagedError

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    store: str
    version: int
    files: int


@router.get("/health", summary="Liveness: the process answers")
async def health() -> Health:  # on the event loop: no worker thread needed, however busy they are
    return Health(status="ok")


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
