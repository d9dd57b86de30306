"""DuckDB over one committed snapshot of the store: the ``steps`` and ``episodes`` views.

``steps`` reads exactly the files listed by one version of the Delta log (never a glob), group by group
(:func:`~trajstore.query.groups.group_files`: files stored alike), each group from one of two sources: DuckDB's
native ``read_parquet`` of their paths (the default, and the fastest), or, with ``registered``, a pyarrow dataset
of them registered with DuckDB (:func:`~trajstore.storage.table.steps_dataset`), so that DuckDB itself opens no
file: the sandbox's connection has no file access at all, and a store whose files pyarrow reads (another
filesystem) needs nothing else. Each group's columns get their logical names and encoding-2 observations are
decoded in SQL (:func:`~trajstore.query.sql.decoded_steps`); the groups are unioned by name, and a column whose
types cannot be one (environments of other kinds) is a VARIANT there: restrict the snapshot to some
environments (``Store.sql(…, env_id=…)``) to see it in its own type in SQL too. An answer never holds a VARIANT
(:func:`typed_answer`): such a column of it comes in its values' own type where they are of one (a query that selects
one environment's rows), else as each value's JSON text. ``episodes`` is built from
``schemas/episode.v1.json``. The SQL of both comes from :mod:`trajstore.query.sql`.
"""

from __future__ import annotations

import dataclasses
import itertools
import os
import re
import threading
from typing import Any, Callable, Sequence

import duckdb
import pyarrow as pa
import pyarrow.fs as pafs

from trajstore import schema as sch
from trajstore.errors import (
    QueryError,
    StoreAccessError,
    StoreDamagedError,
    TrajstoreError,
    UnknownColumnError,
    first_line,
)
from trajstore.query import budget, sql
from trajstore.query import picture_sql as images_sql
from trajstore.query.groups import FileGroup, as_duckdb_reads, group_files, step_types
from trajstore.storage.encoding import NEXT, OBS, FileSchema
from trajstore.storage.location import Location, explain
from trajstore.storage.log import DataFile
from trajstore.storage.table import read_file_schema, steps_dataset

DATASET = "committed_files"  # the name of a registered dataset of the committed files

_DATABASE: tuple[int, duckdb.DuckDBPyConnection] | None = None
_DATABASE_LOCK = threading.Lock()


def cursor() -> duckdb.DuckDBPyConnection:
    """A cursor of this process's in-memory DuckDB database: a connection whose views (temporary: snapshots make
    no others) are its own, next to nothing to open, where opening a database costs ~20-40 ms. The database is
    never reused across a fork."""
    global _DATABASE
    with _DATABASE_LOCK:
        if _DATABASE is None or _DATABASE[0] != os.getpid():
            _DATABASE = (os.getpid(), duckdb.connect())
        return _DATABASE[1].cursor()


Judge = Callable[[StoreDamagedError], TrajstoreError]
"""What a failed read of a committed file means for the version read: the damage itself, or (the store's
judgment, see :meth:`Engine.judged <trajstore.query.engine.Engine.judged>`) a version whose files a vacuum removed."""


def ids_disjoint(files: Sequence[DataFile]) -> bool:
    """Whether no ``episode_id`` can be in two ``(run_id, env_id)`` partitions, judged from the files'
    episode_id ranges in the commit log (each writer draws its ids from its own random block)."""
    spans: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for f in files:
        if f.min_episode_id is None or f.max_episode_id is None:
            return False
        spans.setdefault((f.run_id, f.env_id), []).append((f.min_episode_id, f.max_episode_id))
    merged = sorted(span for part in spans.values() for span in _merge(part))
    return all(b[0] > a[1] for a, b in zip(merged, merged[1:]))


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping ``(lo, hi)`` spans merged (within one partition)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def damaged_file(exc: BaseException, files: Sequence[DataFile], store: str | None = None, *,
                 location: Location | None = None) -> StoreDamagedError | StoreAccessError | None:
    """A :class:`StoreDamagedError` naming the committed file that a read error ``exc`` is about, if it is
    about one (a missing file, a file that is not Parquet), else None. With ``location`` (the store's), an error
    that says the store failed or did not answer is that :class:`StoreAccessError` instead: no damage."""
    access = explain(exc, location) if location is not None else None
    if access is not None:
        return access
    if not isinstance(exc, (duckdb.IOException, duckdb.InvalidInputException, OSError, pa.ArrowException)):
        return None
    text = str(exc)
    for f in files:
        if f.path in text:
            missing = isinstance(exc, FileNotFoundError) or "No files found" in text or "No such file" in text
            return StoreDamagedError.of_file(f.uri, "is missing" if missing else
                                             f"cannot be read ({first_line(exc)})", store)
    return None


