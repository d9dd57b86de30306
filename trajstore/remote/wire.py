"""The wire formats between the service and its clients: Arrow IPC (one table as one body, or a stream
written batch by batch as pieces of bytes) and JSON rows (NaN and infinities as null; ``episode_id`` and any
integer a double does not hold exactly as decimal strings).

>>> import pyarrow as pa
>>> read_table(ipc_bytes(pa.table({"x": [1, 2]}))).to_pydict()
{'x': [1, 2]}
"""

from __future__ import annotations

import math
from typing import Any, Iterator

import pyarrow as pa
import pyarrow.compute as pc

from trajstore.errors import InputError

ARROW_STREAM = "application/vnd.apache.arrow.stream"


def ipc_bytes(table: pa.Table) -> bytes:
    """``table`` as one Arrow IPC stream."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


def read_table(body: bytes, *, field: str = "body") -> pa.Table:
    """An Arrow IPC stream's table, checked whole; :class:`InputError` naming ``field`` when it is not one.
    (pyarrow's reader does not check that each buffer holds what its array says: an array whose buffer is
    shorter than its length, or whose offsets point past its values, would be read past its end.)"""
    try:
        table = pa.ipc.open_stream(body).read_all()
        table.validate(full=True)
    except (pa.ArrowException, OSError) as exc:  # ArrowInvalid, and a type or codec this pyarrow does not read
        raise InputError(f"{field}: not an Arrow IPC stream ({exc})") from None
    except UnicodeDecodeError as exc:  # a column's name
        raise InputError(f"{field}: not an Arrow IPC stream (a name that is not UTF-8: {exc})") from None
    return table


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


# Integers a double holds exactly (JavaScript's Number.MAX_SAFE_INTEGER): beyond them a JSON number is not exact
# for most readers, so the service writes such an integer as a decimal string (see trajstore/api/ints.py).
MAX_SAFE_INT = 2**53 - 1
ID_COLUMNS = ("episode_id",)  # integer columns written as decimal strings in every JSON row, whatever their values


def json_rows(table: pa.Table) -> list[dict[str, Any]]:
    """Rows as JSON-ready dicts, exact for every reader: ``episode_id`` and any other integer beyond ±(2**53 - 1)
    as decimal strings; NaN and infinities as null (JSON has no such numbers)."""
    table = ids_as_text(table)
    if not has_unsafe_ints(table):
        return [json_safe(row) for row in table.to_pylist()]
    return [json_exact(row) for row in table.to_pylist()]


def ids_as_text(table: pa.Table) -> pa.Table:
    """``table`` with its integer :data:`ID_COLUMNS` as decimal strings."""
    for name in ID_COLUMNS:
        at = table.schema.get_field_index(name)
        if at >= 0 and pa.types.is_integer(table.schema.field(at).type):
            table = table.set_column(at, name, table.column(at).cast(pa.string()))
    return table


def has_unsafe_ints(data: pa.Table | pa.ChunkedArray | pa.Array) -> bool:
    """Whether any 64-bit integer in ``data`` (nested in lists, structs, maps, dictionaries too) is beyond
    ±(2**53 - 1): the cheap check before a row-by-row :func:`json_exact`."""
    if isinstance(data, pa.Table):
        return any(has_unsafe_ints(column) for column in data.columns)
    if isinstance(data, pa.ChunkedArray):
        return any(has_unsafe_ints(chunk) for chunk in data.chunks)
    kind = data.type
    if pa.types.is_dictionary(kind):
        return has_unsafe_ints(data.dictionary)
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        return has_unsafe_ints(data.flatten())
    if pa.types.is_map(kind):
        return has_unsafe_ints(data.keys) or has_unsafe_ints(data.items)
    if pa.types.is_struct(kind):
        return any(has_unsafe_ints(data.field(i)) for i in range(kind.num_fields))
    if kind.id not in (pa.int64().id, pa.uint64().id) or len(data) == data.null_count:
        return False
    low, high = pc.min_max(data).values()
    return low.as_py() < -MAX_SAFE_INT or high.as_py() > MAX_SAFE_INT


def exact_int(value: int) -> int | str:
    """``value`` as a JSON number where a double holds it exactly, else as a decimal string."""
    return value if -MAX_SAFE_INT <= value <= MAX_SAFE_INT else str(value)


def json_exact(value: Any) -> Any:
    """:func:`json_safe` that also writes each integer beyond ±(2**53 - 1) as a decimal string."""
    if isinstance(value, int) and not isinstance(value, bool):
        return exact_int(value)
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_exact(v) for k, v in value.items()}
    if isinstance(value, (list, tuple)):  # a map's entries are (key, value) tuples
        return [json_exact(v) for v in value]
    return value


def json_safe(value: Any) -> Any:
    """``value`` with every non-finite float (in nested lists and dicts too) as ``None``."""
    if isinstance(value, float) and not math.isfinite(value):
        return None
    if isinstance(value, dict):
        return {k: json_safe(v) for k, v in value.items()}
    if isinstance(value, list):
        return [json_safe(v) for v in value]
    return value
