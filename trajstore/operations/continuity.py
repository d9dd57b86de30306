"""Whether rows that name their own episodes continue them: among themselves, and after what is stored.

A local :class:`~trajstore.write.writer.Writer` draws its own episode ids and cuts its batches itself, so
its rows are whole by construction and need none of this. Rows of an ingest request name episode ids and
steps themselves; before they are committed, :func:`request_spans` checks each episode's rows among
themselves (steps contiguous, only the last one terminated or truncated), and :func:`check_continues`
checks them against the store's committed rows of the same ids (:func:`stored_ends`: one aggregate per id,
over the files whose logged id range may hold it): a new episode starts at step 0, a stored one goes on
right after its last stored step, in its own run and environment, and only if it has not ended.

The rows of a multi-agent episode (an ``agent_id`` each; ``step`` the env step) follow the rules of
:class:`~trajstore.write.agents.AgentWriter`, agent by agent: each agent's env steps strictly increase in the
order its rows come (it may skip steps: turns, agents that do not act, join late or leave), only its last row
ends it, and rows continuing a stored episode come after that agent's last stored step, never after its end.
An episode's rows are all single-agent (``agent_id`` null) or all agents'.

>>> import numpy as np
>>> spans = request_spans(np.array([9, 9, 4]), np.array([0, 1, 0]), np.array([False, True, False]))
>>> spans.episode_id.tolist(), spans.first.tolist(), spans.last.tolist()
([4, 9], [0, 0], [0, 1])
>>> check_continues(spans, [], run_id="r", env_id="E")
>>> duo = request_spans(np.array([5, 5, 5]), np.array([0, 0, 2]), np.array([False, False, True]),
...                     pa.array(["a", "b", "a"]))
>>> duo.episode_id.tolist(), duo.agent_id.tolist(), duo.first.tolist(), duo.last.tolist()
([5, 5], ['a', 'b'], [0, 0], [2, 0])
"""

from __future__ import annotations

import threading
import time
from collections import OrderedDict
from dataclasses import dataclass, field
from typing import Callable, Generic, Mapping, Sequence, TypeVar

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore.errors import InputError
from trajstore.query import sql
from trajstore.query.snapshot import cursor
from trajstore.storage.log import DataFile, files_holding
from trajstore.storage.table import steps_dataset
from trajstore.write.episode_ids import COUNTER_BITS

KEPT_ENDS = 1_000_000  # episode ends (one per episode, or per agent in one) an EndsCache keeps (~16 MB, +16 of index)
KEPT_IDLE_S = 120.0  # an EndsCache lets go of a file's ends once no request asked about them (nor learnt them) so long
KEPT_RANGES = 1_000_000  # writers' ranges of files (a few per writer a file holds) an EndsCache keeps (~28 MB)
MERGED_AFTER = 32  # files an EndsCache keeps outside its merged index before it merges them all again
KEY_SCHEMA = pa.schema([("run_id", pa.string()), ("env_id", pa.string()), ("episode_id", pa.int64()),
                        ("step", pa.int32()), ("terminated", pa.bool_()), ("truncated", pa.bool_()),
                        ("agent_id", pa.string())])


@dataclass(frozen=True)
class Spans:
    """The trajectories of one request: each episode (each agent of a multi-agent one) with the first and last
    step it has in it, sorted by episode id, then agent; ``agent_id`` None for a single-agent episode."""

    episode_id: np.ndarray
    first: np.ndarray
    last: np.ndarray
    agent_id: np.ndarray  # object: each span's agent, or None
    ended: np.ndarray | None = None  # bool: whether each span's last row is terminated or truncated

    @property
    def episodes(self) -> np.ndarray:
        """The episode ids of the request, sorted and unique."""
        return np.unique(self.episode_id)

    def ends(self, *, run_id: str, env_id: str) -> list[StoredEnd]:
        """What the store holds of each span once these rows are stored (in ``run_id``/``env_id``): what
        :func:`stored_ends` would then find for them."""
        ended = np.zeros(len(self.episode_id), bool) if self.ended is None else self.ended
        return [StoredEnd(run_id, env_id, int(e), int(last), int(last) if end else None, agent)
                for e, last, end, agent in zip(self.episode_id.tolist(), self.last.tolist(), ended.tolist(),
                                               self.agent_id.tolist())]


@dataclass(frozen=True)
class StoredEnd:
    """What the store holds of one episode id (of one of its agents) in one partition: its last step and the
    step that ended it; ``agent_id`` None for a single-agent episode."""

    run_id: str
    env_id: str
    episode_id: int
    last_step: int
    end_step: int | None
    agent_id: str | None = None


