"""Server-Sent Events: each new commit of the store, as it lands (``GET /events``).

The stream starts at the version current when it opens; ``?version=`` is refused (422, see
``api.params.version_refused``): a version never changes, and a follower that wants the commits after version N
reads ``GET /commits/{version}`` for N+1, N+2, … up to the version of the ``hello`` event, as ``Client.follow``
does."""

from __future__ import annotations

import asyncio
import json
from typing import AsyncIterator

from fastapi import APIRouter, Request
from fastapi.responses import StreamingResponse
from starlette.concurrency import run_in_threadpool

from trajstore.api.events import CommitHub
from trajstore.errors import StoreAccessError

router = APIRouter(tags=["events"])
KEEPALIVE_S = 15.0  # a comment line this often, so proxies keep the connection and a gone client is noticed
RETRY_MS = 2000


def hub_of(request: Request) -> CommitHub:
    app = request.app
    if getattr(app.state, "events", None) is None:
        app.state.events = CommitHub(app.state.store)
    return app.state.events


def _event(name: str, data: dict, event_id: int | None = None) -> bytes:
    head = f"id: {event_id}\n" if event_id is not None else ""
    return f"{head}event: {name}\ndata: {json.dumps(data)}\n\n".encode()


async def _stream(request: Request, hub: CommitHub) -> AsyncIterator[bytes]:
    try:
        sub = await hub.subscribe()  # here, not in the route: a stream that never starts never subscribes
    except StoreAccessError:
        return  # the store stopped answering since the route read it: the client connects again
    try:
        try:
            version = await run_in_threadpool(lambda: hub.store.version)  # never on the event loop: it may wait
        except StoreAccessError:
            return
        yield f"retry: {RETRY_MS}\n".encode() + _event("hello", {"version": version}, version)
        while not await request.is_disconnected():
            try:
                item = await asyncio.wait_for(sub.queue.get(), KEEPALIVE_S)
            except asyncio.TimeoutError:
                yield b": keepalive\n\n"
                continue
            if item.version > version or item.lagged:
                yield _event("commit", item.as_dict(), item.version)
    finally:
        hub.unsubscribe(sub)


@router.get("/events", summary="Server-Sent Events: a 'hello' with the current version, then one 'commit' event "
                               "{version, runs, rows_added, files_added, files_removed, lagged} per new commit",
            responses={200: {"content": {"text/event-stream": {"schema": {
                "type": "object", "description": "one Server-Sent Event; data is JSON",
                "properties": {"event": {"type": "string", "enum": ["hello", "commit"]}, "data": {"type": "string"},
                               "id": {"type": "string"}, "retry": {"type": "integer"}}}}}}})
async def events(request: Request) -> StreamingResponse:
    hub = hub_of(request)
    await run_in_threadpool(lambda: hub.store.version)  # a store that fails: a 503 now, not a stream that ends
    return StreamingResponse(_stream(request, hub), media_type="text/event-stream",
                             headers={"Cache-Control": "no-cache", "X-Accel-Buffering": "no"})
