"""A batch assembled in one compiled pass: the items found in the layout, every column leaf's steps copied out of
its memory span, windows padded and masked, n-step rewards summed.

Both kinds of layout hold each leaf's steps in one span of memory (a built layout's column file mapped, or the
files' array copies stitched side by side, :mod:`~trajstore.loaders.stitched`), cut into **fragments**: runs of
consecutive positions stored one after the other (a built layout is one fragment; stitched copies have one per
run of an episode's steps in a file). :class:`Spans` says where each fragment's first step lies in each leaf's
span; the kernels find an item's episode (a binary search over the episodes), walk from the episode's first
fragment to the item's, and copy each window's run of steps inside one fragment as one block of bytes
(``memcpy``), a window crossing into the next fragment in two. Reads of a whole batch are issued before its
copies (one byte of each block first), so the cache and TLB misses of its 256 blocks overlap instead of
following one another.

The kernels read through raw addresses: every offset they compute is inside a fragment of the span it reads
(checked against plain numpy in ``tests/loaders/test_assemble.py``).
"""

from __future__ import annotations

import ctypes
from dataclasses import dataclass, field
from typing import Any, Mapping, Sequence

import numba
import numpy as np
from llvmlite import ir
from numba.core import cgutils, types
from numba.extending import intrinsic


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


def address_of(values: np.ndarray) -> int:
    """The address of a writable C-contiguous array's first byte (0 for an array of no bytes)."""
    return ctypes.addressof(ctypes.c_char.from_buffer(values)) if values.nbytes else 0


@dataclass
class Spans:
    """Where a layout's steps lie, for the kernels: its episodes (``offset`` and ``length``, in positions), the
    fragments' first positions (``start``, the positions' end last) and each episode's first fragment
    (``first``); per column leaf its span (``arrays``: one row per step, read through its address), the bytes of a
    row (``width``) and the row holding each fragment's first step (``rows``). The spans must stay mapped while a
    kernel reads them."""

    offset: np.ndarray
    length: np.ndarray
    start: np.ndarray
    first: np.ndarray
    arrays: dict[str, np.ndarray]
    address: dict[str, int]
    width: dict[str, int]
    rows: dict[str, np.ndarray]
    _packed: dict[tuple[str, ...], tuple[np.ndarray, np.ndarray, np.ndarray]] = field(default_factory=dict)

    @classmethod
    def of(cls, offset: np.ndarray, length: np.ndarray, start: np.ndarray, arrays: Mapping[str, np.ndarray],
           rows: Mapping[str, np.ndarray]) -> Spans:
        """The spans of leaves ``arrays`` (C-contiguous) whose fragments start at positions ``start``, fragment
        ``f`` at row ``rows[leaf][f]``, of the episodes at positions ``offset`` of ``length`` steps each."""
        start = np.ascontiguousarray(start, np.int64)
        offset = np.ascontiguousarray(offset, np.int64)
        typed = {k: np.asarray(v) for k, v in arrays.items()}
        return cls(offset, np.ascontiguousarray(length, np.int64), start,
                   (np.searchsorted(start, offset, side="right") - 1).astype(np.int64), typed,
                   {k: int(v.ctypes.data) for k, v in typed.items()},  # read-only maps too
                   {k: v.dtype.itemsize * int(np.prod(v.shape[1:], dtype=np.int64)) for k, v in typed.items()},
                   {k: np.ascontiguousarray(r, np.int64) for k, r in rows.items()})

    def packed(self, names: Sequence[str]) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """What the kernels read of leaves ``names``: their spans' addresses, their widths, and their rows (a row
        of fragments per leaf)."""
        key = tuple(names)
        got = self._packed.get(key)
        if got is None:
            rows = np.stack([self.rows[k] for k in key]) if key else np.zeros((0, len(self.start) - 1), np.int64)
            got = self._packed[key] = (np.array([self.address[k] for k in key], np.int64),
                                       np.array([self.width[k] for k in key], np.int64), rows)
        return got

    def outputs(self, names: Sequence[str], shape: tuple[int, ...]) -> tuple[dict[str, np.ndarray], np.ndarray]:
        """A fresh array of ``shape`` + a row's shape for each leaf of ``names``, and their addresses."""
        out = {k: np.empty((*shape, *self.arrays[k].shape[1:]), self.arrays[k].dtype) for k in names}
        return out, np.array([address_of(v) for v in out.values()], np.int64)


