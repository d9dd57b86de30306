"""The size an Arrow IPC stream decodes to, read from its messages' metadata before anything is decompressed.

An IPC stream is a schema message, then dictionary and record batch messages (Arrow's ``format/Message.fbs``).
Each batch's metadata (a flatbuffer: ``Message`` -> header ``RecordBatch`` or ``DictionaryBatch.data``) lists its
arrays (``nodes``) and buffers (``offset``, ``length`` in the message's body); in a compressed body each buffer
begins with its uncompressed length (a little-endian int64; -1: stored as is). So :func:`decoded_size` knows what
a stream decodes to without decompressing a byte of it, and a service refuses a small body of zstd that would
decode to gigabytes before it decodes it.

pyarrow frames the messages (:class:`pyarrow.ipc.MessageReader`: each message's metadata and body are there);
the few flatbuffer fields needed are read here (:class:`_Table`), every offset checked against its buffer, so a
malformed stream is an :class:`~trajstore.errors.InputError`, never a crash or a loop. :class:`DecodedSize`
counts, beside the buffers, what decoding and checking rows takes in memory that no buffer says (measured with
pyarrow 26): each array and batch pyarrow makes (~450 and ~300 bytes), each message's metadata (a schema of
many fields: ~7 times its bytes) and each row (its keys widened, its time stamped, its keys sorted by the
service's checks).

>>> import pyarrow as pa
>>> from trajstore.remote.wire import ipc_bytes
>>> size = decoded_size(ipc_bytes(pa.table({"x": pa.array(range(1000), pa.int64())})))
>>> size.buffers, size.rows, size.arrays, size.batches
(8000, 1000, 1, 1)
"""

from __future__ import annotations

import struct
from dataclasses import dataclass, replace
from typing import Any

import pyarrow as pa

from trajstore.errors import InputError, size_text

ROW_BYTES = 32  # each row: episode_id widened to int64, step to int32, wall_time and env_steps, its keys sorted
ARRAY_BYTES = 512  # each array and each batch pyarrow makes of a stream (~450 and ~300 bytes measured)
METADATA_FACTOR = 8  # each message's metadata: a schema of many fields takes ~7 times its bytes once read

# The union MessageHeader of format/Message.fbs, and the fields read (by their index in their table).
SCHEMA, DICTIONARY_BATCH, RECORD_BATCH = 1, 2, 3
HEADER_TYPE, HEADER = 1, 2  # Message
LENGTH, NODES, BUFFERS, COMPRESSION = 0, 1, 2, 3  # RecordBatch
DATA = 1  # DictionaryBatch
CODEC, METHOD = 0, 1  # BodyCompression: LZ4_FRAME = 0, ZSTD = 1; BUFFER = 0
CODECS = {0: "lz4", 1: "zstd"}


@dataclass(frozen=True)
class DecodedSize:
    """What a stream decodes to: its ``buffers`` in bytes (uncompressed), the ``rows`` of its record batches, the
    ``arrays`` of its batches (dictionaries included), its ``batches`` and the bytes of its messages' ``metadata``;
    ``complete``: False where counting stopped once past a limit (the stream holds at least this much)."""

    buffers: int = 0
    rows: int = 0
    arrays: int = 0
    batches: int = 0
    metadata: int = 0
    complete: bool = True

    @property
    def bytes(self) -> int:
        """The memory decoding and checking the stream takes: its buffers and what pyarrow and the checks of
        its rows make beside them (see the module)."""
        return (self.buffers + ROW_BYTES * self.rows + ARRAY_BYTES * (self.arrays + self.batches)
                + METADATA_FACTOR * self.metadata)

    def describe(self) -> str:
        """What was counted, for a message."""
        least = "" if self.complete else "at least "
        return (f"{least}{self.bytes} bytes ({size_text(self.bytes)}: {size_text(self.buffers)} of buffers "
                f"uncompressed, {self.rows} rows, {self.arrays} arrays in {self.batches} batch(es))")


def decoded_size(body: bytes | pa.Buffer, *, limit: int | None = None, field: str = "body") -> DecodedSize:
    """The :class:`DecodedSize` of the Arrow IPC stream ``body``, read from its metadata alone; once past
    ``limit`` bytes, what was counted so far (``complete`` False). :class:`InputError` naming ``field`` for a
    body that is not an IPC stream, or whose metadata is malformed or points past its message."""
    reader = pa.ipc.MessageReader.open_stream(pa.py_buffer(body) if isinstance(body, bytes) else body)
    total, number = DecodedSize(), 0
    while (message := _next(reader, field, number)) is not None:
        try:
            total = _add(total, message, first=number == 0)
        except _Malformed as exc:
            raise InputError(f"{field}: not an Arrow IPC stream (message {number}: {exc})") from None
        if limit is not None and total.bytes > limit:
            return replace(total, complete=False)
        number += 1
    return total


def _next(reader: pa.ipc.MessageReader, field: str, number: int) -> pa.ipc.Message | None:
    """The stream's next message, None at its end."""
    try:
        return reader.read_next_message()
    except StopIteration:
        if number == 0:
            raise InputError(f"{field}: not an Arrow IPC stream (it is empty)") from None
        return None
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{field}: not an Arrow IPC stream ({exc})") from None


class _Malformed(Exception):
    """Metadata that breaks the format (the message says where)."""


