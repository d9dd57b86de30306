"""Dependencies shared by the routes: settings, the store and the API key."""

from __future__ import annotations

import secrets
from typing import Annotated

from fastapi import Depends, HTTPException, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trajstore.settings import Settings
from trajstore.store import Store

_bearer = HTTPBearer(auto_error=False, description="the API key set with TRAJSTORE_API_KEY")


def get_settings(request: Request) -> Settings:
    return request.app.state.settings


def get_store(request: Request) -> Store:
    store = getattr(request.app.state, "store", None)
    if store is None:
        raise HTTPException(status_code=503, detail="the service has no store open")
    return store


def require_api_key(settings: Annotated[Settings, Depends(get_settings)],
                    credentials: Annotated[HTTPAuthorizationCredentials | None, Depends(_bearer)]) -> None:
    """Bearer-token check for writes; with no key configured, writes are disabled."""
    challenge = {"WWW-Authenticate": "Bearer"}
    if not settings.api_key:
        raise HTTPException(status_code=403, detail="ingest is disabled: the server has no TRAJSTORE_API_KEY set")
    if credentials is None:
        raise HTTPException(status_code=401, detail="missing API key: send 'Authorization: Bearer <key>'",
                            headers=challenge)
    if not secrets.compare_digest(credentials.credentials.encode(), settings.api_key.encode()):
        raise HTTPException(status_code=401, detail="wrong API key", headers=challenge)


SettingsDep = Annotated[Settings, Depends(get_settings)]
StoreDep = Annotated[Store, Depends(get_store)]
