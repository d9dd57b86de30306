"""The iterator a training loader returns: batches of items in one shard's order, assembled on demand, in the
format asked for, with a ``state_dict()`` to resume from.

Formats: ``"numpy"`` (a dict of arrays), ``"torch"`` (a dict of CPU tensors sharing the arrays' memory),
``"jax"`` (device arrays; the next batch is assembled and put on the device on a thread while the current
one is used), ``"arrow"`` (a record batch; arrays of shape ``(n, a, b)`` as nested fixed-size lists).
"""

from __future__ import annotations

import concurrent.futures
import importlib
import warnings
from typing import Any, Callable, Iterator, Protocol

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.loaders.order import Order, Position
from trajstore.query.batches import FORMATS as LOADER_FORMATS
from trajstore.query.batches import BatchFormat
from trajstore.schema import to_numpy

Assemble = Callable[[np.ndarray], dict[str, np.ndarray]]


def check_format(format: str) -> None:  # noqa: A002
    if format not in LOADER_FORMATS:
        raise InputError(f"format: must be one of {list(LOADER_FORMATS)}, got {format!r}")
    if format in ("torch", "jax"):
        with needed(format, f"format: {format!r}"):
            importlib.import_module(format)


def __getattr__(name: str) -> Any:
    """``LoaderFormat``, the loaders' Literal of formats until trajstore 0.1: the same type as
    :data:`~trajstore.query.batches.BatchFormat`, now written once; still importable for one release, with a
    :class:`DeprecationWarning` naming the new one."""
    if name == "LoaderFormat":
        warnings.warn("trajstore.loaders.loader.LoaderFormat is deprecated: use trajstore.query.batches.BatchFormat "
                      "(the same type); the old name goes in the next release", DeprecationWarning, stacklevel=2)
        return BatchFormat
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


class BatchStream(Protocol):
    """What a training loader gives, from a store (:class:`Batches`) or a service
    (:class:`~trajstore.remote.loader.RemoteBatches`): batches one after the other, ``state_dict()`` to resume
    right after the last one given (``resume=``), and ``close()`` (or a ``with`` block); ``schema``, the Arrow
    schema of its batches."""

    schema: pa.Schema

    def __iter__(self) -> Iterator[Any]: ...

    def __next__(self) -> Any: ...

    def state_dict(self) -> dict[str, Any]: ...

    def close(self) -> None: ...


class Batches(Iterator[Any]):
    """Batches of ``batch_size`` items of ``order`` from ``start`` on, each made by ``assemble(items)``.

    ``state_dict()`` says how many items of the order the batches returned so far hold; pass it as
    ``resume=`` to the same call to continue right after them. ``len()`` is the number of batches left.
    ``close()`` (or the end of the order) unmaps the files the batches are gathered from.
    """

    def __init__(self, order: Order, *, start: int, batch_size: int, assemble: Assemble, format: str,  # noqa: A002
                 position: Position, on_close: Callable[[], None] | None = None) -> None:
        self._order, self._pos, self._size = order, start, batch_size
        self._assemble, self._format, self._position = assemble, format, position
        self._on_close = on_close
        self._ahead: concurrent.futures.Future[Any] | None = None
        self._pool: concurrent.futures.ThreadPoolExecutor | None = None
        self.schema = to_arrow(assemble(np.zeros(0, np.int64))).schema
        self.items = len(order)

    def __len__(self) -> int:
        return -(-(len(self._order) - self._pos) // self._size)

    def state_dict(self) -> dict[str, Any]:
        p = self._position
        return Position(p.kind, p.digest, p.epoch, self._pos).state_dict()

    def __next__(self) -> Any:
        if self._pos >= len(self._order):
            self.close()
            raise StopIteration
        if self._format != "jax":
            batch = self._make(self._pos)
        else:
            batch = (self._ahead or self._submit(self._pos)).result()
            if self._pos + self._size < len(self._order):
                self._ahead = self._submit(self._pos + self._size)
        self._pos = min(self._pos + self._size, len(self._order))
        return batch

    def _make(self, at: int) -> Any:
        return convert(self._assemble(self._order.take(at, at + self._size)), self._format)

    def _submit(self, at: int) -> concurrent.futures.Future[Any]:
        if self._pool is None:
            self._pool = concurrent.futures.ThreadPoolExecutor(1, thread_name_prefix="trajstore-prefetch")
        return self._pool.submit(self._make, at)

    def close(self) -> None:
        """Stop: release the prefetch thread and the files. Idempotent."""
        if self._pool is not None:
            self._pool.shutdown(wait=True, cancel_futures=True)
            self._pool, self._ahead = None, None
        if self._on_close is not None:
            self._on_close()
            self._on_close = None

    def __enter__(self) -> Batches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def convert(arrays: dict[str, np.ndarray], format: str) -> Any:  # noqa: A002
    """A batch in ``format``; arrays of text (``agent_id``) stay numpy arrays of ``str`` in torch and JAX batches,
    which have no tensors of text."""
    if format == "numpy":
        return arrays
    if format == "arrow":
        return to_arrow(arrays)
    text = {k: v for k, v in arrays.items() if isinstance(v, np.ndarray) and v.dtype.kind in "UO"}
    if format == "torch":
        import torch

        def tensors(value: Any) -> Any:
            if isinstance(value, dict):
                return {k: tensors(v) for k, v in value.items()}
            return torch.from_numpy(np.ascontiguousarray(value))
        return {k: text[k] if k in text else tensors(v) for k, v in arrays.items()}
    import jax

    put = jax.device_put({k: v for k, v in arrays.items() if k not in text})
    return {k: text[k] if k in text else put[k] for k in arrays}


def to_arrow(arrays: dict[str, Any]) -> pa.RecordBatch:
    """Arrays of shape ``(n, a, b, …)`` as nested fixed-size lists (a dict of them, a Dict column's leaves, as a
    struct); read back by :func:`from_arrow`."""
    return pa.record_batch([_fixed_lists(a) for a in arrays.values()], names=list(arrays))


def _fixed_lists(a: Any) -> pa.Array:
    if isinstance(a, dict):
        return pa.StructArray.from_arrays([_fixed_lists(v) for v in a.values()], names=list(a))
    a = np.ascontiguousarray(a)
    out: pa.Array = pa.array(a.reshape(-1))
    for size in reversed(a.shape[1:]):
        out = pa.FixedSizeListArray.from_arrays(out, size)
    return out


def from_arrow(batch: pa.RecordBatch) -> dict[str, Any]:
    """The arrays of :func:`to_arrow`'s record batch (shapes kept, also for no rows)."""
    return {name: _arrays(column) for name, column in zip(batch.schema.names, batch.columns)}


def _arrays(column: pa.Array) -> Any:
    if pa.types.is_string(column.type) or pa.types.is_large_string(column.type):
        return np.asarray(column.to_pylist(), dtype=str).reshape(len(column))  # agent_id: str, as assembled
    if pa.types.is_struct(column.type):
        return {f.name: _arrays(column.field(i)) for i, f in enumerate(column.type)}
    shape, t = [], column.type
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    return np.asarray(to_numpy(column)).reshape((len(column), *shape))