def _add(total: DecodedSize, message: pa.ipc.Message, *, first: bool) -> DecodedSize:
    """``total`` with ``message`` counted."""
    meta = memoryview(message.metadata)
    root = _Table.root(meta)
    kind = root.scalar(HEADER_TYPE, "B", 0)
    if (kind == SCHEMA) != first:
        raise _Malformed("a stream is one schema message, then batches" if first else "a second schema")
    counted = replace(total, metadata=total.metadata + len(meta))
    if kind == SCHEMA:
        return counted
    header = root.table(HEADER, "its header")
    if kind == DICTIONARY_BATCH:
        header = header.table(DATA, "its dictionary batch's data")
    elif kind != RECORD_BATCH:
        raise _Malformed(f"a message of kind {kind}; expected record batches and dictionaries")
    batch = _batch_size(header, memoryview(message.body) if message.body is not None else memoryview(b""))
    rows = batch.rows if kind == RECORD_BATCH else 0  # a dictionary's values are no rows
    return replace(counted, buffers=counted.buffers + batch.buffers, rows=counted.rows + rows,
                   arrays=counted.arrays + batch.arrays, batches=counted.batches + 1)


def _batch_size(batch: _Table, body: memoryview) -> DecodedSize:
    """One ``RecordBatch`` table's rows, arrays and buffers (decompressed) over its message's ``body``."""
    rows = batch.scalar(LENGTH, "q", 0)
    if rows < 0:
        raise _Malformed(f"a batch of {rows} rows")
    nodes = batch.vector(NODES, 16)
    codec = _codec(batch.optional_table(COMPRESSION))
    buffers = 0
    for i, (offset, length) in enumerate(struct.iter_unpack("<qq", batch.vector(BUFFERS, 16))):
        if offset < 0 or length < 0 or offset + length > len(body):
            raise _Malformed(f"buffer {i} (offset {offset}, {length} bytes) lies outside its body of "
                             f"{len(body)} bytes")
        buffers += length if codec is None else _uncompressed(body, offset, length, i)
    return DecodedSize(buffers, rows, len(nodes) // 16)


def _codec(compression: _Table | None) -> str | None:
    """The codec of a compressed body (None: uncompressed); only the per-buffer method exists."""
    if compression is None:
        return None
    codec, method = compression.scalar(CODEC, "b", 0), compression.scalar(METHOD, "b", 0)
    if codec not in CODECS or method != 0:
        raise _Malformed(f"compression codec {codec}, method {method}; expected lz4 or zstd buffer by buffer")
    return CODECS[codec]


def _uncompressed(body: memoryview, offset: int, length: int, i: int) -> int:
    """The length of compressed buffer ``i`` once decompressed: its first 8 bytes (-1: stored as is)."""
    if length == 0:
        return 0  # an empty buffer may be written without its length
    if length < 8:
        raise _Malformed(f"compressed buffer {i} has {length} bytes, less than its 8-byte length")
    (size,) = struct.unpack_from("<q", body, offset)
    if size < -1:
        raise _Malformed(f"compressed buffer {i} says it decompresses to {size} bytes")
    return length - 8 if size == -1 else size


class _Table:
    """One table of a flatbuffer, its fields read by index (``vtable`` entries), every position checked."""

    def __init__(self, buf: memoryview, at: int) -> None:
        self.buf, self.at = buf, at
        vtable = at - _read(buf, "<i", at)
        size = _read(buf, "<H", vtable)
        if size < 4 or size % 2:
            raise _Malformed(f"a table's vtable of {size} bytes")
        self.offsets = [_read(buf, "<H", vtable + 4 + 2 * i) for i in range((size - 4) // 2)]

    @classmethod
    def root(cls, buf: memoryview) -> _Table:
        return cls(buf, _read(buf, "<I", 0))

    def _field(self, i: int) -> int | None:
        """Where field ``i`` is (None: absent, its default)."""
        return self.at + self.offsets[i] if i < len(self.offsets) and self.offsets[i] else None

    def scalar(self, i: int, kind: str, default: int) -> int:
        at = self._field(i)
        return default if at is None else _read(self.buf, "<" + kind, at)

    def _target(self, i: int) -> int | None:
        at = self._field(i)
        return None if at is None else at + _read(self.buf, "<I", at)

    def optional_table(self, i: int) -> _Table | None:
        at = self._target(i)
        return None if at is None else _Table(self.buf, at)

    def table(self, i: int, what: str) -> _Table:
        found = self.optional_table(i)
        if found is None:
            raise _Malformed(f"{what} is missing")
        return found

    def vector(self, i: int, item: int) -> memoryview:
        """The bytes of vector field ``i`` of items of ``item`` bytes (empty when absent)."""
        at = self._target(i)
        if at is None:
            return memoryview(b"")
        n = _read(self.buf, "<I", at)
        if at + 4 + n * item > len(self.buf):
            raise _Malformed(f"a vector of {n} items runs past its metadata of {len(self.buf)} bytes")
        return self.buf[at + 4:at + 4 + n * item]


def _read(buf: memoryview, kind: str, at: int) -> Any:
    """The value of ``kind`` (a ``struct`` format) at ``at`` in ``buf``, which must hold it whole."""
    if at < 0 or at + struct.calcsize(kind) > len(buf):
        raise _Malformed(f"an offset ({at}) past its metadata of {len(buf)} bytes")
    return struct.unpack_from(kind, buf, at)[0]
