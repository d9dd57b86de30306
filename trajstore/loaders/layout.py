"""Steps laid out episode-major for training loaders: a compact index of the selected episodes (id, length,
offset) and each column in one file, ordered by ``(episode, step)``, filled in one streaming pass.

A step's place is ``offset[episode] + step``, so the files are filled straight from the store's scan in
whatever order the files hold the rows, without sorting anything: each record batch is scattered into
memory maps of the column files opened for that batch alone, so building holds the pages of one batch, not
the columns. The files are made by writing zeros, not by a sparse truncate: the page cache then holds them in
large folios, and gathers from them run ~4x faster.

An iterator copies its batches (:mod:`~trajstore.loaders.assemble`) out of maps of the files it opens once
(:meth:`Layout.mapped`): mapping a file costs far more than a batch's copies, and the pages a batch touches are the
page cache's, not the process's own memory (they count in its resident size as file pages, never as anonymous
memory).

Where the files live and who shares them is :mod:`~trajstore.loaders.layout_store`'s business: a layout is
built into a folder it is given (or a temporary one, removed on :meth:`Layout.close`), saved with its index
(:meth:`Layout.describe`) and opened again by any process (:meth:`Layout.load`).
"""

from __future__ import annotations

import tempfile
import threading
from collections import OrderedDict
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterable, Iterator, Literal, Mapping, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trajstore.errors import InputError, StoreDamagedError
from trajstore.loaders.assemble import Spans
from trajstore.query.scan import scan_steps
from trajstore.schema import numpy_dtype, to_numpy
from trajstore.storage.arrays import leaf_arrays, value_bytes
from trajstore.storage.encoding import NEXT, OBS, EncodingError, FileSchema, decode_batches
from trajstore.storage.log import DataFile
from trajstore.storage.table import fsync_file, read_file_schema

Reader = Callable[[Sequence[str]], Iterable[pa.RecordBatch]]
CHUNK_STEPS = 1 << 20  # steps per piece of a derived column computed over the files
READ_ROWS = 16_384  # rows per batch read from a file
ZERO_BLOCK = 4 << 20  # bytes written at a time when a column file is made
READ_BUFFER = 256 * 1024  # bytes of a file read at a time (a whole column chunk otherwise: ~3x the peak memory)
INDEX = {"episode_id": "episode_id.i64", "length": "length.i64"}  # the index's files (int64 each)
T = TypeVar("T")


class BrokenLayoutError(StoreDamagedError):
    """A saved layout whose files are missing or of another size than its description says (a copy cut short,
    a file removed by hand): never used, built again."""


@dataclass(frozen=True)
class Column:
    """One column file: ``rows`` steps of ``dtype`` values shaped ``shape`` each."""

    path: Path
    dtype: np.dtype
    shape: tuple[int, ...]
    rows: int

    @property
    def nbytes(self) -> int:
        return self.rows * value_bytes(self.dtype, self.shape)

    def open(self, mode: Literal["r", "r+"] = "r") -> np.ndarray:
        if self.nbytes == 0:
            return np.zeros((self.rows, *self.shape), self.dtype)
        return np.memmap(self.path, dtype=self.dtype, mode=mode, shape=(self.rows, *self.shape))

    def gather(self, positions: np.ndarray) -> np.ndarray:
        """The values at ``positions`` from a map opened for this call alone (building, derived columns)."""
        values = self.open()
        try:
            return take(values, positions, self.shape)
        finally:
            del values  # unmaps: the pages this call touched leave the process

    def describe(self) -> dict[str, Any]:
        return {"file": self.path.name, "dtype": self.dtype.str, "shape": list(self.shape)}


def leaves(name: str, columns: Mapping[str, Any], read: Callable[[str], np.ndarray]) -> Any:
    """``read(name)`` for a column laid out whole; for a Dict column (laid out leaf by leaf as ``name.a.b``) the
    nested dict of ``read(leaf)`` of its leaves."""
    if name in columns:
        return read(name)
    out: dict[str, Any] = {}
    for leaf in (c for c in columns if c.startswith(name + ".")):
        *parents, last = leaf[len(name) + 1:].split(".")
        target = out
        for part in parents:
            target = target.setdefault(part, {})
        target[last] = read(leaf)
    return out


def leaf_names(columns: Mapping[str, Any], names: Sequence[str]) -> list[str]:
    """The leaves of columns ``names``, in the order :func:`leaves` reads them (a Dict column's ``name.a.b``)."""
    out: list[str] = []
    for name in names:
        leaves(name, columns, out.append)  # type: ignore[arg-type]
    return out