def group_select(group: FileGroup, source: str, variant: Sequence[str],
                 frames: Callable[[str, tuple[int, ...], bool], str]) -> str:
    """The SELECT of one group's steps from ``source`` (its stored rows): logical names, observations decoded
    (:func:`~trajstore.query.sql.decoded_steps`; ``frames(dtype, shape, stacked)`` names the SQL function that
    makes image bytes values)."""
    fmt = group.format
    columns = [("run_id", "run_id"), ("env_id", "env_id")] + \
        [(p.name, lg.name) for p, lg in zip(group.physical, group.logical)]
    if not fmt.encoded or OBS not in group.logical.names:
        return sql.decoded_steps(source, columns, variant=variant)
    images = {path: frames(dtype, shape, path in fmt.stacks) for path, (dtype, shape) in fmt.images.items()}
    return sql.decoded_steps(source, columns, obs=fmt.physical(OBS), plan=fmt.plan(group.logical.field(OBS).type),
                             next_obs=fmt.physical(NEXT) if NEXT in group.logical.names else None,
                             images=images, variant=list(variant))


def decoding_sql(files: Sequence[DataFile], schemas: Sequence[FileSchema], *, source: str = "stored_steps") -> str:
    """SQL that another DuckDB runs unchanged to read the store's steps as trajstore's readers give them: macros
    that make image bytes values, then a ``steps`` view over the relation ``source`` (the table's stored rows, every
    column under its stored name, ``run_id``/``env_id`` included: a ``delta_scan`` of the table, or
    ``read_parquet`` of its committed files with ``hive_partitioning``), each kind of stored rows decoded with window
    functions over each episode's steps (any row order)."""
    groups = group_files(files, schemas)
    variant = list(step_types(groups).conflicts)
    macros: dict[str, str] = {}

    def frames(dtype: str, shape: tuple[int, ...], stacked: bool) -> str:
        name = images_sql.function_name(dtype, shape, stacked)
        if not stacked:
            macros[name] = sql.frame_macro(name, dtype, shape)
        else:
            frame = frames(dtype, shape, False)
            macros[name] = sql.stack_macro(name, frame)
        return name

    selects = [group_select(g, sql.rows_of(source, g.env_ids, g.format.physical(OBS) if OBS in g.logical.names
                                           else None), variant, frames) for g in groups]
    view = sql.create_view("steps", sql.union_by_name(selects) if selects else sql.steps_view([]))
    return "\n".join([*macros.values(), view]) + "\n"


def check_names(names: Sequence[str], known: Sequence[str], *, view: str, field: str) -> None:
    """Raise an :class:`UnknownColumnError` naming ``field`` when a name is not one of ``known`` (columns of
    ``view``). Every unknown column anywhere (Python, CLI, REST) is reported by this one message."""
    unknown = [n for n in names if n not in known]
    if unknown:
        raise UnknownColumnError(f"{field}: unknown column(s) {unknown} of {view}; expected some of {list(known)}")


