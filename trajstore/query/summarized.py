"""The ``episodes`` rows of a version from its files' summaries, not from all of its steps.

An episode's rows are the sum of its *fragments*: one per data file holding some of its steps (a writer's flush
cuts an episode; compaction and other tools' rewrites move steps between files), and per agent of a multi-agent
episode. A fragment holds what the ``episodes`` view aggregates, as partial aggregates that add up
(:func:`~trajstore.query.sql.episode_fragments`: rows, the reward sum, ends, first and last step and wall time, the
largest ``env_steps``, each lineage column at its first step with a value and that step). Each file's fragments are
written with it, from its rows in memory (:func:`~trajstore.storage.summaries.file_fragments`, by the table's
``write``), or, for a file without them (another tool's, a store written before), computed once by one DuckDB query
over every file of a version that has none yet (:func:`summarize`, the reference the written ones are tested
against); either way kept as its summary (:mod:`trajstore.storage.summaries`, with the file's footer, so that a new
process reads neither; beside a local table, and for an ``s3://`` one on this machine); the rows of any version, or
of any selection of its files, are then its files' fragments added up by the view's own definitions
(:func:`~trajstore.query.sql.combined_episodes`), cast to the view's types: a fraction of the work of aggregating
every step, and one footer-free read per file for a new process.

What needs the steps themselves still reads them: discounted returns at a query-time ``gamma``, ``agg(column)``
metrics, ``steps``. The rows are exactly those of the view (tested against it on stores whose episodes span files,
unfinished and multi-agent episodes, deletes, compactions, foreign rewrites and versions read back in time), but for
the order in which a float sum is added (as the view's own parallel sums).
"""

from __future__ import annotations

import logging
from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore import schema as sch
from trajstore.query import sql
from trajstore.query.groups import group_files
from trajstore.query.snapshot import Snapshot
from trajstore.storage.encoding import FileSchema
from trajstore.storage.log import DataFile
from trajstore.storage.summaries import Summary, canonical
from trajstore.storage.table import StepsTable

log = logging.getLogger(__name__)

FRAGMENTS = "episode_fragments"  # the relation a snapshot's fragments are registered as
SMALL_PARTS = 16_384  # files of fewer fragments on average are combined into one piece before the work on them


class NotLocalError(Exception):
    """Files to summarize that DuckDB cannot read itself (an ``s3://`` store's, without copies on this machine):
    the episodes are aggregated from the steps instead."""


def read(table: StepsTable, files: Sequence[DataFile]) -> dict[str, Summary]:
    """The kept summaries of ``files`` (by path) that name them as they are (path, committed size, modification
    time); the table then knows those files' schemas without reading their footers."""
    summaries = table.summaries
    if summaries is None:
        return {}
    found = {}
    for f in files:
        kept = table.file_id(f)
        if kept is None:
            continue  # found missing where it is read
        summary = summaries.read(kept.rel, kept.size, kept.modified_ns)
        if summary is not None:
            found[f.path] = summary
    known = table.known_schemas()
    fresh = [f for f in files if f.path in found and f.path not in known]
    table.remember(fresh, [found[f.path].footer for f in fresh])
    return found


def episode_rows(snap: Snapshot, table: StepsTable, found: dict[str, Summary],
                 schemas: Sequence[FileSchema]) -> pa.Table:
    """The rows of ``snap``'s ``episodes`` view from its files' fragments: those of ``found`` (:func:`read`), and
    for the files without one, computed now (and kept, :func:`summarize`); ``schemas`` are the snapshot's files'.
    An episode of one fragment (most: a file holds whole episodes but where a flush cut one) is that fragment;
    the fragments of the others are added up in DuckDB (:func:`~trajstore.query.sql.combined_episodes`). Text
    columns stay dictionary-encoded, as the summaries hold them (DuckDB reads them as VARCHAR)."""
    missing = [(f, s) for f, s in zip(snap.files, schemas) if f.path not in found]
    parts = {path: summary.fragments for path, summary in found.items()}
    if missing:
        parts.update(summarize(snap, table, [f for f, _ in missing], [s for _, s in missing]))
    fragments = pa.concat_tables([parts[f.path] for f in snap.files], promote_options="permissive")
    if fragments.num_rows < SMALL_PARTS * max(fragments["episode_id"].num_chunks, 1):
        fragments = fragments.unify_dictionaries().combine_chunks()  # many small files: one piece, not thousands
    mask = shared(fragments["episode_id"])
    columns = [(r[0], r[1]) for r in snap.con.execute(sql.describe("episodes")).fetchall()]
    snap.con.register(FRAGMENTS, fragments.filter(mask))
    try:
        added = snap.arrow(sql.combined_episodes(FRAGMENTS, sch.episode_lineage(), columns))
    finally:
        snap.con.unregister(FRAGMENTS)
    alone = whole_episodes(fragments.filter(pc.invert(mask)), added.schema)
    return pa.concat_tables([alone, added.cast(alone.schema)])