@dataclass
class WindowBatch:
    """Windows: each leaf's ``(n, length, …)`` array, ``mask``, each window's ``episode`` (an index) and first
    step (``start``)."""

    arrays: dict[str, np.ndarray]
    mask: np.ndarray
    episode: np.ndarray
    start: np.ndarray


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


def windows(spans: Spans, names: Sequence[str], items: np.ndarray, end: np.ndarray, count: np.ndarray, stride: int,
            length: int) -> WindowBatch:
    """Windows ``items`` (numbered as :class:`~trajstore.loaders.sequences.Windows` ``end``, ``count`` and
    ``stride`` number them) of ``length`` steps of leaves ``names``, zero past their episode's end."""
    n = len(items)
    out, targets = spans.outputs(names, (n, length))
    batch = WindowBatch(out, np.empty((n, length), np.bool_), np.empty(n, np.int64), np.empty(n, np.int64))
    address, width, rows = spans.packed(names)
    _windows(np.ascontiguousarray(items, np.int64), end, count, stride, length, spans.offset, spans.length,
             spans.start, spans.first, address, width, rows, targets, batch.mask, batch.episode, batch.start)
    return batch


def transitions(spans: Spans, names: Sequence[str], later: Sequence[str], positions: np.ndarray, n: int,
                gamma: float, terminal: np.ndarray) -> TransitionBatch:
    """The n-step transitions from ``positions``: leaves ``names`` at step ``t``, leaves ``later`` at
    ``t + m - 1`` (``m``: the steps summed, ``n`` or the episode's last ones); ``reward`` (a float64 sum, cast to
    the reward's dtype) exactly as numpy sums ``rewards * gamma ** k`` over ``k < n`` per row (pairwise; the
    terms past ``m`` zero), ``terminated`` (``terminal[episode]`` and its last step within), ``discount``
    (``gamma ** m``, 0 when terminated)."""
    size = len(positions)
    out, targets = spans.outputs([*names, *later], (size,))
    dtype = spans.arrays["reward"].dtype
    batch = TransitionBatch(out, np.empty(size, dtype), np.empty(size, dtype), np.empty(size, np.bool_),
                            np.empty(size, np.int64), np.empty(size, np.int64))
    address, width, rows = spans.packed([*names, *later, "reward"])
    weights = gamma ** np.arange(n, dtype=np.int64)  # as numpy's n-step rule computes them
    powers = np.power(gamma, np.arange(n + 1), dtype=np.float64)
    _transitions(np.ascontiguousarray(positions, np.int64), n, len(names), spans.offset, spans.length, terminal,
                 spans.start, spans.first, address, width, rows, targets, dtype.itemsize == 8, weights, powers,
                 batch.reward, batch.discount, batch.terminated, batch.episode, batch.step)
    return batch


@numba.njit(cache=True, nogil=True)
def _fragment(start: np.ndarray, f: int, position: int) -> int:
    """The fragment holding ``position``, walking on from fragment ``f`` (one at or before it)."""
    while start[f + 1] <= position:
        f += 1
    return f


@numba.njit(cache=True, nogil=True)
def _touch(address: np.ndarray, width: np.ndarray, at: np.ndarray, leaves: int) -> int:
    """Read one byte of each block (leaf ``c``'s at byte ``at[c, i]`` of its span) before any is copied: their
    cache and TLB misses overlap."""
    total = 0
    for c in range(leaves):
        if width[c] > 0:
            for i in range(at.shape[1]):
                total += _byte_at(address[c] + at[c, i])
    return total


@numba.njit(cache=True, nogil=True)
def _windows(items: np.ndarray, end: np.ndarray, count: np.ndarray, stride: int, length: int, offset: np.ndarray,
             episode_length: np.ndarray, start: np.ndarray, first: np.ndarray, address: np.ndarray,
             width: np.ndarray, rows: np.ndarray, target: np.ndarray, mask: np.ndarray, episode: np.ndarray,
             begin: np.ndarray) -> int:
    n, leaves = len(items), len(width)
    position, needed, fragment = np.empty(n, np.int64), np.empty(n, np.int64), np.empty(n, np.int64)
    at = np.empty((leaves, n), np.int64)
    for i in range(n):
        e = np.searchsorted(end, items[i], side="right")
        s = (items[i] - (end[e] - count[e])) * stride
        keep = min(episode_length[e] - s, length)  # steps of the window inside its episode
        p = offset[e] + s
        f = _fragment(start, first[e], p)
        position[i], needed[i], fragment[i], episode[i], begin[i] = p, keep, f, e, s
        for j in range(length):
            mask[i, j] = j < keep
        for c in range(leaves):
            at[c, i] = (rows[c, f] + p - start[f]) * width[c]
    touched = _touch(address, width, at, leaves)
    for c in range(leaves):
        w = width[c]
        if w == 0:
            continue
        for i in range(n):
            p, keep, f = position[i], needed[i], fragment[i]
            row = target[c] + i * length * w
            done = 0
            while done < keep:  # the window's run in each fragment it crosses as one block
                take = min(keep - done, start[f + 1] - p - done)
                _copy(row + done * w, address[c] + (rows[c, f] + p + done - start[f]) * w, take * w)
                done += take
                f += 1
            if keep < length:
                _zero(row + keep * w, (length - keep) * w)
    return touched


