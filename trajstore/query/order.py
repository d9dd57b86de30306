"""The order a training loader visits its items (windows, transitions) in one epoch: enumerated, shuffled by
``(seed, epoch)`` or sampled with replacement by weight, cut into the shard of one rank, and where a stopped
iterator resumes.

Items are numbered ``0 … n-1`` in storage-independent order (episodes by id, steps ascending). One epoch's
order is a permutation of them (``shuffle``), a seeded draw of ``num_samples`` of them with replacement
weighted by ``weights``, or the plain enumeration; a rank takes every ``world_size``-th entry from its own
``rank`` on, so shards are disjoint, cover the order, and differ in size by at most one item.

>>> epoch_order(5, shuffle=False, seed=0, epoch=0, rank=1, world_size=2).tolist()
[1, 3]
>>> sorted(epoch_order(5, shuffle=True, seed=0, epoch=3, rank=0, world_size=1).tolist())
[0, 1, 2, 3, 4]
"""

from __future__ import annotations

import hashlib
import json
import reprlib
from dataclasses import dataclass
from typing import Any, Mapping

import numpy as np

from trajstore.errors import InputError


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
                weights: np.ndarray | None = None, num_samples: int | None = None) -> np.ndarray:
    """The items of one rank's shard of one epoch, in the order it visits them.

    With ``weights`` (one non-negative weight per item), ``num_samples`` items (``n`` by default) drawn with
    replacement, item ``i`` with probability ``weights[i] / sum(weights)``; else every item once, shuffled
    by ``(seed, epoch)`` if asked. The same arguments give the same order on every machine.
    """
    rng = np.random.default_rng((int(seed), int(epoch)))
    if weights is not None:
        p = _probabilities(weights)
        order = rng.choice(n, size=n if num_samples is None else num_samples, replace=True, p=p) if n else \
            np.zeros(0, np.int64)
    elif shuffle:
        order = rng.permutation(n)
    else:
        order = np.arange(n, dtype=np.int64)
    return order[rank::world_size]


def _probabilities(weights: np.ndarray) -> np.ndarray | None:
    w = np.asarray(weights, dtype=np.float64)
    if len(w) == 0:
        return None
    if not np.isfinite(w).all() or (w < 0).any():
        raise InputError(f"weight_by: weights must be finite and >= 0, got values in [{np.nanmin(w)}, "
                         f"{np.nanmax(w)}]; choose a non-negative column (or shift it into one)")
    total = w.sum()
    if total <= 0:
        raise InputError("weight_by: every weight is 0; nothing can be drawn")
    return w / total


@dataclass(frozen=True)
class Position:
    """Where an iterator is: the arguments that fix its order (as a digest), the epoch, the items done."""

    kind: str
    digest: str
    epoch: int
    position: int

    def state_dict(self) -> dict[str, Any]:
        return {"kind": self.kind, "digest": self.digest, "epoch": self.epoch, "position": self.position}


def digest(arguments: Mapping[str, Any]) -> str:
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
