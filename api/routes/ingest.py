"""Ingest from remote rollout workers: Arrow IPC rows, authenticated, idempotent, size-limited: a body over
``max_body_bytes`` is refused unread by :mod:`trajstore.api.body_limit`, and one that would decode past
``max_decoded_bytes`` (counted from its metadata by :mod:`trajstore.remote.decoded_size`) before it is decoded.

Each request is checked on its own, then committed with the others that arrive meanwhile, in one commit at most
every ``commit_interval`` (:mod:`trajstore.operations.group_commit`), and answered once that commit has landed. What
requests hold from arrival to answer is bounded (``ingest_pending_bytes``, :class:`~trajstore.api.budgets.PendingBytes`:
past it a request waits, then gets 429 with ``Retry-After``)."""

from __future__ import annotations

import asyncio
import functools
import os
from concurrent.futures import Future
from typing import Annotated, Any

import anyio
import anyio.to_thread
import pyarrow as pa
from fastapi import APIRouter, Depends, Header, HTTPException, Path, Query, Request, Response
from pydantic import BaseModel, Field

from trajstore.api.budgets import PendingBytes
from trajstore.api.deps import SettingsDep, require_api_key
from trajstore.api.problems import problem_response
from trajstore.errors import BodyTooLargeError, InputError, size_text
from trajstore.operations.group_commit import GroupCommitter, Outcome
from trajstore.operations.ingest import SEQUENCE_LIMIT
from trajstore.remote.decoded_size import decoded_size
from trajstore.remote.wire import ARROW_STREAM, read_table
from trajstore.settings import PREFIX
from trajstore.storage.names import check_id

router = APIRouter(tags=["ingest"])


class IngestAccess(BaseModel):
    accepted: bool
    max_body_bytes: int
    max_decoded_bytes: int = Field(description="the most a body may decode to (trajstore.remote.decoded_size "
                                               "counts it from the body's metadata); 413 beyond")
    encodings: list[int] = Field([1, 2], description="the row encodings the service takes (2: next_obs and frame "
                                                     "stacks stored once, see docs/architecture.md)")
    idempotency_sequence: bool = Field(True, description="whether the service takes Idempotency-Sequence (a "
                                                          "writer's requests numbered under one key)")


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
                        409: problem_response(409, "the Idempotency-Key (with Idempotency-Sequence: the writer's "
                                                   "number) was already used for another request"),
                        429: problem_response(429, "the service holds TRAJSTORE_INGEST_PENDING_BYTES of requests "
                                                   "waiting for their commit: send it again after Retry-After"),
                        413: problem_response(413, "a body over TRAJSTORE_MAX_BODY_BYTES (default 256 MiB), refused "
                                                   "before it is read, or one that would decode past "
                                                   "TRAJSTORE_MAX_DECODED_BYTES (default 512 MiB), refused before "
                                                   "it is decoded (GET /ingest says both)"),
                        422: problem_response(422, "rows that do not fit the schema, or do not continue their "
                                                   "episodes (the detail names the episode and the step), or a "
                                                   "column name or run id no writer takes (the detail names it)")})
