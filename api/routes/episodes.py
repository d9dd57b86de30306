"""Episodes: a filtered, sorted, paginated list, and the steps of one episode."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, HTTPException, Path, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field

from trajstore.api import pages
from trajstore.api.arrow import ARROW_CONTENT, arrow_response, json_rows, wants_arrow
from trajstore.api.cursor import CursorQuery, decode, encode
from trajstore.api.deps import ReadStoreDep, SettingsDep
from trajstore.api.params import EPISODE_COLUMNS, INT64, NAME, ColumnsDep, FilterDep, run_hint, unknown_runs
from trajstore.query.filters import EpisodeFilter

router = APIRouter(tags=["episodes"])


class EpisodePage(BaseModel):
    items: list[dict[str, Any]]
    total: int
    limit: int
    offset: int
    next_cursor: str | None = Field(None, description="pass as cursor= for the next page (episode_id order only)")


class StepRows(BaseModel):
    episode_id: int
    steps: list[dict[str, Any]]


@router.get("/episodes", summary="Episodes, filtered, sorted and paginated",
            responses={200: {"content": ARROW_CONTENT}})
def episodes(request: Request, store: ReadStoreDep, settings: SettingsDep, flt: FilterDep,
             order_by: Annotated[str, Query(pattern=NAME.replace("^", "^-?"), description=(
                 f"a column of episodes ({EPISODE_COLUMNS}, discounted_return with gamma); prefix - for "
                 "descending"))] = "episode_id",
             limit: Annotated[int, Query(ge=1, description="page size, capped at the server's max_page_size (the "
                                                          "response says which limit applied)")] = 100,
             offset: Annotated[int, Query(ge=0, le=2**62)] = 0,
             gamma: Annotated[float | None, Query(ge=0, le=1, description="adds discounted_return")] = None,
             cursor: CursorQuery = None,
             ) -> Any:
    limit = min(limit, settings.max_page_size)
    hint = run_hint(store, unknown_runs(store, flt))
    if wants_arrow(request):
        return arrow_response(store.episodes(filter=flt, gamma=gamma, order_by=order_by, limit=limit,
                                             offset=offset), hint)
    after = decode(cursor, 1)[0] if cursor else None
    page, total = store.episode_page(filter=flt, gamma=gamma, order_by=order_by, limit=limit,
                                     offset=0 if cursor else offset, after=after)
    following = None
    if page.num_rows == limit and order_by.lstrip("-") == "episode_id":
        following = encode([page["episode_id"][page.num_rows - 1].as_py()])
    body = EpisodePage(items=json_rows(page), total=total, limit=limit, offset=offset, next_cursor=following)
    return JSONResponse(jsonable_encoder(body), headers=hint) if hint else body


@router.get("/episodes/{episode_id}/steps", summary="Every step of one episode, in order (413 past max_page_bytes)",
            responses={200: {"content": ARROW_CONTENT}})
def episode_steps(request: Request, store: ReadStoreDep, settings: SettingsDep,
                  episode_id: Annotated[int, Path(**INT64)], columns: ColumnsDep) -> Any:
    most = pages.page_rows(store, columns, settings.max_page_bytes)  # 413 past it: the stream has no limit
    rows = store.steps_page(["step", *columns] if columns else [], filter=EpisodeFilter(episode_id=[episode_id]),
                            limit=most + 1)
    if rows.num_rows > most:
        raise pages.too_large(episode_id, most, settings.max_page_bytes)
    if rows.num_rows == 0:
        raise HTTPException(status_code=404, detail=f"episode_id {episode_id}: no such episode in the store")
    if wants_arrow(request):
        return arrow_response(rows)
    return StepRows(episode_id=episode_id, steps=json_rows(rows))
