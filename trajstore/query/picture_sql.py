"""Image frames in SQL: DuckDB functions that make the stored bytes of image frames (see
:mod:`trajstore.storage.encoding`) the nested lists of their values again, so that ``SELECT obs FROM steps`` gives
``UTINYINT[][][]`` for uint8 frame stacks, as written.

One function per dtype, frame shape and stacking, registered on the connection whose views use it (Arrow in,
Arrow out: the bytes are viewed, not copied, and the lists built around them). float16 values come as FLOAT:
DuckDB has no 16-bit float.
"""

from __future__ import annotations

import threading
from typing import Any, Callable

import duckdb
import numpy as np
import pyarrow as pa

from trajstore.query import sql


def function_name(dtype: str, shape: tuple[int, ...], stacked: bool) -> str:
    dims = "x".join(str(s) for s in shape)
    return f"trajstore_{'stack' if stacked else 'frame'}_{np.dtype(dtype).name}_{dims}"


_FUNCTIONS: dict[str, Callable[[Any], pa.Array]] = {}  # every function registered, alive as long as the process
_LOCK = threading.Lock()


def register(con: duckdb.DuckDBPyConnection, dtype: str, shape: tuple[int, ...], stacked: bool) -> str:
    """The name of the function for such frames, registered on ``con``'s database (once).

    A function registered through a cursor lives in the database its cursors share, but DuckDB does not keep
    the Python callable alive after that cursor is closed: the callables are kept here for the process's life,
    one per name, so that every registration (and every later call through another cursor) uses a live one."""
    name = function_name(dtype, shape, stacked)
    with _LOCK:
        function = _FUNCTIONS.setdefault(name, values(np.dtype(dtype), tuple(shape), stacked))
    blob = "BLOB[]" if stacked else "BLOB"
    try:
        con.create_function(name, function, [blob],  # type: ignore[call-overload]  # duckdb takes the enums' names
                            sql.values_type(np.dtype(dtype).name, len(shape) + int(stacked)), type="arrow",
                            null_handling="special")
    except (duckdb.CatalogException, duckdb.NotImplementedException) as exc:  # registered in this database before
        if "already" not in str(exc) and isinstance(exc, duckdb.NotImplementedException):
            raise
    return name


def values(dtype: np.dtype, shape: tuple[int, ...], stacked: bool) -> Callable[[Any], pa.Array]:
    """The conversion: BLOBs (or lists of them) of frames of ``dtype`` and ``shape`` to nested lists of values."""
    width = dtype.itemsize * int(np.prod(shape, dtype=np.int64))

    def convert(arr: Any) -> pa.Array:
        arr = arr.combine_chunks() if isinstance(arr, pa.ChunkedArray) else arr
        blobs = arr.flatten() if stacked else arr
        present = blobs.is_valid().to_numpy(zero_copy_only=False)
        data = _bytes(blobs, present, width)
        frames = data.view(dtype)
        if dtype == np.float16:
            frames = frames.astype(np.float32)
        inner = pa.array(frames)
        for size in reversed(shape[1:]):
            inner = pa.ListArray.from_arrays(pa.array(np.arange(0, len(inner) + 1, size, dtype=np.int32)), inner)
        counts = np.where(present, shape[0], 0)
        frame = pa.ListArray.from_arrays(pa.array(np.r_[0, np.cumsum(counts)].astype(np.int32)), inner,
                                         mask=pa.array(~present))
        if not stacked:
            return frame
        return pa.ListArray.from_arrays(arr.offsets, frame, mask=arr.is_null())
    return convert


def _bytes(blobs: pa.Array, present: np.ndarray, width: int) -> np.ndarray:
    """The bytes of the present blobs, one after the other (each ``width`` long)."""
    if pa.types.is_fixed_size_binary(blobs.type):
        data = np.frombuffer(blobs.buffers()[1], np.uint8, count=len(blobs) * width, offset=blobs.offset * width)
        return data.reshape(len(blobs), width)[present].reshape(-1)
    kind = np.dtype(np.int64 if pa.types.is_large_binary(blobs.type) else np.int32)
    offsets = np.frombuffer(blobs.buffers()[1], kind, count=len(blobs) + 1, offset=blobs.offset * kind.itemsize)
    lengths = np.diff(offsets)
    if (lengths[present] != width).any():
        raise ValueError(f"image frames must be {width} bytes each, got {sorted(set(lengths[present].tolist()))}")
    data = np.frombuffer(blobs.buffers()[2], np.uint8) if blobs.buffers()[2] is not None else np.zeros(0, np.uint8)
    if (lengths[~present] == 0).all():
        return data[offsets[0]:offsets[-1]]
    return np.concatenate([data[o:o + width] for o, ok in zip(offsets[:-1], present) if ok]) if present.any() \
        else np.zeros(0, np.uint8)
