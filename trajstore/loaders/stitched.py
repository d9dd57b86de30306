"""A loader layout stitched from the data files' array copies (:mod:`~trajstore.storage.arrays`): nothing is read
or written before the first batch but the copies' small fragment lists.

The selected episodes are numbered as in a built layout (:class:`~trajstore.loaders.layout.Layout`: sorted by id,
step ``t`` of episode ``e`` at position ``offset[e] + t``), but their steps stay where the copies hold them. Each
column's copies are mapped side by side into one span of memory (:class:`Region`: one reservation, each file mapped
at a page-aligned place in it that is also a whole number of steps from its start), so that one array holds every
step of every file. The fragments (runs of one episode's consecutive steps in one file), sorted by episode and first
step, tile the positions: a position is found in that array by its fragment, and a window inside one fragment is
copied as one block out of it (:mod:`~trajstore.loaders.assemble`; a window crossing from one file into the next,
where a writer's flush cut its episode, as one block per file).

:func:`stitch` gives None where the copies cannot give the selection (a file without a copy, a column or type a
copy lacks, episodes whose fragments do not tile their steps): the loader then builds its layout from Parquet.
"""

from __future__ import annotations

import ctypes
import math
import mmap
import os
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Sequence, TypeVar

import numpy as np

from trajstore.loaders.assemble import Spans
from trajstore.loaders.layout import leaves, take
from trajstore.storage.arrays import FileArrays, value_bytes

PAGE = mmap.PAGESIZE
# each file is mapped at a multiple of this (and of its row width): there the kernel maps a large folio of the page
# cache whole (one TLB entry for 2 MiB, not 512); at 4 KiB alignment batches take ~2.5x as long
HUGE = 2 << 20
SLACK = 64 << 20  # readable zeros after the last file: blocks from its last steps fit
MAX_UNIT = 1 << 30  # a coarser alignment than this (rows of a width with a large odd factor) falls back to pages
_libc = ctypes.CDLL(None, use_errno=True)
_libc.mmap.restype = ctypes.c_void_p
_libc.mmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int, ctypes.c_int, ctypes.c_int, ctypes.c_long]
_libc.munmap.argtypes = [ctypes.c_void_p, ctypes.c_size_t]
_libc.madvise.argtypes = [ctypes.c_void_p, ctypes.c_size_t, ctypes.c_int]
MADV_WILLNEED = 3  # Linux and macOS alike
MADV_DONTNEED = 4  # Linux: drop this process's page-table entries of a range (a file mapping refaults its pages)
MADV_HUGEPAGE = 14  # Linux: a fault here reads the file in 2 MiB folios (the kernel maps each one whole)
MADV_POPULATE_READ = 22  # Linux 5.14+: map every page of a range now (an error elsewhere: nothing is done)
POPULATE_CHUNK = 64 << 20
SMAPS = Path("/proc/self/smaps")  # where Linux says how much of each mapping is mapped 2 MiB at a time
FOLD_BELOW = 0.5  # a file with less of its whole 2 MiB blocks than this so mapped is re-read (Region.fold)
_unfoldable: set[int] = set()  # devices whose files a fold left in small pages: not tried again in this process
# a column's reads ask for their pages ahead (Region.ask) until one takes less than this: its pages were cached
WARM_S = 0.005
MAP_FIXED = 0x10  # Linux and macOS alike
MAP_NORESERVE = getattr(mmap, "MAP_NORESERVE", 0x4000)
FAILED = ctypes.c_void_p(-1).value
T = TypeVar("T")


