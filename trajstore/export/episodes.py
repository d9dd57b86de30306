"""The episodes an export writes, streamed: whole episodes in ``episode_id`` order, a bounded group at a time.

A store's files hold many episodes interleaved (one writer's envs step together) and an episode can span many
files, so no order of reading the files gives whole episodes. :func:`select` lays the selected steps out once,
episode-major, on local disk (:mod:`trajstore.loaders.layout`, the training loaders' layout: one streaming pass
over the committed files, no sort, memory of one record batch), pinned to one version of the store. Then
:meth:`Selection.groups` reads whole episodes back from it in groups of about ``GROUP_BYTES`` (one episode larger
than that is a group of its own): an export holds one group at a time, whatever the size of the selection. The
temporary files (the selected columns, uncompressed) live until the selection is closed.

A run of multi-agent episodes is exported one agent at a time (``agent=``): that agent's own trajectory in each
episode (its rows in ``step`` order, :mod:`trajstore.loaders.agents`) is an episode of the dataset, complete when
its last row has ``terminated`` or ``truncated``. Without ``agent`` such a run is refused, naming its agents.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore.errors import InputError, StoreDamagedError
from trajstore.loaders import layout as lay
from trajstore.storage.log import DataFile
from trajstore.store import plumbing

if TYPE_CHECKING:
    from trajstore.store import Store

COLUMNS = ("obs", "next_obs", "action", "reward", "terminated", "truncated")
GROUP_BYTES = 16 << 20  # steps read back from the layout at a time (whole episodes)
ONE_ENV = "export one environment at a time (run_id=… or where=\"env_id = '…'\")"


@dataclass
class Episode:
    """One stored episode: ids, then ``(T, …)`` arrays of its steps in order."""

    run_id: str
    env_id: str
    episode_id: int
    obs: np.ndarray
    next_obs: np.ndarray
    action: np.ndarray
    reward: np.ndarray
    terminated: np.ndarray
    truncated: np.ndarray

    def __len__(self) -> int:
        return len(self.reward)


@dataclass
class EpisodeGroup:
    """Consecutive whole episodes of a selection: each column's steps of all of them, episode after episode,
    and where each episode starts in those arrays."""

    first: int  # position of the group's first episode in the selection
    episode_id: np.ndarray
    run_id: list[str]
    env_id: list[str]
    length: np.ndarray
    columns: dict[str, np.ndarray]
    agent: str | None = None  # the agent whose trajectories these episodes are (None: whole episodes)
    start: np.ndarray = field(init=False)

    def __post_init__(self) -> None:
        self.start = (np.cumsum(self.length) - self.length).astype(np.int64)

    def __len__(self) -> int:
        return len(self.episode_id)

    @property
    def steps(self) -> int:
        return int(self.length.sum())

    def episode(self, i: int) -> Episode:
        """Episode ``i`` of the group (its arrays are views into the group's)."""
        a, b = int(self.start[i]), int(self.start[i] + self.length[i])
        c = {name: values[a:b] for name, values in self.columns.items()}
        return Episode(self.run_id[i], self.env_id[i], int(self.episode_id[i]), c["obs"], c["next_obs"],
                       c["action"], c["reward"], c["terminated"], c["truncated"])

    def __iter__(self) -> Iterator[Episode]:
        return (self.episode(i) for i in range(len(self)))


@dataclass
class ExportResult:
    """What an export wrote: where, how many episodes and steps, from which runs."""

    target: str
    episodes: int = 0
    steps: int = 0
    runs: list[str] = field(default_factory=list)
    kind: str = ""
    agent: str | None = None  # the agent whose trajectories were exported

    def format(self) -> str:
        whose = "" if self.agent is None else f" of agent {self.agent!r}"
        return (f"exported {self.episodes} episode(s){whose}, {self.steps} step(s) of run(s) {', '.join(self.runs)} "
                f"as {self.kind} {self.target}")

    __str__ = format


class Selection:
    """The selected episodes of one version of a store, laid out on local disk (see the module's docstring);
    a context manager that removes the layout's files on exit."""

    def __init__(self, store: Store, layout: lay.Layout, runs: np.ndarray, envs: np.ndarray,
                 names: tuple[list[str], list[str]], kinds: dict[str, tuple[np.dtype, tuple[int, ...]]],
                 episode_ids: np.ndarray | None = None, agent: str | None = None) -> None:
        self.store = store
        self.layout = layout
        self.agent = agent  # the agent whose trajectories these are (None: whole single-agent episodes)
        self.episode_ids = layout.episode_id if episode_ids is None else episode_ids  # per episode, its stored id
        self._run, self._env = runs, envs  # per episode: index into names
        self._names = names
        self.kinds = kinds  # column -> (numpy dtype, shape of one step)

    def __enter__(self) -> Selection:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def close(self) -> None:
        self.layout.close()

    @property
    def episodes(self) -> int:
        return len(self.layout.episode_id)

    @property
    def steps(self) -> int:
        return self.layout.steps

    @property
    def runs(self) -> list[str]:
        return sorted({self._names[0][i] for i in np.unique(self._run)})

    @property
    def env_ids(self) -> list[str]:
        return sorted({self._names[1][i] for i in np.unique(self._env)})

    def groups(self, max_bytes: int | None = None) -> Iterator[EpisodeGroup]:
        """Whole episodes in ``episode_id`` order, about ``max_bytes`` (default ``GROUP_BYTES``) of steps at a
        time; an episode larger than that is a group of its own."""
        max_bytes = GROUP_BYTES if max_bytes is None else max_bytes
        per_step = sum(np.dtype(d).itemsize * int(np.prod(s, dtype=np.int64)) for d, s in self.kinds.values())
        budget = max(1, max_bytes // max(1, per_step))
        lay_ = self.layout
        ends = lay_.offset + lay_.length
        first = 0
        while first < self.episodes:
            last = max(first + 1, int(np.searchsorted(ends, lay_.offset[first] + budget, side="right")))
            lo, hi = int(lay_.offset[first]), int(ends[last - 1])
            columns = {name: _read(lay_.columns[name], lo, hi) for name in COLUMNS}
            yield EpisodeGroup(first, self.episode_ids[first:last], [self._names[0][i] for i in self._run[first:last]],
                               [self._names[1][i] for i in self._env[first:last]], lay_.length[first:last], columns,
                               self.agent)
            first = last

    def __iter__(self) -> Iterator[Episode]:
        for group in self.groups():
            yield from group

    def largest(self, name: str) -> float:
        """The largest value of column ``name`` over every selected step (read from the layout in pieces)."""
        out = -np.inf
        for a in range(0, self.steps, lay.CHUNK_STEPS):
            piece = _read(self.layout.columns[name], a, min(self.steps, a + lay.CHUNK_STEPS))
            out = max(out, float(piece.max())) if piece.size else out
        return out


def _read(column: lay.Column, lo: int, hi: int) -> np.ndarray:
    """Steps ``lo:hi`` of a layout column as an array of this process (the map is closed again)."""
    values = column.open()
    try:
        return np.array(values[lo:hi])
    finally:
        del values


def select(store: Store, *, run_id: str | Sequence[str] | None = None, where: str | None = None,
           include_unfinished: bool = False, agent: str | None = None) -> Selection:
    """The complete episodes (with ``include_unfinished``, the unfinished ones too) of ``run_id`` (all runs when
    None) that ``where`` (a condition over the episodes view) selects, laid out for export at the store's current
    version; with ``agent``, that agent's own trajectory in each of them (complete: ended by its last row). Close
    it (or use it in a ``with`` block)."""
    runs = [run_id] if isinstance(run_id, str) else list(run_id or [])
    if agent is not None and (not isinstance(agent, str) or not agent.strip() or "," in agent):
        raise InputError(f"agent: expected one agent id (a dataset holds one agent per step), got {agent!r}")
    if not include_unfinished and agent is None:  # an agent's trajectory is complete by its own end (below)
        where = "complete" if where is None else f"complete AND ({where})"
    plumbing(store).check_runs(runs)
    if store.version < 0:
        raise InputError(f"run_id/where: nothing to export from {store.uri}: the store is empty")
    pinned = store if store.read_only else store.at(version=store.version)  # every read sees one version
    files, chosen = _files(pinned, runs, where)
    if not files or (chosen is not None and len(chosen) == 0):
        raise InputError(f"run_id/where: nothing to export from {store.uri} (run_id={run_id!r}, where={where!r})")
    if agent is None:
        _refuse_agents(pinned, files)
        plumbing(pinned).step_types(files).check_one_type(list(COLUMNS), stackable=True, hint=ONE_ENV)  # names the envs
    source = plumbing(pinned).loader_source(run_id=runs or None, where=where, agent_id=agent,
                                            complete_only=not include_unfinished, agent_field="agent")
    if source.check_types is not None and agent is not None:
        source.check_types(list(COLUMNS))  # the agent's files alone: their environments' types
    ids = None if source.trajectories is None else source.trajectories.episode_id
    if ids is not None and not len(ids):
        raise InputError(f"run_id/where: nothing to export from {store.uri}: agent {agent!r} ended none of the "
                         f"selected episodes (run_id={run_id!r}, where={where!r}); include_unfinished exports them")
    kinds = {name: _kind(source.schema, name) for name in COLUMNS}
    layout = lay.build(source.read, source.schema, list(COLUMNS))
    try:
        run_idx, env_idx, names = _owners(files, chosen, layout.episode_id if ids is None else ids, store.uri)
    except BaseException:
        layout.close()
        raise
    return Selection(pinned, layout, run_idx, env_idx, names, kinds, ids, agent)


def _refuse_agents(store: Store, files: list[DataFile]) -> None:
    """An :class:`InputError` naming the runs whose selected files hold rows of multi-agent episodes, and their
    agents: an export format holds one agent per step, so such a run is exported one agent at a time."""
    schemas = plumbing(store).file_schemas(files)
    held = [f for f, s in zip(files, schemas) if "agent_id" in s.logical.names]
    if held:
        runs = sorted({f.run_id for f in held})
        agents = pa.concat_arrays([pc.unique(b.column(0).cast(pa.string())) for b in
                                   lay.read_files(held, pa.schema([pa.field("agent_id", pa.string())]), ["agent_id"])]
                                  or [pa.array([], pa.string())])
        names = sorted(a for a in set(agents.to_pylist()) if a)
        raise InputError(f"run_id: {', '.join(map(repr, runs))} holds multi-agent episodes (rows with an agent_id), "
                         f"and an exported dataset holds one agent per step: export one agent (agent=…), one of "
                         f"{', '.join(names)}; or export single-agent runs (run_id=…)")


def _files(store: Store, runs: list[str], where: str | None) -> tuple[list[DataFile], np.ndarray | None]:
    """The committed files holding the selection, and the ids of the episodes ``where`` chose (None: all
    episodes of the files); a condition needs DuckDB, runs alone only the file list."""
    if where is None:
        return [f for f in store.maintain.files() if not runs or f.run_id in runs], None
    plan = plumbing(store).scan_plan(["episode_id"], run_id=runs or None, where=where)
    return plan.files, plan.episode_ids


def _kind(schema: pa.Schema, name: str) -> tuple[np.dtype, tuple[int, ...]]:
    """The numpy dtype and step shape of a stored column, or an :class:`InputError` saying why it cannot be
    exported (Dict spaces, or observations whose shape differs between the selected environments)."""
    t = schema.field(name).type
    if pa.types.is_struct(t):
        raise InputError(f"{name}: Dict observation/action spaces (struct columns) are not exported yet")
    try:
        return lay.column_type(schema, name)
    except InputError:
        raise InputError(f"{name}: its shape differs between the selected environments; {ONE_ENV}") from None


def _owners(files: list[DataFile], chosen: np.ndarray | None, ids: np.ndarray,
            uri: str) -> tuple[np.ndarray, np.ndarray, tuple[list[str], list[str]]]:
    """For each of the sorted ``ids``, the index of its run and env in the returned name lists: those of the
    files holding it (an episode is one writer's, so all its files are of one run and env)."""
    runs = sorted({f.run_id for f in files})
    envs = sorted({f.env_id for f in files})
    run_idx = np.full(len(ids), -1, np.int64)
    env_idx = np.full(len(ids), -1, np.int64)
    schema = pa.schema([pa.field("episode_id", pa.int64())])
    for f in files:
        pieces = [np.unique(b.column(0).to_numpy()) for b in lay.read_files([f], schema, ["episode_id"], chosen)]
        held = np.unique(np.concatenate(pieces)) if pieces else np.zeros(0, np.int64)
        at = np.minimum(np.searchsorted(ids, held), max(len(ids) - 1, 0))
        at = at[ids[at] == held] if len(ids) else at[:0]  # the selection's episodes among those held
        run_idx[at] = runs.index(f.run_id)
        env_idx[at] = envs.index(f.env_id)
    if (run_idx < 0).any():
        raise StoreDamagedError(f"episode {ids[np.argmax(run_idx < 0)]} of {uri} is in no committed file of the "
                                "selection; run `trajstore check`")
    return run_idx, env_idx, (runs, envs)