def take(values: np.ndarray, positions: np.ndarray, shape: tuple[int, ...]) -> np.ndarray:
    """``values[positions]`` as a new array shaped ``(*positions.shape, *shape)``."""
    flat = np.take(values, positions.reshape(-1), axis=0)  # faster than values[positions] on a map
    return np.asarray(flat).reshape(*positions.shape, *shape)


@dataclass
class Layout:
    """The selected episodes sorted by id (``episode_id``, ``length``, ``offset`` of their first step) and
    their column files in ``folder``; with ``owned`` (a temporary folder) the files are this layout's alone
    and :meth:`close` removes them."""

    episode_id: np.ndarray
    length: np.ndarray
    offset: np.ndarray
    columns: dict[str, Column] = field(default_factory=dict)
    folder: Path | None = None
    owned: tempfile.TemporaryDirectory | None = None

    @property
    def steps(self) -> int:
        return int(self.length.sum())

    def gather(self, name: str, positions: np.ndarray) -> Any:
        """Column ``name`` at ``positions``: an array, or for a Dict column a dict of its leaves' arrays."""
        return leaves(name, self.columns, lambda leaf: self.columns[leaf].gather(positions))

    def new_column(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> Column:
        if self.folder is None:
            self.owned = tempfile.TemporaryDirectory(prefix="trajstore-layout-")
            self.folder = Path(self.owned.name)
        column = Column(self.folder / f"{len(self.columns)}.bin", np.dtype(dtype), tuple(shape), self.steps)
        _zeros(column.path, column.nbytes)
        self.columns[name] = column
        return column

    def episode_of(self, positions: np.ndarray) -> np.ndarray:
        """The index (into ``episode_id``) of the episode holding each step position."""
        return np.searchsorted(self.offset, positions, side="right") - 1

    def mapped(self) -> Mapped:
        """The column files mapped once, for one iterator's batches (:meth:`Mapped.close` unmaps them)."""
        return Mapped(self)

    def describe(self) -> dict[str, Any]:
        """What :meth:`load` needs besides the folder: the index's files and each column's file and type."""
        return {"episodes": len(self.episode_id), "steps": self.steps, "index": dict(INDEX),
                "columns": {name: c.describe() for name, c in self.columns.items()}}

    def save(self, *, sync: bool = True) -> list[Path]:
        """Write the index beside the columns (and with ``sync`` flush every file to disk): the files a saved
        layout consists of."""
        if self.folder is None:
            self.owned = tempfile.TemporaryDirectory(prefix="trajstore-layout-")  # no column: only the index
            self.folder = Path(self.owned.name)
        self.episode_id.astype(np.int64).tofile(self.folder / INDEX["episode_id"])
        self.length.astype(np.int64).tofile(self.folder / INDEX["length"])
        files = [self.folder / INDEX["episode_id"], self.folder / INDEX["length"],
                 *(c.path for c in self.columns.values())]
        if sync:
            for path in files:
                fsync_file(path)
        return files

    @classmethod
    def load(cls, folder: Path, description: dict[str, Any]) -> Layout:
        """The layout saved in ``folder`` as ``description`` says; a :class:`BrokenLayoutError` when a file is
        missing or of another size."""
        try:
            episodes, steps = int(description["episodes"]), int(description["steps"])
            episode_id = _index_file(folder / INDEX["episode_id"], episodes)
            length = _index_file(folder / INDEX["length"], episodes)
            if int(length.sum()) != steps:
                raise BrokenLayoutError(f"{folder}: the episode lengths add up to {length.sum()} steps, not {steps}")
            columns = {name: Column(folder / d["file"], np.dtype(d["dtype"]), tuple(d["shape"]), steps)
                       for name, d in description["columns"].items()}
        except (KeyError, TypeError, ValueError) as exc:
            raise BrokenLayoutError(f"{folder}: unreadable description ({exc!r})") from None
        for c in columns.values():
            size = c.path.stat().st_size if c.path.exists() else -1
            if size != c.nbytes and c.nbytes:
                raise BrokenLayoutError(f"{c.path}: {size} bytes, expected {c.nbytes}")
        offset = (np.cumsum(length) - length).astype(np.int64)
        return cls(episode_id, length, offset, columns, folder)

    def close(self) -> None:
        """Remove the files if they are this layout's alone (a saved layout's files stay)."""
        if self.owned is not None:
            self.owned.cleanup()
            self.owned = None
            self.folder = None


def _index_file(path: Path, n: int) -> np.ndarray:
    size = path.stat().st_size if path.exists() else -1
    if size != 8 * n:
        raise BrokenLayoutError(f"{path}: {size} bytes, expected {8 * n}")
    return np.fromfile(path, dtype=np.int64)


class Mapped:
    """A layout as one iterator reads it: the index in memory, each column file mapped once (not per batch).

    The maps are read-only and shared by nothing else; gathers copy out of them. The pages a gather touches
    stay mapped (file pages, reclaimable by the kernel) until :meth:`close`.
    """

    def __init__(self, layout: Layout) -> None:
        self.layout = layout
        self.episode_id, self.length, self.offset = layout.episode_id, layout.length, layout.offset
        self.columns = layout.columns
        self._maps = {name: c.open() for name, c in layout.columns.items()}
        self.steps = layout.steps  # asked for by every batch: found once
        self.longest = int(layout.length.max(initial=1))
        self._spans: Spans | None = None

    def gather(self, name: str, positions: np.ndarray) -> Any:
        """Column ``name`` at ``positions`` (a dict of its leaves' arrays for a Dict column)."""
        return leaves(name, self.columns, lambda leaf: take(self._maps[leaf], positions, self.columns[leaf].shape))

    @property
    def spans(self) -> Spans:
        """Where the kernels of :mod:`~trajstore.loaders.assemble` find the steps: one fragment, every column
        file's rows in position order."""
        if self._spans is None:
            self._spans = Spans(self.offset, self.length, np.array([0, self.steps]), self._maps,
                                {leaf: np.zeros(1, np.int64) for leaf in self._maps})
        return self._spans

    def copying(self, positions: Callable[[], np.ndarray], length: int, names: Sequence[str],
                copy: Callable[[], T]) -> T:
        """``copy()`` (which reads leaves ``names`` at ``length`` steps from each of ``positions()``): the pages
        of a built layout's files are cached once built or found."""
        return copy()

    def episode_of(self, positions: np.ndarray) -> np.ndarray:
        return self.layout.episode_of(positions)

    def close(self) -> None:
        self._spans = None
        self._maps.clear()  # the last references: numpy unmaps the files


class OpenLayouts:
    """The last ``capacity`` layouts opened, kept between calls (the next epoch over the same selection gathers
    from them again without finding or reading anything): each shared by the iterators using it, and closed
    (the files removed, if they are its own) once it has been evicted and the last of them has finished.
    Thread-safe."""

    def __init__(self, capacity: int = 1) -> None:
        self.capacity = capacity
        self._lock = threading.Lock()
        self._entries: OrderedDict[Hashable, Layout] = OrderedDict()
        self._users: dict[int, int] = {}  # id(layout) -> iterators using it
        self._evicted: set[int] = set()

    def get(self, key: Hashable, make: Callable[[], Layout]) -> tuple[Layout, Callable[[], None]]:
        """The layout for ``key`` (built by ``make`` unless kept) and the call that releases it; with
        ``capacity`` 0 the layout is the caller's alone and the release closes it."""
        with self._lock:
            layout = self._entries.get(key)
            if layout is not None:
                self._entries.move_to_end(key)
                self._users[id(layout)] += 1
                return layout, self._releaser(layout)
        layout = make()  # outside the lock: building reads the whole selection
        if self.capacity <= 0:
            return layout, layout.close
        with self._lock:
            kept = self._entries.get(key)
            if kept is not None:  # built by another caller meanwhile: use theirs
                layout.close()
                layout = kept
                self._entries.move_to_end(key)
            else:
                self._entries[key] = layout
                self._users[id(layout)] = 0
                while len(self._entries) > self.capacity:
                    _, old = self._entries.popitem(last=False)
                    self._evicted.add(id(old))
                    self._close_if_unused(old)
            self._users[id(layout)] += 1
        return layout, self._releaser(layout)

    def clear(self) -> None:
        """Evict every layout (each closed once no iterator uses it)."""
        with self._lock:
            while self._entries:
                _, old = self._entries.popitem(last=False)
                self._evicted.add(id(old))
                self._close_if_unused(old)

    def __len__(self) -> int:
        return len(self._entries)

    def _releaser(self, layout: Layout) -> Callable[[], None]:
        released = False

        def release() -> None:
            nonlocal released
            with self._lock:
                if released:
                    return
                released = True
                self._users[id(layout)] -= 1
                self._close_if_unused(layout)

        return release

    def _close_if_unused(self, layout: Layout) -> None:
        key = id(layout)
        if key in self._evicted and self._users.get(key, 0) == 0:
            self._evicted.discard(key)
            self._users.pop(key, None)
            layout.close()


def _zeros(path: Path, size: int) -> None:
    """A file of ``size`` zero bytes, written (not a sparse truncate): the page cache then holds it in large
    folios, and batches gather from it ~4x faster than from pages a memory map allocated one by one."""
    block = bytes(min(size, ZERO_BLOCK))
    with open(path, "wb") as f:
        while size > 0:
            f.write(block[:min(size, len(block))])
            size -= len(block)


def column_leaves(schema: pa.Schema, name: str, *, empty: bool = False) -> dict[str, tuple[np.dtype, tuple[int, ...]]]:
    """The arrays a column is laid out as: itself, or each leaf of a Dict column (``obs.pixels``), with its dtype
    and per-step shape (see :func:`column_type`)."""
    t = schema.field(name).type
    if not pa.types.is_struct(t):
        return {name: column_type(schema, name, empty=empty)}
    out = {}
    for f in t:
        out.update(column_leaves(pa.schema([pa.field(f"{name}.{f.name}", f.type)]), f"{name}.{f.name}", empty=empty))
    return out


def column_type(schema: pa.Schema, name: str, *, empty: bool = False) -> tuple[np.dtype, tuple[int, ...]]:
    """The numpy dtype and per-step shape a stored column has in a layout; an :class:`InputError` naming
    ``columns`` for a column that has no fixed numeric shape (unless no step is selected: ``empty``)."""
    t = schema.field(name).type
    shape: list[int] = []
    while pa.types.is_fixed_size_list(t) or (empty and (pa.types.is_list(t) or pa.types.is_large_list(t))):
        shape.append(t.list_size if pa.types.is_fixed_size_list(t) else 1)  # no rows: any shape
        t = t.value_type
    if pa.types.is_list(t) or pa.types.is_large_list(t):
        raise InputError(f"columns: {name!r} has no fixed shape across the selected steps (environments with "
                         "different shapes?); select one env_id with run_id/where")
    if not (pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)):
        raise InputError(f"columns: {name!r} is {t}, not numbers; loaders batch numeric and boolean columns")
    return numpy_dtype(t), tuple(shape)


