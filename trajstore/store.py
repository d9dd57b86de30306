"""A trajstore store: a directory holding the ``steps`` Delta table, read through DuckDB.

>>> import trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> store.stats().column("n_traj").to_pylist()
[0]
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import json
import logging
import os
import threading
import time
import uuid
from dataclasses import dataclass
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Mapping, Sequence, TypeVar, Union

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.fs as pafs

from trajstore.errors import (
    InputError,
    QueryError,
    RunNotFoundError,
    StoreAccessError,
    StoreDamagedError,
    StoreExistsError,
    StoreNotFoundError,
    TrajstoreError,
    first_line,
)
from trajstore.query.pictures import ImageLeaf, image_leaves
from trajstore.query import sandbox, sql, sql_worker
from trajstore.query.batches import BatchFormat, check_batching, training_batches
from trajstore.query.curves import (
    bin_edges,
    bin_index,
    bin_stats,
    check_binning,
    latest_stats,
    total_env_steps,
    x_values,
    y_values,
)
from trajstore.query.filters import EpisodeFilter, from_keywords
from trajstore.query.filters import keywords as filter_keywords
from trajstore.query.follow import Commit, check_follow, new_commits
from trajstore.query.groups import StepTypes, group_files, step_types
from trajstore.loaders.maps import read_files
from trajstore.loaders.map_store import Basis, LayoutStore
from trajstore.loaders.map_store import files_digest as layout_files_digest
from trajstore.loaders.loader import Batches, LoaderFormat
from trajstore.loaders.order import digest as files_digest
from trajstore.query.returns import SortedReturns, check_gamma, sorted_return_to_go
from trajstore.query.scan import files_holding, scan_steps
from trajstore.loaders.sequences import Sampling, Source
from trajstore.loaders.sequences import sequences as load_sequences
from trajstore.query.snapshot import Snapshot, check_names, damaged_file
from trajstore.loaders.transitions import transitions as load_transitions
from trajstore.settings import Settings
from trajstore.storage.encoding import FileLayout
from trajstore.operations.ingest import append_rows
from trajstore.storage.location import Location, explain, locate
from trajstore.storage.log import DataFile, LogCommit
from trajstore.storage.table import StepsTable
from trajstore.operations.upkeep import Policy, Upkeep
from trajstore.write.writer import Writer

if TYPE_CHECKING:
    from trajstore.operations.add_column import AddColumnReport
    from trajstore.operations.delete import DeleteReport
    from trajstore.operations.vacuum import VacuumReport

log = logging.getLogger(__name__)

MARKER = "trajstore.json"
CURVE_POINT = "curve_point"  # the column Store.curves keeps its rows by
FORMAT_VERSION = 1


def open(uri: str | Path, create: bool = False, *, storage_options: Mapping[str, Any] | None = None,  # noqa: A001
         settings: Settings | None = None, version: int | None = None, as_of: datetime | None = None) -> Store:
    """Open the store at ``uri``: a local directory or ``s3://bucket/prefix``; with ``create=True`` make it if
    absent. For S3, ``storage_options`` holds the ``AWS_*`` keys deltalake uses (each one not given is taken from
    the environment variable of that name).

    With ``version=N`` (see :meth:`Store.history`) or ``as_of=datetime`` (the latest version committed then),
    the store is read-only and every read sees it exactly as it was at that version."""
    location = locate(uri, storage_options, settings=settings)
    try:
        found = _marker_found(location)
        if not found:
            if not create:
                raise StoreNotFoundError(f"no trajstore store at {location.uri}; make one with "
                                         "trajstore.open(uri, create=True) or by writing to it "
                                         "(trajstore rollout --store URI …)")
            _create(location)
    except OSError as exc:
        raise explain(exc, location) or exc
    if version is None and as_of is None:
        return Store(location, settings=settings)
    return Store(location, settings=settings).at(version=version, as_of=as_of)


def _marker_found(location: Location) -> bool:
    info = location.fs.get_file_info(location.path(MARKER))
    if info.type == pafs.FileType.NotFound and not location.is_local:
        bucket = location.fs.get_file_info(location.bucket)
        if bucket.type == pafs.FileType.NotFound:
            raise StoreAccessError(f"{location.uri}: bucket {location.bucket!r} does not exist")
    return info.type == pafs.FileType.File


def _create(location: Location) -> None:
    """Write the marker; safe when several processes (or machines) create the same store at once: each writes
    the same content whole (a local rename, one S3 PUT), and whoever wins, the store is there."""
    fs, marker = location.fs, location.path(MARKER)
    root = location.fs.get_file_info(location.root)
    if root.type == pafs.FileType.File:
        raise StoreExistsError(f"{location.uri} is a file, not a trajstore store; choose an empty or new folder")
    others = [i for i in fs.get_file_info(pafs.FileSelector(location.root, allow_not_found=True))
              if not i.base_name.startswith(f".{MARKER}.") and i.base_name != MARKER]
    if others and fs.get_file_info(marker).type != pafs.FileType.File:
        raise StoreExistsError(f"{location.uri} holds other things and is not a trajstore store (no {MARKER}); "
                               "choose an empty or new folder or prefix")
    body = (json.dumps({"format": "trajstore", "version": FORMAT_VERSION}) + "\n").encode()
    if not location.is_local:
        with fs.open_output_stream(marker) as out:
            out.write(body)
        return
    Path(location.root).mkdir(parents=True, exist_ok=True)
    tmp = Path(location.path(f".{MARKER}.{os.getpid()}.{uuid.uuid4().hex}.tmp"))  # one per process
    tmp.write_bytes(body)
    tmp.replace(marker)


F = TypeVar("F", bound=Callable[..., Any])


def _reader(method: F) -> F:
    """The one place where a read method's selection is resolved, so that every reader takes the same filters
    and says the same about the same mistake:

    - the filter keywords of :func:`~trajstore.query.filters.keywords` (``min_return=``, ``mode=``, …; the
      Client's readers take the same) that the method does not name itself are added to its ``filter``, and
      appear in its signature (a name the method gives a meaning of its own, ``seed`` for a shuffle, keeps it:
      that filter goes in ``filter=``);
    - a run the store does not hold (``run_id=``, or in ``filter``) is a :class:`RunNotFoundError` naming it and
      the runs there are, before anything is read;
    - a query that fails because of the caller's own ``where`` condition is an :class:`InputError` naming
      ``where`` (DuckDB's first line, without the SQL trajstore built around the condition).
    """
    own = inspect.signature(method)
    added = [name for name in filter_keywords() if name not in own.parameters]

    @functools.wraps(method)
    def read(self: Store, *args: Any, **kwargs: Any) -> Any:
        extra = {name: kwargs.pop(name) for name in added if name in kwargs}
        if extra:
            kwargs["filter"] = from_keywords(kwargs.get("filter"), extra)
        flt = kwargs.get("filter")
        self._check_runs(kwargs.get("run_id"), flt.run_id if flt is not None else None)
        try:
            return method(self, *args, **kwargs)
        except QueryError as exc:
            if not kwargs.get("where") or type(exc) is not QueryError:
                raise
            raise InputError(f"where: {str(exc).removeprefix('query failed: ')} (in {kwargs['where']!r})") from None

    types = filter_keywords()
    params = list(own.parameters.values())
    params += [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=types[name])
               for name in added]
    read.__signature__ = own.replace(parameters=params)  # type: ignore[attr-defined]
    return read  # type: ignore[return-value]


Ids = Union[int, Sequence[int], None]
Names = Union[str, Sequence[str], None]


class Store:
    """Entry point for writing and querying one store. Every query reads one committed snapshot.

    The filter keywords of the read methods are the same everywhere, and the same as the Client's:
    ``run_id``/``env_id``/``episode_id`` (one or several), ``complete``/``terminated``/``truncated``,
    ``min_return``/``max_return``/``min_length``/``max_length``, the lineage columns (``policy_version``,
    ``mode``, ``worker_id``, ``seed``, ``env_index``), ``filter`` (all of them as a typed
    :class:`~trajstore.query.filters.EpisodeFilter`, as the REST service builds from its parameters) and
    ``where`` (your own SQL condition over the ``episodes`` view). A run the store does not hold is a
    :class:`~trajstore.errors.RunNotFoundError` naming it and the runs it holds.
    """

    def __init__(self, location: Location | str | Path, *, settings: Settings | None = None,
                 pinned: int | None = None) -> None:
        self.settings = settings or Settings.from_env()
        self.location = locate(location, settings=self.settings)
        self.table = StepsTable(self.location.child("steps"), row_group_rows=self.settings.row_group_rows,
                                pinned=pinned)
        self._duckdb: tuple[int, duckdb.DuckDBPyConnection] | None = None
        self._duckdb_lock = threading.Lock()
        self._episodes_cache: tuple[tuple[str, ...], pa.Table] | None = None
        self._episodes_lock = threading.Lock()
        self._types_cache: dict[tuple[str, ...], StepTypes] = {}
        self._curve_cache: dict[tuple[tuple[str, ...], str], pa.Table] = {}
        self.sql_gate = sandbox.Gate(self.settings.sql_max_concurrent)
        self.layouts = LayoutStore(self.location, cache=self.settings.layout_cache,  # loader layouts, kept
                                    shared=self.settings.store_layouts, keep=self.settings.loader_layouts)
        self._ingest_upkeep: Upkeep | None = None  # compacts what ingest commits (a daemon thread, once needed)

    @property
    def uri(self) -> str:
        """Where the store is: a local directory's absolute path, or ``s3://bucket/prefix``."""
        return self.location.uri

    @property
    def root(self) -> Any:
        """The store's directory as a :class:`~pathlib.Path` for a local store, else its URI."""
        return Path(self.location.root) if self.location.is_local else self.location.uri

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"

    # --- writing ------------------------------------------------------------------------------------

    def writer(self, *, run_id: str, env_id: str, **options: Any) -> Writer:
        """A :class:`Writer` appending to ``run_id``/``env_id``; extra keywords are writer options or lineage."""
        self.table.log.writable("writer")
        options.setdefault("flush_bytes", self.settings.flush_bytes)
        options.setdefault("upkeep", Upkeep(self.table, Policy.of(self.settings)))
        return Writer(self.table, run_id=run_id, env_id=env_id, **options)

    def ingest(self, rows: pa.Table, *, run_id: str, env_id: str,
               idempotency_key: str | None = None) -> tuple[str | None, bool]:
        """Append rows already cut into episodes (what a remote writer sends), checked against what is stored;
        returns ``(file, duplicate)``. Rows that do not continue their episodes raise :class:`InputError`, a key
        used before for another request :class:`~trajstore.errors.ConflictError`. See
        :mod:`trajstore.operations.ingest`."""
        self.table.log.writable("ingest")
        out = append_rows(self.table, rows, run_id=run_id, env_id=env_id, idempotency_key=idempotency_key)
        if out[0] is not None and not out[1]:  # remote writers' commits are compacted by the service
            with self._duckdb_lock:
                if self._ingest_upkeep is None:
                    self._ingest_upkeep = Upkeep(self.table, Policy.of(self.settings))
            self._ingest_upkeep.committed(run_id, env_id)
        return out

    # --- the committed state ------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The latest committed version of the log (-1 for a store nothing was written to); for a store opened
        at a version, that version."""
        return self.table.log.latest_number()

    # --- lifecycle: versions, delete, retention, derived columns (see trajstore.storage.*) ------------------

    @property
    def read_only(self) -> bool:
        """Whether this store is pinned to an old version (``open(uri, version=N)``): it reads, never writes."""
        return self.table.log.pinned is not None

    def at(self, *, version: int | None = None, as_of: datetime | None = None) -> Store:
        """This store, read-only, exactly as it was at ``version`` (or the latest version committed at or before
        ``as_of``): every read (stats, episodes, sql, scan, returns, runs) sees that version's files."""
        from trajstore.storage.history import resolve_version

        pinned = resolve_version(StepsTable(self.table.location), version=version, as_of=as_of)
        store = Store(self.location, settings=self.settings, pinned=pinned)
        store.sql_gate = self.sql_gate  # one bound on the queries at once, whatever version they read
        return store

    def history(self, *, limit: int | None = None) -> pa.Table:
        """One row per committed version, oldest first: ``version, timestamp, operation, rows_added,
        rows_removed, files_added, files_removed, run_ids`` (see :mod:`trajstore.storage.history`)."""
        from trajstore.storage.history import history

        return history(self.table, limit=limit)

    def delete(self, *, run_id: Names = None, where: str | None = None, dry_run: bool = False) -> DeleteReport:
        """Delete whole episodes in one commit: every episode of ``run_id`` and/or every episode whose steps
        ``where`` (a condition over ``steps``) all select; refused if it selects part of an episode. Returns
        what was deleted (see :mod:`trajstore.operations.delete`)."""
        from trajstore.operations.delete import delete

        return delete(self, run_id=run_id, where=where, dry_run=dry_run)

    def vacuum(self, *, older_than: float | str | timedelta = "7d", dry_run: bool = False) -> VacuumReport:
        """Delete the files no version committed within ``older_than`` (seconds, a timedelta, or ``"7d"``,
        ``"12h"``, ``"30m"``) needs: files deleted or compacted away before then, and files no commit ever
        listed (see :mod:`trajstore.operations.vacuum`). With ``dry_run``, only list them."""
        from trajstore.operations.vacuum import vacuum

        return vacuum(self, older_than=older_than, dry_run=dry_run)

    def add_column(self, name: str, expression: str | Callable[[pa.Table], Any], *,
                   where: str | None = None) -> AddColumnReport:
        """Write a derived column ``name`` into the stored steps, in one commit: ``expression`` is DuckDB SQL
        over the steps' columns (``"reward * 0.5 + 0.1"``) or a function of a pyarrow Table of a file's steps
        returning an array. With ``where`` (a condition over ``steps``), only those rows get a value, the
        others null (see :mod:`trajstore.operations.add_column`)."""
        from trajstore.operations.add_column import add_column

        return add_column(self, name, expression, where=where)

    def files(self) -> list[DataFile]:
        """The committed Parquet files of the latest version."""
        return self.table.files()

    def run_ids(self) -> list[str]:
        """The runs the store holds (from the committed file list: no file is read)."""
        return sorted({f.run_id for f in self.files()})

    def _check_runs(self, *selections: Names) -> None:
        """A :class:`RunNotFoundError` naming each run of ``selections`` (a run id or several) the store does
        not hold, and the runs it holds."""
        wanted = list(dict.fromkeys(r for sel in selections for r in _run_list(sel)))
        if not wanted:
            return
        held = self.run_ids()
        missing = [r for r in wanted if r not in held]
        if missing:
            raise RunNotFoundError.naming(missing, self.uri, held)

    def schema(self, env_id: str | None = None) -> pa.Schema:
        """The Arrow types of the stored columns, fixed sizes kept (of one environment's files with ``env_id``);
        an empty schema for an empty store."""
        return self._file_schema(env_id) or pa.schema([])

    def image_leaves(self, env_id: str | None = None) -> list[ImageLeaf]:
        """The observation leaves that are pictures (see :mod:`trajstore.query.pictures`; of one environment's files
        with ``env_id``), their declared frame stacks taken from the files' formats; empty without images."""
        schema = self.schema(env_id)
        if "obs" not in schema.names:
            return []
        stacks: dict[str, int] = {}
        files = [f for f in self.files() if env_id is None or f.env_id == env_id]
        for layout in self._file_layouts(files):
            stacks.update(layout.format.stacks)
        return image_leaves(schema.field("obs").type, stacks)

    def snapshot(self, *, config: dict[str, Any] | None = None, run_id: Names = None,
                 env_id: Names = None) -> Snapshot:
        """A DuckDB connection with ``steps`` and ``episodes`` views over the latest committed version (of the
        files of ``run_id``/``env_id`` only, where every column has its own type: over environments whose
        columns differ in type, such a column is a VARIANT)."""
        return self._new_snapshot(self._selected_files(run_id, env_id), config=config)

    def _selected_files(self, run_id: Names, env_id: Names) -> list[DataFile]:
        """The committed files of ``run_id``/``env_id`` (all when None); a run the store does not hold is a
        :class:`RunNotFoundError`, as for every reader."""
        self._check_runs(run_id)
        runs, envs = _names(run_id) or None, _names(env_id) or None
        return [f for f in self.files() if _selected(f.run_id, runs) and _selected(f.env_id, envs)]

    def _query_snapshot(self, *, episodes: Literal["fill", "if-cached"] | None = None,
                        run_id: Names = None, env_id: Names = None) -> Snapshot:
        """A snapshot on a cursor of this store's own DuckDB database, for the queries the store builds itself.

        Opening a DuckDB database costs ~20 ms, a cursor (a connection with its own views) next to nothing.
        :meth:`snapshot` and :meth:`sql` keep a database of their own, which callers may reconfigure.

        With ``episodes``, its ``episodes`` view reads the view's rows materialized once per committed
        version (the file list), so that the queries of one page (runs, episodes, curves, stats) aggregate
        the steps once, not each: ``"fill"`` materializes them when they are not yet, ``"if-cached"``
        only uses them when they are. With ``run_id``/``env_id``, the views hold those files only (every column
        in its own type, as :meth:`sql` with them); the materialized episodes are then not used.
        """
        restricted = run_id is not None or env_id is not None
        files = self._selected_files(run_id, env_id) if restricted else self.files()
        snap = self._new_snapshot(files, con=self._cursor())
        if episodes is not None and not restricted:
            table = self._materialized_episodes(snap, fill=episodes == "fill")
            if table is not None:
                snap.use_episodes(table)
        return snap

    def _new_snapshot(self, files: list[DataFile], *, con: duckdb.DuckDBPyConnection | None = None,
                      config: dict[str, Any] | None = None, registered: bool | None = None) -> Snapshot:
        """A snapshot over ``files``: DuckDB reads a local store's files itself (``read_parquet``), a remote
        store's through pyarrow datasets over its filesystem (``registered``); both in the files' own types."""
        registered = not self.location.is_local if registered is None else registered
        return Snapshot(files, con=con, config=config, store=self.uri, layouts=self._file_layouts(files),
                        registered=registered, judge=self._judged, location=self.location)

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._duckdb_lock:
            if self._duckdb is None or self._duckdb[0] != os.getpid():  # never reuse one across a fork
                self._duckdb = (os.getpid(), duckdb.connect())
            return self._duckdb[1].cursor()

    def _step_types(self, files: Sequence[DataFile]) -> StepTypes:
        """What readers return for the steps of ``files`` (see :func:`~trajstore.query.groups.step_types`), kept
        for the latest file list asked about."""
        key = tuple(f.path for f in files)
        with self._episodes_lock:
            cached = self._types_cache.get(key)
        if cached is not None:
            return cached
        if files:
            types = step_types(group_files(files, self._file_layouts(files)))
        else:  # an empty store: the typed nulls of the empty view
            with self._new_snapshot([], con=self._cursor()) as own:
                types = StepTypes(own.arrow(sql.select_all("steps", limit=0)).schema, {})
        with self._episodes_lock:
            self._types_cache = {k: v for k, v in self._types_cache.items() if len(k) <= len(key) * 4 + 64}
            while len(self._types_cache) >= TYPES_KEPT:
                self._types_cache.pop(next(iter(self._types_cache)))
            self._types_cache[key] = types
        return types

    def _materialized_episodes(self, snap: Snapshot, *, fill: bool) -> pa.Table | None:
        key = tuple(f.path for f in snap.files)  # committed files never change: the list names the version
        with self._episodes_lock:  # one materialization per version, even for concurrent requests
            cached = self._episodes_cache
            if cached is not None and cached[0] == key:
                return cached[1]
            if not fill:
                return None
            table = snap.arrow(sql.select_all("episodes"))
            self._episodes_cache = (key, table) if table.num_rows <= EPISODE_CACHE_ROWS else None
            return table

    # --- SQL ----------------------------------------------------------------------------------------

    def sql(self, query: str, params: dict[str, Any] | None = None, *, run_id: Names = None,
            env_id: Names = None) -> pa.Table:
        """Run SQL over the ``steps`` and ``episodes`` views; returns an Arrow table.

        With ``run_id``/``env_id``, the views hold those runs' or environments' steps only, and every column
        has its own type (over environments whose columns differ in type, such a column is a VARIANT).
        This is the trusted path (your own process, your own files); for SQL from others use
        :meth:`sandboxed_sql`.
        """
        with self.snapshot(run_id=run_id, env_id=env_id) as snap:
            return snap.arrow(query, params)

    def sandboxed_sql(self, query: str, limits: sandbox.Limits | None = None, *,
                      encode: sandbox.Encoder | None = None, run_id: Names = None,
                      env_id: Names = None) -> sandbox.Result:
        """Run one untrusted, read-only SELECT over the views (of ``run_id``/``env_id`` only, as for :meth:`sql`),
        bounded by ``limits``, and with ``encode`` write the body of its answer within them too (see
        :mod:`~trajstore.query.sandbox`).

        The views read the committed files through registered pyarrow datasets: the connection the query runs
        on can read no file at all. With ``limits.worker_bytes`` (the default) the query runs in a worker
        process that cannot take more memory than that (:mod:`~trajstore.query.sql_worker`); the body is
        encoded here. Concurrent callers share :meth:`sql_slot`'s gate only if they take a slot.
        """
        limits = limits or sandbox.Limits()
        started = time.monotonic()
        files = self._selected_files(run_id, env_id)
        layouts = self._file_layouts(files)
        if limits.worker_bytes is None:
            snap = Snapshot(files, store=self.uri, layouts=layouts, registered=True, judge=self._judged,
                            location=self.location)
            return sandbox.run(snap, query, limits, encode=encode)
        task = sql_worker.Task.of(query, limits, self.location, files, layouts)
        try:
            result = sql_worker.run(task)  # a service starts sql_max_concurrent workers ahead (sql_worker.warm)
        except StoreDamagedError as exc:  # judged here, where the log is: a vacuumed version is not damage
            raise self._judged(exc) from None
        return sandbox.encoded(result, limits, encode, started=started)

    def sql_slot(self, what: str = "query") -> sandbox.Slot:
        """One of the ``sql_max_concurrent`` places for a sandboxed query (or, in the service, a loader
        stream); a :class:`~trajstore.errors.QueryBusyError` whose message starts with ``what`` at once when
        every one is taken. Release it when done. A store opened at a version shares its store's places."""
        return self.sql_gate.take(what)

    # --- episodes and statistics --------------------------------------------------------------------

    @_reader
    def episodes(self, *, run_id: Names = None, env_id: Names = None, complete: bool | None = None,
                 where: str | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                 gamma: float | None = None, order_by: str = "episode_id", limit: int | None = None,
                 offset: int = 0) -> pa.Table:
        """One row per episode (the ``episodes`` view), filtered; with ``gamma`` adds ``discounted_return``."""
        return self._episodes(run_id=run_id, env_id=env_id, complete=complete, where=where, filter=filter,
                              gamma=gamma, order_by=order_by, limit=limit, offset=offset)

    @_reader
    def episode_page(self, *, where: str | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                     gamma: float | None = None, order_by: str = "episode_id", limit: int,
                     offset: int = 0, after: int | None = None) -> tuple[pa.Table, int]:
        """One page of :meth:`episodes` and how many episodes the filter selects in all, in one query.

        With ``after`` (the previous page's last ``episode_id``: a keyset cursor; ``order_by`` must then be
        ``episode_id`` or ``-episode_id``), the page after that episode, whatever its depth."""
        if after is not None:
            if order_by.lstrip("-") != "episode_id":
                raise InputError(f"cursor: pages with a cursor are in episode_id order (order_by=episode_id or "
                                 f"-episode_id), got order_by={order_by!r}")
            key = sql.after_key(["episode_id"], [int(after)], descending=order_by.startswith("-"))
            rows = self._episodes(where=f"({where}) AND {key}" if where else key, filter=filter, gamma=gamma,
                                  order_by=order_by, limit=limit)
            return rows, self._episode_total(where, filter)
        rows = self._episodes(where=where, filter=filter, gamma=gamma, order_by=order_by, limit=limit,
                              offset=offset, total="total_episodes")
        total = rows["total_episodes"][0].as_py() if rows.num_rows else None
        if total is None:  # an empty page says nothing about the rows before it
            total = self._episode_total(where, filter)
        return rows.drop_columns(["total_episodes"]), total

    def _episode_total(self, where: str | None, filter: EpisodeFilter | None) -> int:  # noqa: A002
        total = self._episodes(where=where, filter=filter, total="total_episodes", limit=1)["total_episodes"]
        return total[0].as_py() if len(total) else 0

    def _episodes(self, *, run_id: Names = None, env_id: Names = None, complete: bool | None = None,
                  where: str | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                  gamma: float | None = None, order_by: str = "episode_id", limit: int | None = None,
                  offset: int = 0, total: str | None = None) -> pa.Table:
        with self._query_snapshot(episodes="fill" if gamma is None else None) as snap:
            name, descending = order_by.lstrip("-"), order_by.startswith("-")
            known = snap.columns("episodes") + (["discounted_return"] if gamma is not None else [])
            check_names([name], known, view="episodes", field="order_by")
            conds = sql.conditions(run_id=run_id, env_id=env_id, where=where, filter=filter)
            if complete is not None:
                conds.append("complete" if complete else "NOT complete")
            params = {"gamma": check_gamma(gamma)} if gamma is not None else {}
            src = "episodes" if gamma is None else \
                sql.subquery(sql.episodes_view(snap.step_columns, discounted=True, by_id=snap.by_id))
            return snap.arrow(sql.episodes(conds, source=src, order_by=name, descending=descending, limit=limit,
                                           offset=offset, total=total), params)

    @_reader
    def curves(self, *, run_id: Names = None, env_id: Names = None, where: str | None = None,
               filter: EpisodeFilter | None = None, gamma: float | None = None) -> pa.Table:  # noqa: A002
        """Learning curves: the complete episodes of each ``(run_id, env_id)`` in the order they ended, with
        ``total_env_steps``, the env steps of all the series' writers when each ended (counted over every
        episode of the series, whatever ``where``/``filter`` keep; see :mod:`trajstore.query.curves`).
        With ``gamma`` adds ``discounted_return``."""
        with self._query_snapshot(episodes="fill" if gamma is None else None) as snap:
            series = sql.conditions(run_id=run_id, env_id=env_id)
            chosen = sql.conditions(where=where, filter=filter)
            params = {"gamma": check_gamma(gamma)} if gamma is not None else {}
            src = "episodes" if gamma is None else \
                sql.subquery(sql.episodes_view(snap.step_columns, discounted=True, by_id=snap.by_id))
            walk = snap.arrow(sql.curve_episodes(series, chosen, source=src, flag=CURVE_POINT), params)
        walk = walk.append_column("total_env_steps", pa.array(total_env_steps(walk), pa.int64()))
        return walk.filter(walk[CURVE_POINT]).drop_columns([CURVE_POINT])

    @_reader
    def binned_curves(self, *, x: str = "env_steps", y: str = "episode_return", bins: int = 800,
                      gamma: float | None = None, run_id: Names = None, env_id: Names = None,
                      where: str | None = None, filter: EpisodeFilter | None = None) -> pa.Table:  # noqa: A002
        """Learning curves in ``bins`` bins along ``x`` (``env_steps``, ``wall_time``, ``policy_version`` or
        ``episode_index``), one series per ``(run_id, env_id)``: per non-empty bin ``lo, hi`` (its edges, shared
        by all series, as ``numpy.histogram_bin_edges``), ``count``, ``mean`` and ``p10, p50, p90`` of ``y``
        (``episode_return``, ``episode_length``, or ``discounted_return`` with ``gamma``). The size of the answer
        depends on ``bins`` and the number of series, not on the number of episodes."""
        check_binning(x, y, bins, gamma)
        curve = self._curve(run_id=run_id, env_id=env_id, where=where, filter=filter, gamma=gamma)
        xs = x_values(curve, x)
        edges = bin_edges(xs, bins)
        return bin_stats(self._cursor(), curve, y_values(curve, y), bin_index(xs, edges), edges)

    @_reader
    def histogram(self, *, y: str = "episode_return", bins: int = 60, gamma: float | None = None,
                  run_id: Names = None, env_id: Names = None, where: str | None = None,
                  filter: EpisodeFilter | None = None) -> pa.Table:  # noqa: A002
        """The distribution of ``y`` over the complete episodes of each ``(run_id, env_id)`` in ``bins`` bins
        shared by all series: ``run_id, env_id, bin, lo, hi, count`` per non-empty bin (numpy.histogram's)."""
        check_binning("episode_index", y, bins, gamma)
        curve = self._curve(run_id=run_id, env_id=env_id, where=where, filter=filter, gamma=gamma)
        ys = y_values(curve, y)
        edges = bin_edges(ys, bins)
        return bin_stats(self._cursor(), curve, ys, bin_index(ys, edges), edges, quantiles=())

    @_reader
    def latest_stats(self, last: int = 100, *, gamma: float | None = None, run_id: Names = None,
                     env_id: Names = None, where: str | None = None,
                     filter: EpisodeFilter | None = None) -> pa.Table:  # noqa: A002
        """Statistics of the ``last`` complete episodes of each ``(run_id, env_id)`` to end (the dashboard's
        runs table): ``run_id, env_id, n_traj, return_*, len_*`` (and ``discounted_return_*`` with ``gamma``),
        one row per series with complete episodes; read from the same learning curves :meth:`binned_curves`
        keeps, so its cost does not grow with the store once they are (see
        :func:`~trajstore.query.curves.latest_stats`)."""
        curve = self._curve(run_id=run_id, env_id=env_id, where=where, filter=filter, gamma=gamma)
        return latest_stats(curve, last)

    def _curve(self, **selection: Any) -> pa.Table:
        """:meth:`curves` of ``selection``, kept for the latest committed version and the last few selections
        (a page draws several plots of one selection, and many viewers look at the same runs)."""
        key = (tuple(f.path for f in self.files()), repr(sorted(selection.items())))
        with self._episodes_lock:
            hit = self._curve_cache.get(key)
        if hit is not None:
            return hit
        curve = self.curves(**selection)
        with self._episodes_lock:
            self._curve_cache = {k: v for k, v in self._curve_cache.items() if k[0] == key[0]}
            while len(self._curve_cache) >= CURVE_CACHE_SELECTIONS:
                self._curve_cache.pop(next(iter(self._curve_cache)))
            self._curve_cache[key] = curve
        return curve

    @_reader
    def stats(self, *, by: Names = None, gamma: float | None = None, where: str | None = None,
              filter: EpisodeFilter | None = None, run_id: Names = None,  # noqa: A002
              env_id: Names = None, include_incomplete: bool = False) -> pa.Table:
        """Episode statistics (``n_traj, return_*, len_*`` and ``discounted_return_*`` with ``gamma``).

        One row per group of ``by`` (one row overall without it). Complete episodes only unless
        ``include_incomplete``. Means and standard deviations are summed in parallel, in no fixed order: two
        calls can differ in their last bits (compare them with a tolerance, not ``==``).
        """
        keys = _names(by)
        with self._query_snapshot(episodes="if-cached" if gamma is None else None) as snap:
            if keys:
                snap.check_columns(keys)
            conds = sql.conditions(run_id=run_id, env_id=env_id, where=where, filter=filter)
            source = "episodes" if snap.episodes_materialized else sql.subquery(
                sql.episodes_view(snap.step_columns, discounted=gamma is not None, by_id=snap.by_id))
            q = sql.stats(keys, discounted=gamma is not None, conds=conds, include_incomplete=include_incomplete,
                          source=source)
            return snap.arrow(q, {"gamma": check_gamma(gamma)} if gamma is not None else {})

    def runs(self) -> pa.Table:
        """One row per ``(run_id, env_id)``: its episodes, complete episodes, steps and last write time."""
        with self._query_snapshot(episodes="fill") as snap:
            return snap.arrow(sql.RUNS)

    # --- following the log ------------------------------------------------------------------------

    def follow(self, columns: Sequence[str] | None = None, *, run_id: Names = None, env_id: Names = None,
               since: int | None = None, episodes: bool = False, poll: float = 0.5,
               timeout: float | None = None) -> Iterator[Commit]:
        """The rows of each new commit, in commit order, exactly once: a :class:`~trajstore.query.follow.Commit`
        (``version``, ``rows``, ``runs``) per commit that appended rows of the selected runs/envs.

        ``since``: the last version already seen (the one to resume after; -1 for every commit since the first;
        None: from now on). ``rows`` are the commit's steps (``columns``, or all), or with ``episodes`` the
        ``episodes`` rows of the episodes it completed. Waits for commits by reading the next version's log
        file only, backing off up to ``poll`` seconds; stops after ``timeout`` idle seconds (None: never).
        Commits that rewrite rows (a compaction) add none and are passed over.
        """
        check_follow(since, poll, timeout)
        if self.read_only:
            raise InputError(f"follow: this store is opened at version {self.table.log.pinned}, which never changes; "
                             f"follow the store itself from that version: trajstore.open(uri).follow("
                             f"since={self.table.log.pinned})")
        start = self.version if since is None else since
        for commit in new_commits(self.table, since=start, poll=poll, timeout=timeout):
            rows = self._commit_rows(commit, columns, run_id=run_id, env_id=env_id, episodes=episodes)
            if rows is not None:
                yield rows

    def commit_rows(self, version: int, columns: Sequence[str] | None = None, *, run_id: Names = None,
                    env_id: Names = None, episodes: bool = False) -> Commit | None:
        """What :meth:`follow` yields for the commit of ``version`` (``rows`` empty when it appended none of
        the selected runs' rows); None while there is no such version (for a store opened at a version, a
        version after it). ``episodes`` finds the completed episodes among this store's files."""
        if isinstance(version, bool) or not isinstance(version, int) or version < 0:
            raise InputError(f"version: must be a store version >= 0, got {version!r}")
        if self.table.log.pinned is not None and version > self.table.log.pinned:
            return None  # not committed yet, as of the version this store reads
        commit = self.table.log.commit(version)
        if commit is None:
            return None
        found = self._commit_rows(commit, columns, run_id=run_id, env_id=env_id, episodes=episodes)
        return found or Commit(version, pa.table({}), [], commit.timestamp_ms)

    def _commit_rows(self, commit: LogCommit, columns: Sequence[str] | None, *, run_id: Names, env_id: Names,
                     episodes: bool) -> Commit | None:
        files = [f for f in commit.added if _selected(f.run_id, run_id) and _selected(f.env_id, env_id)]
        if not commit.new_rows or not files:
            return None
        try:
            rows = self._completed_episodes(files, columns) if episodes else self._file_rows(files, columns)
        except (OSError, pa.ArrowException) as exc:  # the commit's own files (a snapshot's errors come judged)
            raise self._damage(exc, files, version=commit.version) or exc
        return Commit(commit.version, rows, sorted({f.run_id for f in files}), commit.timestamp_ms)

    def _file_rows(self, files: list[DataFile], columns: Sequence[str] | None) -> pa.Table:
        """Every step of ``files`` (``columns``, or all), decoded, in their own types."""
        types = self._step_types(files)
        names = list(dict.fromkeys(columns)) if columns else types.schema.names
        check_names(names, types.schema.names, view="steps", field="columns")
        types.check(names)
        return scan_steps(files, types.schema, names, layouts=self._file_layouts(files)).read_all()

    def _completed_episodes(self, files: list[DataFile], columns: Sequence[str] | None) -> pa.Table:
        """The ``episodes`` rows of the episodes whose last step is in ``files`` (read over every committed file
        that may hold their steps)."""
        ends = self._file_rows(files, ["episode_id", "terminated", "truncated"])
        done = ends.filter(pc.or_(ends["terminated"], ends["truncated"]))["episode_id"]
        ids = np.unique(done.to_numpy())
        with self._new_snapshot(files_holding(self.files(), ids), con=self._cursor()) as snap:
            if columns:
                snap.check_columns(list(columns), view="episodes", field="columns")
            rows = snap.arrow(sql.episodes(sql.conditions(episode_id=ids), source="episodes", order_by="episode_id",
                                           descending=False, limit=None))
        return rows.select(list(columns)) if columns else rows

    # --- steps --------------------------------------------------------------------------------------

    @_reader
    def scan(self, columns: Sequence[str] | None = None, *, run_id: Names = None, env_id: Names = None,
             episode_id: Ids = None, where: str | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
             batch_size: int = 65_536, max_batch_bytes: int | None = None) -> pa.RecordBatchReader:
        """The steps of the chosen episodes as a stream of record batches, in storage order, read straight
        from the committed files (see :mod:`trajstore.query.scan`).

        The same rows and types as ``SELECT columns FROM steps`` with these filters (every column without
        ``columns``); ``where`` is a condition on the ``episodes`` view, as for :meth:`episodes`. Batches have
        at most ``batch_size`` rows, and fewer when rows are so wide that a batch would pass ``max_batch_bytes``.
        """
        if batch_size < 1:
            raise InputError(f"batch_size: must be a positive number of rows, got {batch_size}")
        if max_batch_bytes is not None and max_batch_bytes < 1:
            raise InputError(f"max_batch_bytes: must be a positive number of bytes, got {max_batch_bytes}")
        plan = self.scan_plan(columns, run_id=run_id, env_id=env_id, episode_id=episode_id, where=where,
                              filter=filter)
        plan.types.check(plan.columns)  # type: ignore[union-attr]
        return self._read_plan(plan, batch_size=batch_size, max_batch_bytes=max_batch_bytes)

    def _read_plan(self, plan: ScanPlan, *, batch_size: int, max_batch_bytes: int | None) -> pa.RecordBatchReader:
        self._verify_sizes(plan.files)
        try:
            reader = scan_steps(plan.files, plan.schema, plan.columns, episode_ids=plan.episode_ids,
                                batch_size=batch_size, max_batch_bytes=max_batch_bytes, layouts=plan.layouts)
        except (OSError, pa.ArrowException) as exc:
            raise self._damage(exc, plan.files) or exc
        return pa.RecordBatchReader.from_batches(reader.schema, self._damage_named(reader, plan.files))

    @_reader
    def scan_plan(self, columns: Sequence[str] | None = None, *, run_id: Names = None, env_id: Names = None,
                  episode_id: Ids = None, where: str | None = None,
                  filter: EpisodeFilter | None = None) -> ScanPlan:  # noqa: A002
        """What :meth:`scan` reads: the committed files, their types, the columns and the episode ids (None:
        every episode of the files), resolved on one snapshot. Another engine (Ray) can read the plan's files
        in pieces, with :func:`~trajstore.query.scan.scan_steps`, and get exactly the rows of :meth:`scan`."""
        if filter is not None:  # ids, runs and envs select files and rows directly; the rest needs episodes
            run_id, env_id = _both(run_id, filter.run_id), _both(env_id, filter.env_id)
            episode_id = _both(episode_id, filter.episode_id)
            filter = filter.per_episode()
            filter = None if filter.is_empty() else filter
        ids = None if episode_id is None else np.atleast_1d(np.asarray(episode_id, dtype=np.int64))
        if where or filter is not None:  # episode-level conditions: the episode ids they select, on one snapshot
            with self._query_snapshot(episodes="if-cached") as snap:
                conds = sql.conditions(run_id=run_id, env_id=env_id, where=where, filter=filter,
                                       episode_id=episode_id)
                ids = snap.arrow(sql.episode_ids(conds))["episode_id"].to_numpy()
                committed = snap.files
        else:  # no SQL at all once the files' layouts are known for this version
            committed = self.files()
        known = self._step_types(committed).schema
        names = list(dict.fromkeys(columns)) if columns else known.names
        check_names(names, known.names, view="steps", field="columns")
        files = [f for f in committed if _selected(f.run_id, run_id) and _selected(f.env_id, env_id)]
        if ids is not None:
            ids = np.unique(ids)
            files = files_holding(files, ids)
        types = self._step_types(files)
        own = types.schema
        schema = pa.schema([own.field(f.name) if f.name in own.names else f for f in known])
        return ScanPlan(files, schema, names, ids, types, self._file_layouts(files))

    def _file_layouts(self, files: Sequence[DataFile]) -> list[FileLayout]:
        """:meth:`StepsTable.layouts <trajstore.storage.table.StepsTable.layouts>`, a file that cannot be read
        judged by :meth:`_judged`."""
        try:
            return self.table.layouts(files)
        except StoreDamagedError as exc:
            raise self._judged(exc) from exc

    def _file_schema(self, env_id: str | None) -> pa.Schema | None:
        """:meth:`StepsTable.file_schema <trajstore.storage.table.StepsTable.file_schema>`, its file that cannot
        be read judged by :meth:`_judged`."""
        try:
            return self.table.file_schema(env_id=env_id)
        except StoreDamagedError as exc:
            raise self._judged(exc) from exc

    def _verify_sizes(self, files: Sequence[DataFile]) -> None:
        """Raise a :class:`StoreDamagedError` before a stream starts if a file it needs is missing or resized
        (a :class:`VersionNotFoundError` if a vacuum removed it: see :meth:`_judged`)."""
        for f in files:
            problem = self.table.size_problem(f)
            if problem:
                raise self._judged(StoreDamagedError.of_file(f.uri, problem.split(": ", 1)[1], self.uri))

    def _damage_named(self, reader: pa.RecordBatchReader, files: Sequence[DataFile]) -> Iterator[pa.RecordBatch]:
        """``reader``'s batches; a read error about a committed file becomes a :class:`StoreDamagedError`
        (or :class:`VersionNotFoundError`)."""
        try:
            yield from reader
        except (OSError, pa.ArrowException) as exc:
            raise self._damage(exc, files) or exc
        finally:
            reader.close()

    def _damage(self, exc: BaseException, files: Sequence[DataFile], *,
                version: int | None = None) -> TrajstoreError | None:
        """The error to raise for a read error ``exc`` about one of ``files`` (committed files of ``version``,
        by default the version this store reads), judged by :meth:`_judged`, or the :class:`StoreAccessError` of a
        store that failed or did not answer while they were read; None if it is about none of them."""
        found = damaged_file(exc, files, self.uri, location=self.location)
        return found if not isinstance(found, StoreDamagedError) else self._judged(found, version=version)

    def _judged(self, error: StoreDamagedError, *, version: int | None = None) -> TrajstoreError:
        """What a committed file that cannot be read means: a :class:`VersionNotFoundError` when a vacuum
        removed it (it is gone and the latest version no longer lists it: only the older version this read
        needed it; :func:`~trajstore.storage.history.vacuumed`), else ``error`` itself: the store is damaged.

        ``version`` is the version whose file it is (default: the one this store is pinned to, or for the latest,
        the version the read began at)."""
        from trajstore.storage.history import vacuumed

        if error.path is None:
            return error
        path = error.path if self.location.is_local else error.path.removeprefix("s3://")
        at = self.table.log.pinned if version is None else version
        return vacuumed(self.table, path, version=at) or error

    def log_lag(self) -> tuple[int, int]:
        """The log's latest version and how many versions it is past its last checkpoint (what opening it
        replays; see :mod:`trajstore.operations.upkeep`)."""
        version = self.table.log.latest_number()
        return version, self.table.log.versions_since_checkpoint(version)

    def health(self, *, newest: bool = False) -> list[str]:
        """Problems that stop this store from being served: an unreadable log, committed files missing or of
        another size than the log says (cheap checks of every file; ``trajstore check`` reads them all). With
        ``newest``, only the files the latest commit added are looked at (what a commit that lost its files
        would break; a liveness probe's cost, whatever the store's size)."""
        try:
            version = self.table.log.read()
            files = [] if version is None else version.files
            if newest and version is not None:
                commit = self.table.log.commit(version.number)
                added = {f.path for f in commit.added} if commit is not None else set()
                files = [f for f in files if f.path in added]
        except StoreAccessError:
            raise  # the store does not answer (or refuses us): not a damage, and says what to do itself
        except Exception as exc:  # noqa: BLE001 - an unreadable log is the finding
            return [f"the commit log of {self.root} cannot be read: {first_line(exc)}"]
        return [p for p in map(self.table.size_problem, files) if p]

    @_reader
    def iter_batches(self, *, batch_size: int = 4096, columns: Sequence[str] | None = None, shuffle: bool = False,
                     seed: int | None = None, shuffle_buffer: int = 65_536, drop_last: bool = False,
                     format: BatchFormat = "numpy", run_id: Names = None, env_id: Names = None,  # noqa: A002
                     episode_id: Ids = None, where: str | None = None,
                     filter: EpisodeFilter | None = None) -> Iterator[Any]:  # noqa: A002
        """Batches of ``batch_size`` steps for a training loop, read straight from the files: the same
        arguments and batches as :meth:`Client.iter_batches <trajstore.remote.client.Client.iter_batches>`.

        ``format`` is ``"numpy"`` (a dict of ``(n, …)`` arrays), ``"jax"`` or ``"arrow"`` (record batches).
        With ``shuffle``, rows are drawn at random from a buffer of ``shuffle_buffer`` rows, reproducibly for a
        given ``seed``; memory stays bounded by that buffer.
        """
        check_batching(batch_size, shuffle_buffer, format)
        reader = self.scan(columns, run_id=run_id, env_id=env_id, episode_id=episode_id, where=where,
                           filter=filter, batch_size=max(batch_size, 8192),
                           max_batch_bytes=self.settings.stream_batch_bytes)
        with contextlib.closing(reader):
            yield from training_batches(reader, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                        shuffle_buffer=shuffle_buffer, drop_last=drop_last, format=format)

    # --- training loaders: windows and n-step transitions (trajstore.loaders.sequences / .transitions) -------

    @_reader
    def sequences(self, length: int, *, columns: Sequence[str] | None = None, stride: int | None = None,
                  pad: bool = False, gamma: float | None = None, batch_size: int = 256, shuffle: bool = False,
                  seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1, run_id: Names = None,
                  where: str | None = None, format: LoaderFormat = "numpy",  # noqa: A002
                  resume: Mapping[str, Any] | None = None,
                  weight_by: str | None = None, num_samples: int | None = None,
                  filter: EpisodeFilter | None = None,  # noqa: A002
                  max_batch_bytes: int | None = None) -> Batches:
        """Batches of fixed-length windows inside episodes: each column ``(n, length, …)``, ``mask``,
        ``episode_id``, ``start``; see :mod:`trajstore.loaders.sequences`.

        Windows start at steps ``0, stride, …`` (``stride`` defaults to ``length``); ``pad`` adds the partial
        ones at episode ends, zero-padded and masked. ``columns`` defaults to ``obs, action, reward, terminated,
        truncated`` (and ``return_to_go`` when ``gamma`` is given). ``shuffle`` permutes all windows by ``(seed, epoch)``;
        ``rank``/``world_size`` take one shard; ``weight_by`` (a step column, read at a window's first step,
        or an ``episodes`` column such as ``episode_return``) draws ``num_samples`` windows (default: as many
        as there are) with replacement in proportion to it. The iterator's ``state_dict()``, passed back as
        ``resume``, continues right after the last batch it gave. Reads one committed version. With
        ``max_batch_bytes``, an :class:`InputError` before anything is read when one batch would take more.
        """
        source = self._loader_source(run_id=run_id, where=where, filter=filter)
        sampling = Sampling(batch_size, shuffle, seed, epoch, rank, world_size, weight_by, num_samples)
        return load_sequences(source, length, columns=columns, stride=stride, pad=pad, gamma=gamma,
                              sampling=sampling, format=format, resume=resume, max_batch_bytes=max_batch_bytes)

    @_reader
    def transitions(self, n: int, *, gamma: float, columns: Sequence[str] | None = None, batch_size: int = 256,
                    shuffle: bool = False, seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
                    run_id: Names = None, where: str | None = None, format: LoaderFormat = "numpy",  # noqa: A002
                    resume: Mapping[str, Any] | None = None, weight_by: str | None = None,
                    num_samples: int | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                    max_batch_bytes: int | None = None) -> Batches:
        """Batches of n-step transitions, one per step: ``columns`` at t (default ``obs``, ``action``), the
        n-step ``reward``, ``next_obs``, ``terminated``, ``discount``, ``episode_id``, ``step``; see
        :mod:`trajstore.loaders.transitions`. Order, shards, sampling, resume and ``max_batch_bytes`` as for
        :meth:`sequences`."""
        source = self._loader_source(run_id=run_id, where=where, filter=filter)
        sampling = Sampling(batch_size, shuffle, seed, epoch, rank, world_size, weight_by, num_samples)
        return load_transitions(source, n, gamma=gamma, columns=columns, sampling=sampling, format=format,
                                resume=resume, max_batch_bytes=max_batch_bytes)

    def _loader_source(self, *, run_id: Names, where: str | None, filter: EpisodeFilter | None) -> Source:  # noqa: A002
        """The selected steps of the latest version, pinned: every read of a loader reads these files."""
        env_id = None
        if filter is not None and filter.per_episode().is_empty() and not filter.episode_id:
            run_id, env_id, filter = _both(run_id, filter.run_id), filter.env_id or None, None  # files alone
        if where is None and filter is None:
            version, files = _listing(self.table)  # one reading of the log for the files and the layout's basis
            plan = self._loader_plan(run_id, env_id, files)
        else:
            plan = self.scan_plan(None, run_id=run_id, env_id=env_id, where=where, filter=filter)
            version, files = _listing(self.table)  # after the plan's: if anything, later (a layout kept longer)
        self._verify_sizes(plan.files)

        def read(columns: Sequence[str]) -> Iterator[pa.RecordBatch]:
            try:
                yield from read_files(plan.files, plan.schema, list(columns), plan.episode_ids, plan.layouts)
            except (OSError, pa.ArrowException) as exc:
                raise self._damage(exc, plan.files) or exc

        def episode_values(name: str) -> tuple[np.ndarray, np.ndarray]:
            with self._new_snapshot(plan.files, con=self._cursor()) as snap:
                snap.check_columns([name], view="episodes", field="weight_by")
                rows = snap.arrow(sql.episode_values(name))
            return rows["episode_id"].to_numpy(), rows["value"].to_numpy(zero_copy_only=False).astype(np.float64)

        # the order depends on what is selected, not on how: a state made locally resumes over REST and back
        key = files_digest(sorted(self.table.location.relative(f.path) for f in plan.files))  # (in any log order)
        chosen = None if plan.episode_ids is None else files_digest(plan.episode_ids.tolist())
        selection = files_digest({"run_id": run_id, "env_id": env_id, "where": where, "filter": filter})
        types = plan.types
        return Source(plan.schema, read, episode_values, key, {"episodes": chosen}, self.layouts,
                      self._layout_basis(plan, run_id, env_id, selection, version, files),
                      check=lambda names: types.check(names, stackable=True))  # type: ignore[union-attr]

    def _layout_basis(self, plan: ScanPlan, run_id: Names, env_id: Names, selection: str, version: int,
                      files: list[DataFile]) -> Basis:
        """What vacuum keeps a layout of ``plan`` by: ``version`` (that of ``plan``'s files or later), and the
        files its selection names (every file of ``files``, that version's, when episode-level conditions chose
        the episodes)."""
        if plan.episode_ids is not None:
            named = [self.table.location.relative(f.path) for f in files]
            return Basis(version, episodes=True, files=layout_files_digest(named), selection=selection)
        runs, envs = (None if v is None else sorted([v] if isinstance(v, str) else map(str, v))
                      for v in (run_id, env_id))
        named = [self.table.location.relative(f.path) for f in plan.files]
        return Basis(version, runs, envs, files=layout_files_digest(named), selection=selection)

    def _loader_plan(self, run_id: Names, env_id: Names, committed: list[DataFile]) -> ScanPlan:
        """:meth:`scan_plan` for a selection of runs and envs alone among ``committed`` files, without opening
        DuckDB (~35 MiB a loader need not pay): the files' own types."""
        files = [f for f in committed if _selected(f.run_id, run_id) and _selected(f.env_id, env_id)]
        types = self._step_types(files) if files else StepTypes(pa.schema([]))  # no file: no column
        return ScanPlan(files, types.schema, types.schema.names, None, types, self._file_layouts(files))

    @_reader
    def steps_page(self, columns: Sequence[str] | None = None, *, filter: EpisodeFilter | None = None,  # noqa: A002
                   where: str | None = None, limit: int = 100, offset: int = 0,
                   after: tuple[int, int] | None = None) -> pa.Table:
        """One page of the selected steps in ``(episode_id, step)`` order (``columns``, or all); with ``after``
        (the ``(episode_id, step)`` of the previous page's last row: a keyset cursor) the page after it, read
        without counting off the rows before it."""
        restrict = {} if filter is None else {"run_id": filter.run_id, "env_id": filter.env_id}
        with self._query_snapshot(episodes="if-cached", **restrict) as snap:  # the selected envs' own types
            snap.check_columns(list(columns or ()), view="steps", field="columns")
            conds = _step_conditions(filter, where)
            if after is not None:
                conds.append(sql.after_key(["episode_id", "step"], [int(after[0]), int(after[1])]))
            return snap.arrow(sql.steps(list(columns or ()), conds, limit=limit, offset=offset))

    def episode_steps(self, episode_id: int, columns: Sequence[str] | None = None) -> pa.Table:
        """Every step of one episode in order (``step`` and ``columns``, or every column); empty if there is
        no such episode."""
        committed = self.files()
        names = ["step", *columns] if columns else []
        known = self._step_types(committed).schema
        check_names(names, known.names, view="steps", field="columns")
        files = files_holding(committed, np.array([int(episode_id)], np.int64))  # its environment's types alone
        with self._new_snapshot(files, con=self._cursor()) as snap:
            held = [n for n in names if n in snap.step_columns]
            rows = snap.arrow(sql.steps(held, sql.conditions(episode_id=int(episode_id))))
        for name in names:  # a column only other environments store: null here
            if name not in rows.column_names:
                rows = rows.append_column(known.field(name), pa.nulls(rows.num_rows, known.field(name).type))
        return rows.select(names) if names else rows

    @_reader
    def returns(self, *, gamma: float, per: Literal["episode", "step"] = "episode", run_id: Names = None,
                env_id: Names = None, episode_id: Ids = None, where: str | None = None,
                filter: EpisodeFilter | None = None, limit: int | None = None) -> pa.Table:  # noqa: A002
        """Discounted return per episode, or return-to-go ``G_t = r_t + gamma G_{t+1}`` per step, both computed
        in float64 from the stored rewards.

        Rows come sorted by ``episode_id`` (per step by ``(episode_id, step)``, with ``run_id`` and ``env_id``
        dictionary-encoded: the same values, a byte per row). With ``limit``, the first ``limit`` rows;
        per step, only the episodes they reach are read.
        """
        if limit is not None and limit < 0:
            raise InputError(f"limit: must be a number of rows >= 0, got {limit}")
        g = check_gamma(gamma)
        if per not in ("episode", "step"):
            raise InputError(f"per: must be 'episode' or 'step', got {per!r}")
        with self._query_snapshot() as snap:
            if per == "episode":
                conds = sql.conditions(run_id=run_id, env_id=env_id, where=where, episode_id=episode_id,
                                       filter=filter)
                src = sql.subquery(sql.episodes_view(snap.step_columns, discounted=True, by_id=snap.by_id))
                return snap.arrow(sql.episode_returns(conds, source=src, limit=limit), {"gamma": g})
            conds = sql.conditions(run_id=run_id, env_id=env_id, episode_id=episode_id) + \
                _step_conditions(filter, where)
            if limit is not None:
                conds.append(_first_episodes(snap, conds, limit))
            rows = snap.arrow(sql.step_rewards(snap.files, conds))
        out = _with_return_to_go(rows, g)
        return out if limit is None else out.slice(0, limit)


@dataclass(frozen=True)
class ScanPlan:
    """The committed files a scan reads (in log order), the types a scan of them returns for every column of the
    steps view, the columns asked for and the episode ids selected (None: every episode in the files); the
    types of the selected files (with the columns they store unlike each other) and their layouts."""

    files: list[DataFile]
    schema: pa.Schema
    columns: list[str]
    episode_ids: np.ndarray | None
    types: StepTypes | None = None
    layouts: list[FileLayout] | None = None


CURVE_CACHE_SELECTIONS = 8  # curve selections kept per version (Store._curve)
TYPES_KEPT = 8  # file selections whose step types are kept (Store._step_types)
EPISODE_CACHE_ROWS = 2_000_000  # larger episodes views are aggregated per query instead of kept in memory


def _step_conditions(filter: EpisodeFilter | None, where: str | None) -> list[str]:  # noqa: A002
    """Conditions on ``steps`` for an episode filter: ids, runs and envs directly, the rest through ``episodes``."""
    if filter is None:
        return [sql.episodes_selected([sql.user_condition(where)])] if where else []
    direct = sql.conditions(run_id=filter.run_id or None, env_id=filter.env_id or None,
                            episode_id=filter.episode_id or None)
    rest = sql.conditions(filter=filter.per_episode(), where=where)
    return direct + ([sql.episodes_selected(rest)] if rest else [])


def _first_episodes(snap: Snapshot, conds: list[str], rows: int) -> str:
    """A condition keeping the selected steps of the lowest episode ids that together hold ``rows`` steps."""
    counts = snap.arrow(sql.step_counts(conds))
    reached = np.searchsorted(np.cumsum(counts["n"].to_numpy()), rows)
    if reached >= counts.num_rows:
        return "true"
    return sql.episode_id_at_most(counts["episode_id"][int(reached)].as_py())


def _with_return_to_go(rows: pa.Table, gamma: float) -> pa.Table:
    """``rows`` sorted by ``(episode_id, step)`` with their ``return_to_go``; run_id/env_id stay dictionary-encoded."""
    s = sorted_return_to_go(rows["episode_id"].to_numpy(), rows["step"].to_numpy(), rows["reward"].to_numpy(),
                            gamma)
    return pa.table({"run_id": _reordered(rows["run_id"], s), "env_id": _reordered(rows["env_id"], s),
                     "episode_id": s.episode_id, "step": s.step, "reward": s.reward, "return_to_go": s.return_to_go})


def _reordered(column: pa.ChunkedArray, s: SortedReturns) -> pa.Array:
    """``column`` sorted like ``s``; for a dictionary column only its indices move (if they differ at all)."""
    arr = column.combine_chunks()
    if pa.types.is_dictionary(arr.type) and arr.null_count == 0:
        idx = arr.indices.to_numpy()
        if len(idx) == 0 or idx.min() == idx.max():  # one value throughout: sorting changes nothing
            return arr
        return pa.DictionaryArray.from_arrays(s.reorder(idx), arr.dictionary)
    return arr.take(pa.array(s.reorder(np.arange(len(arr)))))


def _listing(table: StepsTable) -> tuple[int, list[DataFile]]:
    """The version the table's log reads and its committed files, from one reading of the log (the two may not
    come from two readings: a commit between them would pair a version with another version's files)."""
    version = table.log.read()
    return (-1, []) if version is None else (version.number, version.files)


def _names(value: str | Sequence[str] | None) -> list[str]:
    """One name, several, or a comma-separated list of them (as the CLI and REST accept)."""
    items = [value] if isinstance(value, str) else list(value or ())
    return [n.strip() for item in items for n in str(item).split(",") if n.strip()]


def _both(a: Any, b: Any) -> Any:
    """The selection of two keywords: one if the other is absent, else their intersection."""
    if b in (None, []):
        return a
    if a is None:
        return b
    a_set = {a} if isinstance(a, (str, int, np.integer)) else set(np.atleast_1d(a).tolist())
    return [v for v in b if v in a_set]


def _run_list(value: Names) -> list[str]:
    """A selection of runs (one id, several, or none) as a list."""
    if value is None:
        return []
    return [value] if isinstance(value, str) else [str(v) for v in value]


def _selected(value: str, wanted: str | Sequence[str] | None) -> bool:
    if wanted is None:
        return True
    return value == wanted if isinstance(wanted, str) else value in wanted
