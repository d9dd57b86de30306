"""Arrow IPC and JSON responses (the encodings themselves are in :mod:`trajstore.remote.wire`; JSON rows are exact
as :mod:`trajstore.api.ints` says)."""

from __future__ import annotations

from typing import Any

import pyarrow as pa
from fastapi import Request, Response
from fastapi.responses import JSONResponse

from trajstore.api.ints import ROWS_SCHEMA
from trajstore.remote.wire import ARROW_STREAM, ipc_bytes, json_rows

ARROW_CONTENT: dict[str, Any] = {ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}}}
# A table's rows: an Arrow IPC stream, or (the default) a JSON array of row objects.
ROWS_CONTENT: dict[str, Any] = {**ARROW_CONTENT, "application/json": {"schema": ROWS_SCHEMA}}


def arrow_response(table: pa.Table, headers: dict[str, str] | None = None) -> Response:
    return Response(ipc_bytes(table), media_type=ARROW_STREAM, headers=headers)


def wants_arrow(request: Request) -> bool:
    """Whether the client asked for an Arrow IPC stream (``Accept: application/vnd.apache.arrow.stream``)."""
    return ARROW_STREAM in request.headers.get("accept", "")


def table_response(request: Request, table: pa.Table, headers: dict[str, str] | None = None) -> Any:
    """``table`` as Arrow IPC when the client asked for it, else as a list of JSON rows."""
    if wants_arrow(request):
        return arrow_response(table, headers)
    return JSONResponse(json_rows(table), headers=headers) if headers else json_rows(table)


__all__ = ["ARROW_CONTENT", "ARROW_STREAM", "ROWS_CONTENT", "arrow_response", "json_rows", "table_response",
           "wants_arrow"]
