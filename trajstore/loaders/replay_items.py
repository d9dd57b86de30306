"""The items a replay holds (:mod:`~trajstore.loaders.replay`), each in a slot, and how they are found again.

An item is known by its **key**: its episode's id, its agent (a code: the agent's index among those chosen; 0 for a
single-agent replay) and its first step (``start``). Its **handle** (the ``index`` a batch gives) is the number of
items registered before it, so handles never change however the store grows: a replay with a ``capacity`` keeps
item ``h`` in slot ``h % capacity`` until item ``h + capacity`` takes that slot (first in, first out), one without
keeps it in slot ``h``.

Items are registered in **runs**: the new items of one trajectory (an episode, or an agent's own rows of one) found
at once, its items ``index .. index + count - 1`` (numbered as its loader numbers them,
:class:`~trajstore.loaders.sequences.Items`: the ``k``-th starts at step ``k · stride``) under consecutive handles. A
replay made over 10M steps holds one run per episode, nothing per item; a replay that follows a store adds a run per
trajectory that grew at each look. A handle's key is found from its run (a binary search over the runs), a key's
handle from the runs sorted by key. What each trajectory has registered is counted, so that a trajectory whose loader
counts more items than were registered gets the new ones (:meth:`Registry.new_runs`), and one that left the
selection (a deleted run) has its slots emptied.
"""

from __future__ import annotations

from dataclasses import dataclass, fields

import numba
import numpy as np

from trajstore.loaders.assemble import Loading
from trajstore.loaders.sumtree import grown_room


@dataclass
class Keys:
    """Items by key (arrays of one length): ``episode`` ids (int64), ``agent`` codes (int32), ``start`` steps
    (int32, as steps are stored)."""

    episode: np.ndarray
    agent: np.ndarray
    start: np.ndarray

    @classmethod
    def empty(cls) -> Keys:
        return cls(np.zeros(0, np.int64), np.zeros(0, np.int32), np.zeros(0, np.int32))

    def __len__(self) -> int:
        return len(self.episode)

    def take(self, at: np.ndarray) -> Keys:
        return Keys(self.episode[at], self.agent[at], self.start[at])


@dataclass
class Runs:
    """Runs of items: ``count`` items of the trajectory (``episode``, ``agent``), its items ``index .. index + count
    - 1``, under the handles ``handle .. handle + count - 1``."""

    episode: np.ndarray
    agent: np.ndarray
    index: np.ndarray
    count: np.ndarray
    handle: np.ndarray

    @classmethod
    def empty(cls) -> Runs:
        z = np.zeros(0, np.int64)
        return cls(z, np.zeros(0, np.int32), z, z, z)

    def __len__(self) -> int:
        return len(self.episode)

    def take(self, at: np.ndarray | slice) -> Runs:
        return Runs(*(getattr(self, f.name)[at] for f in fields(self)))

    @property
    def nbytes(self) -> int:
        return sum(getattr(self, f.name).nbytes for f in fields(self))


