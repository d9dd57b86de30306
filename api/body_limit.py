"""Request bodies bounded before they are read: each route's limit in bytes, refused with 413.

A body whose ``Content-Length`` is over its route's limit is refused before the route runs, without reading a
byte of it. A body of unknown length (chunked) is counted while the route reads it and refused as soon as what
was read passes the limit, so the service never holds more of a body than its limit (plus the one piece, at most
64 KiB, the server reads ahead). Either way the answer is a 413 problem document naming the limit in bytes and
the setting that sets it, and the connection is closed: the rest of the body is never read.

The routes that take a body have their own limits (:data:`ROUTES`); every other route takes none and is sent at
most :data:`OTHER_BYTES`, so a route added without an entry here is bounded too.

>>> from trajstore.api.settings import ServiceSettings
>>> limits = Limits(ServiceSettings(sql_max_body_bytes=1000))
>>> limits.of("/sql").bytes, limits.of("/runs/a/batches").setting, limits.of("/stats").bytes
(1000, 'max_body_bytes', 65536)
"""

from __future__ import annotations

import logging
import re
from dataclasses import dataclass

from starlette.datastructures import Headers
from starlette.exceptions import HTTPException
from starlette.requests import Request
from starlette.routing import compile_path
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trajstore.api.problems import problem
from trajstore.api.settings import ServiceSettings
from trajstore.errors import BodyTooLargeError, size_text
from trajstore.settings import PREFIX

log = logging.getLogger(__name__)

ROUTES = {  # every route that takes a body, and the setting that bounds it
    "/sql": "sql_max_body_bytes",
    "/runs/{run_id}/batches": "max_body_bytes",
    "/runs/{run_id}": "run_max_body_bytes",
    "/replays/{replay_id}/update": "replay_max_body_bytes",
}
METHODS = {"/runs/{run_id}": {"PATCH"}}  # routes whose other methods take no body
OTHER_BYTES = 64 * 1024  # the most any other route is sent (it reads none of it)


@dataclass(frozen=True)
class Limit:
    """The most bytes a route's body may have, and the setting that says so (None: a route that takes no body)."""

    bytes: int
    setting: str | None

    def refusal(self, scope: Scope, declared: int | None) -> BodyTooLargeError:
        """The error of a body over this limit: ``declared`` bytes by its ``Content-Length``, or (None) a body of
        unknown length that passed it while it was read."""
        named = f"{PREFIX}{self.setting.upper()}" if self.setting else "a route that takes no body"
        limit = f"the limit of {self.bytes} bytes ({size_text(self.bytes)}) of {scope['method']} {scope['path']} " \
                f"({named})"
        if declared is not None:
            return BodyTooLargeError(f"request body: its Content-Length of {declared} bytes is over {limit}; "
                                     "nothing of it was read")
        return BodyTooLargeError(f"request body: passed {limit} while it was read; nothing of it was used and "
                                 "the rest was not read")


class Limits:
    """Each route's :class:`Limit`, from ``settings``, found by the request's path."""

    def __init__(self, settings: ServiceSettings) -> None:
        self._routes = [(compile_path(path)[0], METHODS.get(path), Limit(int(getattr(settings, name)), name))
                        for path, name in ROUTES.items()]
        self._other = Limit(OTHER_BYTES, None)

    def of(self, path: str, method: str = "POST") -> Limit:
        return next((limit for pattern, methods, limit in self._routes
                     if pattern.match(path) and (methods is None or method in methods)), self._other)


class BodyLimit:
    """ASGI middleware: refuses a request body over its route's limit (see the module) with a 413 problem."""

    def __init__(self, app: ASGIApp, settings: ServiceSettings) -> None:
        self.app = app
        self.limits = Limits(settings)

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = self.limits.of(scope["path"], scope["method"])
        declared = _content_length(scope)
        if declared is not None and declared > limit.bytes:
            await _refuse(scope, receive, send, limit.refusal(scope, declared))
            return
        await _Bounded(self.app, limit)(scope, receive, send)


class _Bounded:
    """One request whose body is counted as the app reads it.

    Past the limit, the read raises an :class:`HTTPException` (FastAPI passes it on, where any other error would
    become a 400 "error parsing the body"); the app's own answer to it is dropped and the 413 problem is sent in
    its place. Past the limit once the answer has begun (a stream that reads the body only to see whether the
    client left), the app is told the client left."""

    def __init__(self, app: ASGIApp, limit: Limit) -> None:
        self.app = app
        self.limit = limit
        self.read = 0
        self.refused: BodyTooLargeError | None = None
        self.started = False

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        async def bounded() -> Message:
            if self.refused is not None:
                return {"type": "http.disconnect"}
            message = await receive()
            if message["type"] == "http.request":
                self.read += len(message.get("body", b""))
                if self.read > self.limit.bytes:
                    self.refused = self.limit.refusal(scope, None)
                    if self.started:
                        return {"type": "http.disconnect"}
                    raise HTTPException(413, str(self.refused))
            return message

        async def answer(message: Message) -> None:
            if self.refused is not None and not self.started:
                return  # the app's answer to a body it could not read: the refusal goes instead
            self.started = self.started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, bounded, answer)
        except Exception:
            if self.refused is None or self.started:
                raise
            log.debug("error after a refused body", exc_info=True)
        if self.refused is not None and not self.started:
            await _refuse(scope, receive, send, self.refused)


def _content_length(scope: Scope) -> int | None:
    """The request's ``Content-Length`` (None without one; the server refused a malformed one already)."""
    value = Headers(scope=scope).get("content-length")
    return int(value) if value is not None and re.fullmatch(r"\s*\d+\s*", value) else None


async def _refuse(scope: Scope, receive: Receive, send: Send, error: BodyTooLargeError) -> None:
    """Answer ``error`` as a 413 problem and close the connection (what the client still sends is not read)."""
    log.info("%s", error)
    response = problem(413, str(error), request=Request(scope), headers={"Connection": "close"},
                       error=BodyTooLargeError)
    await response(scope, receive, send)
