"""Liveness and readiness."""

from __future__ import annotations

from fastapi import APIRouter
from pydantic import BaseModel

from trajstore.api.deps import StoreDep

router = APIRouter(tags=["health"])


class Health(BaseModel):
    status: str


class Ready(BaseModel):
    status: str
    store: str
    version: int
    files: int


@router.get("/health", summary="Liveness: the process answers")
def health() -> Health:
    return Health(status="ok")


@router.get("/ready", summary="Readiness: the store opens and its commit log can be read")
def ready(store: StoreDep) -> Ready:
    return Ready(status="ready", store=str(store.root), version=store.version, files=len(store.files()))
