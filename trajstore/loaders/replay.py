"""Prioritized replay over a store's steps (Schaul et al. 2016), its priorities kept in the store.

A :class:`Replay`'s items are the selected episodes' steps, windows of ``length`` steps (as
:mod:`~trajstore.loaders.sequences` cuts them: ``stride``, ``pad``, ``mask``) or ``n``-step transitions (as
:mod:`~trajstore.loaders.transitions` computes them). Their batches are gathered by the loaders' own machinery (the
layout stitched from the array copies or built once, one compiled kernel per batch): ``sample(batch_size)`` gives
what the matching loader gives, plus

- ``index``: each item's handle (int64: the number of items registered before it; never reused),
- ``episode_id``, ``start``: each item's episode and first step (``agent_id`` too over agents' trajectories),
- ``probability``: ``P(i) = p_i^α / Σ_k p_k^α`` with ``p_i = priority_i + eps`` (float64),
- ``weight``: ``w_i = (N·P(i))^-β / max_j w_j`` over all ``N`` items, i.e. ``(P(i) / min_j P(j))^-β`` (float32),

drawn with replacement in proportion to ``P`` (:mod:`~trajstore.loaders.sumtree`). An item never given a priority has
the largest priority given so far (1.0 before any), as TorchRL's ``PrioritizedSampler`` gives it; ``alpha=0`` is
uniform. ``update(index, priority)`` sets priorities (finite, >= 0; anything else refused, naming the argument, before
anything changes); an update of an item that has left the replay (its slot taken by a newer one, its run deleted)
changes nothing. The priority of a window is what the learner gives (R2D2 gives ``η·max + (1 - η)·mean`` of its
steps' absolute TD errors).

**Which items.** The replay reads the store's latest version when made. With ``follow=True`` it looks for new commits
at most every ``poll`` seconds when sampled and adds the items they bring: the steps of new episodes and of episodes
still running (an n-step transition near the end of a running episode is gathered from the steps there are when it is
drawn). With ``capacity``, it keeps the newest ``capacity`` items, first in, first out: the items there are when it is
made are ordered by their episode's last write (``episodes.ended_at``), steps in order, and later ones follow in the
order they are found. An episode that leaves the selection (a deleted run, a ``where`` it no longer meets) leaves the
replay.

**Priorities in the store** (:mod:`~trajstore.storage.priorities_log`): updates are committed to the store's
``priorities`` table under the replay's name (``priorities="default"``; None keeps them in memory) by ``commit()``, by
``close()``, and on a thread of their own every ``commit_interval`` or ``commit_updates`` updates. A replay made with
the same name resumes from the table's latest version (or ``version=N``): each item takes its last committed
priority, and the largest priority the table holds is the largest given so far.
"""

from __future__ import annotations

import logging
import math
import threading
import time
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np

from trajstore.durations import seconds
from trajstore.errors import EmptyReplayError, InputError, ReadOnlyError, ReplayClosedError, size_text
from trajstore.loaders import replay_items, sumtree
from trajstore.loaders.order import check_count
from trajstore.loaders.replay_items import Keys, Registry, find
from trajstore.loaders.replay_priorities import Committer, Committing, Pending, Updates, rows_of, stored
from trajstore.loaders.sequences import Items, Source, window_items
from trajstore.loaders.source import loader_source
from trajstore.loaders.sumtree import PriorityTree
from trajstore.loaders.transitions import transition_items
from trajstore.query.returns import check_gamma
from trajstore.storage.priorities_log import PrioritiesLog, Rows, check_name

if TYPE_CHECKING:
    from trajstore.loaders.layout_store import LayoutStore
    from trajstore.query.engine import Engine
    from trajstore.query.filters import EpisodeFilter, Names
    from trajstore.query.sql import Where

log = logging.getLogger(__name__)

STEP_COLUMNS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")  # a step item's, by default


