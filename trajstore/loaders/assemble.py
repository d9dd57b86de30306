"""A batch assembled in one compiled call: the items found in the layout, every column leaf's steps copied out of
its memory span, windows padded and masked, n-step rewards summed.

Both kinds of layout hold each leaf's steps in one span of memory (a built layout's column file mapped, or the
files' array copies stitched side by side, :mod:`~trajstore.loaders.stitched`), cut into **fragments**: runs of
consecutive positions stored one after the other (a built layout is one fragment; stitched copies have one per
run of an episode's steps in a file). :class:`Spans` says where each fragment's steps lie in each leaf's span; a
kernel (:class:`WindowKernel`, :class:`TransitionKernel`: one per iterator, its tables made once) finds each
item's episode (a binary search), walks from the episode's first fragment to the item's, and copies each
window's run of steps inside one fragment as one block of bytes (``memcpy``), a window crossing into the next
fragment in two. Windows read one byte of every block before copying any, so that the cache and TLB misses of
a batch's blocks overlap instead of following one another.

The kernels read and write through raw addresses: every address they compute is inside a fragment of the span
they read or inside the fresh arrays they fill (checked against plain numpy in ``tests/loaders/test_assemble.py``).
A kernel's arrays of addresses are its own, reused by each call: one batch at a time per kernel.
"""

from __future__ import annotations

import ctypes
import logging
import os
import threading
from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic

log = logging.getLogger(__name__)


@intrinsic
def _copy(typingctx: Any, target: Any, source: Any, nbytes: Any) -> Any:
    """Copy ``nbytes`` bytes from address ``source`` to address ``target`` (``llvm.memcpy``)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        byte_ptr = ir.IntType(8).as_pointer()
        cgutils.raw_memcpy(builder, builder.inttoptr(args[0], byte_ptr), builder.inttoptr(args[1], byte_ptr),
                           args[2], 1)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64, types.int64), codegen


@intrinsic
def _zero(typingctx: Any, target: Any, nbytes: Any) -> Any:
    """Set ``nbytes`` bytes from address ``target`` to zero (``llvm.memset``)."""
    def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
        cgutils.memset(builder, builder.inttoptr(args[0], ir.IntType(8).as_pointer()), args[1], 0)
        return context.get_dummy_value()
    return types.void(types.int64, types.int64), codegen


def _load(kind: Any) -> Any:
    """An intrinsic reading the ``kind`` value at an address."""
    @intrinsic
    def load(typingctx: Any, address: Any) -> Any:
        def codegen(context: Any, builder: Any, signature: Any, args: Any) -> Any:
            return builder.load(builder.inttoptr(args[0], context.get_value_type(kind).as_pointer()))
        return kind(types.int64), codegen
    return load


_byte_at, _float32_at, _float64_at = _load(types.uint8), _load(types.float32), _load(types.float64)


class Loading:
    """The kernels of this process (``load`` calls each once), loaded (or compiled) by numba on a thread of their
    own, once: numba's first call in a process sets up its compiler, a few tenths of a second (more with a cold page
    cache). Meanwhile the process's first batch is made by plain numpy (the same values); every later batch waits for
    the kernels. If they cannot be loaded, every batch is made by numpy. A fork waits for the thread (numba's compiler
    lock must not be held by a thread the child lacks)."""

    def __init__(self, load: Callable[[], None] | None = None, what: str = "loader batch kernels") -> None:
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._first_served = False
        self._load_kernels = load or (lambda: _call_kernels())  # (this module's kernels, looked up when loaded)
        self.what = what
        self.loaded = False  # and usable
        self.failed: BaseException | None = None
        os.register_at_fork(before=self.wait)

    def compiled(self, items: int) -> bool:
        """Whether a batch of ``items`` items is made by the kernels (starting to load them if not yet)."""
        if self.loaded:
            return items > 0
        with self._lock:
            thread = self._start()
            if items and not self._first_served and thread.is_alive():
                self._first_served = True
                return False
            if items:
                self._first_served = True
        if not items:
            return False
        self.wait()
        return self.failed is None

    def ready(self) -> bool:
        """Whether the kernels are loaded, never waiting (starting to load them if not yet): callers that have a
        plain numpy way use it until then."""
        if self.loaded:
            return True
        with self._lock:
            self._start()
        return self.loaded

    def usable(self) -> bool:
        """Whether the kernels can be used, waiting for them to load (for work that has no plain numpy way)."""
        if not self.loaded:
            with self._lock:
                self._start()
            self.wait()
        return self.failed is None

    def _start(self) -> threading.Thread:
        if self._thread is None:
            self._thread = threading.Thread(target=self._load, name="trajstore-kernels", daemon=True)
            self._thread.start()
        return self._thread

    def wait(self) -> None:
        thread = self._thread
        if thread is not None and thread is not threading.current_thread():
            thread.join()

    def _load(self) -> None:
        try:
            self._load_kernels()
            self.loaded = True
        except Exception as exc:  # noqa: BLE001 - any failure: numpy makes the batches
            self.failed = exc
            log.warning("%s unavailable (%r): batches are made by numpy", self.what, exc)


_Loading = Loading
LOADING = Loading()


def _call_kernels() -> None:
    """Each kernel called once (on no items): numba loads it from its cache, or compiles it."""
    for dtype in (np.float32, np.float64):  # a reward of either type
        spans = Spans(np.zeros(1), np.ones(1), np.array([0, 1]), {"reward": np.zeros(1, dtype)},
                      {"reward": np.zeros(1)})
        WindowKernel(spans, ["reward"], np.ones(1), np.ones(1), 1, 1).compiled(np.zeros(0, np.int64))
        TransitionKernel(spans, [], [], 1, 1.0, np.zeros(1, np.bool_)).compiled(np.zeros(0, np.int64))


def address_of(values: np.ndarray) -> int:
    """The address of a writable C-contiguous array's first byte (0 for an array of no bytes)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(values)) if values.nbytes else 0  # type: ignore[arg-type]  # typeshed: a Buffer from 3.12