def whole_episodes(fragments: pa.Table, schema: pa.Schema) -> pa.Table:
    """The ``episodes`` rows (``schema``: the view's columns and types, text kept dictionary-encoded) of
    ``fragments`` that are each a whole episode: what :func:`~trajstore.query.sql.combined_episodes` gives for an
    episode of one fragment (a single agent's rows, or one agent's)."""
    single = pc.is_null(fragments["agent_id"])
    ends_once = pc.equal(fragments["ends"], 1)
    span = pc.add(pc.subtract(fragments["last_step"], fragments["first_step"]), 1).cast(pa.int64())
    derived = {
        "episode_length": pc.if_else(single, fragments["rows"], span),
        "episode_return": fragments["reward"],
        "terminated": pc.if_else(single, fragments["terminated"],
                                 pc.and_kleene(ends_once, pc.invert(fragments["truncated"]))),
        "truncated": pc.if_else(single, fragments["truncated"], pc.and_kleene(ends_once, fragments["truncated"])),
        "complete": pc.if_else(single, fragments["ended"], ends_once),
        "n_agents": pa.chunked_array([np.ones(fragments.num_rows, np.int32)], pa.int32()),
    }
    columns, fields = [], []
    for f in schema:
        values = derived[f.name] if f.name in derived else fragments[f.name]
        if pa.types.is_dictionary(values.type) and values.type.value_type == f.type:
            fields.append(pa.field(f.name, values.type))
        else:
            values = values.cast(f.type)
            fields.append(f)
        columns.append(values)
    return pa.Table.from_arrays(columns, schema=pa.schema(fields))


def shared(episode_id: pa.ChunkedArray) -> pa.ChunkedArray:
    """Whether each fragment's episode id is that of another fragment too (an episode spanning files, or of
    several agents; ids equal in other partitions too, which the aggregation then tells apart)."""
    ids = np.concatenate([c.to_numpy() for c in episode_id.chunks]) if episode_id.num_chunks else np.zeros(0, np.int64)
    ordered = np.sort(ids)
    repeated = np.unique(ordered[1:][ordered[1:] == ordered[:-1]])
    return pc.is_in(episode_id, value_set=pa.array(repeated, episode_id.type))


def summarize(snap: Snapshot, table: StepsTable, files: Sequence[DataFile],
              schemas: Sequence[FileSchema]) -> dict[str, pa.Table]:
    """The fragments of each of ``files`` (committed files of ``snap``), computed by one DuckDB query per group
    of files stored alike, and kept as their summaries where the table keeps them."""
    lineage = sch.episode_lineage()
    out: dict[str, pa.Table] = {}
    for group in group_files(files, schemas):
        readable = snap.readable(group.files)
        if readable is None:
            raise NotLocalError(f"{len(group.files)} file(s) of an s3:// store have no copy on this machine")
        columns = [(p.name, lg.name) for p, lg in zip(group.physical, group.logical)
                   if lg.name in sql.FRAGMENT_COLUMNS or lg.name in lineage]
        held = {lg for _, lg in columns}
        nulls = {name: kind for name, kind in _types().items() if name not in held}
        source = sql.fragment_source(readable, columns, nulls, uniform=group.uniform)
        rows = snap.arrow(sql.episode_fragments(source, lineage))
        out.update(_by_file(rows, group.files))
    if table.summaries is not None:
        for f in files:
            footer, kept = table.footer(f), table.file_id(f)
            if kept is not None:
                table.summaries.write(kept.rel, kept.size, kept.modified_ns, Summary(footer, out[f.path]))
    return out


def _by_file(rows: pa.Table, files: Sequence[DataFile]) -> dict[str, pa.Table]:
    """``rows`` (sorted by file: its index in ``files``) cut into each file's, without the file column; an empty
    table for a file without rows."""
    index = rows[sql.FILE].to_numpy()
    starts = np.flatnonzero(np.r_[True, index[1:] != index[:-1]]) if len(index) else np.zeros(0, np.int64)
    ends = np.r_[starts[1:], len(index)]
    rows = canonical(rows.drop_columns([sql.FILE]))
    out = {int(index[a]): rows.slice(a, b - a) for a, b in zip(starts, ends)}
    return {f.path: out.get(i, rows.slice(0, 0)) for i, f in enumerate(files)}


def _types() -> dict[str, str]:
    """The DuckDB type of each column a fragments query reads, for a typed NULL where a file lacks it."""
    spec = sch.load(sch.STEP_SCHEMA_FILE)
    return {c["name"]: sql.duckdb_type(c["type"]) for c in [*spec["columns"], *spec["lineage"]]
            if c["name"] in sql.FRAGMENT_COLUMNS or c.get("in_episodes")}
