"""Dependencies shared by the routes: the service's settings, the store (the latest version, or one ``?version=``
names), the places of sandboxed queries and loader streams, and the API key."""

from __future__ import annotations

import secrets
import threading
from collections import OrderedDict
from typing import Annotated

from fastapi import Depends, HTTPException, Query, Request
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer

from trajstore.api.settings import ServiceSettings
from trajstore.query.sandbox import Gate
from trajstore.store import Store

_bearer = HTTPBearer(auto_error=False, description="the API key set with TRAJSTORE_API_KEY")


async def get_settings(request: Request) -> ServiceSettings:
    return request.app.state.settings


async def get_sql_gate(request: Request) -> Gate:
    """The ``sql_max_concurrent`` places of sandboxed queries and loader streams, shared by every version read."""
    return request.app.state.sql_gate


async def get_store(request: Request) -> Store:
    store = getattr(request.app.state, "store", None)
    if store is None:
        raise HTTPException(status_code=503, detail="the service has no store open")
    return store


PINNED_CACHE = 8  # stores kept open at old versions (each caches its file list and schema)
MAX_VERSION = 2**62  # larger numbers are no version a log reaches: refused as junk (422), like "abc" or -1
_pinned_lock = threading.Lock()

VersionQuery = Annotated[int | None, Query(alias="version", ge=0, le=MAX_VERSION, description=(
    "read the store as it was at this version (see GET /history), as trajstore.open(uri, version=N) does; "
    "default: the latest. 404 for a version the log does not have or whose files a vacuum removed"))]


def get_read_store(store: Annotated[Store, Depends(get_store)], request: Request,
                   at_version: VersionQuery = None) -> Store:  # not `version`: /commits/{version} has that name
    """The store for a read: the latest version, or with ``?version=N`` a read-only store pinned to N (kept
    for the next requests of that version; once a vacuum removes that version's files, its reads answer 404
    :class:`~trajstore.errors.VersionNotFoundError`, as they would from a new store of that version)."""
    version = at_version
    if version is None:
        return store
    with _pinned_lock:
        cache = request.app.state.__dict__.setdefault("pinned", OrderedDict())
        if version in cache:
            cache.move_to_end(version)
            return cache[version]
    pinned = store.at(version=version)
    with _pinned_lock:
        cache[version] = pinned
        while len(cache) > PINNED_CACHE:
            cache.popitem(last=False)
    return pinned


async def require_api_key(settings: Annotated[ServiceSettings, Depends(get_settings)],
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


SettingsDep = Annotated[ServiceSettings, Depends(get_settings)]
SqlGateDep = Annotated[Gate, Depends(get_sql_gate)]
StoreDep = Annotated[Store, Depends(get_store)]
ReadStoreDep = Annotated[Store, Depends(get_read_store)]