@numba.njit(cache=True, nogil=True)
def _block_sum(a: np.ndarray, lo: int, n: int) -> float:
    """``a[lo:lo + n]`` (``n <= 128``) summed as numpy sums a contiguous row of that many: in order below 8
    values, else in 8 running sums."""
    if n < 8:
        res = 0.0
        for i in range(lo, lo + n):
            res += a[i]
        return res
    r = np.empty(8, np.float64)
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
def _pairwise(a: np.ndarray) -> float:
    """``a`` summed as numpy's ``add.reduce`` sums a contiguous row: blocks of up to 128 values (
    :func:`_block_sum`), halves (cut at a multiple of 8) added as the recursion of numpy's ``pairwise_sum``
    adds them, evaluated here with a stack."""
    if len(a) <= 128:
        return _block_sum(a, 0, len(a))
    todo = [(0, len(a), False)]  # (first value, values, halves summed)
    sums = [0.0]
    sums.pop()
    while todo:
        lo, n, halves = todo.pop()
        if n <= 128:
            sums.append(_block_sum(a, lo, n))
        elif halves:
            right = sums.pop()
            sums.append(sums.pop() + right)
        else:
            half = n // 2 - (n // 2) % 8
            todo.append((lo, n, True))
            todo.append((lo + half, n - half, False))
            todo.append((lo, half, False))
    return sums[0]


@numba.njit(cache=True, nogil=True)
def _transitions(positions: np.ndarray, n: int, now: int, offset: np.ndarray, episode_length: np.ndarray,
                 terminal: np.ndarray, start: np.ndarray, first: np.ndarray, address: np.ndarray,
                 width: np.ndarray, rows: np.ndarray, target: np.ndarray, wide: bool, weights: np.ndarray,
                 powers: np.ndarray, reward: np.ndarray, discount: np.ndarray, terminated: np.ndarray,
                 episode: np.ndarray, step: np.ndarray) -> int:
    size, leaves = len(positions), len(width) - 1  # the last leaf: reward
    at = np.empty((leaves, size), np.int64)
    summed = np.empty(size, np.int64)
    reward_at = np.empty((size, n), np.int64)
    for i in range(size):
        p = positions[i]
        e = np.searchsorted(offset, p, side="right") - 1
        t = p - offset[e]
        left = episode_length[e] - t
        m = min(n, left)
        f = _fragment(start, first[e], p)
        last = p + m - 1
        g = _fragment(start, f, last)
        for c in range(leaves):
            at[c, i] = (rows[c, f] + p - start[f]) * width[c] if c < now else \
                (rows[c, g] + last - start[g]) * width[c]
        h = f
        for k in range(n):  # as numpy's rule: the terms past m read the last step (and weigh 0)
            x = p + min(k, m - 1)
            h = _fragment(start, h, x)
            reward_at[i, k] = address[leaves] + (rows[leaves, h] + x - start[h]) * width[leaves]
        ended = terminal[e] and m == left
        summed[i], terminated[i], episode[i], step[i] = m, ended, e, t
        discount[i] = 0.0 if ended else powers[m]
    touched = _touch(address, width, at, leaves)
    terms = np.empty(n, np.float64)
    for i in range(size):
        for k in range(n):
            r = _float64_at(reward_at[i, k]) if wide else np.float64(_float32_at(reward_at[i, k]))
            terms[k] = r * (weights[k] if k < summed[i] else 0.0)
        reward[i] = _pairwise(terms)
    for c in range(leaves):
        w = width[c]
        if w == 0:
            continue
        for i in range(size):
            _copy(target[c] + i * w, address[c] + at[c, i], w)
    return touched
