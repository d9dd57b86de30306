"""The items a replay holds (:mod:`~trajstore.loaders.replay`), each in a slot, and how they are found again.

An item is known by its **key**: its episode's id, its agent (a code: the agent's index among those chosen; 0 for a
single-agent replay) and its first step (``start``). Its **handle** (the ``index`` a batch gives) is the number of
items registered before it, so handles never change however the store grows: a replay with a ``capacity`` keeps
item ``h`` in slot ``h % capacity`` until item ``h + capacity`` takes that slot (first in, first out), one without
keeps it in slot ``h``. Each slot holds its item's key (8 + 4 + 4 bytes); nothing is kept per step of the store.

What is registered is counted per trajectory (an episode, or an agent's own rows of one): the items of a trajectory
are numbered ``0, 1, …`` as its loader numbers them (:class:`~trajstore.loaders.sequences.Items`), and a trajectory
whose loader now counts more items than were registered gets the new ones (:meth:`Registry.new_items`). A trajectory
that left the selection (a deleted run) has its slots emptied.
"""

from __future__ import annotations

from dataclasses import dataclass

import numba
import numpy as np

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

    def sorted(self) -> bool:
        """Whether the keys are in order (episode, agent, start)."""
        return bool(_in_order(self.episode, self.agent, self.start))

    def order(self) -> np.ndarray:
        """The permutation that sorts the keys."""
        return np.lexsort((self.start, self.agent, self.episode))


class Registry:
    """Every item a replay registered: the slots (with a ``capacity``, a ring of that many) and what each trajectory
    has registered."""

    def __init__(self, capacity: int | None) -> None:
        self.capacity = capacity
        self.room = capacity or 0
        self.episode = np.zeros(self.room, np.int64)
        self.agent = np.zeros(self.room, np.int32)
        self.start = np.zeros(self.room, np.int32)
        self.total = 0  # items ever registered: the next handle
        # per trajectory registered (sorted by episode, agent): how many of its items
        self.seen = Keys.empty()

    @property
    def nbytes(self) -> int:
        return self.episode.nbytes + self.agent.nbytes + self.start.nbytes + 16 * len(self.seen)

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
        return handles >= self.total - self.held()

    def keys(self, slots: np.ndarray) -> Keys:
        return Keys(self.episode[slots], self.agent[slots], self.start[slots])

    def add(self, keys: Keys) -> tuple[int, int]:
        """Register ``keys`` (oldest first) as the newest items: the first handle they get and how many (with a
        capacity, the last ``capacity`` of them alone: the others would be taken at once). Grows the slots of a
        replay without one (to the size asked for the first time, doubling after)."""
        if self.capacity is not None and len(keys) > self.capacity:
            skipped = len(keys) - self.capacity
            self.total += skipped
            keys = keys.take(np.arange(skipped, len(keys)))
        first, count = self.total, len(keys)
        if self.capacity is None and self.room == 0 and keys.start.dtype == np.int32:  # the first: kept as they are
            self.episode, self.agent, self.start, self.room = keys.episode, keys.agent, keys.start, count
            self.total = count
            return first, count
        if self.capacity is None and first + count > self.room:
            self._grow(first + count if self.room == 0 else grown_room(first + count, self.room))
        for lo, hi, at in self.runs(first, count):
            self.episode[lo:hi], self.agent[lo:hi], self.start[lo:hi] = \
                keys.episode[at:at + hi - lo], keys.agent[at:at + hi - lo], keys.start[at:at + hi - lo]
        self.total += count
        return first, count

    def runs(self, first: int, count: int) -> list[tuple[int, int, int]]:
        """The slots of handles ``first .. first + count - 1`` as runs of consecutive slots: ``(lo, hi, offset)``,
        ``offset`` the place of handle ``lo``'s among them (one run, or two where the ring wraps)."""
        if not count:
            return []
        if self.capacity is None:
            return [(first, first + count, 0)]
        lo = first % self.capacity
        head = min(count, self.capacity - lo)
        return [(lo, lo + head, 0)] + ([(0, count - head, head)] if head < count else [])

    def _grow(self, room: int) -> None:
        for name in ("episode", "agent", "start"):
            old = getattr(self, name)
            new = np.zeros(room, old.dtype)
            new[:len(old)] = old
            setattr(self, name, new)
        self.room = room

    def new_items(self, trajectories: Keys, count: np.ndarray, stride: int,
                  order: np.ndarray | None = None) -> tuple[Keys, Keys]:
        """The items of ``trajectories`` (sorted; ``start`` unused) not registered yet, given that each has ``count``
        items starting ``stride`` steps apart, trajectory by trajectory (in ``order``, a permutation of them, or as
        they come) and in step order; and the trajectories registered before that are not among them any more. What
        is registered becomes ``trajectories`` and ``count``."""
        count = np.asarray(count, np.int64)
        before = np.zeros(len(trajectories), np.int64)
        found = np.zeros(len(self.seen), np.bool_)
        _merge(self.seen.episode, self.seen.agent, self.seen.start, trajectories.episode, trajectories.agent, before,
               found)
        gone = self.seen.take(np.flatnonzero(~found))
        self.seen = Keys(trajectories.episode, trajectories.agent, count)
        new = np.maximum(count - before, 0)
        if order is None:
            order = np.arange(len(new), dtype=np.int64)
        total = int(new.sum())
        out = Keys(np.empty(total, np.int64), np.empty(total, np.int32), np.empty(total, np.int32))
        _expand(trajectories.episode, trajectories.agent, new, before, np.asarray(order, np.int64), int(stride),
                out.episode, out.agent, out.start)
        return out, gone

    def slots_of(self, trajectories: Keys) -> np.ndarray:
        """The slots holding items of ``trajectories`` (keys of whole trajectories: ``start`` unused)."""
        held = self.held()
        mine = np.isin(self.episode[:held], trajectories.episode)
        candidates = np.flatnonzero(mine)
        if not len(candidates):
            return candidates
        at = find(trajectories, Keys(self.episode[candidates], self.agent[candidates],
                                     np.zeros(len(candidates), np.int32)), starts=False)
        return candidates[at >= 0]


