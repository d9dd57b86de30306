"""What readers need of a committed data file without reading it, kept beside the table: its footer's schema and
its episodes' fragments.

A store keeps, for each committed data file that a reader has summarized (:mod:`trajstore.query.summarized`
computes them), one Arrow IPC file under ``summaries/`` beside ``steps/`` (an ``s3://`` store: in its folder on this
machine, :mod:`~trajstore.storage.cache`)::

    summaries/<digest of the file's path in the table>.arrow

whose schema metadata (key ``trajstore``) names the data file (its path in the table, its size in bytes and when it
was last modified) and
holds its footer's Arrow schema (and, for a file another tool wrote, the footer's null counts and rows: what
:func:`~trajstore.storage.table.read_file_schema` reads), and whose rows are the file's *fragments*: one row per
episode (and agent) of the file, the partial aggregates the ``episodes`` view combines (rows, reward sum, first and
last step, ends, lineage at the first step, …).

Every data file trajstore writes into a store (a writer's flush, an ingest, a compaction, a delete's or
``add_column``'s rewrite) gets its summary right after the file, on the thread that encoded it, from the rows still
in memory (:meth:`Summaries.write_rows`, :func:`file_fragments`: numpy over the file's runs of rows, no DuckDB, no
re-read), so that the first read of a store trajstore wrote summarizes nothing; readers summarize the files that
have none (another tool's, a store written before summaries existed).

A summary is a cache of what its data file says, never a second source of truth, kept by the rule of every such
cache (:class:`~trajstore.storage.cache.FileCache`): it is read only when it names the committed file's path, size
and modification time (committed files never change: a rewrite is a new file; a file damaged in place is read, and
found damaged), written whole into a temporary file and renamed into place (a killed process leaves at most a
temporary file, which nothing reads and ``prune`` removes), and removed with its file by vacuum (or with a write
that failed). One that cannot be written or read is logged and skipped: readers aggregate the file's steps instead.
"""

from __future__ import annotations

import base64
import json
import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.ipc as ipc

from trajstore import schema as sch
from trajstore.storage.cache import FileCache, FileId
from trajstore.storage.encoding import FileSchema

log = logging.getLogger(__name__)

FOLDER = "summaries"
FORMAT = 1
META_KEY = b"trajstore"
SUFFIX = ".arrow"
MAPPED_BYTES = 1 << 20  # summaries this large are mapped, not read
# the step columns a file's fragments are made of (with the lineage columns of the episodes view)
FRAGMENT_COLUMNS = ("episode_id", "step", "reward", "terminated", "truncated", "wall_time", "env_steps", "agent_id")
TIME_ZONE = "UTC"  # the zone fragments' times are kept in (DuckDB gives its own setting's)


def kept_type(t: pa.DataType) -> bool:
    """Whether a lineage value of type ``t`` is kept in a fragment as the file holds it (DuckDB gives it back as
    it is); a file with another is summarized by readers."""
    return pa.types.is_integer(t) or t in (pa.float32(), pa.float64(), pa.bool_(), pa.string())


def lineage_step(name: str) -> str:
    """The fragment column holding the step a lineage column's value was taken at."""
    return f"{name}__step"


@dataclass(frozen=True)
class Footer:
    """What a data file's footer says that readers need: its Arrow schema (with its metadata), and for a file
    another tool wrote, its null values per column and its rows (None for trajstore's own files)."""

    schema: pa.Schema
    nulls: dict[str, int | None] | None = None
    rows: int | None = None
    key: str | None = field(default=None, compare=False)  # the schema as a summary holds it: equal for equal schemas


@dataclass(frozen=True)
class Summary:
    """One data file's summary: its footer and its episodes' fragments (see :mod:`trajstore.query.summarized`)."""

    footer: Footer
    fragments: pa.Table


