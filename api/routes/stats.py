"""Episode statistics and discounted returns."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from api.arrow import ARROW_CONTENT, arrow_response, json_rows
from api.deps import StoreDep, wants_arrow
from api.filters import EpisodeColumn, FilterDep

router = APIRouter(tags=["stats"])
MAX_RETURN_ROWS = 100_000


@router.get("/stats", summary="n_traj, return_{min,mean,std,max}, len_* (and discounted_return_* with gamma)",
            responses={200: {"content": ARROW_CONTENT}})
def stats(request: Request, store: StoreDep, flt: FilterDep,
          by: Annotated[list[EpisodeColumn], Query(description="group by these episode columns")] = [],  # noqa: B006
          gamma: Annotated[float | None, Query(ge=0, le=1)] = None,
          include_incomplete: Annotated[bool, Query(description="also count unfinished episodes")] = False,
          ) -> list[dict[str, Any]] | Any:
    table = store.stats(by=[b.value for b in by], gamma=gamma, where=flt.where(), include_incomplete=include_incomplete)
    return arrow_response(table) if wants_arrow(request) else json_rows(table)


@router.get("/returns", summary="Discounted return per episode, or return-to-go per step",
            responses={200: {"content": ARROW_CONTENT}})
def returns(request: Request, store: StoreDep, flt: FilterDep,
            gamma: Annotated[float, Query(ge=0, le=1)],
            per: Annotated[Literal["episode", "step"], Query()] = "episode",
            limit: Annotated[int, Query(ge=1, le=MAX_RETURN_ROWS)] = 10_000,
            ) -> list[dict[str, Any]] | Any:
    where = flt.where()
    if per == "step" and where:
        where = f"episode_id IN (SELECT episode_id FROM episodes WHERE {where})"
    table = store.returns(gamma=gamma, per=per, where=where, limit=limit)
    return arrow_response(table) if wants_arrow(request) else json_rows(table)
