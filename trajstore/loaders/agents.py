"""Agents' own trajectories, for the loaders and the exports: the rows of the chosen agents, each ``(episode,
agent)`` one trajectory of that agent's rows in ``step`` order.

A loader layout (:mod:`~trajstore.loaders.layout`) places step ``t`` of episode ``e`` at ``offset[e] + t``. The rows
of a multi-agent episode interleave its agents at each env step, and a turn-based game's agent skips the steps of
the others, so a selection of agents is laid out by trajectory instead: :func:`trajectories` numbers the
``(episode_id, agent_id)`` pairs of the selection 0, 1, … in that order and each of their rows by its place among
its agent's rows of the episode (its first row 0, its next 1, … whatever env steps lie between), and
:meth:`Trajectories.reader` hands the layout's builder batches whose ``episode_id`` is that number and whose
``step`` is that place. A window or an n-step transition then stays inside one agent's trajectory, as it stays
inside one episode. Batches name each item's episode and agent again (:meth:`Trajectories.named`): ``episode_id``
the episode's id, ``agent_id`` a numpy array of ``str``; a window's ``start`` and a transition's ``step`` count the
agent's own rows.

The numbering depends only on the files read and the agents chosen, so a layout of it is kept in the store like
any other (its key names the agents). Array copies beside the table (:mod:`~trajstore.storage.arrays`) are in
episode order, not the agent's, and are not stitched for a selection of agents: its layout is built from Parquet.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore import schema as sch
from trajstore.errors import InputError, StoreDamagedError
from trajstore.loaders.layout import Reader, read_files
from trajstore.storage.encoding import FileSchema
from trajstore.storage.log import DataFile

AGENT = "agent_id"
KEYS = ("episode_id", "step", AGENT)


@dataclass
class Trajectories:
    """The chosen agents' trajectories: per trajectory (numbered 0, 1, … by ``(episode_id, agent_id)``) its
    ``episode_id``, ``agent_id`` and ``length``; what places each stored row in one (see the module's description);
    and, per agent, the type each step column has in its files (:meth:`check`)."""

    agents: list[str]
    episode_id: np.ndarray
    agent_id: np.ndarray
    length: np.ndarray
    types: dict[str, dict[str, str]] = field(default_factory=dict)  # agent -> column -> type description
    episodes: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # sorted ids of the rows' episodes
    keys: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # every pair: episode index · n + agent
    number: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per pair: its number, -1 left out
    rows: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # every row: pair index · span + step
    first: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))  # per pair: index of its first row
    span: int = 1  # the largest step + 1

    def __len__(self) -> int:
        return len(self.episode_id)

    def check_alike(self, columns: Sequence[str]) -> None:
        """An :class:`InputError` naming the agents and the columns where the chosen agents' steps differ in
        type (``simple_tag``'s adversaries observe 16 floats, its agent 14): no array stacks them."""
        differ = []
        for name in columns:
            by_type: dict[str, list[str]] = {}
            for agent in self.agents:
                if name in self.types.get(agent, {}):
                    by_type.setdefault(self.types[agent][name], []).append(agent)
            if len(by_type) > 1:
                differ.append(f"{name} (" + "; ".join(f"{t}: {', '.join(a)}" for t, a in by_type.items()) + ")")
        if differ:
            raise InputError(f"agent_id: the agents {', '.join(map(repr, self.agents))} differ in "
                             f"{', '.join(differ)}; a batch stacks the steps of agents of alike spaces: select those "
                             "(agent_id=…)")

    def describe(self, i: int) -> str:
        """Trajectory ``i`` in words, for messages: ``episode_id 7, agent_id 'agent_0'``."""
        return f"episode_id {int(self.episode_id[i])}, agent_id {str(self.agent_id[i])!r}"

    def named(self, batch: dict[str, Any]) -> dict[str, Any]:
        """A batch of a layout of these trajectories with each item's ``episode_id`` (a trajectory's number in the
        layout) made its episode's id again, and its ``agent_id`` beside it."""
        number = np.asarray(batch["episode_id"], np.int64)
        batch["episode_id"] = self.episode_id[number]
        batch[AGENT] = self.agent_id[number]
        return batch

    def values(self, ids: np.ndarray, values: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """Per trajectory (numbered), the value of its episode among ``values`` of the sorted episode ``ids`` (0
        where its episode has none): what ``weight_by`` an ``episodes`` column weights a trajectory by."""
        at = np.minimum(np.searchsorted(ids, self.episode_id), max(len(ids) - 1, 0))
        found = np.where(ids[at] == self.episode_id, values[at], 0.0) if len(ids) else np.zeros(len(self))
        return np.arange(len(self), dtype=np.int64), np.asarray(found, np.float64)

    def reader(self, read: Reader) -> Reader:
        """``read`` (a reader of the selection's stored rows, ``episode_id``, ``step`` and ``agent_id`` among its
        columns) made a reader of the trajectories: the chosen agents' rows of the trajectories kept, each with
        its trajectory's number as ``episode_id`` and its place in it as ``step``."""
        value_set = pa.array(self.agents, pa.string())

        def remapped(columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
            asked = list(columns)
            for batch in read(list(dict.fromkeys([*asked, *KEYS]))):
                number, place, keep = self._placed(batch, value_set)
                arrays = []
                for name in asked:
                    if name == "episode_id":
                        arrays.append(pa.array(number, pa.int64()))
                    elif name == "step":
                        arrays.append(pa.array(place, pa.int64()))
                    else:
                        arrays.append(batch.column(name).filter(pa.array(keep)))
                yield pa.record_batch(arrays, names=asked)

        return remapped

    def _placed(self, batch: pa.RecordBatch, value_set: pa.Array) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """The rows of ``batch`` that belong to a trajectory kept (a mask), with its number and their place."""
        code = _codes(batch.column(AGENT), value_set)
        eid = batch.column("episode_id").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        step = batch.column("step").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        mine = code >= 0
        pair = np.full(len(code), -1, np.int64)
        if len(self.keys) and mine.any():
            episode = np.minimum(np.searchsorted(self.episodes, eid[mine]), len(self.episodes) - 1)
            key = episode * len(self.agents) + code[mine]
            at = np.minimum(np.searchsorted(self.keys, key), len(self.keys) - 1)
            at[(self.episodes[episode] != eid[mine]) | (self.keys[at] != key)] = -1
            pair[mine] = at
        row = np.minimum(np.searchsorted(self.rows, pair * self.span + step), max(len(self.rows) - 1, 0))
        known = pair >= 0
        if (mine & ~known).any() or (known & (self.rows[row] != pair * self.span + step)).any():
            raise StoreDamagedError("agent rows changed while a loader read them (a row no first reading held); "
                                    "run `trajstore check`")
        keep = known & (self.number[np.maximum(pair, 0)] >= 0) if len(self.number) else known
        return self.number[pair[keep]], (row - self.first[np.maximum(pair, 0)])[keep], keep


def _codes(column: pa.Array, value_set: pa.Array) -> np.ndarray:
    """Each row's index among ``value_set`` (the chosen agents), -1 for other agents and null."""
    if pa.types.is_dictionary(column.type):
        column = column.cast(pa.string())
    found = pc.index_in(column, value_set=value_set)
    return found.fill_null(-1).to_numpy(zero_copy_only=False).astype(np.int64)


def trajectories(files: Sequence[DataFile], schemas: Sequence[FileSchema], schema: pa.Schema,
                 episode_ids: np.ndarray | None, agents: Sequence[str], *, where: str,
                 complete_only: bool = False,
                 field: str = AGENT) -> tuple[list[DataFile], list[FileSchema], Trajectories]:
    """The files holding rows of ``agents`` among ``files`` (their schemas, ``schema`` the selection's types;
    ``episode_ids``: the episodes chosen, None for all) and the agents' trajectories in them; with
    ``complete_only``, those whose last row has ``terminated`` or ``truncated`` (the agent's own end) alone.
    An :class:`InputError` naming ``field`` (the caller's name of the agents asked for; ``where`` says what was
    selected) when an agent has no row."""
    chosen = sorted(dict.fromkeys(agents))
    if not chosen:
        raise InputError(f"{field}: expected one agent id or several, got none")
    value_set = pa.array(chosen, pa.string())
    flags = ["terminated", "truncated"] if complete_only else []
    types: dict[str, dict[str, str]]
    kept_files, kept_schemas, types = [], [], {}
    parts: list[tuple[np.ndarray, ...]] = []
    present: set[str] = set()
    for f, s in zip(files, schemas):
        if AGENT not in s.logical.names:
            continue
        held: set[int] = set()
        for batch in read_files([f], schema, [*KEYS, *flags], episode_ids, [s]):
            code = _codes(batch.column(AGENT), value_set)
            present.update(a for a in pc.unique(batch.column(AGENT).cast(pa.string())).to_pylist() if a)
            mine = code >= 0
            if not mine.any():
                continue
            held.update(np.unique(code[mine]).tolist())
            cols = [batch.column(c).to_numpy(zero_copy_only=False)[mine] for c in ("episode_id", "step", *flags)]
            ended = cols[2] | cols[3] if flags else np.zeros(int(mine.sum()), bool)
            parts.append((cols[0].astype(np.int64), cols[1].astype(np.int64), code[mine], ended.astype(bool)))
        if held:
            kept_files.append(f)
            kept_schemas.append(s)
            for a in held:
                mine_types = types.setdefault(chosen[a], {})
                for column in s.logical:
                    mine_types.setdefault(column.name, sch.describe(column.type))
    missing = [a for a in chosen if a not in present]
    if missing:
        there = sorted(present)
        raise InputError(f"{field}: no rows of {', '.join(map(repr, missing))} in {where}; "
                         + (f"its agents are {', '.join(map(repr, there))}" if there else
                            "it holds no multi-agent episodes (rows with an agent_id)"))
    return kept_files, kept_schemas, _numbered(chosen, parts, types, complete_only)


def _numbered(agents: list[str], parts: list[tuple[np.ndarray, ...]], types: dict[str, dict[str, str]],
              complete_only: bool) -> Trajectories:
    """The trajectories of the rows ``parts`` (episode ids, steps, agent codes, ended flags)."""
    eid, step, code, ended = (np.concatenate([p[i] for p in parts]) for i in range(4))
    episodes = np.unique(eid)
    keys, pair = np.unique(np.searchsorted(episodes, eid) * len(agents) + code, return_inverse=True)
    span = int(step.max()) + 1
    rows_of = pair.astype(np.int64) * span + step
    order = np.argsort(rows_of, kind="stable")
    rows = rows_of[order]
    twice = np.flatnonzero(rows[1:] == rows[:-1])
    if len(twice):
        k = pair[order[twice[0]]]
        raise StoreDamagedError(f"episode {episodes[keys[k] // len(agents)]}: agent {agents[keys[k] % len(agents)]!r} "
                                f"has two rows at step {step[order[twice[0]]]}; run `trajstore check`")
    first = np.searchsorted(rows, np.arange(len(keys), dtype=np.int64) * span)
    length = np.diff(np.concatenate([first, [len(rows)]])).astype(np.int64)
    kept = ended[order][first + length - 1] if complete_only else np.ones(len(keys), bool)
    number = np.where(kept, np.cumsum(kept) - 1, -1).astype(np.int64)
    names = np.array(agents, dtype=str)
    return Trajectories(agents, episodes[keys // len(agents)][kept], names[keys % len(agents)][kept], length[kept],
                        types, episodes, keys, number, rows, first.astype(np.int64), span)
