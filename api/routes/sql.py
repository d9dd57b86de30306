"""Ad hoc SQL: one read-only SELECT over the steps and episodes views, sandboxed and bounded.

Its body is bounded before it is read (``sql_max_body_bytes``, :mod:`~trajstore.api.body_limit`). Each
query takes one of the store's ``sql_max_concurrent`` slots on the event loop (429 with ``Retry-After``
at once when none is free; the loader streams share them), then runs in a worker process that cannot take
more than ``sql_worker_bytes`` of memory (:mod:`~trajstore.query.sql_worker`), and its rows are encoded (JSON
or Arrow IPC) on a thread here, all within its limits: rows, bytes (413), memory (413: DuckDB's
``sql_memory_limit`` or the worker's), and time (408, fetching and encoding included). A worker that dies
before it answers (killed or crashed) is a 503 saying so, with ``Retry-After``: a fresh worker takes the query
when it is sent again. The whole body is built before the answer starts, and the slot is given back once it is
sent, so the bodies waiting for slow clients are counted too.
"""

from __future__ import annotations

import weakref
from typing import Annotated, Any, Iterator

from fastapi import APIRouter, Request, Response
from pydantic import BaseModel, Field, WithJsonSchema
from starlette.concurrency import run_in_threadpool
from starlette.types import Receive, Scope, Send

from trajstore.api import json_body
from trajstore.api.arrow import ARROW_CONTENT, ARROW_STREAM, wants_arrow
from trajstore.api.deps import ReadStoreDep, SettingsDep, SqlGateDep
from trajstore.api.ints import ROWS_SCHEMA
from trajstore.api.problems import problem_response
from trajstore.query import sandbox
from trajstore.remote.wire import ipc_pieces
from trajstore.store import plumbing

router = APIRouter(tags=["sql"])


class SqlRequest(BaseModel):
    query: str = Field(min_length=1, max_length=100_000, description="one SELECT over steps and episodes",
                       examples=["SELECT run_id, count(*) AS episodes FROM episodes GROUP BY run_id"])
    max_rows: int | None = Field(None, ge=1, description="at most this many rows (capped by the server's limit)")
    run_id: list[str] | None = Field(None, description="the views hold only these runs' steps")
    env_id: list[str] | None = Field(None, description="the views hold only these environments' steps, every column "
                                                       "in its own type (over environments whose columns differ in "
                                                       "type, such a column is a VARIANT)")


class SqlResult(BaseModel):
    columns: list[str]
    rows: Annotated[list[dict[str, Any]], WithJsonSchema(ROWS_SCHEMA)] = Field(
        description="one object per row; an integer column's values are numbers, but episode_id's and those beyond "
                    "±(2**53 - 1) are decimal strings (Arrow keeps int64)")
    truncated: bool = Field(description="more rows existed than were returned")


class SlotResponse(Response):
    """A whole body that gives its query's slot back once it is sent (or could not be)."""

    def __init__(self, content: bytes, slot: sandbox.Slot, **kwargs: Any) -> None:
        super().__init__(content, **kwargs)
        self.slot = slot
        weakref.finalize(self, slot.release)  # never sent at all: given back when the response is dropped

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        try:
            await super().__call__(scope, receive, send)
        finally:
            self.slot.release()


def json_pieces(result: sandbox.Result) -> Iterator[bytes]:
    """The body of a :class:`SqlResult`, in pieces."""
    yield b'{"columns":' + json_body.dumps(result.table.column_names) + b',"rows":['
    yield from json_body.rows(result.table)
    yield b'],"truncated":' + (b"true" if result.truncated else b"false") + b"}"


def arrow_pieces(result: sandbox.Result) -> Iterator[bytes]:
    return ipc_pieces(result.table.to_reader())


@router.post("/sql", summary="Run one read-only SELECT over the steps and episodes views",
             description="The request body may have at most TRAJSTORE_SQL_MAX_BODY_BYTES (default 1 MiB, 1048576 "
                         "bytes: a query of 100,000 characters fits even with every character escaped); a larger "
                         "one is refused with 413 before it is read. The answer is bounded by the server's row, "
                         "byte, memory and time limits (413, 408), and at most TRAJSTORE_SQL_MAX_CONCURRENT queries "
                         "run at once (429).",
             response_model=SqlResult,
             responses={200: {"content": ARROW_CONTENT},
                        413: problem_response(413, "a body over TRAJSTORE_SQL_MAX_BODY_BYTES (refused unread), or an "
                                                   "answer or query past its byte or memory limits"),
                        503: problem_response(503, "the store cannot be read, or the worker process running the query "
                                                   "died before it answered (killed or crashed): send it again "
                                                   "after Retry-After")})
async def sql(body: SqlRequest, request: Request, store: ReadStoreDep, settings: SettingsDep,
              gate: SqlGateDep) -> Response:
    limits = sandbox.Limits(max_rows=min(body.max_rows or settings.sql_max_rows, settings.sql_max_rows),
                            max_bytes=settings.sql_max_bytes, timeout_s=settings.sql_timeout_s,
                            memory_limit=settings.sql_memory_limit,
                            worker_bytes=plumbing(store).settings.sql_worker_bytes)
    arrow = wants_arrow(request)
    slot = gate.take()  # QueryBusyError (429) when every slot is taken: nothing waits
    try:
        result = await run_in_threadpool(plumbing(store).sandboxed_sql, body.query, limits,
                                         encode=arrow_pieces if arrow else json_pieces, run_id=body.run_id,
                                         env_id=body.env_id)
    except BaseException:
        slot.release()
        raise
    headers = {"X-Trajstore-Truncated": str(result.truncated).lower()}
    return SlotResponse(result.body or b"", slot, headers=headers,
                        media_type=ARROW_STREAM if arrow else "application/json")