def find(sorted_keys: Keys, query: Keys, *, starts: bool = True) -> np.ndarray:
    """The index of each of ``query`` among ``sorted_keys`` (in key order), -1 where absent; with ``starts=False``
    by episode and agent alone."""
    out = np.empty(len(query), np.int64)
    _find(sorted_keys.episode, sorted_keys.agent, sorted_keys.start, query.episode, query.agent, query.start,
          bool(starts), out)
    return out


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
def _merge(se: np.ndarray, sa: np.ndarray, sc: np.ndarray, te: np.ndarray, ta: np.ndarray, before: np.ndarray,
           found: np.ndarray) -> None:
    """For sorted trajectories ``(te, ta)``, the count ``sc`` registered for each (0 if none) among the sorted
    registered ``(se, sa)``, and whether each registered one is among them."""
    i = 0
    for j in range(len(te)):
        while i < len(se) and (se[i] < te[j] or (se[i] == te[j] and sa[i] < ta[j])):
            i += 1
        if i < len(se) and se[i] == te[j] and sa[i] == ta[j]:
            before[j] = sc[i]
            found[i] = True


@numba.njit(cache=True, nogil=True)
def _expand(episode: np.ndarray, agent: np.ndarray, new: np.ndarray, before: np.ndarray, order: np.ndarray,
            stride: int, out_episode: np.ndarray, out_agent: np.ndarray, out_start: np.ndarray) -> None:
    """The new items of each trajectory, trajectory by trajectory in ``order``: ``new[t]`` items from its index
    ``before[t]`` on, starting ``stride`` steps apart."""
    k = 0
    for j in range(len(order)):
        t = order[j]
        for i in range(new[t]):
            out_episode[k] = episode[t]
            out_agent[k] = agent[t]
            out_start[k] = (before[t] + i) * stride
            k += 1


@numba.njit(cache=True, nogil=True)
def _in_order(e: np.ndarray, a: np.ndarray, s: np.ndarray) -> bool:
    for i in range(1, len(e)):
        if _before(e[i], a[i], s[i], e[i - 1], a[i - 1], s[i - 1], True):
            return False
    return True
