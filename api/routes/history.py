"""The store's versions: every commit of its log (what ``?version=`` on the read routes takes); with
``?version=V`` the versions up to V, as ``trajstore.open(uri, version=V).history()`` lists them."""

from __future__ import annotations

from datetime import datetime
from typing import Annotated

from fastapi import APIRouter, Query
from pydantic import BaseModel

from trajstore.api.deps import ReadStoreDep

router = APIRouter(tags=["history"])


class Version(BaseModel):
    version: int
    timestamp: datetime
    operation: str
    rows_added: int
    rows_removed: int | None
    files_added: int
    files_removed: int
    run_ids: list[str]


@router.get("/history", summary="Every committed version (up to ?version=), oldest first: operation, rows added "
                                "and removed, runs")
def history(store: ReadStoreDep, limit: Annotated[int | None, Query(ge=0, le=1_000_000,
                                                                description="only the last N versions")] = None,
            ) -> list[Version]:
    return [Version(**row) for row in store.history(limit=limit).to_pylist()]