async def ingest(request: Request, response: Response, settings: SettingsDep,
                 run_id: Annotated[str, Path(description="checked by trajstore.storage.names.check_id, as every "
                                                         "writer's: 422 naming what it may not hold")],
                 env_id: Annotated[str, Query(description="checked as run_id is")],
                 idempotency_key: Annotated[str | None, Header(max_length=200, description=(
                     "makes a retry harmless: alone, it names this request (a retry repeats it); with "
                     "Idempotency-Sequence, it names the writer"))] = None,
                 idempotency_sequence: Annotated[int | None, Header(ge=0, lt=SEQUENCE_LIMIT, description=(
                     "this request's number among its writer's (the Idempotency-Key), rising in the order the "
                     "writer sends them: the store keeps one key per writer, and a number at or below the "
                     "writer's last stored one is answered as a duplicate"))] = None) -> Ingested:
    check_id(run_id, field="run_id")  # before the body is read: the one rule of every path that writes a run
    check_id(env_id, field="env_id")
    if idempotency_sequence is not None and idempotency_key is None:
        raise InputError("Idempotency-Sequence: numbers a writer's requests, so it needs the Idempotency-Key that "
                         "names the writer")
    content_type = request.headers.get("content-type", "")
    if not content_type.startswith(ARROW_STREAM):
        raise HTTPException(status_code=415, detail=f"content-type: expected {ARROW_STREAM}, got {content_type!r}")
    committer, pending = committer_of(request)
    async with pending.held() as share:
        length = request.headers.get("content-length")
        await share.take(int(length) if length and length.isdigit() else settings.max_body_bytes, "body")
        body = await request.body()  # at most max_body_bytes (api/body_limit.py)
        threads = ingest_threads(request)
        size = await anyio.to_thread.run_sync(checked_size, body, settings.max_decoded_bytes, request.url.path,
                                              limiter=threads)
        await share.take(size, "rows")
        n_rows, future = await anyio.to_thread.run_sync(
            functools.partial(handed, committer, body, run_id=run_id, env_id=env_id, idempotency_key=idempotency_key,
                              idempotency_sequence=idempotency_sequence), limiter=threads)
        del body
        outcome = await asyncio.wrap_future(future)  # answered once its group's commit landed
    if outcome.duplicate:
        response.status_code = 200  # already stored under this key: nothing new was created
    return Ingested(run_id=run_id, env_id=env_id, rows=n_rows, duplicate=outcome.duplicate)


@router.get("/ingest", dependencies=[Depends(require_api_key)],
            summary="Whether this API key may append rows (what a remote worker asks before it rolls out)")
def ingest_access(settings: SettingsDep) -> IngestAccess:
    """200 when the key is accepted; 401 for a missing or wrong key, 403 when the server takes no writes."""
    return IngestAccess(accepted=True, max_body_bytes=settings.max_body_bytes,
                        max_decoded_bytes=settings.max_decoded_bytes)


def ingest_threads(request: Request) -> anyio.CapacityLimiter:
    """The threads ingest requests are read and checked on, apart from the pool of the other routes: a burst of
    ingest requests never holds the threads a ``/stats`` or ``/health`` needs. ``ingest_threads`` of them (below 1:
    one per core): their work is mostly Python, one thread at a time under the GIL, and each thread more only adds
    waits for it (256 actors on 2 cores: 19,648 stored steps/s with 2 threads, 15,457 with the pool's 40)."""
    state = request.app.state
    limiter = getattr(state, "ingest_threads", None)
    if limiter is None:  # made on the event loop, at the first request
        wanted = state.settings.ingest_threads
        limiter = state.ingest_threads = anyio.CapacityLimiter(wanted if wanted >= 1 else os.cpu_count() or 2)
    return limiter


def committer_of(request: Request) -> tuple[GroupCommitter, PendingBytes]:
    """The service's committer of its store's ingest requests and their byte budget."""
    state = request.app.state
    return state.committer, state.ingest_bytes


def checked_size(body: bytes, limit: int, path: str) -> int:
    """What ``body`` decodes to, in bytes (from its metadata, nothing decoded); :class:`BodyTooLargeError` (413) past
    ``limit``, :class:`InputError` (422) when it is no Arrow IPC stream."""
    size = decoded_size(body, limit=limit)
    if size.bytes > limit:
        raise BodyTooLargeError(f"body: decodes to {size.describe()}, over the limit of {limit} bytes "
                                f"({size_text(limit)}) of POST {path} ({PREFIX}MAX_DECODED_BYTES); nothing of it "
                                "was decoded or stored. Send fewer rows per request (a RemoteWriter keeps each "
                                "request under the limits GET /ingest says) or raise the limit")
    return size.bytes


def handed(committer: GroupCommitter, body: bytes, **request: Any) -> tuple[int, Future[Outcome]]:
    """The rows of ``body`` (:func:`read_rows`) handed to ``committer`` (its ``ingest``, with the ``request``'s
    run, environment and keys): their number, and the future its group's commit answers. Decoded and checked on one
    worker thread, not two in turn: each trip through the thread pool costs the event loop a wake-up."""
    rows = read_rows(body)
    return rows.num_rows, committer.ingest(rows, **request)


def read_rows(body: bytes) -> pa.Table:
    """The rows of a ``body`` whose size was checked (:func:`checked_size`)."""
    return read_table(body).combine_chunks()  # the batches let go as they are joined: checked in one piece
