"""RFC 9457 problem details: every error the service returns is ``application/problem+json``."""

from __future__ import annotations

import logging
from http import HTTPStatus
from typing import Any

from fastapi import FastAPI, Request
from fastapi.encoders import jsonable_encoder
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse
from pydantic import BaseModel, Field
from starlette.exceptions import HTTPException as StarletteHTTPException
from starlette.routing import Match
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from trajstore.errors import (
    AuthenticationError,
    BodyTooLargeError,
    ConflictError,
    EmptyReplayError,
    IngestBusyError,
    InputError,
    QueryBusyError,
    QueryError,
    QueryMemoryError,
    QueryRefusedError,
    QueryTimeoutError,
    QueryWorkerDiedError,
    ReadOnlyError,
    ReplayNotFoundError,
    ResultTooLargeError,
    RunNotFoundError,
    StoreAccessError,
    StoreDamagedError,
    StoreNotFoundError,
    TrajstoreError,
    UnsupportedTableError,
    VersionNotFoundError,
)

log = logging.getLogger(__name__)

PROBLEM_JSON = "application/problem+json"


class Problem(BaseModel):
    """An RFC 9457 problem document."""

    type: str = Field("about:blank", description="a URI naming the kind of problem: urn:trajstore:error:<name> for "
                                                 "an error of trajstore.errors (e.g. RunNotFoundError), else "
                                                 "about:blank")
    title: str = Field(description="short summary of the kind of problem")
    status: int = Field(description="the HTTP status code")
    detail: str | None = Field(None, description="what went wrong in this request")
    instance: str | None = Field(None, description="the request path")
    errors: list[dict[str, Any]] | None = Field(None, description="per-field errors of an invalid request")


ERROR_STATUSES = (400, 401, 403, 404, 406, 408, 409, 413, 415, 422, 429, 500, 503)


def problem_response(code: int, description: str | None = None) -> dict[str, Any]:
    """The OpenAPI description of a problem+json answer with status ``code``."""
    return {"model": Problem, "description": description or HTTPStatus(code).phrase,
            "content": {PROBLEM_JSON: {"schema": {"$ref": "#/components/schemas/Problem"}}}}


ERROR_RESPONSES: dict[int | str, dict[str, Any]] = {code: problem_response(code) for code in ERROR_STATUSES}

_STATUS_OF: tuple[tuple[type[BaseException], int], ...] = (
    (AuthenticationError, 401),
    (QueryRefusedError, 403),
    (QueryTimeoutError, 408),
    (ConflictError, 409),
    # a table version trajstore does not read (a Delta reader feature, rows deleted through deletion vectors): the
    # request conflicts with the table's state, which the user resolves (the files rewritten without the feature, or
    # version=N from before it); not a 503, which clients retry as passing, nor a 500, which is trajstore's own fault
    (UnsupportedTableError, 409),
    (RunNotFoundError, 404),
    (VersionNotFoundError, 404),
    (ReplayNotFoundError, 404),
    (EmptyReplayError, 409),  # a replay with no items yet: sampled again once commits bring some
    (ReadOnlyError, 403),
    (ResultTooLargeError, 413),
    (BodyTooLargeError, 413),
    (QueryMemoryError, 413),
    (QueryBusyError, 429),
    (IngestBusyError, 429),
    (QueryWorkerDiedError, 503),
    (InputError, 422),
    (QueryError, 400),
    (StoreNotFoundError, 503),
    (StoreDamagedError, 503),
    (StoreAccessError, 503),
)
STORE_RETRY_AFTER_S = 2  # Retry-After of a 503 for an object store that failed or did not answer
WORKER_RETRY_AFTER_S = 1  # Retry-After of a 503 for a query whose worker died (a fresh one is being started)


ERROR_TYPE = "urn:trajstore:error:"  # + the name of the trajstore error: what a client may raise again