class Summaries(FileCache):
    """The summaries of a store's data files, under ``folder`` (a local store's ``summaries/``; an ``s3://`` store's
    in its cache folder on this machine): a :class:`~trajstore.storage.cache.FileCache`."""

    def __init__(self, folder: str | Path) -> None:
        super().__init__(folder, owner=_owner, suffix=SUFFIX)
        self._failed = False

    def read(self, rel: str, size: int, modified_ns: int) -> Summary | None:
        """The summary of the data file ``rel`` (its path in the table) of ``size`` bytes, last modified at
        ``modified_ns`` (its ``st_mtime_ns``; 0 on an object store), or None where there is none, or it names
        another file, size or time (a file changed in place since), or cannot be read whole."""
        path = self.path_of(rel)
        try:
            with open(path, "rb") as source:  # small: read at once; large: mapped (the page cache's own pages)
                body = source.read() if os.fstat(source.fileno()).st_size < MAPPED_BYTES else None
            reader = ipc.open_file(pa.py_buffer(body) if body is not None else pa.memory_map(path))
            meta = json.loads((reader.schema.metadata or {})[META_KEY])
            if meta.get("format") != FORMAT or not FileId(rel, size, modified_ns).named_by(meta):
                return None
            footer = Footer(ipc.read_schema(pa.py_buffer(base64.b64decode(meta["footer"]))), meta.get("nulls"),
                            meta.get("rows"), meta["footer"])
            fragments = reader.read_all()
        except FileNotFoundError:
            return None
        except (OSError, ValueError, KeyError, TypeError, pa.ArrowException) as exc:
            log.warning("the summary of %s cannot be read (%s); its steps are read instead", rel, exc)
            return None
        return Summary(footer, canonical(fragments.replace_schema_metadata(None)))

    def write_rows(self, rel: str, size: int, modified_ns: int, footer: pa.Schema, data: pa.Table, *,
                   run_id: str, env_id: str) -> bool:
        """Keep the summary of the data file ``rel`` just written (``size`` bytes, modified at ``modified_ns``, its
        footer's schema ``footer``) from its rows ``data`` (as stored: physical names) of partition ``run_id``/
        ``env_id``; whether it was. A file whose rows :func:`file_fragments` does not make is left to readers."""
        try:
            made = file_fragments(data, FileSchema.of(footer, where=rel), run_id=run_id, env_id=env_id)
        except Exception as exc:  # noqa: BLE001 - a cache: readers summarize the file
            log.warning("no summary of %s kept (%s); readers will summarize it", rel, exc)
            return False
        return made is not None and self.write(rel, size, modified_ns, Summary(Footer(footer), made))

    def write(self, rel: str, size: int, modified_ns: int, summary: Summary) -> bool:
        """Keep ``summary`` as that of the data file ``rel`` of ``size`` bytes modified at ``modified_ns``, written
        whole by a rename; whether it was. A failure is logged, never raised: readers summarize the file again."""
        try:
            self._write(FileId(rel, size, modified_ns), summary)
            return True
        except Exception as exc:  # noqa: BLE001 - a cache: the file's steps are read instead
            (log.debug if self._failed else log.warning)("no summary of %s kept (%s)", rel, exc)
            self._failed = True  # said once (a folder that cannot be written refuses every file)
            return False

    def _write(self, f: FileId, summary: Summary) -> None:
        footer = summary.footer
        meta: dict[str, Any] = {"format": FORMAT, **f.meta(),
                                "footer": base64.b64encode(footer.schema.serialize().to_pybytes()).decode()}
        if footer.nulls is not None:
            meta.update(nulls=footer.nulls, rows=footer.rows)
        table = summary.fragments.replace_schema_metadata({META_KEY: json.dumps(meta).encode()})
        with self.writing(f.rel) as partial, pa.OSFile(str(partial), "wb") as sink, \
                ipc.new_file(sink, table.schema) as out:
            out.write_table(table)


def _owner(path: Path) -> str | None:
    """The data file the summary at ``path`` is of, or None where it cannot be read."""
    try:
        with pa.memory_map(str(path)) as source:
            return str(json.loads((ipc.open_file(source).schema.metadata or {})[META_KEY])["file"])
    except (OSError, ValueError, KeyError, TypeError, pa.ArrowException):
        return None


