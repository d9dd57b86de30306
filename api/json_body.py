"""JSON rows of an Arrow table, written in small pieces off the event loop.

The values are those of ``table.to_pylist()`` written by pydantic's JSON serializer (as FastAPI writes a
response model: timestamps in ISO 8601, NaN and infinities as null), exact for every reader as
:mod:`trajstore.api.ints` says (``episode_id`` and any integer beyond ±(2**53 - 1) as a decimal string), but each
piece comes from at most
about :data:`PIECE_BYTES` of decoded Arrow data, so that no single call holds the GIL for long (the event
loop answers ``/health`` in between) and a caller can count the bytes and watch the clock between pieces.
A value larger than that (one row with a list of millions of floats, a string of megabytes) is itself
written in pieces: lists and structs element by element, strings in slices.

>>> import pyarrow as pa
>>> b"".join(rows(pa.table({"x": [1, 2], "s": ["a", None]})))
b'{"x":1,"s":"a"},{"x":2,"s":null}'
>>> b"".join(rows(pa.table({"episode_id": [7], "n": [2**53], "m": [2**53 - 1]})))
b'{"episode_id":"7","n":"9007199254740992","m":9007199254740991}'
"""

from __future__ import annotations

from functools import partial
from typing import Any, Callable, Iterator, Union

import pyarrow as pa
from pydantic_core import PydanticSerializationError, to_json

from trajstore.errors import QueryError
from trajstore.query.sandbox import decoded_nbytes
from trajstore.remote.wire import has_unsafe_ints, ids_as_text, json_exact

PIECE_BYTES = 64 * 1024

Rows = Union[pa.Table, pa.Array]


Dumps = Callable[[Any], bytes]


def rows(table: pa.Table) -> Iterator[bytes]:
    """The rows of ``table`` as JSON objects, separated by commas (no brackets), in pieces."""
    table = ids_as_text(table)
    encode = exact_dumps if has_unsafe_ints(table) else dumps  # values walked one by one only where needed
    return _sequence(table, partial(_row, encode=encode), encode)


def dumps(value: Any) -> bytes:
    try:
        return to_json(value, inf_nan_mode="null")
    except PydanticSerializationError as exc:
        raise QueryError(f"query: a value of the result cannot be written as JSON ({exc}); ask for Arrow "
                         "(Accept: application/vnd.apache.arrow.stream)") from None


def exact_dumps(value: Any) -> bytes:
    """:func:`dumps` with every integer beyond ±(2**53 - 1) as a decimal string."""
    return dumps(json_exact(value))


def _sequence(items: Rows, one: Callable[[Any], Iterator[bytes]], encode: Dumps) -> Iterator[bytes]:
    """``items`` (rows of a table, values of an array) as comma-separated JSON, a growing number at a time
    while they stay small; a single item larger than a piece goes to ``one``."""
    start, step, n = 0, 1, len(items)
    while start < n:
        part = items.slice(start, step)
        size = decoded_nbytes(part)
        if size > PIECE_BYTES and step > 1:
            step //= 2
            continue
        if start:
            yield b","
        if size > PIECE_BYTES:
            yield from one(part)
        else:
            yield encode(part.to_pylist())[1:-1]
            step = step * 2 if size < PIECE_BYTES // 2 else step
        start += len(part)


def _row(row: pa.Table, encode: Dumps) -> Iterator[bytes]:
    """One large row as a JSON object, column by column."""
    yield b"{"
    for i, name in enumerate(row.column_names):
        yield (b"," if i else b"") + dumps(name) + b":"
        yield from _value(row.column(i).combine_chunks(), encode)
    yield b"}"


def _value(value: pa.Array, encode: Dumps) -> Iterator[bytes]:
    """One value (an array of length 1) as JSON: small ones at once, large lists, structs and strings in pieces."""
    kind = value.type
    if value.null_count or decoded_nbytes(value) <= PIECE_BYTES:
        yield encode(value.to_pylist())[1:-1]
    elif pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_fixed_size_list(kind):
        yield b"["
        yield from _sequence(value.flatten(), partial(_value, encode=encode), encode)
        yield b"]"
    elif pa.types.is_struct(kind):
        yield b"{"
        for i, (field, child) in enumerate(zip(kind, value.flatten(), strict=True)):
            yield (b"," if i else b"") + dumps(field.name) + b":"
            yield from _value(child, encode)
        yield b"}"
    elif pa.types.is_string(kind) or pa.types.is_large_string(kind):
        yield from _text(value[0].as_buffer())
    else:  # a map, a blob, a dictionary: written whole
        yield encode(value.to_pylist())[1:-1]


def _text(data: pa.Buffer) -> Iterator[bytes]:
    """A UTF-8 string as a JSON string, in slices cut between characters."""
    view, start = memoryview(data), 0
    yield b'"'
    while start < len(view):
        end = min(len(view), start + PIECE_BYTES)
        while end < len(view) and view[end] & 0xC0 == 0x80:  # not inside a character's bytes
            end -= 1
        yield dumps(bytes(view[start:end]).decode())[1:-1]
        start = end
    yield b'"'