class Snapshot:
    """A DuckDB connection whose ``steps``/``episodes`` views read one committed version of the store (and, given
``runs``, the rows of :func:`~trajstore.storage.run_config.table`, its ``runs`` view; given ``priorities``, the
``priorities`` view of the replays' priorities).

    ``schemas`` are the files' own (:meth:`~trajstore.storage.table.StepsTable.schemas`; read from their footers
    when not given). With ``registered``, ``steps`` reads the files through registered pyarrow datasets instead
    of ``read_parquet``: the same rows and types. With ``local`` (an ``s3://`` store's files copied to this
    machine, :meth:`~trajstore.storage.table.StepsTable.local_copies`: a path for each of ``files``), DuckDB reads
    those copies itself instead. ``judge`` turns the error about a committed file that cannot be
    read into the one to raise.
    """

    def __init__(self, files: Sequence[DataFile], *, config: dict[str, Any] | None = None,
                 con: duckdb.DuckDBPyConnection | None = None, store: str | None = None,
                 schemas: Sequence[FileSchema] | None = None, registered: bool = False,
                 judge: Judge | None = None, location: Location | None = None, runs: pa.Table | None = None,
                 episodes: pa.Table | None = None, priorities: Any = None, local: Sequence[str] | None = None) -> None:
        self.files = list(files)
        self._local = None if local is None else dict(zip((f.path for f in self.files), local))
        self.store = store  # where the files are from, for messages
        self.judge = judge
        self.location = location  # the store's, to tell a store that fails from a damaged file
        self.con = con if con is not None else duckdb.connect(config=config or {})
        self._names: list[str] | None = None  # the stored columns, where known without asking DuckDB
        try:  # binding read_parquet reads the files' footers (of one file per group where all agree)
            self.con.execute(sql.create_view("committed_steps", self._stored_steps(schemas, registered)))
            stored = self._names if self._names is not None else self.columns("committed_steps")
        except duckdb.Error as exc:
            raise self.damage(exc) or QueryError(f"the store's files cannot be read: {first_line(exc)}") from exc
        self.con.execute(sql.create_view("steps", sql.with_lineage(stored, "committed_steps")))
        self.step_columns = [n for n, _ in sch.view_columns(stored)] if self._names is not None else \
            self.columns("steps")
        self.by_id = ids_disjoint(self.files)
        self.agents = "agent_id" in stored  # some rows belong to agents of multi-agent episodes
        self.episodes_materialized = False
        self.materialized: pa.Table | None = None  # the rows the episodes view reads, where materialized
        if episodes is None:
            self.con.execute(sql.create_view("episodes", self.episodes_select()))
        else:
            self.use_episodes(episodes)
        self.con.execute(sql.create_view("agent_episodes", sql.agent_episodes_view(self.agents)))
        if runs is not None:
            self.use_runs(runs)
        if priorities is not None:
            self.use_priorities(priorities)

    def _stored_steps(self, schemas: Sequence[FileSchema] | None, registered: bool) -> str:
        """The SELECT of the stored steps, logical and decoded: the groups of files, each from ``read_parquet``
        of its files or a registered dataset of them, unioned by name."""
        if not self.files:
            return sql.steps_view(self.files)
        if schemas is None:
            schemas = [read_file_schema(f) for f in self.files]
        groups = group_files(self.files, schemas)
        variant = list(step_types(groups).conflicts)
        names = ["run_id", "env_id", *groups[0].logical.names]
        if len(groups) == 1 and len(set(names)) == len(names):  # one SELECT: its columns in its order
            self._names = names
        return sql.union_by_name([self._group(i, g, variant, registered) for i, g in enumerate(groups)])

    def _group(self, i: int, group: FileGroup, variant: list[str], registered: bool) -> str:
        local = self.readable(group.files) if self._local is not None else None
        if local is not None:  # copies on this machine: read as a local store's files
            source = sql.parquet_source(local, uniform=group.uniform)
        elif registered:
            name = f"{DATASET}_{i}"
            self.con.register(name, steps_dataset(group.files, as_duckdb_reads(group.physical)))
            source = sql.registered_source(name)
        else:
            source = sql.parquet_source(group.files, uniform=group.uniform)
        return group_select(group, source, variant,
                            lambda dtype, shape, stacked: images_sql.register(self.con, dtype, shape, stacked))

    def readable(self, files: Sequence[DataFile]) -> list[DataFile] | None:
        """``files`` (some of this snapshot's) as DuckDB's ``read_parquet`` reads them: a local store's as they are,
        an ``s3://`` store's as this machine's copies of them; None where it cannot (no copies)."""
        if all(f.is_local for f in files):
            return list(files)
        local = self._local
        if local is None or any(f.path not in local for f in files):
            return None
        return [dataclasses.replace(f, path=local[f.path], fs=pafs.LocalFileSystem()) for f in files]

    def episodes_select(self, *, discounted: bool = False) -> str:
        """The SELECT behind the ``episodes`` view of these files (with ``discounted_return`` for ``$gamma``)."""
        return sql.episodes_view(self.step_columns, discounted=discounted, by_id=self.by_id, agents=self.agents)

    def columns(self, view: str) -> list[str]:
        """The column names of ``view``."""
        return [r[0] for r in self.con.execute(sql.describe(view)).fetchall()]

    def use_runs(self, table: pa.Table) -> None:
        """Give this snapshot the ``runs`` view of ``table``, the rows of
        :func:`~trajstore.storage.run_config.table`."""
        self.con.register("run_info", table)
        self.con.execute(sql.create_view("runs", sql.runs_view("run_info")))

    def use_priorities(self, rows: Any) -> None:
        """Give this snapshot the ``priorities`` view over ``rows`` (a pyarrow dataset of the ``priorities`` table's
        rows, :func:`~trajstore.storage.priorities_log.dataset`): each item's latest priority."""
        self.con.register("priority_rows", rows)
        self.con.execute(sql.create_view("priorities", sql.priorities_view("priority_rows")))

    def use_episodes(self, table: pa.Table) -> None:
        """Make the ``episodes`` view read ``table``: the rows of this very view, materialized earlier."""
        self.con.register("materialized_episodes", table)
        self.con.execute(sql.create_view("episodes", sql.select_all("materialized_episodes")))
        self.episodes_materialized = True
        self.materialized = table

    def arrow(self, query: str, params: dict[str, Any] | None = None) -> pa.Table:
        """The rows of ``query``, read within the current budget's time (:mod:`~trajstore.query.budget`)."""
        with budget.interrupting(self.con) as limits:
            try:
                return typed_answer(self.con, self.con.sql(query, params=params or None))
            except (duckdb.Error, OSError) as exc:
                if limits.passed():
                    raise limits.timeout() from None
                raise self.damage(exc) or QueryError(f"query failed: {first_line(exc)}") from exc

    def reader(self, query: str, params: dict[str, Any] | None = None,
               batch_size: int = 65_536) -> pa.RecordBatchReader:
        try:
            return self.con.sql(query, params=params or None).to_arrow_reader(batch_size)
        except duckdb.Error as exc:
            raise self.damage(exc) or QueryError(f"query failed: {first_line(exc)}") from exc

    def damage(self, exc: BaseException) -> TrajstoreError | None:
        """The error to raise when ``exc`` says that a committed file is missing or unreadable (judged), or that
        the store failed or did not answer while it was read; else None."""
        found = damaged_file(exc, self.files, self.store, location=self.location)
        if isinstance(found, StoreDamagedError) and self.judge is not None:
            return self.judge(found)
        return found

    @property
    def episode_columns(self) -> list[str]:
        """The columns of the ``episodes`` view, known from the steps' (no query binds the files again)."""
        if self.episodes_materialized:
            return self.columns("episodes")
        return sch.episode_names() + [n for n in sch.episode_lineage() if n in self.step_columns]

    def check_columns(self, names: Sequence[str], *, view: str = "episodes", field: str = "by") -> None:
        """Raise an :class:`UnknownColumnError` naming ``field`` when a name is not a column of ``view``."""
        known = self.step_columns if view == "steps" else self.episode_columns if view == "episodes" else \
            self.columns(view)
        check_names(names, known, view=view, field=field)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# --- answers: a VARIANT column in its values' own type, or as JSON text -------------------------------------------