def canonical(fragments: pa.Table) -> pa.Table:
    """``fragments`` as summaries keep them: text dictionary-encoded (a file's partition, agents and lineage text
    take a few values each), times in :data:`TIME_ZONE` (the same instants)."""
    for i, f in enumerate(fragments.schema):
        column = fragments.column(i)
        if pa.types.is_string(f.type) or pa.types.is_large_string(f.type):
            column = pc.dictionary_encode(column)
        elif pa.types.is_timestamp(f.type) and f.type.tz not in (None, TIME_ZONE):
            column = column.cast(pa.timestamp(f.type.unit, TIME_ZONE))
        else:
            continue
        fragments = fragments.set_column(i, f.name, column)
    return fragments


def file_fragments(data: pa.Table, stored: FileSchema, *, run_id: str, env_id: str) -> pa.Table | None:
    """The fragments of one file's rows ``data`` (physical names, as ``stored`` says) of partition ``run_id``/
    ``env_id``: per episode and agent, what :func:`trajstore.query.sql.episode_fragments` computes from the file,
    in its order (episode, then agent, unnamed agent last), :func:`canonical`; computed by numpy over the runs of
    rows of one episode and agent (:class:`_Runs`). None for a file readers must summarize themselves
    (:func:`_summarizable`; a step twice in one episode and agent)."""
    if stored.format.foreign:
        return None
    names = set(stored.logical.names)
    columns = {n: data.column(stored.format.physical(n)) for n in (*FRAGMENT_COLUMNS, *sch.episode_lineage())
               if n in names}
    runs = _Runs.of(columns) if _summarizable(columns) else None
    if runs is None:
        return None
    fixed = sch.fixed_types()
    keys = runs.keys(columns["episode_id"].type, columns["step"].type)
    out = {"run_id": pa.array([run_id] * runs.k, pa.string()), "env_id": pa.array([env_id] * runs.k, pa.string()),
           "episode_id": keys.pop("episode_id"), "agent_id": keys.pop("agent_id"), "rows": keys.pop("rows"),
           **runs.sums(columns), **keys}
    out["started_at"], out["ended_at"] = runs.extremes(columns.get("wall_time"), fixed["wall_time"])
    out["env_steps"] = runs.extremes(columns.get("env_steps"), fixed["env_steps"], least=False)[1]
    lineage = sch.lineage_columns()
    for name in sch.episode_lineage():
        out[name], out[lineage_step(name)] = runs.first_value(columns.get(name), lineage[name],
                                                              columns["step"].type)
    return canonical(pa.table(out))


def _summarizable(columns: dict[str, pa.ChunkedArray]) -> bool:
    """Whether a file of ``columns`` (by logical name) has the keys, rewards and end flags without nulls, times and
    env-step counts of the schema's types, and lineage of types DuckDB gives back as they are."""
    fixed = sch.fixed_types()
    return all(n in columns and not columns[n].null_count for n in ("episode_id", "step", "reward", "terminated",
                                                                     "truncated")) and \
        all(columns[n].type == fixed[n] for n in ("wall_time", "env_steps") if n in columns) and \
        all(kept_type(columns[n].type) for n in sch.episode_lineage() if n in columns)


