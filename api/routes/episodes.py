"""Episodes: a filtered, sorted, paginated list, and the steps of one episode."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field, WithJsonSchema

from trajstore.api import pages
from trajstore.api.arrow import ARROW_CONTENT, arrow_response, json_rows, wants_arrow
from trajstore.api.cursor import CursorQuery, decode, encode
from trajstore.api.deps import ReadStoreDep, SettingsDep
from trajstore.api.ints import INT64, ROW_SCHEMA, EpisodeIdText, Int64
from trajstore.api.params import EPISODE_COLUMNS, NAME, ColumnsDep, FilterDep, WhereDep
from trajstore.query.filters import EpisodeFilter
from trajstore.store import plumbing

router = APIRouter(tags=["episodes"])
_KEY = NAME.strip("^$").join(["-?", ""])
ORDER = f"^{_KEY}(,{_KEY})*$"  # columns, each - prefixed for descending, comma-separated


Rows = Annotated[list[dict[str, Any]], WithJsonSchema({"type": "array", "items": ROW_SCHEMA})]


class EpisodePage(BaseModel):
    items: Rows = Field(description="one object per episode (episode_id a decimal string)")
    total: int
    limit: int
    offset: int
    next_cursor: str | None = Field(None, description="pass as cursor= for the next page (episode_id order only)")


class StepRows(BaseModel):
    episode_id: EpisodeIdText
    steps: Rows = Field(description="one object per step, in order")


# Arrow pages carry in headers what the JSON page carries in its body: the total, the next cursor, and the
# version they read (to pin the next pages to: Client.episodes walks every page of one version).
TOTAL_HEADER, CURSOR_HEADER, VERSION_HEADER = "X-Total-Count", "X-Next-Cursor", "X-Trajstore-Version"


@router.get("/episodes", summary="Episodes, filtered, sorted and paginated", response_model=EpisodePage,
            responses={200: {"content": ARROW_CONTENT, "headers": {
                TOTAL_HEADER: {"description": "Arrow pages: the episodes the filter selects in all",
                               "schema": {"type": "integer"}},
                CURSOR_HEADER: {"description": "Arrow pages: the next page's cursor, as next_cursor",
                                "schema": {"type": "string"}},
                VERSION_HEADER: {"description": "the store version the page was read at (pass as version= to "
                                                "read the next pages at that version)",
                                 "schema": {"type": "integer"}}}}})
def episodes(request: Request, store: ReadStoreDep, settings: SettingsDep, flt: FilterDep, where: WhereDep,
             order_by: Annotated[str, Query(pattern=ORDER, description=(
                 f"a column of episodes ({EPISODE_COLUMNS}, discounted_return with gamma); prefix - for "
                 "descending; several comma-separated (-complete,-ended_at: complete episodes first, then the "
                 "latest to end; ties by episode_id)"))] = "episode_id",
             limit: Annotated[int, Query(ge=1, description="page size, capped at the server's max_page_size (the "
                                                          "response says which limit applied)")] = 100,
             offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
             gamma: Annotated[float | None, Query(ge=0, le=1, description="adds discounted_return")] = None,
             cursor: CursorQuery = None,
             ) -> Any:
    limit = min(limit, settings.max_page_size)
    version = store.version  # before the read: the rows are of this version or, rarely, a newer one
    after = decode(cursor, 1)[0] if cursor else None
    page, total = plumbing(store).episode_page(filter=flt, where=where, gamma=gamma, order_by=order_by,
                                               limit=limit, offset=0 if cursor else offset, after=after)
    following = None
    if page.num_rows == limit and order_by.lstrip("-") == "episode_id":
        following = encode([page["episode_id"][page.num_rows - 1].as_py()])
    headers = {TOTAL_HEADER: str(total), VERSION_HEADER: str(version),
               **({CURSOR_HEADER: following} if following else {})}
    if wants_arrow(request):
        return arrow_response(page, headers)
    body = EpisodePage(items=json_rows(page), total=total, limit=limit, offset=offset, next_cursor=following)
    return JSONResponse(jsonable_encoder(body), headers={VERSION_HEADER: str(version)})


@router.get("/episodes/{episode_id}/steps", summary="Every step of one episode, in order (413 past max_page_bytes)",
            response_model=StepRows,
            responses={200: {"content": ARROW_CONTENT}})
def episode_steps(request: Request, store: ReadStoreDep, settings: SettingsDep,
                  episode_id: Annotated[Int64, Path(**INT64)], columns: ColumnsDep,
                  agent_id: Annotated[list[str] | None, Query(description="a multi-agent episode's rows of these "
                                                              "agents only (repeat for several)")] = None,
                  limit: Annotated[int | None, Query(ge=0, le=2**62, description="the first steps only")] = None,
                  ) -> Any:
    found, _ = plumbing(store).episode_page(filter=EpisodeFilter(episode_id=[episode_id]), limit=1)
    env = [found["env_id"][0].as_py()] if found.num_rows else None  # its environment's own column types
    most = pages.page_rows(store, columns, settings.max_page_bytes, env)  # 413 past it: streams have no limit
    asked = most + 1 if limit is None else min(limit, most + 1)
    rows = store.episode_steps(episode_id, columns or None, limit=asked, agent_id=agent_id or None)
    if rows.num_rows > most:
        raise pages.too_large(episode_id, most, settings.max_page_bytes)
    if rows.num_rows == 0:
        raise HTTPException(status_code=404, detail=f"episode_id {episode_id}: no such episode in the store")
    if wants_arrow(request):
        return arrow_response(rows)
    return StepRows(episode_id=episode_id, steps=json_rows(rows))
