"""Episode statistics and discounted returns."""

from __future__ import annotations

from typing import Annotated, Any, Literal

from fastapi import APIRouter, Query, Request

from trajstore.api.arrow import ARROW_CONTENT, table_response
from trajstore.api.deps import ReadStoreDep
from trajstore.api.params import ByDep, FilterDep

router = APIRouter(tags=["stats"])
MAX_RETURN_ROWS = 100_000


@router.get("/stats", summary="n_traj, return_{min,mean,std,max}, len_* (and discounted_return_* with gamma)",
            responses={200: {"content": ARROW_CONTENT}})
def stats(request: Request, store: ReadStoreDep, flt: FilterDep,
          by: ByDep,
          gamma: Annotated[float | None, Query(ge=0, le=1)] = None,
          include_incomplete: Annotated[bool, Query(description="also count unfinished episodes")] = False,
          ) -> list[dict[str, Any]] | Any:
    table = store.stats(by=by, gamma=gamma, filter=flt, include_incomplete=include_incomplete)
    return table_response(request, table)


@router.get("/returns", summary="Discounted return per episode, or return-to-go per step",
            responses={200: {"content": ARROW_CONTENT}})
def returns(request: Request, store: ReadStoreDep, flt: FilterDep,
            gamma: Annotated[float, Query(ge=0, le=1)],
            per: Annotated[Literal["episode", "step"], Query()] = "episode",
            limit: Annotated[int, Query(ge=1, le=MAX_RETURN_ROWS)] = 10_000,
            ) -> list[dict[str, Any]] | Any:
    table = store.returns(gamma=gamma, per=per, filter=flt, limit=limit)
    return table_response(request, table)
