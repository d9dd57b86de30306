"""The rows one commit added (``GET /commits/{version}``): what a follower reads after each ``/events`` commit.

With ``?version=V`` the commit is read as the store was at version V (``trajstore.open(uri, version=V)
.commit_rows(version)``): a commit after V is 404 (not committed as of V), and ``episodes=true`` finds the
episodes the commit completed among V's files. Without it, among the latest version's.
"""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, HTTPException, Path, Query, Response

from trajstore.api.arrow import ARROW_CONTENT, arrow_response
from trajstore.api.deps import ReadStoreDep
from trajstore.api.params import ColumnsDep
from trajstore.store import plumbing

router = APIRouter(tags=["steps"])


@router.get("/commits/{version}", summary="The steps (or the episodes completed) that the commit of one version "
                                          "added, as an Arrow IPC stream; empty when it added none of the selection",
            responses={200: {"content": ARROW_CONTENT}})
def commit_rows(store: ReadStoreDep, columns: ColumnsDep,
                version: Annotated[int, Path(ge=0, le=2**62, description="a store version")],
                run_id: Annotated[list[str], Query(description="runs to include (all by default)")] = [],  # noqa: B006
                env_id: Annotated[list[str], Query(description="envs to include (all by default)")] = [],  # noqa: B006
                episodes: Annotated[bool, Query(description="the episodes the commit completed instead of its "
                                                            "steps")] = False) -> Response:
    found = plumbing(store).commit_rows(version, columns or None, run_id=run_id or None, env_id=env_id or None,
                              episodes=episodes)
    if found is None:
        when = f"as of version {store.version}, which ?version= reads" if store.read_only else \
            f"yet (the store is at version {store.version})"
        raise HTTPException(status_code=404, detail=f"version {version}: not committed {when}")
    return arrow_response(found.rows)