# variant_typeof's names of the scalar types trajstore stores, and the DuckDB types they are
VARIANT_SCALARS = {"BOOL_TRUE": "BOOLEAN", "BOOL_FALSE": "BOOLEAN", "INT8": "TINYINT", "INT16": "SMALLINT",
                   "INT32": "INTEGER", "INT64": "BIGINT", "UINT8": "UTINYINT", "UINT16": "USMALLINT",
                   "UINT32": "UINTEGER", "UINT64": "UBIGINT", "FLOAT": "FLOAT", "DOUBLE": "DOUBLE",
                   "VARCHAR": "VARCHAR"}
VARIANT_DEPTH = 6  # arrays nested this deep at most are typed (a stack of RGB frames is 4)
_answers = itertools.count()


def typed_answer(con: duckdb.DuckDBPyConnection, answer: duckdb.DuckDBPyRelation | None) -> pa.Table:
    """``answer`` as an Arrow table, with no VARIANT column (which Arrow readers would see as opaque ``{metadata,
    value}`` structs): each such column in the one type all its values have (the environment's own type, where the
    query selected one environment's rows: CartPole's int actions as BIGINT), else, where values of several types
    mix, as each value's JSON text (VARCHAR: ``1`` beside ``[0.5]``). Other answers are read as they are."""
    if answer is None:
        return pa.table({})
    variants = [name for name, t in zip(answer.columns, answer.types) if str(t) == "VARIANT"]
    if not variants:
        return answer.to_arrow_table()
    table = f"trajstore_answer_{next(_answers)}"
    answer.to_table(table)
    try:
        columns = [(sql.ident(name), _one_type(con, table, sql.ident(name)) if name in variants else None)
                   for name in answer.columns]
        return con.sql(sql.typed_answer(table, columns)).to_arrow_table()
    finally:
        con.execute(f"DROP TABLE IF EXISTS {table}")


def _one_type(con: duckdb.DuckDBPyConnection, table: str, column: str) -> str:
    """The expression that reads the VARIANT ``column`` of ``table`` in its values' one type, or as JSON text."""
    found = con.sql(sql.variant_types(table, column, VARIANT_DEPTH)).fetchall()
    types = {_duckdb_type(row) for row in found}
    one = types.pop() if len(types) == 1 else None
    return sql.cast(column, one) if one is not None else sql.as_json_text(column)


def _duckdb_type(probed: Sequence[str]) -> str | None:
    """The DuckDB type of a value whose ``variant_typeof`` at depths 0, 1, … (its first element's, …) is ``probed``:
    ``("ARRAY(4)", "FLOAT", …)`` is ``FLOAT[]`` (a list, as the column reads over its own environment); None for
    what is no scalar or list of one (an object)."""
    depth = 0
    for name in probed:
        if re.fullmatch(r"ARRAY\(\d+\)", name) is None:
            scalar = VARIANT_SCALARS.get(name)
            return None if scalar is None else scalar + "[]" * depth
        depth += 1
    return None
