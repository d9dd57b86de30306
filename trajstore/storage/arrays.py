"""A data file's steps as plain arrays, kept beside the table: what training loaders gather from.

For each Parquet file trajstore wrote into a store (the writer's, an ingest's, a compaction's), the decoded
value of every numeric column of fixed shape (each leaf of a Dict column as ``obs.pixels``; ``next_obs`` whole, as
readers get it) in the file's row order, and its *fragments*: the runs of rows holding consecutive steps of one
episode, ``(episode_id, first step, first row, rows)``. Loaders stitch the files of a selection together by their
fragments (:mod:`~trajstore.loaders.stitched`), so a batch gathers from the copies, not from the store.

A copy costs disk: 2-3.5 times the bytes of its Parquet file (measured: 3.5x for CartPole rollouts, whose Parquet
compresses well and stores each observation once; about 1.9x for random float observations of 17 values). So it is
made by the first loader that reads the file (:meth:`StepsTable.array_copies
<trajstore.storage.table.StepsTable.array_copies>`, from the Parquet file, once for every later loader, process and
epoch), never by a writer unless asked (``TRAJSTORE_WRITER_ARRAYS=1``: each file's copy written as it is written,
from the rows in memory, so that the first batch of a store just written reads no Parquet): a store nobody trains
from holds none.

In the store, beside ``steps/`` (an ``s3://`` store: in its folder on this machine, :mod:`~trajstore.storage.cache`)::

    arrays/<digest of the file's path in the table>/
        arrays.json        what the copy holds: the file's path, size and time, rows, each column's file, dtype, shape
        fragments.i64      (k, 4) int64: episode_id, first step, first row, rows
        0.bin, 1.bin, …    one column each, ``rows`` values

A copy is kept by the rule of every cache of a data file (:class:`~trajstore.storage.cache.FileCache`): read only
for the file's path, size and modification time, written into a temporary folder and renamed into place: it is there
whole or not at all, and a killed process leaves a temporary folder nothing reads (removed by ``prune``); a whole
copy another process renamed there first is kept (loaders of one machine take turns on a lock,
:meth:`StepArrays.building`). It is not flushed to disk (a third of its cost to a writer): a copy that a power loss
cut short has files of other sizes than its manifest says (ext4 and XFS never give a file a size whose blocks were
not written), and a copy of other sizes is never read (the next loader makes it again). A copy belongs to its data
file: it is removed with the file (a write that failed, a vacuum), and a file that cannot have one (another tool's)
is laid out by loaders from the Parquet itself. Copies are a cache of data the table holds: one that cannot be
written is logged and skipped, never an error of a write or a read. Steps wider than ``MAX_STEP_BYTES`` (images,
frame stacks: stored once per frame in the table, but whole per step here) get no copy; loaders lay them out at
their first read."""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa

from trajstore.schema import numpy_dtype, to_numpy
from trajstore.storage.cache import FileCache, FileId
from trajstore.storage.encoding import (
    NEXT,
    OBS,
    EncodingError,
    FileEncoding,
    FileSchema,
    decode_batches,
    fixed_numpy,
    leaf_column,
)

log = logging.getLogger(__name__)

FOLDER = "arrays"
FORMAT = 1
MANIFEST = "arrays.json"
FRAGMENTS = "fragments.i64"
MAX_STEP_BYTES = 4096  # a step's bytes over every column, above which a file gets no copy
# the fragments' keys, the partition, and lineage no loader batches (when a step was written, the env's step count)
SKIPPED = ("episode_id", "step", "run_id", "env_id", "wall_time", "env_steps")
BLOCK = 2 << 20
LOCK = ".building.lock"  # held while a process of this machine makes copies (a file: prune passes it over)


def fixed_type(t: pa.DataType) -> tuple[np.dtype, tuple[int, ...]] | None:
    """The numpy dtype and per-step shape of values of Arrow type ``t`` (numbers or booleans, in fixed-size lists),
    or None for any other type."""
    shape: list[int] = []
    while pa.types.is_fixed_size_list(t):
        shape.append(t.list_size)
        t = t.value_type
    if pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t):
        return numpy_dtype(t), tuple(shape)
    return None


def value_bytes(dtype: np.dtype, shape: tuple[int, ...]) -> int:
    """The bytes of one step's value of ``dtype`` shaped ``shape``."""
    return dtype.itemsize * int(np.prod(shape, dtype=np.int64))