def problem(status: int, detail: str | None = None, *, request: Request | None = None,
            headers: dict[str, str] | None = None, errors: list[dict[str, Any]] | None = None,
            error: type[BaseException] | None = None) -> JSONResponse:
    body = Problem(type=ERROR_TYPE + error.__name__ if error is not None else "about:blank",
                   title=HTTPStatus(status).phrase, status=status, detail=detail,
                   instance=request.url.path if request is not None else None, errors=errors)
    return JSONResponse(jsonable_encoder(body, exclude_none=True), status_code=status, headers=headers,
                        media_type=PROBLEM_JSON)


def _allowed_methods(request: Request) -> list[str]:
    """Every method some route of the app answers on the request's path."""
    methods: set[str] = set()
    routes = list(request.app.router.routes)
    while routes:
        route = routes.pop()
        if hasattr(route, "original_router"):  # an included router (FastAPI >= 0.165): its own routes
            routes.extend(route.original_router.routes)
        elif route.matches(request.scope)[0] is not Match.NONE:  # PARTIAL: the path matches, the method not
            methods |= set(getattr(route, "methods", None) or ())
    return sorted(methods)


def install(app: FastAPI) -> None:
    """Register the handlers that turn every error into a problem document."""

    @app.exception_handler(StarletteHTTPException)
    async def http_error(request: Request, exc: StarletteHTTPException) -> JSONResponse:
        headers = getattr(exc, "headers", None)
        if exc.status_code == 405:  # Starlette names the methods of the first route on the path only
            headers = {**(headers or {}), "Allow": ", ".join(_allowed_methods(request))}
        return problem(exc.status_code, str(exc.detail) if exc.detail else None, request=request, headers=headers)

    @app.exception_handler(RequestValidationError)
    async def invalid_request(request: Request, exc: RequestValidationError) -> JSONResponse:
        errors = [{"loc": list(e.get("loc", ())), "msg": e.get("msg", ""), "type": e.get("type", "")}
                  for e in exc.errors()]
        detail = "; ".join(f"{'.'.join(str(p) for p in e['loc'])}: {e['msg']}" for e in errors)
        return problem(422, detail, request=request, errors=errors)

    @app.exception_handler(TrajstoreError)
    async def trajstore_error(request: Request, exc: TrajstoreError) -> JSONResponse:
        status = next((code for kind, code in _STATUS_OF if isinstance(exc, kind)), 500)
        if isinstance(exc, StoreDamagedError) and exc.path:  # /ready fails while that file is still committed
            request.app.state.damaged = exc
        headers = {"WWW-Authenticate": "Bearer"} if status == 401 else None
        if isinstance(exc, (QueryBusyError, IngestBusyError)):
            headers = {"Retry-After": str(exc.retry_after_s)}
        if isinstance(exc, StoreAccessError):
            headers = {"Retry-After": str(STORE_RETRY_AFTER_S)}
        if isinstance(exc, QueryWorkerDiedError):
            headers = {"Retry-After": str(WORKER_RETRY_AFTER_S)}
        if status == 500:
            log.exception("error serving %s", request.url.path, exc_info=exc)
        return problem(status, str(exc), request=request, headers=headers, error=type(exc))

    @app.exception_handler(Exception)
    async def unexpected(request: Request, exc: Exception) -> JSONResponse:
        log.exception("unexpected error serving %s", request.url.path, exc_info=exc)
        return problem(500, "internal error; see the server log", request=request)

    app.add_middleware(KeepAliveOn500)


class KeepAliveOn500:
    """ASGI middleware: an unexpected error is answered as a 500 problem here, and the connection stays usable.

    A handler of ``Exception`` alone does not do that: Starlette runs it in its outermost middleware, which sends
    the answer and then raises the error again, and uvicorn closes the connection of an app that raised. This
    sits inside it, answers, and does not raise (unless the answer had begun: a broken stream must be cut)."""

    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        started = False

        async def sending(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, receive, sending)
        except Exception as exc:
            if started:
                raise
            request = Request(scope)
            log.exception("unexpected error serving %s", request.url.path, exc_info=exc)
            await problem(500, "internal error; see the server log", request=request)(scope, receive, send)
