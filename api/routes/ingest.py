"""Ingest from remote rollout workers: Arrow IPC rows, authenticated, idempotent, size-limited (a body over
``max_body_bytes`` is refused unread by :mod:`trajstore.api.body_limit`)."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from trajstore.api.deps import SettingsDep, StoreDep, require_api_key
from trajstore.api.problems import problem_response
from trajstore.remote.wire import ARROW_STREAM, read_table

router = APIRouter(tags=["ingest"])
NAME = r"^[^\s/](.*[^\s])?$"


class IngestAccess(BaseModel):
    accepted: bool
    max_body_bytes: int
    encodings: list[int] = Field([1, 2], description="the row encodings the service takes (2: next_obs and frame "
                                                     "stacks stored once, see docs/architecture.md)")


class Ingested(BaseModel):
    run_id: str
    env_id: str
    rows: int
    duplicate: bool


@router.post("/runs/{run_id}/batches", status_code=201, dependencies=[Depends(require_api_key)],
             summary="Append rows already cut into episodes (what a RemoteWriter sends)",
             openapi_extra={"requestBody": {"required": True,
                                            "content": {ARROW_STREAM: {"schema": {"type": "string",
                                                                                  "format": "binary"}}}}},
             responses={200: {"model": Ingested, "description": "already stored under this Idempotency-Key"},
                        409: problem_response(409, "the Idempotency-Key was already used for another request"),
                        413: problem_response(413, "a body over TRAJSTORE_MAX_BODY_BYTES (default 256 MiB; GET "
                                                   "/ingest says it), refused before it is read"),
                        422: problem_response(422, "rows that do not fit the schema, or do not continue their "
                                                   "episodes (the detail names the episode and the step)")})
async def ingest(request: Request, response: Response, store: StoreDep,
                 run_id: Annotated[str, Path(min_length=1, max_length=200, pattern=NAME)],
                 env_id: Annotated[str, Query(min_length=1, max_length=200, pattern=NAME)],
                 idempotency_key: Annotated[str | None, Header(max_length=200)] = None) -> Ingested:
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith(ARROW_STREAM):
        raise HTTPException(status_code=415, detail=f"content-type: expected {ARROW_STREAM}, got {content_type!r}")
    rows = read_table(await request.body())  # at most max_body_bytes (api/body_limit.py)
    _, duplicate = await run_in_threadpool(store.ingest, rows, run_id=run_id, env_id=env_id,
                                           idempotency_key=idempotency_key)
    if duplicate:
        response.status_code = 200  # already stored under this key: nothing new was created
    return Ingested(run_id=run_id, env_id=env_id, rows=rows.num_rows, duplicate=duplicate)


@router.get("/ingest", dependencies=[Depends(require_api_key)],
            summary="Whether this API key may append rows (what a remote worker asks before it rolls out)")
def ingest_access(settings: SettingsDep) -> IngestAccess:
    """200 when the key is accepted; 401 for a missing or wrong key, 403 when the server takes no writes."""
    return IngestAccess(accepted=True, max_body_bytes=settings.max_body_bytes)
