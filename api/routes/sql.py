"""Ad hoc SQL: one read-only SELECT over the steps and episodes views, sandboxed and bounded."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Request
from pydantic import BaseModel, Field
from starlette.concurrency import run_in_threadpool

from trajstore.api.arrow import ARROW_CONTENT, arrow_response, json_rows, wants_arrow
from trajstore.api.deps import SettingsDep, StoreDep
from trajstore.query import sandbox

router = APIRouter(tags=["sql"])


class SqlRequest(BaseModel):
    query: str = Field(min_length=1, max_length=100_000, description="one SELECT over steps and episodes",
                       examples=["SELECT run_id, count(*) AS episodes FROM episodes GROUP BY run_id"])
    max_rows: int | None = Field(None, ge=1, description="at most this many rows (capped by the server's limit)")


class SqlResult(BaseModel):
    columns: list[str]
    rows: list[dict[str, Any]]
    truncated: bool = Field(description="more rows existed than were returned")


@router.post("/sql", summary="Run one read-only SELECT over the steps and episodes views",
             responses={200: {"content": ARROW_CONTENT}})
async def sql(body: SqlRequest, request: Request, store: StoreDep, settings: SettingsDep) -> Any:
    limits = sandbox.Limits(max_rows=min(body.max_rows or settings.sql_max_rows, settings.sql_max_rows),
                            timeout_s=settings.sql_timeout_s, memory_limit=settings.sql_memory_limit)
    result = await run_in_threadpool(store.sandboxed_sql, body.query, limits)
    if wants_arrow(request):
        response = arrow_response(result.table)
        response.headers["X-Trajstore-Truncated"] = str(result.truncated).lower()
        return response
    return SqlResult(columns=result.table.column_names, rows=json_rows(result.table), truncated=result.truncated)