def leaf_arrays(name: str, value: Any) -> dict[str, np.ndarray]:
    """A column's values (:func:`~trajstore.schema.to_numpy`) as arrays by leaf name (``obs.pixels``)."""
    if isinstance(value, dict):
        return {leaf: a for k, v in value.items() for leaf, a in leaf_arrays(f"{name}.{k}", v).items()}
    return {name: value}


def leaf_types(name: str, t: pa.DataType) -> dict[str, tuple[np.dtype, tuple[int, ...]] | None]:
    """The leaves of a column of type ``t`` (itself, or each leaf of a struct) with :func:`fixed_type` each."""
    if not pa.types.is_struct(t):
        return {name: fixed_type(t)}
    return {leaf: kind for f in t for leaf, kind in leaf_types(f"{name}.{f.name}", f.type).items()}


def fragments_of(episode_id: np.ndarray, step: np.ndarray) -> np.ndarray:
    """The runs of consecutive steps of one episode in rows ordered as given: ``(k, 4)`` int64 rows
    ``episode_id, first step, first row, rows``."""
    n = len(episode_id)
    if not n:
        return np.zeros((0, 4), np.int64)
    breaks = np.flatnonzero((episode_id[1:] != episode_id[:-1]) | (step[1:] != step[:-1] + 1)) + 1
    starts = np.concatenate([[0], breaks]).astype(np.int64)
    rows = np.diff(np.concatenate([starts, [n]]))
    return np.stack([episode_id[starts].astype(np.int64), step[starts].astype(np.int64), starts, rows], axis=1)


@dataclass(frozen=True)
class FileArrays:
    """The copy of one data file: its folder, rows, columns (leaf -> dtype, shape, file) and fragments."""

    folder: Path
    rows: int
    columns: dict[str, tuple[np.dtype, tuple[int, ...], str]]
    fragments: np.ndarray

    def file(self, leaf: str) -> tuple[Path, int]:
        """Column ``leaf``'s file and its size in bytes (``rows`` values of the leaf's dtype and shape)."""
        dtype, shape, file = self.columns[leaf]
        return self.folder / file, self.rows * value_bytes(dtype, shape)


