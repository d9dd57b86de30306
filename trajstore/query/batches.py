"""Batches for training from a stream of record batches: fixed-size batches, a bounded and seeded shuffle
buffer, and conversion to numpy, JAX or Arrow. Used alike by :meth:`Store.iter_batches
<trajstore.store.Store.iter_batches>` (from the files) and :meth:`Client.iter_batches
<trajstore.remote.client.Client.iter_batches>` (from a service's stream).

>>> import pyarrow as pa
>>> reader = pa.RecordBatchReader.from_batches(pa.schema([("x", pa.int64())]),
...     [pa.record_batch([pa.array(range(0, 5))], ["x"]), pa.record_batch([pa.array(range(5, 9))], ["x"])])
>>> [b.num_rows for b in rebatch(reader, 4)]
[4, 4, 1]
"""

from __future__ import annotations

import importlib
from typing import Any, Iterable, Iterator, Literal, get_args

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.schema import to_numpy

BatchFormat = Literal["numpy", "jax", "arrow", "torch"]  # what a training batch is: every loader's and stream's
FORMATS: tuple[str, ...] = get_args(BatchFormat)


def training_batches(batches: Iterable[pa.RecordBatch], *, batch_size: int, shuffle: bool, seed: int | None,
                     shuffle_buffer: int, drop_last: bool, format: BatchFormat) -> Iterator[Any]:  # noqa: A002
    """Batches of ``batch_size`` rows, shuffled in a bounded buffer if asked, in the ``format`` asked for."""
    check_batching(batch_size, shuffle_buffer, format)
    out = rebatch(batches, batch_size, drop_last=drop_last)
    if shuffle:
        out = shuffled(out, batch_size, shuffle_buffer, np.random.default_rng(seed), drop_last=drop_last)
    for batch in out:
        yield convert(batch, format)


def check_batching(batch_size: int, shuffle_buffer: int, format: str) -> None:  # noqa: A002
    if not isinstance(batch_size, (int, np.integer)) or batch_size < 1:
        raise InputError(f"batch_size: must be a positive number of rows, got {batch_size!r}")
    if not isinstance(shuffle_buffer, (int, np.integer)) or shuffle_buffer < 0:
        raise InputError(f"shuffle_buffer: must be a number of rows >= 0, got {shuffle_buffer!r}")
    if format not in FORMATS:
        raise InputError(f"format: must be one of {list(FORMATS)}, got {format!r}")
    if format in ("torch", "jax"):
        with needed(format, f"format: {format!r}"):
            importlib.import_module(format)


def convert(batch: pa.RecordBatch, format: BatchFormat) -> Any:  # noqa: A002
    """A record batch as itself (``arrow``), or a dict of ``(n, …)`` numpy arrays (``numpy``), JAX arrays or CPU
    torch tensors sharing the arrays' memory (``torch``); text columns (``run_id``, ``agent_id``) stay numpy."""
    if format == "arrow":
        return batch
    arrays = {name: to_numpy(batch.column(i)) for i, name in enumerate(batch.schema.names)}
    if format == "jax":
        import jax.numpy as jnp
        import jax.tree_util

        return jax.tree_util.tree_map(lambda a: jnp.asarray(a) if a.dtype.kind in "biuf" else a, arrays)
    if format == "torch":
        import torch

        def tensors(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: tensors(v) for k, v in value.items()}
            return torch.from_numpy(np.ascontiguousarray(value)) if value.dtype.kind in "biuf" else value
        return tensors(arrays)
    return arrays


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
        piece = pa.Table.from_batches([batch])
        buffer = piece if buffer is None else pa.concat_tables([buffer, piece])
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