@dataclass
class _Runs:
    """A file's rows as runs of one episode and agent each, one run per episode and agent, its steps increasing:
    in the file's order, or in ``order`` (a permutation of the rows) where the file has them apart. ``starts``:
    each run's first row (in that order); ``first``: the runs in the fragments' order (episode, then agent)."""

    n: int
    order: np.ndarray | None
    episode: np.ndarray
    step: np.ndarray
    codes: np.ndarray | None  # each row's agent (its place among the file's names; unnamed last), or None
    agents: pa.Array | None  # the file's agent names in that order
    starts: np.ndarray
    first: np.ndarray

    @classmethod
    def of(cls, columns: dict[str, pa.ChunkedArray]) -> _Runs | None:
        episode, step = (np.asarray(columns[n].to_numpy()) for n in ("episode_id", "step"))
        n, agent = len(episode), columns.get("agent_id")
        codes, agents = _agent_codes(agent) if agent is not None and agent.null_count < n else (None, None)
        order = None
        for _ in range(2):
            found = _runs(episode, step, codes)
            if found is not None:
                starts, first = found
                return cls(n, order, episode, step, codes, agents, starts, first)
            if order is not None:
                return None  # a step twice in one episode and agent: readers' arg_min decides
            order = np.lexsort((step, np.zeros(n, np.int64) if codes is None else codes, episode))
            episode, step, codes = episode[order], step[order], None if codes is None else codes[order]
        return None

    @property
    def k(self) -> int:
        return len(self.starts)

    def values(self, c: pa.ChunkedArray | pa.Array) -> np.ndarray:
        """Column ``c`` as numpy, in the runs' row order."""
        a = np.asarray(c.to_numpy() if isinstance(c, pa.ChunkedArray) else c.to_numpy(zero_copy_only=False))
        return a if self.order is None else a[self.order]

    def reduce(self, ufunc: np.ufunc, a: np.ndarray) -> np.ndarray:
        """``ufunc`` over each run of ``a``, in the fragments' order."""
        return ufunc.reduceat(a, self.starts)[self.first] if self.k else a[:0]

    def count(self, flags: pa.ChunkedArray | pa.Array) -> np.ndarray:
        """How many rows of each run have ``flags`` (a boolean column without nulls; few true), in the fragments'
        order: counted from the true rows' numbers, the bitmap never unpacked."""
        rows = _true_rows(flags.combine_chunks() if isinstance(flags, pa.ChunkedArray) else flags)
        if self.order is not None:
            rows = np.sort(np.argsort(self.order)[rows])
        run = np.searchsorted(self.starts, rows, side="right") - 1
        return np.bincount(run, minlength=self.k)[self.first]

    def keys(self, id_type: pa.DataType, step_type: pa.DataType) -> dict[str, pa.Array]:
        """Each fragment's episode, agent, rows and first and last step."""
        starts = self.starts[self.first]
        last = np.r_[self.starts[1:], self.n][self.first] - 1
        agent = pa.nulls(self.k, pa.string())
        if self.codes is not None and self.agents is not None:
            codes = self.codes[starts]
            agent = self.agents.take(pa.array(codes, pa.int64(), mask=codes >= len(self.agents)))
        return {"episode_id": pa.array(self.episode[starts], id_type), "agent_id": agent,
                "rows": pa.array(last + 1 - starts, pa.int64()), "first_step": pa.array(self.step[starts], step_type),
                "last_step": pa.array(self.step[last], step_type)}

    def sums(self, columns: dict[str, pa.ChunkedArray]) -> dict[str, pa.Array]:
        """Each fragment's reward sum (in float64) and ends: its rows that ended, whether any terminated,
        truncated or ended (ends are few: counted by their rows)."""
        terminated, truncated = (columns[n].combine_chunks() for n in ("terminated", "truncated"))
        ends = self.count(pc.or_(terminated, truncated))
        reward = self.reduce(np.add, self.values(columns["reward"]).astype(np.float64))
        return {"reward": pa.array(reward, pa.float64()), "ends": pa.array(ends, pa.int64()),
                "terminated": pa.array(self.count(terminated) > 0), "truncated": pa.array(self.count(truncated) > 0),
                "ended": pa.array(ends > 0)}

    def extremes(self, c: pa.ChunkedArray | None, kind: pa.DataType, *, least: bool = True
                 ) -> tuple[pa.Array, pa.Array]:
        """The least (unless not ``least``: nulls) and greatest value of column ``c`` in each fragment, nulls left
        out (null where a fragment has none); typed nulls where the file lacks it."""
        if c is None:
            return pa.nulls(self.k, kind), pa.nulls(self.k, kind)
        raw = self.values(pc.fill_null(c, pa.scalar(0, kind)) if c.null_count else c)
        a = raw.view(np.int64) if raw.dtype.kind == "M" else raw
        none = None
        if c.null_count:
            valid = self.values(pc.is_valid(c))
            none = self.reduce(np.add, valid.astype(np.int64)) == 0
            bounds = np.iinfo(np.int64)
            lo, hi = np.where(valid, a, bounds.max), np.where(valid, a, bounds.min)
        else:
            lo = hi = a
        low = pa.array(self.reduce(np.minimum, lo), mask=none).cast(kind) if least else pa.nulls(self.k, kind)
        return low, pa.array(self.reduce(np.maximum, hi), mask=none).cast(kind)

    def first_value(self, c: pa.ChunkedArray | None, kind: pa.DataType, step_type: pa.DataType
                    ) -> tuple[pa.Array, pa.Array]:
        """Each fragment's value of column ``c`` at its first step with one, and that step (typed nulls where the
        file lacks it or a fragment has no value)."""
        starts = self.starts[self.first]
        if c is None:
            return pa.nulls(self.k, kind), pa.nulls(self.k, step_type)
        if c.null_count:
            at = _first_valid(self.values(pc.is_valid(c)), starts, np.r_[self.starts[1:], self.n][self.first])
        else:
            at = starts
        none = at < 0
        at = np.maximum(at, 0)
        rows = at if self.order is None else self.order[at]
        return (c.take(pa.array(rows, pa.int64(), mask=none if none.any() else None)),
                pa.array(self.step[at], step_type, mask=none if none.any() else None))