class Region:
    """Files of ``width``-byte rows mapped (read-only, shared with the page cache) side by side into one reserved
    span of memory, each at a 2 MiB boundary (``HUGE``) a whole number of rows from the span's start: :attr:`array`
    holds them all, file ``k``'s first row at row :attr:`first_row` ``[k]`` (the rows between and after the files
    read as zeros). :meth:`close` unmaps the span; nothing may use :attr:`array` after it.

    Random reads cost a TLB miss per page: the kernel maps a 2 MiB folio of the page cache with one entry, 512
    small ones with 512. Pages read through the span come in 2 MiB folios (``MADV_HUGEPAGE``); :meth:`populate`
    re-reads a file cached in small folios (:meth:`fold`)."""

    def __init__(self, files: Sequence[tuple[Path, int]], width: int, dtype: np.dtype,
                 shape: tuple[int, ...]) -> None:
        unit = math.lcm(max(width, 1), HUGE)
        unit = unit if unit <= MAX_UNIT else math.lcm(max(width, 1), PAGE)
        places, total = [], 0
        for _, nbytes in files:
            places.append(total)
            total += -(-nbytes // unit) * unit
        self.size = max(total, unit) + HUGE + SLACK
        # readable zeros between and after the files: a block read past a file's end (steps a padded window does
        # not need) reads zeros or the next file, never faults; no memory (the kernel's one zero page)
        reserved = _libc.mmap(None, self.size, mmap.PROT_READ, mmap.MAP_PRIVATE | mmap.MAP_ANONYMOUS | MAP_NORESERVE,
                              -1, 0)
        if reserved in (None, FAILED):
            raise OSError(ctypes.get_errno(), f"cannot reserve {self.size} bytes of address space for a layout")
        self.reserved: int | None = reserved
        self.spans: list[tuple[int, int]] = []  # each file's address and bytes
        self.paths: list[Path] = []  # and its path
        self._lock = threading.Lock()  # held by close and by a thread's madvise calls: never one on a closed span
        base = -(-reserved // HUGE) * HUGE
        try:
            for (path, nbytes), place in zip(files, places):
                if nbytes:
                    self._map(path, nbytes, base + place)
                    self.spans.append((base + place, nbytes))
                    self.paths.append(Path(path))
        except BaseException:
            self.close()
            raise
        self.first_row = np.array([place // max(width, 1) for place in places], np.int64)
        usable = self.size - HUGE
        flat = np.frombuffer((ctypes.c_uint8 * (usable - usable % max(width, 1))).from_address(base), np.uint8)  # type: ignore[call-overload]  # a Buffer (typeshed: from 3.12)
        flat.flags.writeable = False
        # steps of no bytes (a shape with a 0): as many as any position asks for, in no memory
        self.array = flat.view(dtype).reshape(-1, *shape) if width else np.zeros((1 << 40, *shape), dtype)

    @staticmethod
    def _map(path: Path, nbytes: int, address: int) -> None:
        fd = os.open(path, os.O_RDONLY)
        try:
            got = _libc.mmap(address, nbytes, mmap.PROT_READ, mmap.MAP_SHARED | MAP_FIXED, fd, 0)
        finally:
            os.close(fd)
        if got != address:
            raise OSError(ctypes.get_errno(), f"cannot map {path} for a layout")
        _libc.madvise(address, nbytes, MADV_HUGEPAGE)  # an error (not Linux, THP off) leaves small folios

    def ask(self, rows: np.ndarray, length: int) -> None:
        """Tell the kernel that rows ``rows[i] .. rows[i] + length - 1`` are about to be read: their pages are
        read from disk all at once (the disk's queue full), not one fault after another as the copy reaches them.
        For a cold page cache (a store just written by another machine, or evicted): a first batch's 768 windows
        fault in ~0.05 s instead of ~1.5 s; once the pages are cached it only costs the calls (~1 ms a batch), so
        a layout's reads ask only until one finds its pages cached (``WARM_S``)."""
        if self.reserved is None or not len(rows):
            return
        width = self.array.strides[0]
        base = self.array.ctypes.data
        starts = (base + rows.astype(np.int64) * width) // PAGE * PAGE
        ends = base + (rows.astype(np.int64) + length) * width
        for start, end in zip(starts.tolist(), ends.tolist()):
            _libc.madvise(start, end - start, MADV_WILLNEED)

    def populate(self) -> None:
        """Map every page of the files into this process now (a thread's work, once their pages are cached):
        without it each batch of a fresh map takes hundreds of page faults, one per 4 KiB page it touches first
        (~0.4 ms a batch, as much as its copies). Then :meth:`fold` the files mapped in small pages."""
        for address, nbytes in list(self.spans):
            if not self._populate(address, nbytes):
                return
        self.fold()

    def _populate(self, address: int, nbytes: int) -> bool:
        """Map ``address .. + nbytes`` in, and read a byte of every page of it: pages the disk has just written
        into memory cost their first reader more under some hypervisors (on this project's VMs a batch took 0.5-2
        ms instead of 0.06 ms until its pages had been read once), and that reader is this thread, not a batch."""
        for at in range(address, address + nbytes, POPULATE_CHUNK):
            size = min(POPULATE_CHUNK, address + nbytes - at)
            with self._lock:
                if self.reserved is None or _libc.madvise(at, size, MADV_POPULATE_READ) != 0:
                    return False
                np.frombuffer((ctypes.c_uint8 * size).from_address(at), np.uint8)[::PAGE].max()  # type: ignore[call-overload]  # a Buffer (typeshed: from 3.12)
        return True

    def fold(self) -> list[Path]:
        """Re-read in 2 MiB folios the files less than half mapped 2 MiB at a time (``FOLD_BELOW`` of their whole
        2 MiB blocks): their pages were cached in small folios (read with ``read()`` by another program, or asked
        for one by one while the cache was cold, :meth:`ask`), and every random read of them costs a TLB miss the
        same rows in 2 MiB pages would not (batches of 3-step transitions of a 20M-step store: 0.10 ms against
        0.08 ms). A file's pages are dropped from this process and, where no other process maps them, from the
        page cache, then read again through the span. Linux only; a device whose files stay small after a fold
        (a file system without large folios) is not tried again. The files folded."""
        if not SMAPS.exists() or not hasattr(os, "posix_fadvise"):
            return []
        mapped = huge_mappings()
        folded, works = [], set()  # devices where a fold gave 2 MiB mappings
        for (address, nbytes), path in zip(list(self.spans), self.paths):
            whole = nbytes // HUGE * HUGE
            if not whole or mapped.get(address, 0) >= FOLD_BELOW * whole:
                continue
            device = self._fold(path, address, nbytes)
            if device is None:
                continue
            if device not in works:  # the first fold on a device: did it work?
                if huge_mappings().get(address, 0) < FOLD_BELOW * whole:
                    _unfoldable.add(device)
                    continue
                works.add(device)
            folded.append(path)
        return folded

    def _fold(self, path: Path, address: int, nbytes: int) -> int | None:
        """Drop ``path``'s pages (mapped at ``address``) and read them again: its device, or None where it was
        not done (the span closed, the file removed, its device unfoldable)."""
        try:
            fd = os.open(path, os.O_RDONLY)
        except OSError:
            return None  # removed since it was mapped: its pages stay as they are
        try:
            device = os.fstat(fd).st_dev
            if device in _unfoldable:
                return None
            with self._lock:
                if self.reserved is None:
                    return None
                _libc.madvise(address, nbytes, MADV_DONTNEED)  # the span's entries: the page cache may drop them
            os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)  # pages another process maps stay
        finally:
            os.close(fd)
        return device if self._populate(address, nbytes) else None

    def close(self) -> None:
        with self._lock:
            if self.reserved is not None:
                _libc.munmap(self.reserved, self.size)
                self.reserved = None


def huge_mappings() -> dict[int, int]:
    """Bytes this process maps 2 MiB at a time (``FilePmdMapped``) in each mapping, by its first address (from
    /proc/self/smaps): a region's file is one mapping, at its address."""
    out: dict[int, int] = {}
    start = None
    with open(SMAPS) as f:
        for line in f:
            if line[0] in "0123456789abcdef":  # a mapping's first line: "start-end perms ..."
                start = int(line[:line.index("-")], 16)
            elif start is not None and line.startswith("FilePmdMapped:"):
                out[start] = int(line.split()[1]) << 10
    return out


@dataclass
class Stitched:
    """The selected episodes (``episode_id`` sorted, ``length``, ``offset``), each column leaf's dtype and shape
    (``columns``) and its :class:`Region`; the fragments tiling the positions: the first position of each
    (``start``, with the total steps after the last) and the row of the region holding it, per leaf (``rows``:
    the files' places in the regions differ by row width)."""

    episode_id: np.ndarray
    length: np.ndarray
    offset: np.ndarray
    columns: dict[str, tuple[np.dtype, tuple[int, ...]]]
    start: np.ndarray
    regions: dict[str, Region] = field(default_factory=dict)
    rows: dict[str, np.ndarray] = field(default_factory=dict)
    cold: set[str] = field(default_factory=set)  # leaves whose reads ask for their pages ahead (see Region.ask)

    @property
    def steps(self) -> int:
        return int(self.start[-1]) if len(self.start) else 0

    def mapped(self) -> StitchedView:
        return StitchedView(self)

    def episode_of(self, positions: np.ndarray) -> np.ndarray:
        return np.searchsorted(self.offset, positions, side="right") - 1

    def gather(self, name: str, positions: np.ndarray) -> Any:
        return self.mapped().gather(name, positions)

    def close(self) -> None:
        for region in self.regions.values():
            region.close()
        self.regions = {}


class StitchedView:
    """A stitched layout as one iterator reads it (the interface of :class:`~trajstore.loaders.layout.Mapped`)."""

    def __init__(self, layout: Stitched) -> None:
        self.layout = layout
        self.episode_id, self.length, self.offset = layout.episode_id, layout.length, layout.offset
        self.columns = layout.columns
        self.steps = layout.steps
        self.longest = int(layout.length.max(initial=1))
        self._last: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
        self._spans: Spans | None = None

    def gather(self, name: str, positions: np.ndarray) -> Any:
        """Column ``name`` at ``positions`` (a dict of its leaves' arrays for a Dict column)."""
        fragment, within = self._found(positions)

        def read(leaf: str) -> np.ndarray:
            rows = self.layout.rows[leaf][fragment] + within
            return self._timed(leaf, rows.reshape(-1), 1,
                               lambda: take(self.layout.regions[leaf].array, rows, self.columns[leaf][1]))

        return leaves(name, self.columns, read)

    @property
    def spans(self) -> Spans:
        """Where the kernels of :mod:`~trajstore.loaders.assemble` find the steps: each leaf's region, and the
        row of it holding each fragment's first step."""
        if self._spans is None:
            self._spans = Spans(self.offset, self.length, self.layout.start,
                                {leaf: region.array for leaf, region in self.layout.regions.items()},
                                self.layout.rows)
        return self._spans

    def copying(self, positions: Callable[[], np.ndarray], length: int, names: Sequence[str],
                copy: Callable[[], T]) -> T:
        """``copy()``, which reads leaves ``names`` at ``length`` steps from each of ``positions()``: while a leaf
        is cold, the pages of those steps asked for first (:meth:`Region.ask`); warm once a copy takes less than
        ``WARM_S``, and its pages mapped in by a thread."""
        if not self.layout.cold:
            return copy()
        cold = [leaf for leaf in names if leaf in self.layout.cold]
        first = positions() if cold else None
        if first is None or not len(first):
            return copy()
        fragment, within = self._found(first)
        for leaf in cold:
            self.layout.regions[leaf].ask(self.layout.rows[leaf][fragment] + within, length)
        started = time.perf_counter()
        out = copy()
        if time.perf_counter() - started < WARM_S:
            for leaf in cold:
                self._warm(leaf)
        return out

    def _warm(self, leaf: str) -> None:
        """``leaf``'s pages are cached: no more asking ahead; its region mapped in ahead of the batches."""
        self.layout.cold.discard(leaf)
        region = self.layout.regions[leaf]
        threading.Thread(target=region.populate, name="trajstore-populate", daemon=True).start()

    def _timed(self, leaf: str, rows: np.ndarray, length: int, copy: Callable[[], np.ndarray]) -> np.ndarray:
        """``copy()``, which reads rows ``rows[i] .. + length - 1`` of ``leaf``: while ``leaf`` is cold, their pages
        asked for ahead first (:meth:`Region.ask`); warm once a copy takes less than ``WARM_S``."""
        if leaf not in self.layout.cold or not len(rows):
            return copy()
        self.layout.regions[leaf].ask(rows, length)
        started = time.perf_counter()
        out = copy()
        if time.perf_counter() - started < WARM_S:
            self._warm(leaf)
        return out

    def _found(self, positions: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """The fragment holding each of ``positions`` and the step's place in it; kept for the next call with the
        same array (a batch asks it of each column)."""
        if self._last is not None and self._last[0] is positions:
            return self._last[1], self._last[2]
        fragment = np.searchsorted(self.layout.start, positions, side="right") - 1
        within = positions - self.layout.start[fragment]
        self._last = (positions, fragment, within)
        return fragment, within

    def episode_of(self, positions: np.ndarray) -> np.ndarray:
        return self.layout.episode_of(positions)

    def close(self) -> None:
        self._spans = None  # the regions are the layout's, unmapped when it is released


def stitch(copies: Sequence[FileArrays | None], columns: dict[str, tuple[np.dtype, tuple[int, ...]]],
           episode_ids: np.ndarray | None) -> Stitched | None:
    """The layout of the column leaves ``columns`` (dtype and shape each) of ``episode_ids`` (sorted; None for
    all) of the files whose copies are ``copies``, or None where the copies cannot give it."""
    if any(c is None for c in copies):
        return None
    held: list[FileArrays] = [c for c in copies if c is not None]
    for leaf, (dtype, shape) in columns.items():
        for c in held:
            kind = c.columns.get(leaf)
            if kind is None or kind[0] != dtype or tuple(kind[1]) != tuple(shape):
                return None
    parts = [np.concatenate([c.fragments, np.full((len(c.fragments), 1), i, np.int64)], axis=1)
             for i, c in enumerate(held)]
    frags = np.concatenate(parts) if parts else np.zeros((0, 5), np.int64)
    if episode_ids is not None:
        frags = frags[np.isin(frags[:, 0], episode_ids)]
    frags = frags[np.lexsort((frags[:, 1], frags[:, 0]))]
    eid, first_step, rows = frags[:, 0], frags[:, 1], frags[:, 3]
    start = np.concatenate([[0], np.cumsum(rows)]).astype(np.int64)
    new = np.concatenate([[True], eid[1:] != eid[:-1]]) if len(eid) else np.zeros(0, bool)
    heads = np.flatnonzero(new)
    begins = np.repeat(start[heads], np.diff(np.concatenate([heads, [len(eid)]])))
    if not np.array_equal(first_step, start[:-1] - begins):
        return None  # steps missing or repeated: the build from Parquet says which
    episode_id = eid[heads]
    offset = start[heads]
    length = np.diff(np.concatenate([offset, [start[-1]]])).astype(np.int64)
    layout = Stitched(episode_id, length, offset.astype(np.int64), dict(columns), start, cold=set(columns))
    try:
        for leaf, (dtype, shape) in columns.items():
            width = value_bytes(dtype, shape)
            region = Region([c.file(leaf) for c in held], width, dtype, shape)
            layout.regions[leaf] = region
            layout.rows[leaf] = region.first_row[frags[:, 4]] + frags[:, 2]
    except BaseException:
        layout.close()
        raise
    return layout