def read_files(files: Sequence[DataFile], schema: pa.Schema, columns: Sequence[str],
               episode_ids: np.ndarray | None = None,
               schemas: Sequence[FileSchema] | None = None) -> Iterator[pa.RecordBatch]:
    """``columns`` of the steps of ``files``, one file after the other, in small buffered reads: the memory of a
    few batches, not of a row group (the scan for a loader, which must not cost what it saves). Decoded and under
    their logical names (``schemas``: the files' own, read from their footers when not given), typed as in
    ``schema``; columns a file lacks come as nulls; with ``episode_ids`` (sorted), only those episodes' steps."""
    known = [schemas[i] if schemas is not None else read_file_schema(f) for i, f in enumerate(files)]
    foreign = [i for i, s in enumerate(known) if s.format.foreign]
    for i, f in enumerate(files):
        if not known[i].format.foreign:
            yield from _file_batches(f, known[i], schema, list(columns), episode_ids)
    if foreign:  # another tool's files: in the log's types, rows in any order and file; read as scan reads them
        yield from scan_steps([files[i] for i in foreign], schema, list(columns), episode_ids=episode_ids,
                              schemas=[known[i] for i in foreign], batch_size=READ_ROWS)


def _file_batches(f: DataFile, stored: FileSchema, schema: pa.Schema, columns: list[str],
                  episode_ids: np.ndarray | None) -> Iterator[pa.RecordBatch]:
    fmt = stored.format
    held = [c for c in columns if c in stored.logical.names]
    decode = fmt.encoded and bool({OBS, NEXT} & set(held))
    read = list(dict.fromkeys(held + (["episode_id", "step", OBS] if decode else []) +
                              (["episode_id"] if episode_ids is not None or not held else [])))
    parquet = pq.ParquetFile(f.path, filesystem=f.fs, pre_buffer=False, buffer_size=READ_BUFFER)
    batches: Iterator[pa.RecordBatch]
    batches = (pa.record_batch(b.columns, names=read) for b in
               parquet.iter_batches(batch_size=READ_ROWS, columns=[fmt.physical(c) for c in read], use_threads=False))
    if episode_ids is not None:
        batches = (b.filter(pa.array(np.isin(b.column("episode_id").to_numpy(zero_copy_only=False), episode_ids)))
                   for b in batches)
    if decode:
        batches = _checked_decode(decode_batches(batches, fmt, stored.logical.field(OBS).type, where=f.uri), f)
    for batch in batches:
        arrays = [_cast(batch.column(c), schema.field(c).type) if c in held
                  else pa.nulls(batch.num_rows, schema.field(c).type) for c in columns]
        yield pa.record_batch(arrays, names=list(columns))