def request_spans(episode_id: np.ndarray, step: np.ndarray, ended: np.ndarray,
                  agent_id: pa.Array | pa.ChunkedArray | None = None) -> Spans:
    """Each episode's first and last step among rows (in any order), and each agent's of a multi-agent episode
    (``agent_id``: each row's, null for single-agent rows); raises :class:`InputError` naming the episode (and
    the agent) and the step when an episode repeats or skips a step, an agent's steps repeat or go back, or
    rows go on after their terminated or truncated step. ``ended`` is ``terminated | truncated`` per row."""
    agent, names = _agent_codes(agent_id, len(episode_id))
    single = agent < 0
    if single.all():
        return _episode_spans(episode_id, step, ended)
    _refuse_mixed(episode_id, single)
    multi = ~single
    parts = [_episode_spans(episode_id[single], step[single], ended[single]),
             _agent_spans(episode_id[multi], step[multi], ended[multi], agent[multi], names)]
    order = np.argsort(np.concatenate([p.episode_id for p in parts]), kind="stable")  # agents stay in order
    return Spans(*(np.concatenate([getattr(p, k) for p in parts])[order]
                   for k in ("episode_id", "first", "last", "agent_id", "ended")))


def _episode_spans(episode_id: np.ndarray, step: np.ndarray, ended: np.ndarray) -> Spans:
    """:func:`request_spans` of single-agent rows."""
    if not len(episode_id):
        return Spans(np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.int32), np.empty(0, object),
                     np.empty(0, bool))
    order = np.lexsort((step, episode_id))
    ids, steps, ends = episode_id[order], step[order], ended[order]
    same = ids[1:] == ids[:-1]
    _refuse_repeats_and_gaps(ids, steps, same)
    first = np.flatnonzero(np.r_[True, ~same])
    last = np.r_[first[1:] - 1, len(ids) - 1]
    early = np.flatnonzero(ends[:-1] & same)
    if len(early):
        i = int(early[0])
        end = int(steps[last[np.searchsorted(first, i, side="right") - 1]])
        raise InputError(f"terminated/truncated: episode_id {ids[i]} ends at step {steps[i]}, but the rows go on "
                         f"to step {end}; only an episode's last step may be terminated or truncated")
    return Spans(ids[first], steps[first], steps[last], np.full(len(first), None, object), ends[last])


