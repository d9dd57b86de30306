"""The order a training loader visits its items (windows, transitions) in one epoch: enumerated, shuffled by
``(seed, epoch)`` or sampled with replacement by weight, cut into the shard of one rank, and where a stopped
iterator resumes.

Items are numbered ``0 … n-1`` in storage-independent order (episodes by id, steps ascending). One epoch's
order is a permutation of them (``shuffle``), a seeded draw of ``num_samples`` of them with replacement
weighted by :class:`Weights`, or the plain enumeration; a rank takes every ``world_size``-th entry from its own
``rank`` on, so shards are disjoint, cover the order, and differ in size by at most one item.

An order is never a list of its items: its entries are computed block by block as the batches reach them, so it
holds ``BLOCK`` items whatever ``n`` (50M windows would be 400 MB as an int64 array, recomputed each epoch). The
shuffle is a keyed pseudo-random permutation of ``[0, n)`` (:class:`Permutation`, a Feistel network over the
next power of 4, cycle-walked into range); weighted draws come in seeded blocks of ``BLOCK`` draws.

>>> epoch_order(5, shuffle=False, seed=0, epoch=0, rank=1, world_size=2).take(0, 2).tolist()
[1, 3]
>>> sorted(epoch_order(5, shuffle=True, seed=0, epoch=3, rank=0, world_size=1).take(0, 5).tolist())
[0, 1, 2, 3, 4]
"""

from __future__ import annotations

import hashlib
import json
import reprlib
import tempfile
from dataclasses import dataclass
from typing import Any, Callable, Iterable, Mapping

import numpy as np

from trajstore.errors import InputError

BLOCK = 1 << 14  # order entries computed at a time (128 KiB of int64)
ROUNDS = 6  # Feistel rounds (4 make a pseudo-random permutation of a random round function; 6 for margin)
IN_MEMORY_WEIGHTS = 1 << 20  # items whose cumulative weights stay in memory; more go to a temporary file


def check_shard(rank: int, world_size: int) -> None:
    if not _is_int(world_size) or world_size < 1:
        raise InputError(f"world_size: must be a positive number of ranks, got {world_size!r}")
    if not _is_int(rank) or not 0 <= rank < world_size:
        raise InputError(f"rank: must be in [0, world_size) = [0, {world_size}), got {rank!r}")


def check_count(name: str, value: Any, *, minimum: int = 1) -> int:
    """``value`` as an int ``>= minimum``, else an :class:`InputError` naming ``name``."""
    if not _is_int(value) or value < minimum:
        raise InputError(f"{name}: must be an integer >= {minimum}, got {value!r}")
    return int(value)


def _is_int(value: Any) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def epoch_order(n: int, *, shuffle: bool, seed: int, epoch: int, rank: int, world_size: int,
                weights: Weights | np.ndarray | None = None, num_samples: int | None = None) -> Order:
    """The items of one rank's shard of one epoch, in the order it visits them.

    With ``weights`` (a :class:`Weights`, or one non-negative weight per item), ``num_samples`` items (``n``
    by default) drawn with replacement, item ``i`` with probability ``weight[i] / total``; else every item
    once, shuffled by ``(seed, epoch)`` if asked. The same arguments give the same order on every machine.
    """
    if weights is not None:
        w = weights if isinstance(weights, Weights) else StepWeights.of_array(np.asarray(weights))
        draws = n if num_samples is None else int(num_samples)
        return Order(draws if n else 0, rank, world_size, Draws(w, seed, epoch))
    if shuffle:
        return Order(n, rank, world_size, Permutation(n, seed, epoch))
    return Order(n, rank, world_size, None)


class Order:
    """One rank's entries of an epoch's order of ``total`` entries: entry ``j`` of the shard is entry
    ``rank + j * world_size`` of the epoch, mapped to an item by ``items`` (the identity without it)."""

    def __init__(self, total: int, rank: int, world_size: int,
                 items: Callable[[np.ndarray], np.ndarray] | None) -> None:
        self.total, self.rank, self.world_size, self._items = total, rank, world_size, items
        self._block: tuple[int, np.ndarray] | None = None  # (first entry, the items of a block of entries)

    def __len__(self) -> int:
        return len(range(self.rank, self.total, self.world_size))

    def take(self, start: int, stop: int) -> np.ndarray:
        """The items of this shard's entries ``start … stop-1`` (int64)."""
        stop = min(stop, len(self))
        if start >= stop:
            return np.zeros(0, np.int64)
        if self._items is None:
            return self.rank + np.arange(start, stop, dtype=np.int64) * self.world_size
        parts = []
        while start < stop:
            first, block = self._block_of(start)
            end = min(stop, first + len(block))
            parts.append(block[start - first:end - first])
            start = end
        return parts[0] if len(parts) == 1 else np.concatenate(parts)

    def _block_of(self, entry: int) -> tuple[int, np.ndarray]:
        first = entry - entry % BLOCK
        if self._block is None or self._block[0] != first:
            entries = np.arange(first, min(first + BLOCK, len(self)), dtype=np.int64)
            self._block = (first, self._items(self.rank + entries * self.world_size))  # type: ignore[misc]
        return self._block