class StepArrays(FileCache):
    """The copies of a store's data files, under ``folder`` (a local store's ``arrays/``; an ``s3://`` store's in
    its cache folder on this machine): a :class:`~trajstore.storage.cache.FileCache` of folders."""

    def __init__(self, folder: str | Path, *, max_step_bytes: int = MAX_STEP_BYTES) -> None:
        super().__init__(folder, owner=_owner)
        self.max_step_bytes = max_step_bytes

    def write(self, f: FileId, data: pa.Table) -> bool:
        """Write the copy of the file ``f`` holding ``data`` (the rows as stored: physical names, encoded); whether
        one was written. A failure is logged, never raised: the file is stored."""
        try:
            return self._write(f, data)
        except Exception as exc:  # noqa: BLE001 - a cache: loaders lay the file out from Parquet instead
            log.warning("no loader copy of %s (%s); loaders will read it from Parquet", f.rel, exc)
            return False

    def kinds(self, stored: FileSchema) -> dict[str, tuple[np.dtype, tuple[int, ...]]] | None:
        """The leaves a copy of a file of schema ``stored`` holds (dtype and shape each), or None where the file gets
        none (another tool's, or steps wider than ``max_step_bytes``)."""
        if stored.format.foreign or not {"episode_id", "step"} <= set(stored.logical.names):
            return None
        kinds = {leaf: kind for f in stored.logical if f.name not in SKIPPED
                 for leaf, kind in leaf_types(f.name, f.type).items() if kind is not None}
        if sum(value_bytes(d, s) for d, s in kinds.values()) > self.max_step_bytes:
            return None
        return kinds

    def columns(self, stored: FileSchema) -> list[str] | None:
        """The stored (physical) columns a copy of a file of schema ``stored`` is made from, or None where the file
        gets none: its keys, the columns it holds, and ``obs`` with ``next_obs`` (stored once: decoded from both)."""
        kinds = self.kinds(stored)
        if kinds is None:
            return None
        logical = {"episode_id", "step"} | {leaf.split(".")[0] for leaf in kinds}
        if logical & {OBS, NEXT}:
            logical |= {OBS, NEXT}
        fmt = stored.format
        return [fmt.physical(n) for n in stored.logical.names if n in logical]

    def writable(self) -> bool:
        """Whether this process may make copies here (a store on a read-only disk: loaders lay it out instead)."""
        existing = next((p for p in (self.folder, self.folder.parent) if p.exists()), None)
        return existing is not None and os.access(existing, os.W_OK | os.X_OK)

    @contextlib.contextmanager
    def building(self) -> Iterator[None]:
        """Held while this process makes copies: the loaders of one machine (DataLoader workers, processes of one
        job) take turns, so each copy is made once and the next finds it."""
        self.folder.mkdir(parents=True, exist_ok=True)
        with open(self.folder / LOCK, "a+b") as lock:
            fcntl.flock(lock.fileno(), fcntl.LOCK_EX)
            yield  # closing the file releases the lock

    def _write(self, f: FileId, data: pa.Table) -> bool:
        stored = FileSchema.of(data.schema, where=f.rel)
        kinds = self.kinds(stored)
        if kinds is None:
            return False
        with self.writing(f.rel, folder=True, keep=lambda: self.read(f) is not None) as partial:
            files = {leaf: _BlockWriter(partial / f"{i}.bin") for i, leaf in enumerate(kinds)}
            nulls: set[str] = set()
            try:
                for name, values in _values(data, stored, set(kinds), f.rel):
                    if values is None:
                        nulls.update(leaf for leaf in kinds if leaf == name or leaf.startswith(name + "."))
                        continue
                    for leaf, leaf_values in leaf_arrays(name, values).items():
                        if leaf in files and leaf not in nulls:
                            files[leaf].write(np.ascontiguousarray(leaf_values, dtype=kinds[leaf][0]))
            finally:
                for out in files.values():
                    out.close()
            fmt = stored.format
            episode_id = data.column(fmt.physical("episode_id")).to_numpy()
            fragments = fragments_of(episode_id, data.column(fmt.physical("step")).to_numpy())
            fragments.tofile(partial / FRAGMENTS)
            columns = {leaf: {"file": f"{i}.bin", "dtype": kinds[leaf][0].str, "shape": list(kinds[leaf][1])}
                       for i, leaf in enumerate(kinds) if leaf not in nulls}
            (partial / MANIFEST).write_text(json.dumps({"format": FORMAT, **f.meta(), "rows": len(episode_id),
                                                        "fragments": len(fragments), "columns": columns}))
        return True

    def read(self, f: FileId) -> FileArrays | None:
        """The copy of the file ``f``, or None where there is none, it is of another file (path, size, time) or
        it is not whole (files of other sizes than its manifest says)."""
        folder = Path(self.path_of(f.rel))
        try:
            manifest = json.loads((folder / MANIFEST).read_text())
            if manifest.get("format") != FORMAT or not f.named_by(manifest):
                return None
            rows, k = int(manifest["rows"]), int(manifest["fragments"])
            columns = {leaf: (np.dtype(c["dtype"]), tuple(c["shape"]), c["file"])
                       for leaf, c in manifest["columns"].items()}
            for dtype, shape, file in columns.values():
                if (folder / file).stat().st_size != rows * value_bytes(dtype, shape):
                    return None
            if (folder / FRAGMENTS).stat().st_size != 32 * k:
                return None
            fragments = np.fromfile(folder / FRAGMENTS, dtype=np.int64).reshape(k, 4)
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return FileArrays(folder, rows, columns, fragments)