@dataclass(frozen=True)
class ItemSpec:
    """What a replay's items are: windows of ``length`` steps (``stride``, ``pad``; ``return_to_go`` with
    ``gamma``), n-step transitions (``n``, ``gamma``), or steps (neither); and the columns of their batches."""

    columns: tuple[str, ...] | None = None
    length: int | None = None
    stride: int | None = None
    pad: bool = False
    n: int | None = None
    gamma: float | None = None

    @property
    def kind(self) -> str:
        return "windows" if self.length is not None else "transitions" if self.n is not None else "steps"

    def check_arguments(self) -> ItemSpec:
        """This spec with its numbers checked (an :class:`InputError` naming the argument)."""
        if self.length is not None and self.n is not None:
            raise InputError("n: windows (length=) and n-step transitions (n=) are two kinds of items; give one")
        if self.n is not None and self.gamma is None:
            raise InputError("gamma: n-step transitions need a discount; pass gamma in [0, 1]")
        if self.kind == "steps" and self.gamma is not None:
            raise InputError("gamma: a discount is for windows (length=, their return_to_go) or n-step transitions "
                             "(n=); steps take none")
        if self.kind != "windows" and (self.stride is not None or self.pad):
            raise InputError("stride: stride and pad cut windows; give them with length=")
        return ItemSpec(None if self.columns is None else tuple([self.columns] if isinstance(self.columns, str)
                                                                  else self.columns),
                        None if self.length is None else check_count("length", self.length),
                        None if self.stride is None else check_count("stride", self.stride), bool(self.pad),
                        None if self.n is None else check_count("n", self.n),
                        None if self.gamma is None else check_gamma(self.gamma))

    def items(self, source: Source) -> Items:
        """The items of ``source``, gathered as the matching loader gathers them."""
        columns = None if self.columns is None else list(self.columns)
        if self.kind == "windows":
            return window_items(source, int(self.length or 1), columns=columns, stride=self.stride, pad=self.pad,
                                gamma=self.gamma)
        if self.kind == "transitions":
            return transition_items(source, int(self.n or 1), gamma=float(self.gamma or 0.0), columns=columns)
        if columns is None:
            columns = [c for c in STEP_COLUMNS if c in source.schema.names]
        return window_items(source, 1, columns=columns, stride=1)

    def finished(self, batch: dict[str, Any]) -> dict[str, Any]:
        """A batch of the items' loader as this replay gives it: a step's columns without their window axis (and no
        mask), a transition's ``step`` also as ``start``."""
        if self.kind == "transitions":
            batch["start"] = batch["step"]
        elif self.kind == "steps":
            batch.pop("mask")
            for name, value in batch.items():
                if name not in ("episode_id", "start", "agent_id"):
                    batch[name] = _first_step(value)
        return batch

    def described(self) -> dict[str, Any]:
        return {"kind": self.kind, "columns": None if self.columns is None else list(self.columns),
                "length": self.length, "stride": self.stride, "pad": self.pad, "n": self.n, "gamma": self.gamma}


def _first_step(value: Any) -> Any:
    return {k: _first_step(v) for k, v in value.items()} if isinstance(value, dict) else value[:, 0]


@dataclass(frozen=True)
class Prioritization:
    """``P(i) ∝ (priority_i + eps)^alpha``, importance weights with exponent ``beta``."""

    alpha: float = 0.6
    beta: float = 0.4
    eps: float = 1e-6

    def check_arguments(self) -> Prioritization:
        for name, low in (("alpha", 0.0), ("beta", 0.0)):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, (int, float, np.number)) or not math.isfinite(value) \
                    or value < low:
                raise InputError(f"{name}: must be a finite number >= {low:g}, got {value!r}")
        if isinstance(self.eps, bool) or not isinstance(self.eps, (int, float, np.number)) or \
                not math.isfinite(self.eps) or self.eps <= 0:
            raise InputError(f"eps: must be a finite number > 0 (so that every item can be drawn), got {self.eps!r}")
        return Prioritization(float(self.alpha), float(self.beta), float(self.eps))

    def weights(self, priority: np.ndarray | float, *, out: np.ndarray | None = None) -> np.ndarray:
        """``(priority + eps) ** alpha``: what the trees hold (into ``out``, a float64 array, where given)."""
        if out is None:
            return np.power(np.asarray(priority, np.float64) + self.eps, self.alpha)
        np.add(priority, self.eps, out=out)
        return np.power(out, self.alpha, out=out)