def _agent_codes(agent_id: pa.Array | pa.ChunkedArray | None, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Each row's agent as its index in the sorted agent names (also returned), -1 for a single-agent row."""
    if agent_id is None or agent_id.null_count == len(agent_id):
        return np.full(n, -1, np.int64), np.empty(0, object)
    names = np.array(sorted(a for a in pc.unique(agent_id).to_pylist() if a is not None), object)
    codes = pc.index_in(agent_id, value_set=pa.array(names.tolist(), pa.string())).fill_null(-1)
    return np.asarray(codes, np.int64), names


def _refuse_mixed(episode_id: np.ndarray, single: np.ndarray) -> None:
    both = np.intersect1d(episode_id[single], episode_id[~single])
    if len(both):
        raise InputError(f"agent_id: episode_id {both[0]} has rows with and without an agent_id; an episode's rows "
                         "are all single-agent (agent_id null) or all its agents' (agent_id set)")


def _agent_spans(ids: np.ndarray, steps: np.ndarray, ends: np.ndarray, agent: np.ndarray,
                 names: np.ndarray) -> Spans:
    """:func:`request_spans` of the rows of agents: each agent's rows of an episode in the order they came."""
    order = np.lexsort((np.arange(len(ids)), agent, ids))
    ids, steps, ends, agent = ids[order], steps[order], ends[order], agent[order]
    same = (ids[1:] == ids[:-1]) & (agent[1:] == agent[:-1])
    bad = np.flatnonzero(same & (steps[1:] <= steps[:-1]))
    if len(bad):
        i = int(bad[0])
        what = f"has step {steps[i]} more than once" if steps[i + 1] == steps[i] else \
            f"goes from step {steps[i]} back to step {steps[i + 1]}"
        raise InputError(f"step: agent {names[agent[i]]!r} of episode_id {ids[i]} {what}; expected strictly "
                         "increasing env steps for one agent in one episode (it may skip steps)")
    first = np.flatnonzero(np.r_[True, ~same])
    last = np.r_[first[1:] - 1, len(ids) - 1]
    early = np.flatnonzero(ends[:-1] & same)
    if len(early):
        i = int(early[0])
        end = int(steps[last[np.searchsorted(first, i, side="right") - 1]])
        raise InputError(f"terminated/truncated: agent {names[agent[i]]!r} of episode_id {ids[i]} ends at step "
                         f"{steps[i]}, but its rows go on to step {end}; only an agent's last step in an episode "
                         "may be terminated or truncated")
    return Spans(ids[first], steps[first], steps[last], names[agent[first]], ends[last])


def _refuse_repeats_and_gaps(ids: np.ndarray, steps: np.ndarray, same: np.ndarray) -> None:
    bad = np.flatnonzero(same & (steps[1:] != steps[:-1] + 1))
    if not len(bad):
        return
    i = int(bad[0])
    if steps[i + 1] == steps[i]:
        raise InputError(f"step: episode_id {ids[i]} has step {steps[i]} more than once")
    raise InputError(f"step: episode_id {ids[i]} goes from step {steps[i]} to step {steps[i + 1]}; "
                     f"expected step {steps[i] + 1} (an episode's steps are contiguous)")


def stored_ends(files: Sequence[DataFile], episode_ids: np.ndarray) -> list[StoredEnd]:
    """The committed rows of ``episode_ids`` (sorted, unique) in ``files`` (one version's), one aggregate per
    id, agent (of a multi-agent episode) and partition; only files whose logged episode_id range may hold one of
    the ids are read."""
    files = files_holding(files, episode_ids)
    if not files or not len(episode_ids):
        return []
    con = cursor()
    try:  # through a pyarrow dataset over the table's filesystem: the same for a directory and for S3
        con.register("stored_keys", steps_dataset(files, KEY_SCHEMA))
        found = con.execute(sql.stored_episode_ends("stored_keys", episode_ids.tolist())).fetchall()
    finally:
        con.close()
    return [StoredEnd(r, e, int(i), int(last), None if end is None else int(end), agent)
            for r, e, i, agent, last, end in found]


@dataclass(frozen=True)
class FileEnds:
    """What one committed file holds of each of its episodes (each agent of a multi-agent one): sorted by episode
    id, its last step and the first step that ended it (-1: none); the file's partition."""

    run_id: str
    env_id: str
    episode_id: np.ndarray  # int64, sorted; an id once per agent
    last: np.ndarray  # int32 (a step)
    end: np.ndarray  # int32, -1 while the episode runs
    agent_id: np.ndarray  # object: each one's agent, or None (one None for all, read-only, in a file without agents)

    @classmethod
    def of(cls, rows: pa.Table, *, run_id: str, env_id: str) -> FileEnds:
        """The ends of ``rows`` (stored names: ``episode_id``, ``step``, ``terminated``, ``truncated``, and
        ``agent_id`` if any), as :func:`stored_ends` aggregates them."""
        ended = pc.or_(rows["terminated"], rows["truncated"])
        agent = rows["agent_id"] if "agent_id" in rows.column_names else pa.nulls(rows.num_rows, pa.string())
        keys = pa.table({"e": rows["episode_id"].cast(pa.int64()), "a": agent.cast(pa.string()),
                         "s": rows["step"].cast(pa.int64()),
                         "x": pc.if_else(ended, rows["step"].cast(pa.int64()), pa.scalar(None, pa.int64()))})
        g = keys.group_by(["e", "a"], use_threads=False).aggregate([("s", "max"), ("x", "min")])
        g = g.sort_by([("e", "ascending")])
        agents = np.array(g["a"].to_pylist(), object) if g["a"].null_count < g.num_rows else \
            np.broadcast_to(np.array([None], object), (g.num_rows,))  # kept for every file's episodes: no copy
        return cls(run_id, env_id, g["e"].to_numpy(), g["s_max"].to_numpy().astype(np.int32),
                   g["x_min"].fill_null(-1).to_numpy().astype(np.int32), agents)

    @property
    def size(self) -> int:
        return len(self.episode_id)


class EndsCache:
    """:func:`stored_ends`, from what each committed file holds of its episodes, kept in memory by path: a committed
    file never changes (a rewrite, a delete, a compaction commits new files and removes the old from the log), so
    the ends of the files one version lists are that version's ends. A file is read once (all its episodes, the key
    columns only), or never when its writer said what it holds (:meth:`learn`: the group committer, of the files it
    writes); the files asked about are the caller's (one version's, from its log): another writer's files are read
    as they appear. At most ``limit`` ends are kept, the least recently used file's let go first; a file the log
    no longer lists goes as the committer meets a version without it, and one nobody asked about for ``idle_s``
    (an actor's run that ended, a partition written once) goes then too (:meth:`retain`): read again, once, if a
    request asks after all.

    Which files may hold a request's ids is told by each file's writers' ranges (:class:`_Ranges`, kept while the
    log lists the file, at most :data:`KEPT_RANGES`), not by its logged range alone: the files a group commit writes
    hold many actors' episodes, each actor's ids counted up from its own random token, so each file's logged range
    may hold any id, and every request needed the ends of every file of the store (past the bound of ends, read
    again and again). A request's ids are looked up in one sorted index of every kept file's ends, and in one of
    every file's ranges (each merged again every :data:`MERGED_AFTER` files kept; those kept since are searched one
    by one). Which files of a list are kept, and which have their ranges kept, is known for the list (a version's)
    at once, again only once a file was kept or let go."""

    def __init__(self, limit: int = KEPT_ENDS, *, idle_s: float = KEPT_IDLE_S,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.limit, self.idle_s = limit, idle_s
        self.reads = 0  # files read (not learnt)
        self._clock = clock
        self._ends: _Layered[FileEnds, _Merged] = _Layered(_Merged.of, lambda e: e.size)  # least recently used first
        self._ranges: _Layered[_Ranges, _Stabs] = _Layered(_Stabs.of, _Ranges.count)  # the oldest first
        self._used: dict[str, float] = {}  # when each file's ends were last asked about or learnt
        self._lock = threading.Lock()
        self._view: _View | None = None  # the list of files last asked about
        self._loading: dict[str, threading.Event] = {}  # files being read, set once they are
        self._turns = 0  # counts files kept and let go: what a list found kept at one count may not be at the next

    def learn(self, path: str, ends: FileEnds) -> None:
        """Take ``ends`` as what the file at ``path`` holds (the writer's word; the file is then never read)."""
        with self._lock:
            self._keep(path, ends)

    @property
    def kept(self) -> int:
        """The ends kept, of all files."""
        return self._ends.size

    @property
    def ranged(self) -> int:
        """The files whose writers' ranges are kept."""
        return len(self._ranges.items)

    def retain(self, files: Sequence[DataFile]) -> None:
        """Let go of what is kept of the files a version no longer lists (``files``: all of its files): compacted,
        deleted or rewritten, no later version asks about them. Then of the ends of those nobody asked about for
        ``idle_s``: a service's store gains partitions for as long as it runs (a run each, of each environment), and
        an ended run's would otherwise stay until the cache's ``limit``."""
        with self._lock:
            listed = {f.path for f in files}
            for path in [p for p in self._ends.items if p not in listed]:
                self._drop(path)
            for path in [p for p in self._ranges.items if p not in listed]:
                self._ranges.take(path)
                self._turns += 1
            self._note_used()
            idle = self._clock() - self.idle_s
            while self._ends.items:
                oldest = next(iter(self._ends.items))
                if self._used[oldest] > idle:
                    break
                self._drop(oldest)

    def ends(self, files: Sequence[DataFile], episode_ids: np.ndarray) -> list[StoredEnd]:
        """:func:`stored_ends` of ``episode_ids`` (sorted, unique) in ``files`` (one version's)."""
        if not len(files) or not len(episode_ids):
            return []
        view = self._view_of(files)
        hold = view.holding(episode_ids)
        hits: list[tuple[FileEnds, int]] | None = None
        with self._lock:
            if view.turns != self._turns:
                view.kept = np.fromiter((p in self._ends.items for p in view.paths), bool, len(view.paths))
                view.ranged = np.fromiter((p in self._ranges.items for p in view.paths), bool, len(view.paths))
                view.turns = self._turns
            if (hold & view.ranged).any():  # files whose writers' ranges hold none of the ids hold none
                hold &= ~view.ranged | self._spanning(view.index, len(view.paths), episode_ids)
            if view.kept[hold].all():  # every file that may hold one is kept: one look-up in the merged index
                view.used[hold] = self._clock()
                hits = self._hits(view.index, hold, episode_ids)
        if hits is not None:
            return _merged_ends(hits)
        held = [files[i] for i in np.flatnonzero(hold).tolist()]
        known: dict[str, FileEnds] = {}
        for _ in range(3):  # a file another thread was reading, let go again before this one looked: read here
            mine, theirs = self._claim(held, known)
            if mine:
                try:
                    read = _read_ends(mine)
                    with self._lock:
                        self.reads += len(mine)
                        for f in mine:
                            self._keep(f.path, read[f.path])
                    known.update(read)
                finally:
                    with self._lock:
                        for f in mine:
                            self._loading.pop(f.path).set()
            for event in theirs:
                event.wait()
            if not theirs:
                break
        else:
            rest = [f for f in held if f.path not in known]
            known.update(_read_ends(rest) if rest else {})
        return _combined([known[f.path] for f in held], episode_ids)

    def _claim(self, held: Sequence[DataFile],
               known: dict[str, FileEnds]) -> tuple[list[DataFile], list[threading.Event]]:
        """The ends of ``held`` kept (into ``known``), then the files this thread is to read (each read by one thread
        at a time: a file every request asks about when it appears is read once) and the reads of others to wait for."""
        mine, theirs = [], []
        with self._lock:
            for f in held:
                if f.path in known:
                    continue
                found = self._ends.items.get(f.path)
                if found is not None:
                    self._ends.items.move_to_end(f.path)
                    self._used[f.path] = self._clock()
                    known[f.path] = found
                elif f.path in self._loading:
                    theirs.append(self._loading[f.path])
                else:
                    self._loading[f.path] = threading.Event()
                    mine.append(f)
        return mine, theirs

    def _keep(self, path: str, ends: FileEnds) -> None:
        self._ends.put(path, ends)
        self._used[path] = self._clock()
        self._turns += 1
        while self._ends.size > self.limit and len(self._ends.items) > 1:
            self._drop(next(iter(self._ends.items)))
        if path not in self._ranges.items:  # a file never changes: its ranges, once kept, stay its
            self._ranges.put(path, _Ranges.of(ends))
            while self._ranges.size > KEPT_RANGES and len(self._ranges.items) > 1:
                self._ranges.take(next(iter(self._ranges.items)))

    def _drop(self, path: str) -> None:
        self._ends.take(path)
        del self._used[path]
        self._turns += 1

    def _spanning(self, listed: Mapping[str, int], n: int, ids: np.ndarray) -> np.ndarray:
        """Which of the ``n`` files ``listed`` (by path, their places in a list) have a writer's range that holds one
        of ``ids`` (sorted), of the files whose ranges are kept."""
        out = np.zeros(n, bool)

        def mark(path: str) -> None:
            at = listed.get(path)
            if at is not None:
                out[at] = True

        stabs = self._ranges.merged
        if stabs is not None and len(stabs.low):
            for i, j in zip(ids.tolist(), (np.searchsorted(stabs.low, ids, "right") - 1).tolist()):
                while j >= 0 and stabs.reach[j] >= i:  # back over the ranges starting below i while one reaches it
                    if stabs.high[j] >= i:
                        owner = int(stabs.owner[j])
                        if self._ranges.current(stabs.paths[owner], stabs.items[owner]):
                            mark(stabs.paths[owner])
                    j -= 1
        for path, ranges in self._ranges.recent.items():
            if ranges.hold(ids):
                mark(path)
        return out

    def _hits(self, listed: Mapping[str, int], hold: np.ndarray, ids: np.ndarray) -> list[tuple[FileEnds, int]]:
        """Each entry of ``ids`` (sorted, unique) among the kept ends of the files ``listed`` (by path, their places
        in a list) that may ``hold`` them: the file's ends and the entry's row in them."""
        def wanted(path: str) -> bool:
            at = listed.get(path)
            return at is not None and bool(hold[at])

        hits: list[tuple[FileEnds, int]] = []
        merged = self._ends.merged
        if merged is not None:
            lo, hi = np.searchsorted(merged.ids, ids, "left"), np.searchsorted(merged.ids, ids, "right")
            for a, b in zip(lo[hi > lo].tolist(), hi[hi > lo].tolist()):
                for k in range(a, b):
                    owner = int(merged.owner[k])
                    path, ends = merged.paths[owner], merged.items[owner]
                    if self._ends.current(path, ends) and wanted(path):
                        hits.append((ends, int(merged.row[k])))
        for path, ends in self._ends.recent.items():
            if wanted(path):
                hits.extend(_file_hits(ends, ids))
        return hits

    def _note_used(self) -> None:
        """Carry the uses of the files of the list last asked about (kept per file of the list as requests come) into
        when each was last used, the least recently used first."""
        view = self._view
        if view is None:
            return
        used = [(t, p) for p, t in zip(view.paths, view.used.tolist()) if t > self._used.get(p, t)]
        for t, path in sorted(used):
            self._used[path] = t
            self._ends.items.move_to_end(path)

    def _view_of(self, files: Sequence[DataFile]) -> _View:
        """What is kept of the list ``files`` (a version's, while it is the one asked about)."""
        view = self._view
        if view is None or view.files is not files:
            view = _View.of(files)
            with self._lock:
                self._note_used()
                self._view = view
        return view


T = TypeVar("T")
M = TypeVar("M")


class _Layered(Generic[T, M]):
    """Things kept by path (``items``, the least recently put or touched first) and one index of them all
    (``merged``, made by ``make``), made again once :data:`MERGED_AFTER` things were put since (kept apart in
    ``recent`` till then: a caller searches those one by one) or once half its entries (``count``: a thing's) are of
    things taken out or put anew (:meth:`current` tells)."""

    def __init__(self, make: Callable[[list[str], list[T]], M], count: Callable[[T], int]) -> None:
        self.items: OrderedDict[str, T] = OrderedDict()
        self.size = 0  # the entries of all items
        self.merged: M | None = None
        self.recent: dict[str, T] = {}  # every item is in recent or (its entries still its) in _in_merged, not both
        self._make, self._count = make, count
        self._in_merged: dict[str, T] = {}
        self._merged_size = 0
        self._stale = 0  # entries of merged whose items were taken out since

    def put(self, path: str, item: T) -> None:
        self.take(path)
        self.items[path] = item
        self.size += self._count(item)
        self.recent[path] = item
        if len(self.recent) > MERGED_AFTER:
            self.merge()

    def take(self, path: str) -> None:
        item = self.items.pop(path, None)
        if item is None:
            return
        self.size -= self._count(item)
        self.recent.pop(path, None)
        if self._in_merged.pop(path, None) is not None:
            self._stale += self._count(item)
            if self._stale > self._merged_size // 2:
                self.merge()

    def current(self, path: str, item: T) -> bool:
        """Whether ``item``, an entry of ``merged``, is ``path``'s still."""
        return self._in_merged.get(path) is item

    def merge(self) -> None:
        paths, items = list(self.items), list(self.items.values())
        self.merged = self._make(paths, items)
        self._in_merged, self.recent, self._stale, self._merged_size = dict(zip(paths, items)), {}, 0, self.size


@dataclass
class _View:
    """A list of files asked about (one version's): their logged episode_id ranges, their paths (and places in the
    list), when a request last needed each, and which were kept (their ends; their writers' ranges) when the cache
    had kept and let go ``turns`` files."""

    files: Sequence[DataFile]
    low: np.ndarray
    high: np.ndarray
    paths: list[str]
    index: dict[str, int]
    used: np.ndarray
    kept: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # each file's ends kept, as of ``turns``
    ranged: np.ndarray = field(default_factory=lambda: np.zeros(0, bool))  # each file's ranges kept, as of ``turns``
    turns: int = -1

    @classmethod
    def of(cls, files: Sequence[DataFile]) -> _View:
        low, high = np.iinfo(np.int64).min, np.iinfo(np.int64).max
        paths = [f.path for f in files]
        return cls(files, np.array([low if f.min_episode_id is None else f.min_episode_id for f in files], np.int64),
                   np.array([high if f.max_episode_id is None else f.max_episode_id for f in files], np.int64),
                   paths, {p: i for i, p in enumerate(paths)}, np.zeros(len(files)))

    def holding(self, ids: np.ndarray) -> np.ndarray:
        """Which files may hold one of ``ids`` (sorted), by their logged ranges
        (:func:`~trajstore.storage.log.files_holding`, at once)."""
        at = np.searchsorted(ids, self.low)
        return (at < len(ids)) & (ids[np.minimum(at, len(ids) - 1)] <= self.high)


@dataclass(frozen=True)
class _Merged:
    """The ends of several files as one index: every entry's episode id, sorted, its file (``owner``, a place in
    ``paths`` and ``items``) and its row in that file's ends."""

    ids: np.ndarray
    owner: np.ndarray
    row: np.ndarray
    paths: list[str]
    items: list[FileEnds]

    @classmethod
    def of(cls, paths: list[str], ends: list[FileEnds]) -> _Merged:
        sizes = np.array([e.size for e in ends], np.int64)
        ids = np.concatenate([e.episode_id for e in ends]) if ends else np.empty(0, np.int64)
        owner = np.repeat(np.arange(len(ends), dtype=np.int32), sizes)
        row = (np.arange(len(ids), dtype=np.int64) - np.repeat(np.cumsum(sizes) - sizes, sizes)).astype(np.int32)
        order = np.argsort(ids, kind="stable")
        return cls(ids[order], owner[order], row[order], paths, ends)


@dataclass(frozen=True)
class _Ranges:
    """A file's episode ids by the writer's token each carries (``id >> COUNTER_BITS``, see
    :mod:`~trajstore.write.episode_ids`): the lowest and the highest id of each token, in order. A writer counts its ids
    up from its token, so a file of many writers' episodes holds ids in a few narrow ranges, far apart."""

    low: np.ndarray
    high: np.ndarray

    @classmethod
    def of(cls, ends: FileEnds) -> _Ranges:
        ids = ends.episode_id
        if not len(ids):
            return cls(ids[:0].copy(), ids[:0].copy())
        cut = np.flatnonzero(np.diff(ids >> COUNTER_BITS)) + 1
        return cls(ids[np.r_[0, cut]], ids[np.r_[cut - 1, len(ids) - 1]])

    def count(self) -> int:
        return len(self.low)

    def hold(self, ids: np.ndarray) -> bool:
        """Whether one of ``ids`` (sorted) is within one of the ranges."""
        at = np.searchsorted(self.low, ids, "right") - 1
        return bool(((at >= 0) & (ids <= self.high[np.maximum(at, 0)])).any())


@dataclass(frozen=True)
class _Stabs:
    """The ranges of several files as one index: every range's low end, sorted, its high end, the highest high end of
    it and of those before it (``reach``: a search goes back from the last range starting at or below an id only
    while one may still reach the id), and its file (``owner``, a place in ``paths`` and ``items``)."""

    low: np.ndarray
    high: np.ndarray
    reach: np.ndarray
    owner: np.ndarray
    paths: list[str]
    items: list[_Ranges]

    @classmethod
    def of(cls, paths: list[str], ranges: list[_Ranges]) -> _Stabs:
        empty = np.empty(0, np.int64)
        low = np.concatenate([r.low for r in ranges]) if ranges else empty
        high = np.concatenate([r.high for r in ranges]) if ranges else empty
        owner = np.repeat(np.arange(len(ranges), dtype=np.int32), [r.count() for r in ranges])
        order = np.argsort(low, kind="stable")
        high = high[order]
        return cls(low[order], high, np.maximum.accumulate(high) if len(high) else high, owner[order], paths, ranges)


def _file_hits(ends: FileEnds, ids: np.ndarray) -> list[tuple[FileEnds, int]]:
    """The rows of ``ends`` (one file's) whose episode is one of ``ids`` (sorted)."""
    lo, hi = np.searchsorted(ends.episode_id, ids, "left"), np.searchsorted(ends.episode_id, ids, "right")
    return [(ends, j) for a, b in zip(lo[hi > lo].tolist(), hi[hi > lo].tolist()) for j in range(a, b)]


def _read_ends(files: Sequence[DataFile]) -> dict[str, FileEnds]:
    """What each of ``files`` holds of all its episodes, read from their key columns."""
    if len(files) == 1:
        return {files[0].path: FileEnds.of(steps_dataset(files, KEY_SCHEMA).to_table(columns=KEY_SCHEMA.names),
                                           run_id=files[0].run_id, env_id=files[0].env_id)}
    keys = steps_dataset(files, KEY_SCHEMA).to_table(columns=[*KEY_SCHEMA.names, "__fragment_index"])
    which = keys["__fragment_index"].to_numpy()
    order = np.argsort(which, kind="stable")
    keys, which = keys.take(order), which[order]
    starts = np.searchsorted(which, np.arange(len(files) + 1))
    return {f.path: FileEnds.of(keys.slice(a, b - a), run_id=f.run_id, env_id=f.env_id)
            for f, a, b in zip(files, starts[:-1].tolist(), starts[1:].tolist())}


def _combined(found: Sequence[FileEnds], ids: np.ndarray) -> list[StoredEnd]:
    """The ends of ``ids`` over several files' ends: per partition, episode and agent, the last step of any and the
    first step that ended it in any, ordered as :func:`stored_ends` orders them."""
    return _merged_ends([hit for f in found for hit in _file_hits(f, ids)])


def _merged_ends(hits: Sequence[tuple[FileEnds, int]]) -> list[StoredEnd]:
    """:func:`_combined` of the entries ``hits`` (a file's ends, a row of them)."""
    merged: dict[tuple[int, str, str, str | None], list[int]] = {}
    for f, j in hits:
        key = (int(f.episode_id[j]), f.run_id, f.env_id, f.agent_id[j])
        last, end = int(f.last[j]), int(f.end[j])
        seen = merged.get(key)
        if seen is None:
            merged[key] = [last, end]
        else:
            seen[0] = max(seen[0], last)
            seen[1] = end if seen[1] < 0 else seen[1] if end < 0 else min(seen[1], end)
    order = sorted(merged, key=lambda k: (k[0], k[1], k[2], k[3] is None, k[3] or ""))
    return [StoredEnd(r, e, i, merged[(i, r, e, a)][0], None if merged[(i, r, e, a)][1] < 0 else
                      merged[(i, r, e, a)][1], a) for i, r, e, a in order]


def check_continues(spans: Spans, stored: Sequence[StoredEnd], *, run_id: str, env_id: str) -> None:
    """Raise :class:`InputError` naming the episode (and the agent) and the step unless each episode of
    ``spans`` starts at step 0 (an id the store lacks) or continues one of ``run_id``/``env_id`` that has not
    ended right after its last stored step; each agent of a multi-agent episode goes on after its own last
    stored step if it has not ended (an agent the store lacks, or a new multi-agent episode, at any step)."""
    _refuse_other_partitions(spans, stored, run_id=run_id, env_id=env_id)
    _refuse_other_kind(spans, stored)
    held = {(s.episode_id, s.agent_id): s for s in stored}
    single = np.fromiter((a is None for a in spans.agent_id), bool, len(spans.agent_id))
    new = single & ~np.isin(spans.episode_id, np.fromiter((e for e, a in held if a is None), np.int64))
    late = np.flatnonzero(new & (spans.first != 0))
    if len(late):
        eid, first = spans.episode_id[late[0]], spans.first[late[0]]
        raise InputError(f"step: episode_id {eid} starts at step {first}, but the store holds none of its steps; "
                         "expected step 0")
    for i in np.flatnonzero(single & ~new).tolist():
        _check_after(held[(int(spans.episode_id[i]), None)], int(spans.first[i]))
    for i in np.flatnonzero(~single).tolist():
        agent_end = held.get((int(spans.episode_id[i]), spans.agent_id[i]))
        if agent_end is not None:
            _check_agent_after(agent_end, int(spans.first[i]))


def _refuse_other_partitions(spans: Spans, stored: Sequence[StoredEnd], *, run_id: str, env_id: str) -> None:
    for s in stored:
        if (s.run_id, s.env_id) != (run_id, env_id):
            first = int(spans.first[np.searchsorted(spans.episode_id, s.episode_id)])
            raise InputError(f"episode_id: episode_id {s.episode_id} (step {first} here) belongs to run_id "
                             f"{s.run_id!r}, env_id {s.env_id!r}, not to run_id {run_id!r}, env_id {env_id!r}; "
                             "rows may only continue episodes of their own run and environment")


def _refuse_other_kind(spans: Spans, stored: Sequence[StoredEnd]) -> None:
    """Refuse rows of agents continuing a stored single-agent episode, and single-agent rows a multi-agent one."""
    multi = {s.episode_id: s.agent_id is not None for s in stored}
    for i in np.flatnonzero(np.isin(spans.episode_id, np.fromiter(multi, np.int64, len(multi)))).tolist():
        eid, agent = int(spans.episode_id[i]), spans.agent_id[i]
        if multi[eid] != (agent is not None):
            held, given = ("agents'", "single-agent rows") if multi[eid] else \
                ("single-agent", f"rows of agent {agent!r}")
            raise InputError(f"agent_id: the store holds {held} rows of episode_id {eid}; {given} cannot continue "
                             "it (an episode's rows are all single-agent or all its agents')")


def _check_after(s: StoredEnd, first: int) -> None:
    if s.end_step is not None:
        raise InputError(f"step: episode_id {s.episode_id} ended at step {s.end_step} (terminated or truncated); "
                         f"step {first} cannot follow it")
    if first != s.last_step + 1:
        raise InputError(f"step: episode_id {s.episode_id} continues at step {first}, but the store holds its "
                         f"steps up to {s.last_step}; expected step {s.last_step + 1}")


def _check_agent_after(s: StoredEnd, first: int) -> None:
    where = f"agent {s.agent_id!r} of episode_id {s.episode_id}"
    if s.end_step is not None:
        raise InputError(f"step: {where} ended at step {s.end_step} (terminated or truncated); its step {first} "
                         "cannot follow it")
    if first <= s.last_step:
        raise InputError(f"step: {where} continues at step {first}, but the store holds its steps up to "
                         f"{s.last_step}; expected strictly increasing env steps for one agent in one episode "
                         f"(a step after {s.last_step}; it may skip steps)")