def _owner(folder: Path) -> str | None:
    """The data file the copy in ``folder`` is of, or None where it cannot be read (not a copy, or damaged)."""
    try:
        return str(json.loads((folder / MANIFEST).read_text())["file"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


class _BlockWriter:
    """A file written in whole blocks of ``BLOCK`` bytes at multiples of ``BLOCK`` (the rest at the end): the page
    cache then holds it in 2 MiB folios, which a loader's map reads with one TLB entry each (written as the bytes
    come, at other offsets, about half of it is in small pages, and batches take ~1.5x as long). Whole blocks are
    written straight from the values; only the bytes around a block boundary are copied."""

    def __init__(self, path: Path) -> None:
        self.file = open(path, "wb")
        self.pending = bytearray()

    def write(self, values: np.ndarray) -> None:
        data = memoryview(values).cast("B")  # type: ignore[arg-type]  # typeshed: a Buffer from Python 3.12
        if self.pending:  # complete the block begun before
            head = min(BLOCK - len(self.pending), len(data))
            self.pending += data[:head]
            data = data[head:]
            if len(self.pending) < BLOCK:
                return
            self.file.write(self.pending)
            self.pending = bytearray()
        whole = len(data) - len(data) % BLOCK
        if whole:
            self.file.write(data[:whole])
        self.pending += data[whole:]

    def close(self) -> None:
        try:
            self.file.write(self.pending)
        finally:
            self.file.close()


def _values(data: pa.Table, stored: FileSchema, leaves: set[str], where: str) -> Iterator[tuple[str, Any]]:
    """Each column holding any of ``leaves``: its values as readers get them (:func:`~trajstore.schema.to_numpy`),
    piece by piece in row order, under its logical name; None for a piece with nulls. Where no observation leaf is
    stored as frames (stacks, images), ``next_obs`` is made from ``obs`` shifted by a row and the rows that store
    it (whole-array copies); otherwise the file is decoded as readers decode it."""
    fmt = stored.format
    names = [n for n in stored.logical.names if fmt.physical(n) in data.column_names
             and any(leaf == n or leaf.startswith(n + ".") for leaf in leaves)]
    if fmt.encoded and (fmt.stacks or fmt.images) and {OBS, NEXT} & set(names):
        for batch in _decoded(data, stored, where):
            for name in names:
                column = batch.column(name)
                yield name, None if column.null_count else to_numpy(column)
        return
    for name in names:
        column = data.column(fmt.physical(name))
        if fmt.encoded and name == NEXT:
            yield name, _next_values(data, fmt, leaves, where)
            continue
        for chunk in column.chunks:
            yield name, None if chunk.null_count else to_numpy(chunk)


def _next_values(data: pa.Table, fmt: FileEncoding, leaves: set[str], where: str) -> Any:
    """``next_obs`` of an encoded file whose observation leaves are stored plain, as
    :func:`~trajstore.schema.to_numpy` gives a column (its leaves among ``leaves`` only): each row's next row's
    ``obs`` where ``next_obs`` is null (the file says that row is its episode's next step), the stored value
    elsewhere; None when ``obs`` has nulls."""
    obs = data.column(fmt.physical(OBS)).combine_chunks()
    if obs.null_count:
        return None
    stored = data.column(fmt.physical(NEXT)).combine_chunks()
    valid = stored.is_valid().to_numpy(zero_copy_only=False)
    eid = data.column(fmt.physical("episode_id")).to_numpy()
    step = data.column(fmt.physical("step")).to_numpy()
    follows = np.r_[(eid[1:] == eid[:-1]) & (step[1:] == step[:-1] + 1), False]
    bad = np.flatnonzero(~valid & ~follows)
    if len(bad):
        raise EncodingError(f"{where}: row {bad[0]}: next_obs is null, but the next row is not the same episode's "
                            "next step")
    rows = np.flatnonzero(valid)
    out: dict[str, Any] = {}
    for leaf in sorted(leaf for leaf in leaves if leaf == NEXT or leaf.startswith(NEXT + ".")):
        path = OBS + leaf[len(NEXT):]
        shifted = fixed_numpy(leaf_column(obs, path))
        values = np.empty_like(shifted)
        values[:-1] = shifted[1:]
        values[rows] = fixed_numpy(leaf_column(stored, path))[rows]
        if leaf == NEXT:
            return values
        *parents, name = leaf.split(".")[1:]
        inner = out
        for parent in parents:
            inner = inner.setdefault(parent, {})
        inner[name] = values
    return out


def _decoded(data: pa.Table, stored: FileSchema, where: str) -> Iterator[pa.RecordBatch]:
    """The rows of ``data`` under their logical names, ``obs``/``next_obs`` decoded as readers get them."""
    fmt = stored.format
    names = [n for n in stored.logical.names if fmt.physical(n) in data.column_names]
    batches: Iterator[pa.RecordBatch]
    batches = (pa.record_batch([b.column(fmt.physical(n)) for n in names], names=names)
               for b in data.to_batches(max_chunksize=65_536))
    if fmt.encoded and {OBS, NEXT} & set(names):
        batches = decode_batches(batches, fmt, stored.logical.field(OBS).type, where=where)
    yield from batches
