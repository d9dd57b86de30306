"""Record-batch streams for training: reading an HTTP body as it arrives, fixed-size batches, and a
bounded, seeded shuffle buffer.

>>> import pyarrow as pa
>>> reader = pa.RecordBatchReader.from_batches(pa.schema([("x", pa.int64())]),
...     [pa.record_batch([pa.array(range(0, 5))], ["x"]), pa.record_batch([pa.array(range(5, 9))], ["x"])])
>>> [b.num_rows for b in rebatch(reader, 4)]
[4, 4, 1]
"""

from __future__ import annotations

import io
from typing import Iterable, Iterator

import numpy as np
import pyarrow as pa


class HttpByteStream(io.RawIOBase):
    """A readable file over an iterator of byte chunks (an HTTP body as it arrives)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n


def rebatch(batches: Iterable[pa.RecordBatch], size: int, *, drop_last: bool = False) -> Iterator[pa.RecordBatch]:
    """Batches of exactly ``size`` rows (the last one shorter unless ``drop_last``), in stream order.

    Rows within one incoming batch are yielded as zero-copy slices of it; only batches that span
    incoming batches are copied together.
    """
    pending: list[pa.RecordBatch] = []
    rows = 0
    for batch in batches:
        start = 0
        if pending:
            start = min(size - rows, batch.num_rows)
            pending.append(batch.slice(0, start))
            rows += start
            if rows < size:
                continue
            yield _one_batch(pa.Table.from_batches(pending))
            pending, rows = [], 0
        while batch.num_rows - start >= size:
            yield batch.slice(start, size)
            start += size
        if start < batch.num_rows:
            pending, rows = [batch.slice(start)], batch.num_rows - start
    if rows and not drop_last:
        yield _one_batch(pa.Table.from_batches(pending))


def shuffled(batches: Iterable[pa.RecordBatch], size: int, buffer_rows: int, rng: np.random.Generator, *,
             drop_last: bool = False) -> Iterator[pa.RecordBatch]:
    """Batches of ``size`` rows drawn at random from a buffer of up to ``buffer_rows + size`` rows.

    Deterministic for a given input order and ``rng`` state: the same seed gives the same batches.
    """
    buffer: pa.Table | None = None
    for batch in batches:
        buffer = pa.Table.from_batches([batch]) if buffer is None else pa.concat_tables([buffer, pa.Table.from_batches([batch])])
        while buffer.num_rows >= buffer_rows + size:
            out, buffer = _draw(buffer, size, rng)
            yield out
    while buffer is not None and buffer.num_rows >= size:
        out, buffer = _draw(buffer, size, rng)
        yield out
    if buffer is not None and buffer.num_rows and not drop_last:
        yield _one_batch(buffer.take(pa.array(rng.permutation(buffer.num_rows))))


def _draw(buffer: pa.Table, size: int, rng: np.random.Generator) -> tuple[pa.RecordBatch, pa.Table]:
    picked = rng.choice(buffer.num_rows, size, replace=False)
    keep = np.ones(buffer.num_rows, bool)
    keep[picked] = False
    return _one_batch(buffer.take(pa.array(picked))), buffer.filter(pa.array(keep)).combine_chunks()


def _one_batch(table: pa.Table) -> pa.RecordBatch:
    return table.combine_chunks().to_batches()[0] if table.num_rows else pa.RecordBatch.from_pylist([], table.schema)