class Permutation:
    """A pseudo-random permutation of ``[0, n)`` keyed by ``(seed, epoch)``, computed entry by entry in O(1)
    memory: a balanced Feistel network over ``[0, 4**k)`` (the smallest power of 4 >= n), walked again from
    its output until the output falls in ``[0, n)`` (cycle walking keeps it a bijection; ~2 passes on average,
    at most 4 expected). Rounds mix with SplitMix64's finalizer, keyed from ``SeedSequence((seed, epoch))``."""

    def __init__(self, n: int, seed: int, epoch: int) -> None:
        self.n = int(n)
        bits = max(2, int(max(self.n - 1, 1)).bit_length())
        self.half = (bits + 1) // 2
        self.mask = np.uint64((1 << self.half) - 1)
        self.keys = np.random.SeedSequence([int(seed), int(epoch)]).generate_state(ROUNDS, np.uint64)

    def __call__(self, x: np.ndarray) -> np.ndarray:
        out = self._rounds(np.asarray(x, np.uint64))
        outside = np.flatnonzero(out >= self.n)
        while len(outside):
            out[outside] = self._rounds(out[outside])
            outside = outside[out[outside] >= self.n]
        return out.astype(np.int64)

    def _rounds(self, x: np.ndarray) -> np.ndarray:
        half = np.uint64(self.half)
        left, right = x >> half, x & self.mask
        for key in self.keys:
            left, right = right, left ^ (_mix(right ^ key) & self.mask)
        return (left << half) | right


