"""The wire formats between the service and its clients: Arrow IPC (one table as one body, or a stream
written batch by batch as pieces of bytes) and JSON rows (NaN and infinities as null).

>>> import pyarrow as pa
>>> read_table(ipc_bytes(pa.table({"x": [1, 2]}))).to_pydict()
{'x': [1, 2]}
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import pyarrow as pa

from trajstore.errors import InputError

ARROW_STREAM = "application/vnd.apache.arrow.stream"


def ipc_bytes(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_table(body: bytes, *, field: str = "body") -> pa.Table:
    """An Arrow IPC stream's table; :class:`InputError` naming ``field`` when it is not one."""
    try:
        return pa.ipc.open_stream(body).read_all()
    except (pa.ArrowException, OSError) as exc:  # ArrowInvalid, and a type or codec this pyarrow does not read
        raise InputError(f"{field}: not an Arrow IPC stream ({exc})") from None


class _Chunks:
    """A write-only file that keeps what was written until taken."""

    def __init__(self) -> None:
        self.parts: list[Any] = []
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


def ipc_pieces(reader: pa.RecordBatchReader) -> Iterator[bytes]:
    """The IPC stream of ``reader`` in pieces: the schema, then one piece per record batch, then the end."""
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


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (in nested lists and dicts too) as ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value
