"""Files another tool wrote into the table: OPTIMIZE and Z-ORDER, DELETE, UPDATE and MERGE rewrites, appends.

trajstore's own files (their footer records their format) are each in episode-and-step order and complete: an
episode's first row in a file holds whole frame stacks, a null ``next_obs_sparse`` is followed by the episode's
next step in the same file. Another tool's files (read through the table's declarations, see
:func:`~trajstore.storage.encoding.foreign_format`) promise neither. So before a reader uses them, the steps of every
partition holding one are checked (:func:`check`): each ``(episode_id, step)`` once and no step missing between
an episode's first and last, else one :class:`ForeignChangeError` names the episode and the version whose commit
added the file; and :func:`in_order` tells whether the files can be decoded one by one as trajstore's own (each
in episode-and-step order, no episode split between two: a DELETE or an OPTIMIZE into one file per partition
keeps that, a Z-ORDER does not), else readers sort their rows by episode and step before decoding.
Results are kept per set of files (committed files never change).
"""

from __future__ import annotations

import threading
from typing import Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute
import pyarrow.parquet as pq

from trajstore.errors import StoreDamagedError
from trajstore.storage.encoding import FileEncoding, FileSchema
from trajstore.storage.log import DataFile

KEPT = 1024  # verdicts kept per process
_lock = threading.Lock()
_checked: dict[frozenset[str], bool] = {}
_grouped: dict[frozenset[str], bool] = {}


class ForeignChangeError(StoreDamagedError):
    """Another tool changed the table in a way trajstore cannot read back exactly (a duplicate step, a missing
    step in the middle of an episode, rows it cannot decode); the message names the episode and the version."""


def foreign(schemas: Sequence[FileSchema]) -> list[int]:
    """The indices of the files another tool wrote."""
    return [i for i, s in enumerate(schemas) if s.format.foreign]


def check_partitions(files: Sequence[DataFile], schemas: Sequence[FileSchema],
                     version_of: Callable[[str], int | None]) -> None:
    """Raise :class:`ForeignChangeError` when a partition holding a file another tool wrote has a step twice or
    misses a step between an episode's first and last (``version_of``: the version that added a file)."""
    parts = {(files[i].run_id, files[i].env_id) for i in foreign(schemas)}
    if not parts:
        return
    chosen = [(f, s) for f, s in zip(files, schemas) if (f.run_id, f.env_id) in parts]
    key = frozenset(f.path for f, _ in chosen)
    with _lock:
        if key in _checked:
            return
    keys = [_keys(f, s.format, agents=True) for f, s in chosen]
    eid = np.concatenate([k[0] for k in keys]) if keys else np.empty(0, np.int64)
    step = np.concatenate([k[1] for k in keys]) if keys else np.empty(0, np.int64)
    agent, agent_names = _agent_codes([k[2] for k in keys])
    source = np.repeat(np.arange(len(chosen)), [len(k[0]) for k in keys])
    order = np.lexsort((step, agent, eid))
    eid, step, agent, source = eid[order], step[order], agent[order], source[order]
    same = (eid[1:] == eid[:-1]) & (agent[1:] == agent[:-1])
    single = agent[1:] < 0  # an agent's own steps may skip (turns, agents that join late): not checked
    for bad, what in ((same & (step[1:] == step[:-1]), "is stored twice"),
                      (same & single & (step[1:] > step[:-1] + 1), "is missing")):
        hit = np.flatnonzero(bad)
        if len(hit):
            i = int(hit[0])
            both = [chosen[int(source[i])], chosen[int(source[i + 1])]]
            culprit = next((f for f, s in both if s.format.foreign), both[1][0])
            missing = int(step[i]) + 1 if what == "is missing" else int(step[i + 1])
            version = version_of(culprit.path)
            whose = "" if agent[i] < 0 else f" of agent {agent_names[int(agent[i])]!r}"
            raise ForeignChangeError(
                f"episode {int(eid[i])} (run {culprit.run_id!r}, env {culprit.env_id!r}): step {missing}{whose} "
                f"{what} "
                f"after another tool changed the table (version {version if version is not None else '?'} added "
                f"{culprit.uri}); trajstore cannot read this episode back exactly: restore an earlier version "
                "(`trajstore open --version`, or deltalake's restore) or delete the whole episode",
                path=culprit.uri)
    with _lock:
        if len(_checked) >= KEPT:
            _checked.clear()
        _checked[key] = True


def in_order(files: Sequence[DataFile], fmt: FileEncoding) -> bool:
    """Whether ``files`` (another tool's, of format ``fmt``) can be decoded file by file, as trajstore's own: each
    holds each of its episodes' rows together and in step order, and no episode has rows in two of them (an
    episode a rewrite split may need rows of another file to decode)."""
    key = frozenset(f.path for f in files)
    with _lock:
        known = _grouped.get(key)
    if known is None:
        seen: set[int] = set()
        known = True
        for f in files:
            eid, step, _ = _keys(f, fmt)
            ids = set(np.unique(eid).tolist())
            if not _file_in_order(eid, step) or ids & seen:
                known = False
                break
            seen |= ids
        with _lock:
            if len(_grouped) >= KEPT:
                _grouped.clear()
            _grouped[key] = known
    return known


def _keys(f: DataFile, fmt: FileEncoding, *, agents: bool = False) -> tuple[np.ndarray, np.ndarray, pa.Array]:
    """A file's ``episode_id`` and ``step``, and with ``agents`` its ``agent_id`` (all null where it has none)."""
    names = [fmt.physical(c) for c in ("episode_id", "step")]
    held = pq.read_schema(f.path, filesystem=f.fs).names if agents else []
    agent = fmt.physical("agent_id")
    table = pq.read_table(f.path, columns=names + ([agent] if agent in held else []), filesystem=f.fs)
    ids = table.column(2).combine_chunks() if agent in held else pa.nulls(table.num_rows, pa.string())
    return (table.column(0).to_numpy().astype(np.int64, copy=False),
            table.column(1).to_numpy().astype(np.int64, copy=False), ids)


def _agent_codes(ids: Sequence[pa.Array]) -> tuple[np.ndarray, list[str]]:
    """Each row's agent as a number (its index in the sorted agent names, also returned; -1 for a single-agent
    row)."""
    if not ids:
        return np.empty(0, np.int64), []
    values = pa.chunked_array(ids, pa.string()).combine_chunks()
    names = sorted(set(values.drop_null().to_pylist()))
    codes = pa.compute.index_in(values, pa.array(names, pa.string())).fill_null(-1)
    return codes.to_numpy().astype(np.int64), names


def _file_in_order(eid: np.ndarray, step: np.ndarray) -> bool:
    if len(eid) < 2:
        return True
    follows = (eid[1:] == eid[:-1]) & (step[1:] == step[:-1] + 1)
    starts = np.r_[0, np.flatnonzero(~follows) + 1]
    return len(np.unique(eid[starts])) == len(starts)


def sorted_rows(table: pa.Table) -> pa.Table:
    """``table``'s rows by episode and step (stable)."""
    return table.take(np.lexsort((table["step"].to_numpy(), table["episode_id"].to_numpy())))