def _mix(z: np.ndarray) -> np.ndarray:
    """SplitMix64's finalizer: every input bit affects every output bit (uint64 arithmetic wraps)."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class Weights:
    """Item weights for draws with replacement: their ``total`` and the items that hold given points of
    ``[0, total)`` once the weights are laid end to end (an item of weight 0 holds none)."""

    total: float

    def locate(self, points: np.ndarray) -> np.ndarray:
        raise NotImplementedError


class GroupWeights(Weights):
    """One weight per group of consecutive items (an episode's windows or steps): ``weight[g]`` for each of the
    ``count[g]`` items from ``first[g]`` on. Memory per group, not per item."""

    def __init__(self, weight: np.ndarray, first: np.ndarray, count: np.ndarray) -> None:
        count = np.asarray(count, np.int64)
        some = count > 0  # groups without items (episodes too short for a window) are never drawn
        self.weight = _checked(np.asarray(weight, np.float64)[some])
        self.first, self.count = np.asarray(first, np.int64)[some], count[some]
        self.cumulative = np.cumsum(self.weight * self.count)
        self.total = _total(self.cumulative)

    def locate(self, points: np.ndarray) -> np.ndarray:
        g = np.minimum(np.searchsorted(self.cumulative, points, side="right"), len(self.cumulative) - 1)
        before = self.cumulative[g] - self.weight[g] * self.count[g]
        within = np.floor((points - before) / self.weight[g]).astype(np.int64)
        return self.first[g] + np.clip(within, 0, self.count[g] - 1)


class StepWeights(Weights):
    """A weight per item, given in chunks (item order): their running sum is kept, in memory up to
    ``IN_MEMORY_WEIGHTS`` items, else in a temporary file mapped read-only (file pages, not process memory)."""

    def __init__(self, chunks: Iterable[np.ndarray], n: int) -> None:
        self._file = None if n <= IN_MEMORY_WEIGHTS else tempfile.TemporaryFile(prefix="trajstore-weights-")
        self.cumulative = np.zeros(n, np.float64) if self._file is None else \
            np.memmap(self._file, dtype=np.float64, mode="w+", shape=(max(n, 1),))[:n]
        at, carry = 0, 0.0
        for chunk in chunks:
            sums = np.cumsum(_checked(np.asarray(chunk, np.float64))) + carry
            self.cumulative[at:at + len(sums)] = sums
            at += len(sums)
            carry = float(sums[-1]) if len(sums) else carry
        self.total = _total(self.cumulative[-1:] if n else np.zeros(0))

    @classmethod
    def of_array(cls, weights: np.ndarray) -> StepWeights:
        return cls([weights], len(weights))

    def locate(self, points: np.ndarray) -> np.ndarray:
        return np.minimum(np.searchsorted(self.cumulative, points, side="right"), len(self.cumulative) - 1)


def _checked(w: np.ndarray) -> np.ndarray:
    if len(w) and (not np.isfinite(w).all() or (w < 0).any()):
        raise InputError(f"weight_by: weights must be finite and >= 0, got values in [{np.nanmin(w)}, "
                         f"{np.nanmax(w)}]; choose a non-negative column (or shift it into one)")
    return w


def _total(cumulative: np.ndarray) -> float:
    total = float(cumulative[-1]) if len(cumulative) else 0.0
    if len(cumulative) and total <= 0:
        raise InputError("weight_by: every weight is 0; nothing can be drawn")
    return total


class Draws:
    """Draw ``j`` of an epoch's weighted draws: a point of ``[0, total)`` from the ``j % BLOCK``-th number of a
    generator seeded by ``(seed, epoch, j // BLOCK)``, and the item holding it. Blocks make any draw computable
    without the ones before it, whatever the batch size or shard."""

    def __init__(self, weights: Weights, seed: int, epoch: int) -> None:
        self.weights, self.seed, self.epoch = weights, int(seed), int(epoch)
        self._block: tuple[int, np.ndarray] | None = None

    def __call__(self, draws: np.ndarray) -> np.ndarray:
        points = np.empty(len(draws), np.float64)
        blocks = draws // BLOCK
        for b in np.unique(blocks):
            here = blocks == b
            points[here] = self._uniform(int(b))[draws[here] % BLOCK]
        return self.weights.locate(points * self.weights.total)

    def _uniform(self, block: int) -> np.ndarray:
        if self._block is None or self._block[0] != block:
            self._block = (block, np.random.default_rng((self.seed, self.epoch, block)).random(BLOCK))
        return self._block[1]


@dataclass(frozen=True)
class Position:
    """Where an iterator is: the arguments that fix its order (as a digest), the epoch, the items done."""

    kind: str
    digest: str
    epoch: int
    position: int

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "digest": self.digest, "epoch": self.epoch, "position": self.position}


def digest(arguments: Any) -> str:
    """A short hash of the arguments that fix an order (JSON of them, keys sorted)."""
    text = json.dumps(arguments, sort_keys=True, default=_plain)
    return hashlib.sha256(text.encode()).hexdigest()[:32]


def _plain(value: Any) -> Any:
    if isinstance(value, np.generic):
        return value.item()
    if hasattr(value, "__dataclass_fields__"):
        import dataclasses

        return dataclasses.asdict(value)
    return repr(value)


STATE_KEYS = ("kind", "digest", "epoch", "position")
_SHORT = reprlib.Repr()  # (keywords only from Python 3.12)
_SHORT.maxlevel, _SHORT.maxstring, _SHORT.maxother, _SHORT.maxlist, _SHORT.maxdict, _SHORT.maxlong = 3, 60, 60, 6, 6, 40


def _short(value: Any) -> str:
    """``value`` for a message: a bounded repr, however large or deeply nested it is."""
    try:
        return _SHORT.repr(value)
    except (ValueError, RecursionError):  # an int of more digits than str() writes, a repr that recurses
        return f"a {type(value).__name__}"


def parse_state(text: str) -> dict[str, Any]:
    """The ``state_dict()`` whose JSON is ``text`` (how it travels over REST: ``resume=``); an
    :class:`InputError` naming ``resume`` for anything that is not a JSON object, deeply nested or huge text
    included (the JSON decoder's recursion limit is bad input, not a server error)."""
    try:
        state = json.loads(text)
    except (ValueError, RecursionError):  # ValueError: not JSON, or an integer of more digits than Python takes
        state = None
    if not isinstance(state, dict):
        raise InputError("resume: expected the JSON of an iterator's state_dict() ({\"kind\": ..., \"digest\": ..., "
                         f"\"epoch\": ..., \"position\": ...}}), got {_short(text)}")
    return state


def resume_position(resume: Mapping[str, Any] | None, *, kind: str, digest_: str, epoch: int, total: int) -> int:
    """The number of items already done by the iterator whose ``state_dict()`` is ``resume`` (0 without one);
    an :class:`InputError` naming ``resume`` when it was made by another call or over other data, or is not
    such a state at all."""
    if resume is None:
        return 0
    if not isinstance(resume, Mapping) or not all(k in resume for k in STATE_KEYS):
        raise InputError("resume: expected the dict an iterator's state_dict() returned (kind, digest, epoch, "
                         f"position), got {_short(resume)}")
    got_kind, got_digest, got_epoch, position = (resume[k] for k in STATE_KEYS)
    if not (isinstance(got_kind, str) and isinstance(got_digest, str) and _is_int(got_epoch)):
        raise InputError("resume: kind and digest must be strings and epoch an integer, as state_dict() makes "
                         f"them, got {_short(dict(zip(STATE_KEYS[:3], (got_kind, got_digest, got_epoch))))}")
    if got_kind != kind:
        raise InputError(f"resume: a state of store.{_short(got_kind)[1:-1]}(...), not of store.{kind}(...)")
    if got_epoch != epoch:
        raise InputError(f"resume: a state of epoch {_short(got_epoch)}, but epoch={epoch}; pass the same epoch")
    if got_digest != digest_:
        raise InputError("resume: the state was made with other arguments (or over other data: episodes were "
                         "added or removed since); pass the same arguments as the call that made it")
    if not _is_int(position) or not 0 <= position <= total:
        raise InputError(f"resume: position must be in [0, {total}], got {_short(position)}")
    return int(position)