@dataclass
class Spans:
    """Where a layout's steps lie: its episodes (``offset`` and ``length`` in positions), the fragments' first
    positions (``start``, the positions' end last) and, per column leaf, its span (``arrays``: one row per step,
    C-contiguous) and the row of it holding each fragment's first step (``rows``). The spans must stay mapped
    while a kernel reads them."""

    offset: np.ndarray
    length: np.ndarray
    start: np.ndarray
    arrays: dict[str, np.ndarray]
    rows: dict[str, np.ndarray]
    episodes: np.ndarray = field(init=False)  # (offset, length, first fragment) of each episode

    def __post_init__(self) -> None:
        self.offset = np.ascontiguousarray(self.offset, np.int64)
        self.length = np.ascontiguousarray(self.length, np.int64)
        self.start = np.ascontiguousarray(self.start, np.int64)
        self.arrays = {k: np.asarray(v) for k, v in self.arrays.items()}
        self.rows = {k: np.asarray(r, np.int64) for k, r in self.rows.items()}
        first = np.searchsorted(self.start, self.offset, side="right") - 1
        self.episodes = np.ascontiguousarray(np.stack([self.offset, self.length, first], axis=1), np.int64)

    def width(self, leaf: str) -> int:
        """The bytes of one of ``leaf``'s rows."""
        values = self.arrays[leaf]
        return values.dtype.itemsize * int(np.prod(values.shape[1:], dtype=np.int64))

    def gather(self, leaf: str, positions: np.ndarray) -> np.ndarray:
        """``leaf`` at ``positions`` (any shape), by plain numpy: each position's fragment, row and value."""
        fragment = np.searchsorted(self.start, positions, side="right") - 1
        rows = self.rows[leaf][fragment] + positions - self.start[fragment]
        values = self.arrays[leaf]
        return np.take(values, rows.reshape(-1), axis=0).reshape(*positions.shape, *values.shape[1:])

    def table(self, names: Sequence[str]) -> np.ndarray:
        """One row per fragment (and one after the last): its first position ``s``, then for each leaf of
        ``names`` the address position ``p`` of the fragment is at, minus ``p`` times the leaf's width."""
        fragments = len(self.start) - 1
        out = np.zeros((fragments + 1, 1 + len(names)), np.int64)
        out[:, 0] = self.start
        for c, leaf in enumerate(names):
            base = self.arrays[leaf].ctypes.data if self.arrays[leaf].nbytes else 0  # read-only maps too
            out[:fragments, 1 + c] = base + (self.rows[leaf] - self.start[:-1]) * self.width(leaf)
        return out