def _agent_codes(agent: pa.ChunkedArray) -> tuple[np.ndarray, pa.Array]:
    """Each row's agent as its place among the file's agent names in order (an unnamed agent after them all),
    and the names in that order."""
    encoded = pc.dictionary_encode(agent.combine_chunks())
    order = np.argsort(np.asarray(encoded.dictionary.to_pylist(), dtype=object), kind="stable")
    place = np.empty(len(order), np.int64)
    place[order] = np.arange(len(order))
    indices = encoded.indices.fill_null(0).to_numpy(zero_copy_only=False).astype(np.int64)
    unnamed = encoded.is_null().to_numpy(zero_copy_only=False)
    codes = np.where(unnamed, len(order), place[indices] if len(order) else 0)
    return codes, encoded.dictionary.take(pa.array(order, pa.int64())).cast(pa.string())


def _runs(episode: np.ndarray, step: np.ndarray, codes: np.ndarray | None) -> tuple[np.ndarray, np.ndarray] | None:
    """The first row of each run of rows of one episode and agent, and the runs in (episode, agent) order, where
    each episode and agent has one run and its steps increase along it; else None."""
    if not len(episode):
        return np.zeros(0, np.int64), np.zeros(0, np.int64)
    change = episode[1:] != episode[:-1]
    if codes is not None:
        change |= codes[1:] != codes[:-1]
    if not np.all(change | (step[1:] > step[:-1])):
        return None
    starts = np.flatnonzero(np.r_[True, change])
    ids = episode[starts]
    agents = np.zeros(len(starts), np.int64) if codes is None else codes[starts]
    first = np.lexsort((agents, ids))
    ids, agents = ids[first], agents[first]
    if np.any((ids[1:] == ids[:-1]) & (agents[1:] == agents[:-1])):
        return None  # an episode and agent in two runs
    return starts, first


def _true_rows(flags: pa.BooleanArray) -> np.ndarray:
    """The numbers of the rows where ``flags`` (without nulls) is true, read from its bitmap's nonzero bytes."""
    if flags.offset % 8:
        return np.asarray(pc.indices_nonzero(flags).to_numpy(zero_copy_only=False), np.int64)
    n = len(flags)
    packed = np.frombuffer(flags.buffers()[1], np.uint8)[flags.offset // 8:(flags.offset + n + 7) // 8]
    nonzero = np.flatnonzero(packed)
    byte, bit = np.nonzero(np.unpackbits(packed[nonzero], bitorder="little").reshape(-1, 8))
    rows = nonzero[byte].astype(np.int64) * 8 + bit
    return rows[rows < n]


def _first_valid(valid: np.ndarray, starts: np.ndarray, ends: np.ndarray) -> np.ndarray:
    """The first row of each run (``starts`` up to ``ends``) where ``valid``; -1 where there is none."""
    rows = np.flatnonzero(valid)
    if not len(rows):
        return np.full(len(starts), -1, np.int64)
    i = np.minimum(np.searchsorted(rows, starts), len(rows) - 1)
    return np.where(rows[i] < ends, rows[i], -1).astype(np.int64)
