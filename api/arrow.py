"""Arrow IPC on the wire: whole tables as one response body, or a stream written batch by batch."""

from __future__ import annotations

from typing import Any, Iterator

import pyarrow as pa
from fastapi import Response

from api.deps import ARROW_STREAM
from trajstore.formats import json_safe
from trajstore.stream import ipc_bytes

ARROW_CONTENT: dict[str, Any] = {ARROW_STREAM: {"schema": {"type": "string", "format": "binary"}}}


def arrow_response(table: pa.Table) -> Response:
    return Response(ipc_bytes(table), media_type=ARROW_STREAM)


class _Chunks:
    """A write-only file that keeps what was written until taken."""

    def __init__(self) -> None:
        self.parts: list[bytes] = []
        self.closed = False

    def write(self, data: Any) -> int:
        self.parts.append(data)  # bytes, or a pa.Buffer of the batch being written: joined (copied) in take()
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True

    def take(self) -> bytes:
        out, self.parts = b"".join(self.parts), []
        return out


def ipc_stream(reader: pa.RecordBatchReader) -> Iterator[bytes]:
    """The IPC stream of ``reader`` in pieces: the schema, then one piece per record batch."""
    sink = _Chunks()
    writer = pa.ipc.new_stream(sink, reader.schema)
    yield sink.take()
    for batch in reader:
        writer.write_batch(batch)
        yield sink.take()
    writer.close()
    yield sink.take()


def json_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts: NaN and infinities become null (JSON has no such numbers)."""
    return [json_safe(row) for row in table.to_pylist()]