class Replay:
    """A prioritized replay over the selection ``source()`` reads (see the module). Made by
    :meth:`Store.replay <trajstore.store.Store.replay>`; use it as a context manager, or call :meth:`close`."""

    def __init__(self, spec: ItemSpec, source: Callable[[], Source], *, prioritization: Prioritization,
                 name: str | None, table: PrioritiesLog | None, version: int | None = None,
                 capacity: int | None = None, follow: bool = False, poll: float = 1.0, seed: int = 0,
                 committing: Committing = Committing(), latest: Callable[[], int] | None = None,  # noqa: B008
                 max_batch_bytes: int | None = None, writable: Callable[[str], None] | None = None) -> None:
        self.spec, self.prioritization = spec.check_arguments(), prioritization.check_arguments()
        self.name = None if name is None else check_name(name)
        self._table = table if name is not None else None
        self._source, self._latest, self._writable = source, latest, writable
        self.capacity = None if capacity is None else check_count("capacity", capacity)
        self.follow, self.poll = bool(follow), _seconds("poll", poll)
        if isinstance(seed, bool) or not isinstance(seed, (int, np.integer)) or seed < 0:
            raise InputError(f"seed: must be an integer >= 0, got {seed!r}")
        committing.check_arguments()
        self.max_batch_bytes = max_batch_bytes
        self._rng = np.random.default_rng(int(seed))
        self._lock = threading.RLock()  # the trees, the slots, the items and the pending updates
        self._commits = threading.Lock()  # one commit at a time
        self._pending = Pending()
        self._committing = 0  # updates being committed
        self._committer = Committer(committing, self._pending, self._lock, self.commit)
        self._closed = False
        self._next_poll = 0.0
        self.version: int | None = None  # the version of the priorities table last read or committed
        self._registry = Registry(self.capacity, 1)
        self._tree = PriorityTree(self.capacity or 1)
        self._live = 0
        self._highest: float | None = None  # the largest priority given so far
        self._items: Items | None = None
        self._build(version)

    # --- made, and made again on new commits ------------------------------------------------------------------

    def _build(self, version: int | None) -> None:
        for kernels in (sumtree.KERNELS, replay_items.KERNELS):  # loading on threads while the store is read
            kernels.ready()
        source = self._source()
        items = self.spec.items(source)
        try:
            self._steps_version = _version_of(source, self._latest)
            trajectories, agents = _trajectories(source, items)
            order = _by_last_write(source, items, trajectories) if self.capacity is not None else None
            self._registry = Registry(self.capacity, items.stride)
            runs, _ = self._registry.new_runs(trajectories, items.count, order)
            rows = self._table.rows(self.name, version) if self._table is not None and self.name is not None else \
                Rows(-1, [], None)
            self.version = rows.version if rows.version >= 0 else None
            self._highest = rows.highest
            self._agents = agents
            self._item_bytes = _item_bytes(self.spec, items)
            first, count = self._registry.add(runs)
            default = float(self.prioritization.weights(self._default_priority()))
            self._tree = PriorityTree(self._registry.room or 1)
            if not rows.files:
                self._put(first, count, default)
            else:
                prior = stored(rows, self._registry, first, count, agents)
                none = np.isnan(prior)
                weights = self.prioritization.weights(prior, out=prior)  # in place: no new array of every item
                weights[none] = default
                self._put(first, count, weights)
            self._live = count
        except BaseException:
            items.release()
            raise
        self._items, self._trajectories = items, trajectories

    def _poll(self) -> None:
        """With ``follow``: the items of commits made since the replay last looked, at most every ``poll`` s."""
        if not self.follow:
            return
        now = time.monotonic()
        if now < self._next_poll:
            return
        self._next_poll = now + self.poll
        latest = self._latest() if self._latest is not None else None
        if latest is not None and latest == self._steps_version:
            return
        self._refresh()

    def _refresh(self) -> None:
        source = self._source()
        items = self.spec.items(source)
        try:
            version = _version_of(source, self._latest)
            trajectories, _ = _trajectories(source, items)
            runs, gone = self._registry.new_runs(trajectories, items.count)
            if len(gone):
                emptied = self._registry.slots_of(gone)
                self._live -= int((self._tree.leaves(emptied) > 0).sum())
                self._tree.set(emptied, np.zeros(len(emptied)))
            first, count = self._registry.add(runs)
            if self._registry.room > self._tree.room:
                self._tree = self._tree.grown(self._registry.room)
            for lo, hi, _ in self._registry.slot_runs(first, count):  # the items whose slots the new ones take
                self._live -= int(np.count_nonzero(self._tree.sums[lo:hi]))
            self._put(first, count, float(self.prioritization.weights(self._default_priority())))
            self._live += count
        except BaseException:
            items.release()
            raise
        old, self._items, self._trajectories, self._steps_version = self._items, items, trajectories, version
        if old is not None:
            old.release()

    def _put(self, first: int, count: int, weights: np.ndarray | float) -> None:
        """``weights`` (one for all, or one each) into the tree at the slots of handles ``first .. first + count -
        1``: consecutive runs loaded in bulk."""
        for lo, hi, at in self._registry.slot_runs(first, count):
            part = weights if np.ndim(weights) == 0 else weights[at:at + hi - lo]  # type: ignore[index]
            self._tree.fill(lo, part, hi - lo)

    def _default_priority(self) -> float:
        return 1.0 if self._highest is None else self._highest

    # --- what a learner calls -----------------------------------------------------------------------------------

    def __len__(self) -> int:
        """The items the replay holds."""
        with self._lock:
            self._open()
            self._poll()
            return self._live

    def sample(self, batch_size: int) -> dict[str, Any]:
        """``batch_size`` items drawn with replacement in proportion to their priorities: the matching loader's
        batch plus ``index``, ``episode_id``, ``start``, ``probability`` and ``weight`` (see the module)."""
        n = check_count("batch_size", batch_size)
        if self.max_batch_bytes is not None and n * self._item_bytes > self.max_batch_bytes:
            raise InputError(f"batch_size: {n} items of about {self._item_bytes} bytes each would take "
                             f"{size_text(n * self._item_bytes)}, over the limit of {size_text(self.max_batch_bytes)} "
                             "a batch may take (max_batch_bytes; a server's TRAJSTORE_LOADER_BATCH_BYTES); ask for "
                             "fewer")
        with self._lock:
            self._open()
            self._poll()
            if self._live == 0:
                raise EmptyReplayError("replay: it holds no items yet: its selection has no steps (or no episode "
                                       "long enough for its windows); with follow=True, items come with new commits")
            total, least = self._tree.total, self._tree.minimum
            slots = self._tree.draw(self._rng.random(n) * total)
            weights = self._tree.leaves(slots)
            handles = self._registry.handles(slots)
            keys = self._registry.keys(handles)
            assert self._items is not None
            at = find(self._trajectories, keys, starts=False)
            batch = self._items.batch(self._items.first[at] + keys.start // self._items.stride)
            batch = self.spec.finished(batch)
            batch["index"] = handles
            batch["probability"] = weights / total
            batch["weight"] = np.power(weights / least, -self.prioritization.beta).astype(np.float32)
            return batch

    def update(self, index: Any, priority: Any) -> None:
        """Give the items of handles ``index`` (int64, as :meth:`sample` gave them) their ``priority`` (finite and
        >= 0; one per handle, or one for all); a handle given twice keeps its last. An item that has left the replay
        is passed over; a handle the replay never gave, a priority that is not finite or below 0, or arrays of two
        lengths are refused before anything changes."""
        handles, given = checked_updates(index, priority)
        now_us = np.full(len(handles), time.time_ns() // 1000, np.int64)
        with self._lock:
            self._open()
            refused = ~self._registry.issued(handles)
            if refused.any():
                bad = handles[refused][:3].tolist()
                raise InputError(f"index: {bad} {'is not a handle' if refused.sum() == 1 else 'are not handles'} "
                                 f"this replay gave (handles are 0 to {self._registry.total - 1})")
            kept = self._registry.kept(handles)
            slots = self._registry.slots(handles[kept])
            alive = self._tree.leaves(slots) > 0
            slots, given_kept, handles_kept = slots[alive], given[kept][alive], handles[kept][alive]
            if len(given):
                top = float(given.max())
                self._highest = top if self._highest is None else max(self._highest, top)
            self._tree.set(slots, self.prioritization.weights(given_kept))
            if self._table is not None:
                self._pending.add(Updates(self._registry.keys(handles_kept), given_kept, now_us[:len(slots)]))
        if self._table is not None:
            self._committer.notify()

    def commit(self) -> int | None:
        """Commit the updates given since the last commit to the store's ``priorities`` table; the version they
        landed as (the last version committed when there were none; None for a replay without a table)."""
        if self._table is None or self.name is None:
            return None
        with self._commits:
            with self._lock:
                parts = self._pending.take()
                self._committing = sum(len(p) for p in parts)
            if not parts:
                return self.version
            try:
                if self._writable is not None:
                    self._writable("a replay's commit")  # a store read at a version takes no commits
                version = self._table.append(self.name, rows_of(parts, self._agents))
            except BaseException:
                with self._lock:
                    self._pending.put_back(parts)
                raise
            finally:
                with self._lock:
                    self._committing = 0
            self.version = version
            return version

    def close(self) -> None:
        """Commit what is pending, stop the commit thread and unmap the layout. Idempotent."""
        if self._closed:
            return
        self._committer.stop()
        try:
            self.commit()
        except ReadOnlyError:  # a store read at a version: its updates were for this process alone
            log.warning("replay %r: %d update(s) not committed: the store is read at a version", self.name,
                        self.pending)
        finally:
            with self._lock:
                self._closed = True
                if self._items is not None:
                    self._items.release()
                    self._items = None

    def __enter__(self) -> Replay:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _open(self) -> None:
        if self._closed:
            raise ReplayClosedError("replay: closed; make a new one with store.replay(...) (it resumes from the "
                                    "priorities committed)")

    # --- what it holds ----------------------------------------------------------------------------------------

    @property
    def nbytes(self) -> int:
        """The memory the replay holds: its trees and slots (the steps are the store's files, mapped)."""
        return self._tree.nbytes + self._registry.nbytes

    @property
    def steps_version(self) -> int:
        """The version of the store's steps the replay's items come from (the latest it has looked at)."""
        return self._steps_version

    @property
    def pending(self) -> int:
        """Updates given and not committed yet (those being committed too)."""
        with self._lock:
            return self._pending.count + self._committing

    def describe(self) -> dict[str, Any]:
        """What the replay is: its items, prioritization, name, capacity and what it holds."""
        return {**self.spec.described(), "alpha": self.prioritization.alpha, "beta": self.prioritization.beta,
                "eps": self.prioritization.eps, "priorities": self.name, "capacity": self.capacity,
                "follow": self.follow, "items": self._live, "version": self.version,
                "steps_version": self._steps_version, "item_bytes": self._item_bytes}


def _seconds(name: str, value: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value) or value < 0:
        raise InputError(f"{name}: must be a number of seconds >= 0, got {value!r}")
    return float(value)


def _version_of(source: Source, latest: Callable[[], int] | None) -> int:
    """The version of steps ``source`` reads."""
    if source.basis is not None:
        return int(source.basis.version)
    return latest() if latest is not None else -1


def _trajectories(source: Source, items: Items) -> tuple[Keys, list[str] | None]:
    """The keys (episode, agent code) of the layout's trajectories, in the layout's order, and the agents' names."""
    traj = source.trajectories
    if traj is None:
        episodes = np.asarray(items.view.episode_id, np.int64)
        return Keys(episodes, np.zeros(len(episodes), np.int32), np.zeros(len(episodes), np.int32)), None
    agents = sorted(traj.agents)
    codes = np.searchsorted(np.asarray(agents, dtype=str), traj.agent_id).astype(np.int32)
    return Keys(np.asarray(traj.episode_id, np.int64), codes, np.zeros(len(codes), np.int32)), agents


def _by_last_write(source: Source, items: Items, trajectories: Keys) -> np.ndarray:
    """The trajectories in the order their episodes were last written (``episodes.ended_at``; by id on a tie)."""
    ids, ended = source.episode_values("ended_at")
    if source.trajectories is not None:  # per trajectory already
        when = np.zeros(len(trajectories)) if not len(ended) else ended
    else:
        at = np.minimum(np.searchsorted(ids, trajectories.episode), max(len(ids) - 1, 0))
        when = np.where(ids[at] == trajectories.episode, ended[at], 0.0) if len(ids) else \
            np.zeros(len(trajectories))
    return np.lexsort((trajectories.agent, trajectories.episode, np.nan_to_num(when)))


def _item_bytes(spec: ItemSpec, items: Items) -> int:
    """About the bytes one item of a batch takes, at most: every column laid out, at each of its steps (a window's
    ``length``; a transition's step and its ``next_obs``), and its keys, mask and weights."""
    spans = items.view.spans
    per_step = sum(spans.width(leaf) for leaf in spans.arrays)
    steps = spec.length or 1
    return int(per_step * steps + steps + 64)


def checked_updates(index: Any, priority: Any) -> tuple[np.ndarray, np.ndarray]:
    """``index`` as int64 handles, ``priority`` as float64 of its length, checked (see :meth:`Replay.update`)."""
    handles = _array(index)
    if handles.ndim != 1 or not (handles.dtype.kind in "iu" or (handles.dtype.kind == "f" and not len(handles))):
        raise InputError(f"index: expected a 1-D array of int64 handles (a batch's 'index'), got "
                         f"{handles.dtype} of shape {handles.shape}")
    handles = handles.astype(np.int64)
    given = _array(priority)
    if given.dtype.kind not in "iuf" or given.ndim > 1:
        raise InputError(f"priority: expected a number or a 1-D array of numbers, got {given.dtype} of shape "
                         f"{given.shape}")
    given = np.broadcast_to(given.astype(np.float64), handles.shape) if given.ndim == 0 else \
        given.astype(np.float64)
    if len(given) != len(handles):
        raise InputError(f"priority: {len(given)} priorities for {len(handles)} handles (index); give one per handle "
                         "or one for all")
    bad = ~np.isfinite(given) | (given < 0)
    if bad.any():
        raise InputError(f"priority: must be finite and >= 0, got {given[bad][:3].tolist()} (at positions "
                         f"{np.flatnonzero(bad)[:3].tolist()})")
    return handles, np.ascontiguousarray(given)


def _array(value: Any) -> np.ndarray:
    """A numpy array of ``value`` (a torch tensor's detached CPU copy, a JAX array, a list, a number)."""
    if hasattr(value, "detach"):
        value = value.detach().cpu().numpy()
    return np.asarray(value)


def open_replay(engine: Engine, layouts: LayoutStore, columns: Sequence[str] | None = None, *,
                length: int | None = None, n: int | None = None, gamma: float | None = None, stride: int | None = None,
                pad: bool = False, run_id: Names = None, where: Where | None = None,
                filter: EpisodeFilter | None = None, agent_id: Names = None,  # noqa: A002
                priorities: str | None = "default", alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6,
                capacity: int | None = None, follow: bool = False, poll: float = 1.0, seed: int = 0,
                version: int | None = None, commit_interval: float | str | None = "5s",
                commit_updates: int | None = 100_000, max_batch_bytes: int | None = None) -> Replay:
    """The :class:`Replay` of ``Store.replay`` (see the module) over the selection of ``engine``'s store (its loader
    layouts kept by ``layouts``)."""
    interval = None if commit_interval is None else seconds(commit_interval, "commit_interval", minimum=0.0,
                                                             inclusive=False)

    def source() -> Source:
        return loader_source(engine, layouts, run_id=run_id, where=where, filter=filter, agent_id=agent_id)

    spec = ItemSpec(None if columns is None else tuple([columns] if isinstance(columns, str) else columns),
                    length, stride, pad, n, gamma)
    return Replay(spec, source, prioritization=Prioritization(alpha, beta, eps), name=priorities,
                  table=engine.priorities, version=version, capacity=capacity, follow=follow, poll=poll, seed=seed,
                  committing=Committing(interval, commit_updates), latest=engine.table.log.latest_number,
                  max_batch_bytes=max_batch_bytes, writable=engine.table.log.writable)