def _checked_decode(batches: Iterator[pa.RecordBatch], f: DataFile) -> Iterator[pa.RecordBatch]:
    try:
        yield from batches
    except EncodingError as exc:
        raise StoreDamagedError.of_file(f.uri, f"breaks its encoding: {exc}", None) from exc


def _cast(column: pa.Array, t: pa.DataType) -> pa.Array:
    return column if column.type.equals(t) else column.cast(t)


def build(read: Reader, schema: pa.Schema, columns: Sequence[str], folder: Path | None = None) -> Layout:
    """The layout of every step ``read`` yields, with ``columns`` (stored columns typed by ``schema``) in files
    in ``folder`` (an empty folder; a temporary one the layout owns without it): one pass over
    ``episode_id, step`` for the index, one over the columns to fill the files."""
    layout = _index(read(["episode_id", "step"]))
    layout.folder = folder
    pa.default_memory_pool().release_unused()  # what the reads decoded goes back to the system, not kept
    types = {leaf: kind for c in columns for leaf, kind in column_leaves(schema, c, empty=layout.steps == 0).items()}
    try:
        files = {leaf: layout.new_column(leaf, *kind) for leaf, kind in types.items()}
        if columns:
            for batch in read(["episode_id", "step", *columns]):
                _scatter(layout, batch, files)
    except BaseException:
        layout.close()
        raise
    pa.default_memory_pool().release_unused()
    return layout