class _Outputs:
    """Fresh arrays for each batch of leaves ``names`` (a row of each shaped as in ``spans``), and their
    addresses in one array that each batch reuses."""

    def __init__(self, spans: Spans, names: Sequence[str]) -> None:
        self.kinds = [(k, spans.arrays[k].dtype, spans.arrays[k].shape[1:]) for k in names]
        self.addresses = np.zeros(len(names), np.int64)

    def make(self, shape: tuple[int, ...]) -> dict[str, np.ndarray]:
        out = {}
        for c, (name, dtype, row) in enumerate(self.kinds):
            out[name] = values = np.empty((*shape, *row), dtype)
            self.addresses[c] = address_of(values)
        return out


@dataclass
class WindowBatch:
    """Windows: each leaf's ``(n, length, …)`` array, ``mask``, each window's ``episode`` (an index) and first
    step (``start``)."""

    arrays: dict[str, np.ndarray]
    mask: np.ndarray
    episode: np.ndarray
    start: np.ndarray


class WindowKernel:
    """Windows of ``length`` steps of leaves ``names`` of ``spans``, numbered as
    :class:`~trajstore.loaders.sequences.Windows` ``end``, ``count`` and ``stride`` number them: each call makes
    the windows of its items, zero past their episode's end."""

    def __init__(self, spans: Spans, names: Sequence[str], end: np.ndarray, count: np.ndarray, stride: int,
                 length: int) -> None:
        self.spans, self.names, self.length, self.stride = spans, list(names), int(length), int(stride)
        self.end, self.count = np.ascontiguousarray(end, np.int64), np.ascontiguousarray(count, np.int64)
        self.first, self.shift = bucketed(self.end, int(self.end[-1]) if len(self.end) else 0)
        self.table = spans.table(names)
        self.width = np.array([spans.width(k) for k in names], np.int64)
        self.outputs = _Outputs(spans, names)

    def __call__(self, items: np.ndarray) -> WindowBatch:
        return self.compiled(items) if LOADING.compiled(len(items)) else self.plain(items)

    def compiled(self, items: np.ndarray) -> WindowBatch:
        """The windows ``items``, by the kernel."""
        n = len(items)
        batch = WindowBatch(self.outputs.make((n, self.length)), np.empty((n, self.length), np.bool_),
                            np.empty(n, np.int64), np.empty(n, np.int64))
        _windows(np.ascontiguousarray(items, np.int64), self.end, self.first, self.shift, self.count, self.stride,
                 self.length, self.spans.episodes, self.table, self.width, self.outputs.addresses, batch.mask,
                 batch.episode, batch.start)
        return batch

    def plain(self, items: np.ndarray) -> WindowBatch:
        """The windows ``items``, by plain numpy: every step gathered (those past the episode's end zeroed)."""
        items = np.asarray(items, np.int64)
        episode = np.searchsorted(self.end, items, side="right")
        start = (items - (self.end[episode] - self.count[episode])) * self.stride
        keep = np.minimum(self.spans.length[episode] - start, self.length)
        steps = np.arange(self.length, dtype=np.int64)
        mask = steps < keep[:, None]
        positions = (self.spans.offset[episode] + start)[:, None] + np.minimum(steps, keep[:, None] - 1)
        arrays = {}
        for leaf in self.names:
            arrays[leaf] = values = self.spans.gather(leaf, positions)
            values[~mask] = 0
        return WindowBatch(arrays, mask, episode.astype(np.int64), start)


