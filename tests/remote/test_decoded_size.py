"""The size an Arrow IPC stream decodes to, read from its metadata (trajstore/remote/decoded_size.py): equal to
what pyarrow decodes over many schemas, compressions and batchings; a bomb counted without being decompressed;
malformed streams (truncated, corrupted, lying lengths, buffers past their body) refused with an InputError,
never a crash, and never read past their buffers."""

from __future__ import annotations

import struct
import time
from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from trajstore.errors import InputError
from trajstore.remote.decoded_size import ARRAY_BYTES, ROW_BYTES, decoded_size
from trajstore.remote.wire import read_table

INTS = [pa.int8(), pa.int16(), pa.int32(), pa.int64(), pa.uint8(), pa.uint32(), pa.uint64()]
LEAVES = st.sampled_from([*INTS, pa.float32(), pa.float64(), pa.bool_(), pa.string(), pa.large_string(),
                          pa.binary(), pa.binary(3), pa.timestamp("us", tz="UTC"), pa.null()])
TYPES = st.recursive(LEAVES, lambda inner: st.one_of(
    inner.map(pa.list_), inner.map(pa.large_list),
    st.tuples(inner, st.integers(1, 3)).map(lambda a: pa.list_(a[0], a[1])),
    st.lists(inner, min_size=1, max_size=3).map(lambda ts: pa.struct([(f"f{i}", t) for i, t in enumerate(ts)]))),
    max_leaves=4)
CODECS = st.sampled_from([None, "zstd", "lz4"])


def values(t: pa.DataType) -> st.SearchStrategy[Any]:
    """Python values of type ``t``, nulls among them."""
    if pa.types.is_null(t):
        return st.none()
    if pa.types.is_integer(t):
        info = np.iinfo(t.to_pandas_dtype())
        v: st.SearchStrategy[Any] = st.integers(int(info.min), int(info.max))
    elif pa.types.is_floating(t):
        v = st.floats(width=t.bit_width, allow_nan=False)
    elif pa.types.is_boolean(t):
        v = st.booleans()
    elif pa.types.is_string(t) or pa.types.is_large_string(t):
        v = st.text(max_size=6)
    elif pa.types.is_fixed_size_binary(t):
        v = st.binary(min_size=t.byte_width, max_size=t.byte_width)
    elif pa.types.is_binary(t):
        v = st.binary(max_size=6)
    elif pa.types.is_timestamp(t):
        v = st.integers(-2**40, 2**40)
    elif pa.types.is_fixed_size_list(t):
        v = st.lists(values(t.value_type), min_size=t.list_size, max_size=t.list_size)
    elif pa.types.is_list(t) or pa.types.is_large_list(t):
        v = st.lists(values(t.value_type), max_size=4)
    else:
        v = st.fixed_dictionaries({f.name: values(f.type) for f in t})
    return st.none() | v


@st.composite
def tables(draw: st.DrawFn) -> pa.Table:
    """Tables of 1-4 columns of any of :data:`TYPES`, maybe with a dictionary column whose chunks each have
    their own dictionary (so the stream replaces it)."""
    n = draw(st.integers(0, 30))
    columns = {f"c{i}": pa.array(draw(st.lists(values(t), min_size=n, max_size=n)), type=t)
               for i, t in enumerate(draw(st.lists(TYPES, min_size=1, max_size=4)))}
    if draw(st.booleans()):
        words = draw(st.lists(st.none() | st.sampled_from(["a", "bb", "ccc"]), min_size=n, max_size=n))
        cut = draw(st.integers(0, n))
        columns["d"] = pa.chunked_array([pa.array(part, pa.string()).dictionary_encode()
                                         for part in (words[:cut], words[cut:])])
    return pa.table(columns)


