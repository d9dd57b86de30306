"""The rows one commit added (``GET /commits/{version}``): what a follower reads after each ``/events`` commit."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Response

from trajstore.api.arrow import ARROW_CONTENT, arrow_response
from trajstore.api.deps import StoreDep
from trajstore.api.params import ColumnsDep

router = APIRouter(tags=["steps"])


@router.get("/commits/{version}", summary="The steps (or the episodes completed) that the commit of one version "
                                          "added, as an Arrow IPC stream; empty when it added none of the selection",
            responses={200: {"content": ARROW_CONTENT}})
def commit_rows(store: StoreDep, columns: ColumnsDep,
                version: Annotated[int, Path(ge=0, le=2**62, description="a store version")],
                run_id: Annotated[list[str], Query(description="runs to include (all by default)")] = [],  # noqa: B006
                env_id: Annotated[list[str], Query(description="envs to include (all by default)")] = [],  # noqa: B006
                episodes: Annotated[bool, Query(description="the episodes the commit completed instead of its "
                                                            "steps")] = False) -> Response:
    found = store.commit_rows(version, columns or None, run_id=run_id or None, env_id=env_id or None,
                              episodes=episodes)
    if found is None:
        raise HTTPException(status_code=404, detail=f"version {version}: not committed yet (the store is at "
                                                    f"version {store.version})")
    return arrow_response(found.rows)