@dataclass
class TransitionBatch:
    """n-step transitions: each leaf's ``(n, …)`` array; ``reward``, ``discount``, ``terminated``, each one's
    ``episode`` (an index) and ``step``."""

    arrays: dict[str, np.ndarray]
    reward: np.ndarray
    discount: np.ndarray
    terminated: np.ndarray
    episode: np.ndarray
    step: np.ndarray


class TransitionKernel:
    """The n-step transitions of ``spans`` (``n`` no longer than its longest episode): each call makes those
    from its positions: leaves ``names`` at step ``t``, leaves ``later`` at ``t + m - 1`` (``m``: the steps summed,
    ``n`` or the episode's last ones); ``reward`` (a float64 sum, cast to the reward's dtype) exactly as numpy sums
    ``rewards * gamma ** k`` over ``k < n`` per row (pairwise; the terms past ``m`` zero), ``terminated``
    (``terminal[episode]`` and its last step within), ``discount`` (``gamma ** m``, 0 when terminated)."""

    def __init__(self, spans: Spans, names: Sequence[str], later: Sequence[str], n: int, gamma: float,
                 terminal: np.ndarray) -> None:
        self.spans, self.n, self.now = spans, int(n), len(names)
        self.names = [*names, *later, "reward"]  # the leaves each call reads
        self.table = spans.table(self.names)
        self.width = np.array([spans.width(k) for k in self.names], np.int64)
        self.terminal = np.ascontiguousarray(terminal, np.bool_)
        self.first, self.shift = bucketed(spans.offset, int(spans.start[-1]) if len(spans.start) else 0)
        self.dtype = spans.arrays["reward"].dtype
        self.weights = gamma ** np.arange(self.n, dtype=np.int64)  # as numpy's n-step rule computes them
        self.powers = np.power(gamma, np.arange(self.n + 1), dtype=np.float64)
        self.outputs = _Outputs(spans, [*names, *later])

    def __call__(self, positions: np.ndarray) -> TransitionBatch:
        return self.compiled(positions) if LOADING.compiled(len(positions)) else self.plain(positions)

    def plain(self, positions: np.ndarray) -> TransitionBatch:
        """The transitions from ``positions``, by plain numpy (the rewards of each as one row, summed)."""
        positions = np.asarray(positions, np.int64)
        episode = np.searchsorted(self.spans.offset, positions, side="right") - 1
        t = positions - self.spans.offset[episode]
        left = self.spans.length[episode] - t
        m = np.minimum(self.n, left)
        k = np.arange(self.n, dtype=np.int64)
        rewards = self.spans.gather("reward", positions[:, None] + np.minimum(k[None, :], m[:, None] - 1))
        reward = (rewards.astype(np.float64) * np.where(k[None, :] < m[:, None], self.weights[None, :], 0.0)).sum(1)
        terminated = self.terminal[episode] & (m == left)
        at = {leaf: positions if c < self.now else positions + m - 1 for c, leaf in enumerate(self.names[:-1])}
        return TransitionBatch({leaf: self.spans.gather(leaf, p) for leaf, p in at.items()}, reward.astype(self.dtype),
                               np.where(terminated, 0.0, self.powers[m]).astype(self.dtype), terminated,
                               episode.astype(np.int64), t)

    def compiled(self, positions: np.ndarray) -> TransitionBatch:
        """The transitions from ``positions``, by the kernel."""
        size = len(positions)
        batch = TransitionBatch(self.outputs.make((size,)), np.empty(size, self.dtype), np.empty(size, self.dtype),
                                np.empty(size, np.bool_), np.empty(size, np.int64), np.empty(size, np.int64))
        _transitions(np.ascontiguousarray(positions, np.int64), self.n, self.now, self.spans.offset, self.first,
                     self.shift, self.spans.episodes, self.terminal, self.table, self.width, self.outputs.addresses,
                     self.dtype.itemsize == 8, self.weights, self.powers, batch.reward, batch.discount,
                     batch.terminated, batch.episode, batch.step)
        return batch