def _index(batches: Iterable[pa.RecordBatch]) -> Layout:
    """Episode ids, lengths and offsets from a stream of ``episode_id, step`` batches (per batch, the
    counts and largest step of each episode it holds; then summed)."""
    ids, counts, tops = [], [], []
    for batch in batches:
        eid = batch.column(0).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        step = batch.column(1).to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        u, inverse, n = np.unique(eid, return_inverse=True, return_counts=True)
        top = np.full(len(u), -1, np.int64)
        np.maximum.at(top, inverse, step)
        ids.append(u)
        counts.append(n)
        tops.append(top)
    if not ids:
        empty = np.zeros(0, np.int64)
        return Layout(empty, empty.copy(), empty.copy())
    u, inverse = np.unique(np.concatenate(ids), return_inverse=True)
    length = np.bincount(inverse, weights=np.concatenate(counts), minlength=len(u)).astype(np.int64)
    top = np.full(len(u), -1, np.int64)
    np.maximum.at(top, inverse, np.concatenate(tops))
    bad = np.flatnonzero(top + 1 != length)
    if len(bad):
        raise StoreDamagedError(f"episode {u[bad[0]]} has {length[bad[0]]} stored steps but its last step is "
                                f"{top[bad[0]]}: steps are missing or repeated; run `trajstore check`")
    offset = (np.cumsum(length) - length).astype(np.int64)
    return Layout(u, length, offset)


def _scatter(layout: Layout, batch: pa.RecordBatch, files: dict[str, Column]) -> None:
    eid = batch.column(0).to_numpy(zero_copy_only=False)
    step = batch.column(1).to_numpy(zero_copy_only=False)
    pos = layout.offset[np.searchsorted(layout.episode_id, eid)] + step
    for i in range(2, batch.num_columns):
        name, values = batch.schema.names[i], batch.column(i)
        if values.null_count:
            raise InputError(f"columns: {name!r} is missing (null) in some selected steps; select episodes "
                             "that all hold it (where=…)")
        for leaf, array in leaf_arrays(name, to_numpy(values)).items():
            target = files[leaf].open("r+")
            target[pos] = array
            del target  # unmapped after each batch: written pages go to the page cache, not this process


def derive(layout: Layout, name: str, dtype: np.dtype, source: str,
           compute: Callable[[np.ndarray, np.ndarray], np.ndarray]) -> None:
    """Add column ``name`` computed per group of whole episodes from column ``source``: ``compute(values,
    starts)`` gets the group's values and the offsets of its episodes within them."""
    out = layout.new_column(name, dtype, ())
    first = 0
    while first < len(layout.episode_id):
        last = int(np.searchsorted(layout.offset, layout.offset[first] + CHUNK_STEPS, side="left"))
        last = max(last, first + 1)
        lo = int(layout.offset[first])
        hi = int(layout.offset[last - 1] + layout.length[last - 1])
        values = layout.columns[source].open()[lo:hi]
        target = out.open("r+")
        target[lo:hi] = compute(np.asarray(values), layout.offset[first:last] - lo)
        del target, values
        first = last