def stream(table: pa.Table | pa.RecordBatch, compression: str | None = None, *, chunk: int | None = None,
           times: int = 1) -> bytes:
    """``table`` written ``times`` as an IPC stream by pyarrow, as a client writes it."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression=compression)) as w:
        for _ in range(times):
            if isinstance(table, pa.RecordBatch):
                w.write_batch(table)
            else:
                w.write_table(table, max_chunksize=chunk)
    return sink.getvalue().to_pybytes()


def decoded_by_pyarrow(body: bytes) -> tuple[int, int]:
    """The reference: the bytes of the buffers pyarrow decodes ``body`` into (each dictionary once) and its
    rows."""
    seen, total, rows = set(), 0, 0
    for batch in pa.ipc.open_stream(body):
        rows += batch.num_rows
        for column in batch.columns:
            total += sum(b.size for b in column.buffers() if b is not None)
            if pa.types.is_dictionary(column.type):
                key = tuple(0 if b is None else b.address for b in column.dictionary.buffers())
                if key not in seen:
                    seen.add(key)
                    total += sum(b.size for b in column.dictionary.buffers() if b is not None)
    return total, rows


def arrays_by_pyarrow(body: bytes) -> tuple[int, int]:
    """The reference of arrays and batches: each batch message's arrays (one per node of its schema's tree; a
    dictionary batch's of its value type), and the batch messages, as pyarrow's message reader frames them."""
    schema = pa.ipc.open_stream(body).schema
    reader, arrays, batches = pa.ipc.MessageReader.open_stream(pa.py_buffer(body)), 0, 0
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return arrays, batches
        if message.type == "record batch":
            arrays += sum(nodes(f.type) for f in schema)
        elif message.type == "dictionary":
            arrays += 1  # the dictionaries here are strings
        batches += message.type != "schema"


def nodes(t: pa.DataType) -> int:
    if pa.types.is_struct(t):
        return 1 + sum(nodes(f.type) for f in t)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return 1 + nodes(t.value_type)
    return 1


@pytest.mark.slow
@settings(max_examples=400, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tables(), CODECS, st.integers(1, 7), st.integers(0, 5))
def test_the_size_is_what_pyarrow_decodes(table: pa.Table, compression: str | None, chunk: int,
                                          offset: int) -> None:
    body = stream(table.slice(min(offset, table.num_rows)), compression, chunk=chunk)  # slices: buffers cut
    size = decoded_size(body)
    assert (size.buffers, size.rows) == decoded_by_pyarrow(body)
    assert (size.arrays, size.batches) == arrays_by_pyarrow(body)
    assert size.complete and size.bytes >= size.buffers + ROW_BYTES * size.rows


def zero_rows(n: int) -> pa.RecordBatch:
    """``n`` rows of zeros shaped like an ingest's (obs of 4 floats): 56 bytes a row decoded."""
    obs = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(n * 4, np.float32)), 4)
    return pa.record_batch({
        "episode_id": pa.array(np.zeros(n, np.int64)), "step": pa.array(np.zeros(n, np.int32)), "obs": obs,
        "action": pa.array(np.zeros(n, np.int64)), "reward": pa.array(np.zeros(n, np.float32)), "next_obs": obs,
        "terminated": pa.array(np.zeros(n, bool)), "truncated": pa.array(np.zeros(n, bool))})


def test_a_bomb_is_counted_without_decompressing_it() -> None:
    rows = zero_rows(30_000_000)
    body = stream(rows, "zstd")
    assert len(body) < 64 * 1024  # the probe's 57 KB body
    started = time.perf_counter()
    size = decoded_size(body)
    assert time.perf_counter() - started < 0.5
    assert size.buffers == rows.nbytes and size.rows == 30_000_000 and size.bytes > 2 * 2**30


def test_many_small_batches_add_up() -> None:
    one = zero_rows(1000)
    size, single = decoded_size(stream(one, "zstd", times=500)), decoded_size(stream(one, "zstd"))
    assert (size.buffers, size.rows, size.arrays, size.batches) == \
        (500 * single.buffers, 500 * 1000, 500 * single.arrays, 500)
    assert size.bytes >= 500 * (one.nbytes + ROW_BYTES * 1000 + ARRAY_BYTES * (one.num_columns + 1))