def bucketed(keys: np.ndarray, top: int) -> tuple[np.ndarray, int]:
    """For ``keys`` sorted and values in ``0 .. top - 1``: a ``shift`` giving about one key per ``2 ** shift``
    values, and for each bucket of that many values the index of the last key at or below its first value (-1
    where none). :func:`_last_at_or_below` starts there and walks a step or two, where a binary search over 100k
    episodes takes ~17 dependent reads, each a branch the CPU mispredicts half the time."""
    shift = max(0, (top // max(len(keys), 1)).bit_length() - 1)
    first = np.searchsorted(keys, np.arange(0, max(top, 1), 1 << shift, dtype=np.int64), side="right") - 1
    return np.ascontiguousarray(first, np.int64), shift


@numba.njit(cache=True, nogil=True)
def _last_at_or_below(keys: np.ndarray, first: np.ndarray, shift: int, value: int) -> int:
    """``np.searchsorted(keys, value, side="right") - 1``, from the bucket index of :func:`bucketed`."""
    i = first[min(value >> shift, len(first) - 1)]
    while i + 1 < len(keys) and keys[i + 1] <= value:
        i += 1
    return i


@numba.njit(cache=True, nogil=True)
def _fragment(table: np.ndarray, f: int, position: int) -> int:
    """The fragment holding ``position``, walking on from fragment ``f`` (one at or before it)."""
    while table[f + 1, 0] <= position:
        f += 1
    return f


@numba.njit(cache=True, nogil=True)
def _windows(items: np.ndarray, end: np.ndarray, first: np.ndarray, shift: int, count: np.ndarray, stride: int,
             length: int, episodes: np.ndarray, table: np.ndarray, width: np.ndarray, target: np.ndarray,
             mask: np.ndarray, episode: np.ndarray, begin: np.ndarray) -> int:
    """Each pass over the items a loop of independent reads (their misses overlap): the episodes, their rows, the
    fragments, one byte of every block; then the copies."""
    n, leaves = len(items), len(width)
    position, needed, fragment = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    for i in range(n):
        episode[i] = _last_at_or_below(end, first, shift, items[i]) + 1
    for i in range(n):
        e = episode[i]
        s = (items[i] - (end[e] - count[e])) * stride
        begin[i], needed[i] = s, min(episodes[e, 1] - s, length)  # the window's steps inside its episode
        position[i], fragment[i] = episodes[e, 0] + s, episodes[e, 2]
    for i in range(n):
        fragment[i] = _fragment(table, fragment[i], position[i])
        for j in range(length):
            mask[i, j] = j < needed[i]
    touched = 0
    for c in range(leaves):  # the first byte of every block, before any copy
        if width[c] > 0:
            for i in range(n):
                touched += _byte_at(table[fragment[i], 1 + c] + position[i] * width[c])
    for c in range(leaves):
        w = width[c]
        if w == 0:
            continue
        for i in range(n):
            p, keep, f = position[i], needed[i], fragment[i]
            row = target[c] + i * length * w
            done = 0
            while done < keep:  # the window's run in each fragment it crosses as one block
                take = min(keep - done, table[f + 1, 0] - p - done)
                _copy(row + done * w, table[f, 1 + c] + (p + done) * w, take * w)  # type: ignore[call-arg]  # numba passes typingctx
                done += take
                f += 1
            if keep < length:
                _zero(row + keep * w, (length - keep) * w)  # type: ignore[call-arg]  # numba passes typingctx
    return touched


@numba.njit(cache=True, nogil=True)
def _transitions(positions: np.ndarray, n: int, now: int, offset: np.ndarray, first: np.ndarray, shift: int,
                 episodes: np.ndarray,
                 terminal: np.ndarray, table: np.ndarray, width: np.ndarray, target: np.ndarray, wide: bool,
                 weights: np.ndarray, powers: np.ndarray, reward: np.ndarray, discount: np.ndarray,
                 terminated: np.ndarray, episode: np.ndarray, step: np.ndarray) -> None:
    """Passes as :func:`_windows`' (episodes, their rows, fragments, addresses), then the rewards summed, then
    the copies."""
    size, leaves = len(positions), len(width) - 1  # the last leaf: reward
    summed, fragment, last = np.empty(size, np.int64), np.empty(size, np.int64), np.empty(size, np.int64)
    source = np.empty((leaves, size), np.int64)
    reward_at = np.empty((size, n), np.int64)
    for i in range(size):
        episode[i] = _last_at_or_below(offset, first, shift, positions[i])
    for i in range(size):
        e = episode[i]
        t = positions[i] - episodes[e, 0]
        left = episodes[e, 1] - t
        m = min(n, left)
        ended = terminal[e] and m == left
        step[i], summed[i], fragment[i], terminated[i] = t, m, episodes[e, 2], ended
        discount[i] = 0.0 if ended else powers[m]
    for i in range(size):
        fragment[i] = _fragment(table, fragment[i], positions[i])
        last[i] = _fragment(table, fragment[i], positions[i] + summed[i] - 1)
    w = width[leaves]
    for i in range(size):
        p, f, g, m = positions[i], fragment[i], last[i], summed[i]
        for c in range(leaves):
            source[c, i] = table[f, 1 + c] + p * width[c] if c < now else table[g, 1 + c] + (p + m - 1) * width[c]
        h = f
        for k in range(n):  # as numpy's rule: the terms past m read the last step (and weigh 0)
            x = p + min(k, m - 1)
            h = _fragment(table, h, x)
            reward_at[i, k] = table[h, 1 + leaves] + x * w
    terms, sums = np.empty(n, np.float64), np.empty(8, np.float64)
    for i in range(size):
        for k in range(n):
            r = _float64_at(reward_at[i, k]) if wide else np.float64(_float32_at(reward_at[i, k]))
            terms[k] = r * (weights[k] if k < summed[i] else 0.0)
        if n < 8:  # numpy's pairwise sum of so few: in order, from 0.0
            total = 0.0
            for k in range(n):
                total += terms[k]
            reward[i] = total
        else:
            reward[i] = _pairwise(terms, sums)
    for c in range(leaves):
        if width[c] > 0:
            for i in range(size):
                _copy(target[c] + i * width[c], source[c, i], width[c])  # type: ignore[call-arg]  # numba passes typingctx


@numba.njit(cache=True, nogil=True)
def _block_sum(a: np.ndarray, lo: int, n: int, r: np.ndarray) -> float:
    """``a[lo:lo + n]`` (``n <= 128``) summed as numpy sums a contiguous row of that many: in order below 8
    values, else in 8 running sums (``r``: room for them)."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    for j in range(8):
        r[j] = a[lo + j]
    i = 8
    while i < n - n % 8:
        for j in range(8):
            r[j] += a[lo + i + j]
        i += 8
    res = ((r[0] + r[1]) + (r[2] + r[3])) + ((r[4] + r[5]) + (r[6] + r[7]))
    while i < n:
        res += a[lo + i]
        i += 1
    return res


@numba.njit(cache=True, nogil=True)
def _pairwise(a: np.ndarray, r: np.ndarray) -> float:
    """``a`` summed as numpy's ``add.reduce`` sums a contiguous row: blocks of up to 128 values (
    :func:`_block_sum`), halves (cut at a multiple of 8) added as the recursion of numpy's ``pairwise_sum``
    adds them, evaluated here with a stack."""
    if len(a) <= 128:
        return _block_sum(a, 0, len(a), r)
    todo = [(0, len(a), False)]  # (first value, values, halves summed)
    sums = [0.0]
    sums.pop()
    while todo:
        lo, n, halves = todo.pop()
        if n <= 128:
            sums.append(_block_sum(a, lo, n, r))
        elif halves:
            right = sums.pop()
            sums.append(sums.pop() + right)
        else:
            half = n // 2 - (n // 2) % 8
            todo.append((lo, n, True))
            todo.append((lo + half, n - half, False))
            todo.append((lo, half, False))
    return sums[0]