class Registry:
    """Every item a replay registered, in runs (see the module), and what each trajectory has registered; the slots
    (with a ``capacity``, a ring of that many) its tree weighs. Items start ``stride`` steps apart."""

    def __init__(self, capacity: int | None, stride: int) -> None:
        self.capacity, self.stride = capacity, int(stride)
        self.room = capacity or 0  # the slots the tree needs room for
        self.total = 0  # items ever registered: the next handle
        self.runs = Runs.empty()  # in handle order; those wholly taken by newer items dropped
        self.seen = Keys.empty()  # per trajectory registered (sorted by episode, agent; start unused)
        self.seen_count = np.zeros(0, np.int64)  # how many of its items

    @property
    def nbytes(self) -> int:
        return self.runs.nbytes + self.seen.episode.nbytes + self.seen.agent.nbytes + self.seen_count.nbytes

    def held(self) -> int:
        """How many slots hold an item registered (emptied ones too)."""
        return self.total if self.capacity is None else min(self.total, self.capacity)

    def slots(self, handles: np.ndarray) -> np.ndarray:
        return handles if self.capacity is None else handles % self.capacity

    def handles(self, slots: np.ndarray) -> np.ndarray:
        """The handle of the item each of ``slots`` holds."""
        if self.capacity is None:
            return slots
        return slots + self.capacity * ((self.total - 1 - slots) // self.capacity)

    def issued(self, handles: np.ndarray) -> np.ndarray:
        """Whether each handle was given (>= 0, below the next one)."""
        return (handles >= 0) & (handles < self.total)

    def kept(self, handles: np.ndarray) -> np.ndarray:
        """Whether each handle (one given) still has its slot: not taken by a newer item."""
        return handles >= self._oldest()

    def keys(self, handles: np.ndarray) -> Keys:
        """The keys of the items of ``handles`` (kept ones)."""
        run = np.searchsorted(self.runs.handle, handles, side="right") - 1
        index = self.runs.index[run] + handles - self.runs.handle[run]
        return Keys(self.runs.episode[run], self.runs.agent[run], (index * self.stride).astype(np.int32))

    def handles_of(self, keys: Keys) -> np.ndarray:
        """The handle of each item of ``keys`` the replay holds, -1 for one it does not."""
        out = np.full(len(keys), -1, np.int64)
        if not len(self.runs) or not len(keys):
            return out
        if KERNELS.usable():
            runs = self.runs.take(self._by_key())
            _handles_of(runs.episode, runs.agent, runs.index, runs.count, runs.handle, self.stride, self._oldest(),
                        *_kernel_keys(keys), out)
            return out
        return self.handles_of_numpy(keys)

    def scatter(self, keys: Keys, values: np.ndarray, first: int, out: np.ndarray) -> None:
        """``out[h - first]`` set to the value of each item of ``keys`` the replay holds under a handle ``h`` in
        ``first .. first + len(out) - 1``, in order: a later key's value over an earlier one's of the same item."""
        if not len(self.runs) or not len(keys):
            return
        if KERNELS.usable():
            runs = self.runs.take(self._by_key())
            _scatter(runs.episode, runs.agent, runs.index, runs.count, runs.handle, self.stride, self._oldest(),
                     *_kernel_keys(keys), np.asarray(values, np.float64), int(first), out)
            return
        handles = self.handles_of_numpy(keys)
        hit = (handles >= first) & (handles < first + len(out))
        out[handles[hit] - first] = np.asarray(values)[hit]

    def handles_of_numpy(self, keys: Keys) -> np.ndarray:
        """:meth:`handles_of` by whole-array numpy passes (the kernels' reference, and their stand-in when numba
        cannot load them)."""
        out = np.full(len(keys), -1, np.int64)
        aligned = keys.start % self.stride == 0
        if not len(self.runs) or not aligned.any():
            return out
        runs = self.runs.take(self._by_key())
        index = (keys.start // self.stride).astype(np.int64)
        at = last_at_or_below(Keys(runs.episode, runs.agent, runs.index), Keys(keys.episode, keys.agent, index))
        ok = aligned & (at >= 0)
        run = np.maximum(at, 0)
        ok &= (runs.episode[run] == keys.episode) & (runs.agent[run] == keys.agent) & \
            (index < runs.index[run] + runs.count[run])
        handle = runs.handle[run] + index - runs.index[run]
        ok &= self.kept(handle)
        out[ok] = handle[ok]
        return out

    def _by_key(self) -> np.ndarray:
        """The order of the runs by (episode, agent, index); runs of equal keys as registered."""
        return np.lexsort((self.runs.index, self.runs.agent, self.runs.episode))

    def _oldest(self) -> int:
        """The oldest handle still held."""
        return self.total - self.held()

    def new_runs(self, trajectories: Keys, count: np.ndarray, order: np.ndarray | None = None) -> tuple[Runs, Keys]:
        """The items of ``trajectories`` (sorted; ``start`` unused) not registered yet, given that each has ``count``
        items: a run per trajectory that has more (in ``order``, a permutation of them, or as they come); and the
        trajectories registered before that are not among them any more. What is registered becomes
        ``trajectories`` and ``count``."""
        count = np.asarray(count, np.int64)
        before = np.zeros(len(trajectories), np.int64)
        found = np.zeros(len(self.seen), np.bool_)
        if len(self.seen):  # (none registered yet: nothing to match)
            at = find(self.seen, trajectories, starts=False)
            hit = at >= 0
            before[hit] = self.seen_count[at[hit]]
            found[at[hit]] = True
        gone = self.seen.take(np.flatnonzero(~found))
        self.seen, self.seen_count = Keys(trajectories.episode, trajectories.agent, trajectories.start), count
        new = np.maximum(count - before, 0)
        order = np.arange(len(new)) if order is None else np.asarray(order, np.int64)
        order = order[new[order] > 0]
        runs = Runs(trajectories.episode[order], trajectories.agent[order], before[order], new[order],
                    np.full(len(order), -1, np.int64))
        return runs, gone

    def add(self, runs: Runs) -> tuple[int, int]:
        """Register ``runs`` (oldest first) as the newest items: the first handle they get and how many (with a
        capacity, the last ``capacity`` items alone: the others would be taken at once). The room of a replay without
        one grows (to the size asked for the first time, doubling after)."""
        counts = runs.count
        if self.capacity is not None and counts.sum() > self.capacity:  # the oldest of them never held
            skip = int(counts.sum()) - self.capacity
            ends = np.cumsum(counts)
            first = int(np.searchsorted(ends, skip, side="right"))
            runs = runs.take(slice(first, None))
            cut = skip - (int(ends[first - 1]) if first else 0)
            runs.index, runs.count = runs.index.copy(), runs.count.copy()
            runs.index[0] += cut
            runs.count[0] -= cut
            self.total += skip
            counts = runs.count
        start, added = self.total, int(counts.sum())
        runs.handle = start + np.cumsum(counts) - counts
        self.runs = _joined(self.runs, runs)
        self.total += added
        if self.capacity is None and self.total > self.room:
            self.room = self.total if self.room == 0 else grown_room(self.total, self.room)
        elif self.capacity is not None:
            self._forget_taken()
        return start, added

    def _forget_taken(self) -> None:
        """Drop the runs whose every item a newer one has replaced, once they are half of the runs."""
        oldest = self._oldest()
        taken = int(np.searchsorted(self.runs.handle + self.runs.count, oldest, side="right"))
        if taken and taken * 2 >= len(self.runs):
            self.runs = self.runs.take(slice(taken, None))

    def slot_runs(self, first: int, count: int) -> list[tuple[int, int, int]]:
        """The slots of handles ``first .. first + count - 1`` as runs of consecutive slots: ``(lo, hi, offset)``,
        ``offset`` the place of slot ``lo``'s handle among them (one run, or two where the ring wraps)."""
        if not count:
            return []
        if self.capacity is None:
            return [(first, first + count, 0)]
        lo = first % self.capacity
        head = min(count, self.capacity - lo)
        return [(lo, lo + head, 0)] + ([(0, count - head, head)] if head < count else [])

    def slots_of(self, trajectories: Keys) -> np.ndarray:
        """The slots holding items of ``trajectories`` (whole trajectories: ``start`` unused)."""
        mine = find(trajectories, Keys(self.runs.episode, self.runs.agent, np.zeros(len(self.runs), np.int32)),
                    starts=False) >= 0
        runs = self.runs.take(np.flatnonzero(mine))
        if not len(runs):
            return np.zeros(0, np.int64)
        handles = np.concatenate([np.arange(h, h + c, dtype=np.int64) for h, c in zip(runs.handle, runs.count)])
        return self.slots(handles[self.kept(handles)])


def _joined(a: Runs, b: Runs) -> Runs:
    if not len(a):
        return b
    return Runs(*(np.concatenate([getattr(a, f.name), getattr(b, f.name)]) for f in fields(a)))


def find(sorted_keys: Keys, query: Keys, *, starts: bool = True) -> np.ndarray:
    """The index of each of ``query`` among ``sorted_keys`` (in key order), -1 where absent; with ``starts=False``
    by episode and agent alone."""
    out = np.empty(len(query), np.int64)
    if KERNELS.ready():
        _find(sorted_keys.episode, sorted_keys.agent, sorted_keys.start, query.episode, query.agent, query.start,
              bool(starts), out)
        return out
    lo = _searched(sorted_keys, query, starts)
    at = np.minimum(lo, max(len(sorted_keys) - 1, 0))
    hit = (lo < len(sorted_keys)) & (sorted_keys.episode[at] == query.episode) & \
        (sorted_keys.agent[at] == query.agent) & (~np.bool_(starts) | (sorted_keys.start[at] == query.start))
    out[:] = np.where(hit, lo, -1)
    return out


def last_at_or_below(sorted_keys: Keys, query: Keys) -> np.ndarray:
    """For each of ``query``, the index of the last of ``sorted_keys`` at or before it in key order (-1: none)."""
    out = np.empty(len(query), np.int64)
    if KERNELS.usable():
        _last_at_or_below(sorted_keys.episode, sorted_keys.agent, sorted_keys.start, query.episode, query.agent,
                          query.start, out)
        return out
    return _searched(sorted_keys, query, True, right=True) - 1


def _searched(sorted_keys: Keys, query: Keys, starts: bool, *, right: bool = False) -> np.ndarray:
    """Where each of ``query`` would go among ``sorted_keys`` (before equal ones; after them with ``right``): a
    binary search of every query at once, in numpy."""
    lo, hi = np.zeros(len(query), np.int64), np.full(len(query), len(sorted_keys), np.int64)
    while (lo < hi).any():
        mid = (lo + hi) >> 1
        at = np.minimum(mid, max(len(sorted_keys) - 1, 0))
        e, a, s = sorted_keys.episode[at], sorted_keys.agent[at], sorted_keys.start[at]
        same = (e == query.episode) & (a == query.agent)
        last = (s <= query.start) if right else (s < query.start)
        below = (e < query.episode) | ((e == query.episode) & (a < query.agent)) | (
            same & (last if starts else np.bool_(right)))
        moving = lo < hi
        lo = np.where(moving & below, mid + 1, lo)
        hi = np.where(moving & ~below, mid, hi)
    return lo


@numba.njit(cache=True, nogil=True)
def _before(e1: int, a1: int, s1: int, e2: int, a2: int, s2: int, starts: bool) -> bool:
    if e1 != e2:
        return e1 < e2
    if a1 != a2 or not starts:
        return a1 < a2
    return s1 < s2


@numba.njit(cache=True, nogil=True)
def _find(ke: np.ndarray, ka: np.ndarray, ks: np.ndarray, qe: np.ndarray, qa: np.ndarray, qs: np.ndarray,
          starts: bool, out: np.ndarray) -> None:
    n = len(ke)
    for i in range(len(qe)):
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) >> 1
            if _before(ke[mid], ka[mid], ks[mid], qe[i], qa[i], qs[i], starts):
                lo = mid + 1
            else:
                hi = mid
        out[i] = lo if lo < n and ke[lo] == qe[i] and ka[lo] == qa[i] and (not starts or ks[lo] == qs[i]) else -1


@numba.njit(cache=True, nogil=True)
def _last_at_or_below(ke: np.ndarray, ka: np.ndarray, ks: np.ndarray, qe: np.ndarray, qa: np.ndarray,
                      qs: np.ndarray, out: np.ndarray) -> None:
    n = len(ke)
    for i in range(len(qe)):
        lo, hi = 0, n
        while lo < hi:
            mid = (lo + hi) >> 1
            if not _before(qe[i], qa[i], qs[i], ke[mid], ka[mid], ks[mid], True):  # ke[mid] at or before the query
                lo = mid + 1
            else:
                hi = mid
        out[i] = lo - 1


def _kernel_keys(keys: Keys) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``keys``' arrays in the types the kernels are compiled for (no copy when they have them)."""
    return np.asarray(keys.episode, np.int64), np.asarray(keys.agent, np.int32), np.asarray(keys.start, np.int32)


@numba.njit(cache=True, nogil=True)
def _run_of(re: np.ndarray, ra: np.ndarray, ri: np.ndarray, e: int, a: int, index: int, guess: int) -> int:
    """The last of the runs (sorted by key) at or before item ``index`` of (``e``, ``a``) in key order (-1: none):
    ``guess`` if it is (keys in order mostly fall in the run of the one before: not searched for again)."""
    n = len(re)
    if 0 <= guess < n and not _before(e, a, index, re[guess], ra[guess], ri[guess], True) and (
            guess + 1 == n or _before(e, a, index, re[guess + 1], ra[guess + 1], ri[guess + 1], True)):
        return guess
    lo, hi = 0, n
    while lo < hi:
        mid = (lo + hi) >> 1
        if not _before(e, a, index, re[mid], ra[mid], ri[mid], True):  # run mid at or before the item
            lo = mid + 1
        else:
            hi = mid
    return lo - 1


# The kernels below are one loop each, the within-run check written in both: the run found kept in a local, and no
# call per key that returns a handle (such a helper, numba-compiled, made them 4-5x slower).
@numba.njit(cache=True, nogil=True)
def _handles_of(re: np.ndarray, ra: np.ndarray, ri: np.ndarray, rc: np.ndarray, rh: np.ndarray, stride: int,
                oldest: int, qe: np.ndarray, qa: np.ndarray, qs: np.ndarray, out: np.ndarray) -> None:
    run = -1
    for i in range(len(qe)):
        e, a, start = qe[i], qa[i], qs[i]
        index = start // stride  # (one division, not % and //: dividing by a stride not known when compiled is slow)
        out[i] = -1
        if index * stride != start:
            continue
        run = _run_of(re, ra, ri, e, a, index, run)
        if run < 0 or re[run] != e or ra[run] != a or index >= ri[run] + rc[run]:
            continue
        handle = rh[run] + index - ri[run]
        if handle >= oldest:
            out[i] = handle


@numba.njit(cache=True, nogil=True)
def _scatter(re: np.ndarray, ra: np.ndarray, ri: np.ndarray, rc: np.ndarray, rh: np.ndarray, stride: int,
             oldest: int, qe: np.ndarray, qa: np.ndarray, qs: np.ndarray, values: np.ndarray, first: int,
             out: np.ndarray) -> None:
    run, n = -1, len(out)
    for i in range(len(qe)):
        e, a, start = qe[i], qa[i], qs[i]
        index = start // stride
        if index * stride != start:
            continue
        run = _run_of(re, ra, ri, e, a, index, run)
        if run < 0 or re[run] != e or ra[run] != a or index >= ri[run] + rc[run]:
            continue
        handle = rh[run] + index - ri[run]
        if handle >= oldest and first <= handle < first + n:
            out[handle - first] = values[i]


def _warm() -> None:
    """Each kernel called once: numba loads it from its cache, or compiles it."""
    one = Keys(np.zeros(1, np.int64), np.zeros(1, np.int32), np.zeros(1, np.int32))
    _find(one.episode, one.agent, one.start, one.episode, one.agent, one.start, True, np.zeros(1, np.int64))
    index = np.zeros(1, np.int64)
    _last_at_or_below(one.episode, one.agent, index, one.episode, one.agent, index, np.zeros(1, np.int64))
    _handles_of(one.episode, one.agent, index, index, index, 1, 0, one.episode, one.agent, one.start,
                np.zeros(1, np.int64))
    _scatter(one.episode, one.agent, index, index, index, 1, 0, one.episode, one.agent, one.start, np.zeros(1),
             0, np.zeros(1))


# a replay's first items are found by numpy while numba loads these on a thread (as the loaders' kernels load)
KERNELS = Loading(_warm, "replay item kernels")