def test_counting_stops_once_past_a_limit() -> None:
    body = stream(zero_rows(1000), "zstd", times=10_000)
    whole = decoded_size(body)
    cut = decoded_size(body, limit=whole.bytes // 100)
    assert not cut.complete and whole.bytes // 100 < cut.bytes < whole.bytes // 50
    assert whole.batches // 100 <= cut.batches < whole.batches // 50  # the rest was never read
    assert "at least" in cut.describe() and "at least" not in whole.describe()


# --- malformed streams -------------------------------------------------------------------------------------

def messages(body: bytes) -> list[tuple[int, int, int, int]]:
    """Where each message of ``body`` is: its metadata's start and length, its body's start and length."""
    reader, at, out = pa.ipc.MessageReader.open_stream(pa.py_buffer(body)), 0, []
    while True:
        try:
            message = reader.read_next_message()
        except StopIteration:
            return out
        head = 8 if struct.unpack_from("<I", body, at)[0] == 0xFFFFFFFF else 4
        length = struct.unpack_from("<i", body, at + head - 4)[0]
        size = 0 if message.body is None else message.body.size
        out.append((at + head, length, at + head + length, size))
        at += head + length + size


def patched(body: bytes, at: int, fmt: str, *values: int) -> bytes:
    out = bytearray(body)
    struct.pack_into(fmt, out, at, *values)
    return bytes(out)


INTS_1000 = pa.table({"x": pa.array(np.zeros(1000, np.int64))})  # buffers: no validity (0, 0), data (0, 8000)


def outcome(body: bytes) -> str:
    """What reading ``body`` as the service does gives: its rows, "too large" past 1 MiB decoded, or the
    InputError's message (any other error fails the test)."""
    try:
        if decoded_size(body).bytes > 2**20:
            return "too large"
        return f"{read_table(body).num_rows} rows"
    except InputError as exc:
        return str(exc)


def test_every_truncation_is_refused_or_a_shorter_stream() -> None:
    table = pa.table({"x": pa.array(np.arange(50)), "s": pa.array(["ab", None] * 25).dictionary_encode()})
    body = stream(table, "zstd", chunk=20)
    ends = {m[2] + m[3] for m in messages(body)}  # a stream cut after a whole message is a shorter stream
    for cut in range(len(body)):
        got = outcome(body[:cut])
        if cut in ends:
            assert got.endswith("rows"), (cut, got)
        elif cut < max(ends):
            assert got.startswith("body: not an Arrow IPC stream"), (cut, got)


@settings(max_examples=300, deadline=None)
@given(st.data(), CODECS)
def test_corrupted_bytes_are_refused_never_a_crash(data: st.DataObject, compression: str | None) -> None:
    table = pa.table({"x": pa.array(np.arange(40)), "l": pa.array([[1, 2], None, [3]] * 13 + [[4]]),
                      "s": pa.array(["ab", None, "c", "def"] * 10).dictionary_encode()})
    body = bytearray(stream(table, compression, chunk=16))
    for _ in range(data.draw(st.integers(1, 4))):
        body[data.draw(st.integers(0, len(body) - 1))] = data.draw(st.integers(0, 255))
    got = outcome(bytes(body))
    assert got.endswith("rows") or got == "too large" or got.startswith("body: not an Arrow IPC stream"), got


@pytest.mark.parametrize("says, counted, refused", [
    (10, 10, "Destination buffer is too small"),  # less than it holds: decompression stops at what it said
    (7999, 7999, "Destination buffer is too small"),
    (8001, 8001, "Corrupt ZSTD compressed data"),
    (2**40, 2**40, None),  # a terabyte: counted as said, never allocated (see test_bombs.py)
    (-1, 19, "Buffer #1 too small in array of type int64 and length 1000"),  # "stored as is": its 19 bytes
])
def test_a_compressed_buffer_that_lies_about_its_length(says: int, counted: int, refused: str | None) -> None:
    body = stream(INTS_1000, "zstd")
    data = messages(body)[1][2]  # the batch's body: its one non-empty buffer first
    assert struct.unpack_from("<q", body, data) == (8000,)
    lying = patched(body, data, "<q", says)
    assert decoded_size(lying).buffers == counted
    if refused is not None:
        with pytest.raises(InputError, match=f"body: not an Arrow IPC stream.*{refused}"):
            read_table(lying)


@pytest.mark.parametrize("offset, length", [(8, 8000), (0, 8008), (-8, 16), (0, 2**62)])
def test_a_buffer_outside_its_body_is_refused(offset: int, length: int) -> None:
    body = stream(INTS_1000)
    start, size, _, _ = messages(body)[1]
    at = body.index(struct.pack("<qq", 0, 8000), start, start + size)
    with pytest.raises(InputError, match=rf"message 1: buffer 1 \(offset {offset}, {length} bytes\) lies outside "
                                         r"its body of 8000 bytes"):
        decoded_size(patched(body, at, "<qq", offset, length))


def test_a_buffer_shorter_than_its_array_is_refused_when_read() -> None:
    body = stream(INTS_1000)
    start, size, _, _ = messages(body)[1]
    short = patched(body, body.index(struct.pack("<qq", 0, 8000), start, start + size), "<qq", 0, 16)
    assert decoded_size(short).buffers == 16
    with pytest.raises(InputError, match="Buffer #1 too small in array of type int64 and length 1000: expected "
                                         "at least 8000 byte"):
        read_table(short)


@pytest.mark.parametrize("body, refused", [
    (b"", "it is empty"),
    (b"not arrow at all", "Expected to read 544501614 metadata bytes, but only read 12"),
    (stream(INTS_1000)[:-8] + stream(INTS_1000), "message 2: a second schema"),
    (stream(INTS_1000)[messages(stream(INTS_1000))[1][0] - 8:], "message 0: a stream is one schema message"),
])
def test_what_is_no_ipc_stream_is_refused(body: bytes, refused: str) -> None:
    with pytest.raises(InputError, match=f"body: not an Arrow IPC stream.*{refused}"):
        decoded_size(body)


def test_a_negative_length_is_refused() -> None:
    body = stream(INTS_1000, "zstd")
    with pytest.raises(InputError, match="message 1: compressed buffer 1 says it decompresses to -2 bytes"):
        decoded_size(patched(body, messages(body)[1][2], "<q", -2))
