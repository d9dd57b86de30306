"""A trajstore store: a directory (or an ``s3://`` prefix) holding the ``steps`` Delta table, and the façade users
write and read it through.

:class:`Store` keeps a handful of handles — its location, settings, the table (its files and its log), the read
engine (:class:`~trajstore.query.engine.Engine`: DuckDB, the caches of one version) and where loader maps are kept
— and each of its methods resolves the selection and makes one call into the module named after its topic.

>>> import trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> store.stats().column("n_traj").to_pylist()
[0]
"""

from __future__ import annotations

import contextlib
import json
import logging
import os
import uuid
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Mapping, Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from trajstore.errors import (
    InputError,
    QueryError,
    StoreAccessError,
    StoreExistsError,
    StoreNotFoundError,
    caller_sql_error,
)
from trajstore.loaders.layout_store import LayoutStore
from trajstore.loaders.loader import Batches, LoaderFormat
from trajstore.loaders.sequences import Sampling
from trajstore.loaders.sequences import sequences as load_sequences
from trajstore.loaders.source import loader_source
from trajstore.loaders.transitions import transitions as load_transitions
from trajstore.operations import add_column as add_column_op
from trajstore.operations import check as check_op
from trajstore.operations import compact as compact_op
from trajstore.operations import delete as delete_op
from trajstore.operations import retention as retention_op
from trajstore.operations import vacuum as vacuum_op
from trajstore.operations.handoff import handed_files
from trajstore.operations.ingest import append_rows
from trajstore.operations.upkeep import Policy, Upkeep
from trajstore.query import compare as compare_op
from trajstore.query import curves, episodes, follow, returns, sandbox, scan, spark_sql, sql_worker, stats
from trajstore.query.batches import BatchFormat, check_batching, training_batches
from trajstore.query.engine import Engine
from trajstore.query.filters import EpisodeFilter, Ids, Names, check_runs, filtered, names_of
from trajstore.query.follow import Commit
from trajstore.query.pictures import ImageLeaf, stored_image_leaves
from trajstore.query.scan import ScanPlan
from trajstore.query.snapshot import Snapshot, decoding_sql
from trajstore.query.sql import Where
from trajstore.schema import describe
from trajstore.settings import Settings
from trajstore.storage import run_config
from trajstore.storage.arrays import FOLDER as ARRAYS
from trajstore.storage.arrays import StepArrays
from trajstore.storage.history import history, resolve_version
from trajstore.storage.location import Location, explain, locate
from trajstore.storage.log import DataFile
from trajstore.storage.summaries import FOLDER as SUMMARIES
from trajstore.storage.summaries import Summaries
from trajstore.storage.table import StepsTable
from trajstore.write.writer import Writer

if TYPE_CHECKING:
    from trajstore.operations.add_column import AddColumnReport
    from trajstore.operations.check import CheckReport
    from trajstore.operations.compact import CompactReport
    from trajstore.operations.delete import DeleteReport
    from trajstore.operations.retention import RetentionReport
    from trajstore.operations.vacuum import VacuumReport

log = logging.getLogger(__name__)

MARKER = "trajstore.json"
FORMAT_VERSION = 1


def open(uri: str | Path, create: bool = False, *, storage_options: Mapping[str, Any] | None = None,  # noqa: A001
         settings: Settings | None = None, version: int | None = None, as_of: datetime | None = None,
         log_retention: float | str | timedelta | None = None) -> Store:
    """Open the store at ``uri``: a local directory or ``s3://bucket/prefix``; with ``create=True`` make it if
    absent. For S3, ``storage_options`` holds the ``AWS_*`` keys deltalake uses (each one not given is taken from
    the environment variable of that name).

    With ``version=N`` (see :meth:`Store.history`) or ``as_of=datetime`` (the latest version committed then),
    the store is read-only and every read sees it exactly as it was at that version. ``log_retention`` (``"7d"``,
    ``"1h"``; the default of a new store: 7 days) is how long its log keeps each version: see
    :meth:`Store.set_log_retention`."""
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
    store = Store(location, settings=settings)
    if log_retention is not None:
        store.set_log_retention(log_retention)
    return store if version is None and as_of is None else store.at(version=version, as_of=as_of)


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
    try:
        listed = fs.get_file_info(pafs.FileSelector(location.root, allow_not_found=True))
    except FileNotFoundError:  # another creator's folder between its existence check and the listing: nothing else
        listed = []
    others = [i for i in listed if not i.base_name.startswith(f".{MARKER}.") and i.base_name != MARKER]
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


def _read(self: Store, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    """How a reader of the Store is called (:func:`~trajstore.query.filters.filtered`): a run the store does not
    hold (``run_id=``, or in ``filter``) is a :class:`~trajstore.errors.RunNotFoundError` naming it and the runs
    there are, before anything is read; a query that fails because of the caller's own ``where`` condition is an
    :class:`InputError` naming ``where`` (DuckDB's first line, without the SQL trajstore built around it)."""
    flt = kwargs.get("filter")
    self.engine.check_runs(kwargs.get("run_id"), flt.run_id if flt is not None else None)
    try:
        return method(self, *args, **kwargs)
    except QueryError as exc:
        if not kwargs.get("where") or type(exc) is not QueryError:
            raise
        raise caller_sql_error(exc, "where", f"in {kwargs['where']!r}") from None


_reader = filtered(around=_read)


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
                 pinned: int | None = None, sql_gate: sandbox.Gate | None = None) -> None:
        self.settings = settings or Settings.from_env()
        self.location = locate(location, settings=self.settings)
        arrays = StepArrays(self.location.path(ARRAYS)) if self.settings.loader_arrays and self.location.is_local \
            else None
        summaries = Summaries(self.location.path(SUMMARIES)) if self.settings.episode_summaries and \
            self.location.is_local else None
        self.table = StepsTable(self.location.child("steps"), row_group_rows=self.settings.row_group_rows,
                                pinned=pinned, arrays=arrays, summaries=summaries)
        self.engine = Engine(self.table, self.location, self.settings, sql_gate)
        self.layouts = LayoutStore(self.location, cache=self.settings.layout_cache,  # loader layouts, kept
                                   shared=self.settings.store_layouts, keep=self.settings.loader_layouts)
        # compacts what ingest commits (its thread starts with the first); a store read at a version takes none
        self.ingest_upkeep = None if pinned is not None else Upkeep(self.table, Policy.of(self.settings))

    @property
    def uri(self) -> str:
        """Where the store is: a local directory's absolute path, or ``s3://bucket/prefix``."""
        return self.location.uri

    @property
    def root(self) -> Any:
        """The store's directory as a :class:`~pathlib.Path` for a local store, else its URI."""
        return Path(self.location.root) if self.location.is_local else self.location.uri

    @property
    def sql_gate(self) -> sandbox.Gate:
        """The places for sandboxed queries and loader streams at once (shared by the store at every version)."""
        return self.engine.sql_gate

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"

    # --- writing ------------------------------------------------------------------------------------

    def writer(self, *, run_id: str, env_id: str, config: Mapping[str, Any] | None = None,
               tags: Sequence[str] | None = None, notes: str | None = None, **options: Any) -> Writer:
        """A :class:`Writer` appending to ``run_id``/``env_id``; extra keywords are writer options or lineage.
        ``config``, ``tags``, ``notes`` describe the run (:mod:`~trajstore.storage.run_config`; committed before
        the writer is made): the first writer of a run records them, a later one adds its tags and must give the
        same config (change it with :meth:`set_run`). ``committer=`` (a :class:`trajstore.Committer`, or the
        ``address`` of one in another process) commits the writer's files with other writers' in groups: the writer
        writes them itself and hands them over (see :mod:`trajstore.operations.group_commit`)."""
        self.table.log.writable("writer")
        options.setdefault("flush_bytes", self.settings.flush_bytes)
        sink = handed_files(self.table, options.pop("committer", None))  # the committer's upkeep, if handed
        options.setdefault("upkeep", Upkeep(self.table, Policy.of(self.settings)) if sink is self.table else None)
        writer = Writer(sink, run_id=run_id, env_id=env_id, **options)  # checks the names first
        try:
            self.describe_run(run_id, config=config, tags=tags, notes=notes)
        except BaseException:
            writer.close()  # nothing written: nothing committed
            raise
        return writer

    def describe_run(self, run_id: str, *, config: Mapping[str, Any] | None = None,
                     tags: Sequence[str] | None = None, notes: str | None = None,
                     provenance: Mapping[str, str | None] | None = None) -> None:
        """What a writer of ``run_id`` does with its ``config``, ``tags``, ``notes``: the first describes the run, with
        ``created`` and the program's version, git commit and host (``provenance``: those a remote program reports
        of itself), also when nothing is given; a later one adds its tags, keeps stored notes, and must give the same
        config (:class:`InputError` naming what differs). One row of the store's ``runs`` table
        (:mod:`~trajstore.storage.run_config`), none when nothing changes."""
        change = run_config.given(config=config, tags=tags, notes=notes)
        self.engine.descriptions.change(run_id, change, replace=False, what="writer", provenance=provenance)

    def set_run(self, run_id: str, *, config: Mapping[str, Any] | None = None, tags: Sequence[str] | None = None,
                notes: str | None = None) -> None:
        """Change what describes ``run_id`` (a run with steps, or one described before; else
        :class:`~trajstore.errors.RunNotFoundError`): each of ``config``, ``tags``, ``notes`` given replaces the
        stored one, None leaves it. One row of the store's ``runs`` table: the store read at an earlier version
        keeps the earlier description (see :mod:`~trajstore.storage.run_config`)."""
        self.run_info(run_id)  # a run the store holds, or has described
        change = run_config.given(config=config, tags=tags, notes=notes)
        self.engine.descriptions.change(run_id, change, replace=True, what="set_run")

    def run_info(self, run_id: str) -> dict[str, Any]:
        """What describes ``run_id`` at the version this store reads: ``config`` (a dict), ``tags``, ``notes``,
        ``created`` (when first described; None for a run never described), ``trajstore_version``,
        ``git_commit`` and ``host`` of the program that first described it, and ``problem``: what of its stored
        description cannot be used (left out), or None."""
        infos = self.engine.descriptions.infos()
        check_runs([run_id], {*self.engine.run_ids(), *infos}, self.uri)
        return infos.get(run_id) or run_config.undescribed()

    def run_infos(self) -> dict[str, dict[str, Any]]:
        """:meth:`run_info` of every run the store holds, by run id (each table read once)."""
        infos = self.engine.descriptions.infos()
        return {r: infos.get(r) or run_config.undescribed() for r in self.engine.run_ids()}

    def ingest(self, rows: pa.Table, *, run_id: str, env_id: str,
               idempotency_key: str | None = None) -> tuple[str | None, bool]:
        """Append rows already cut into episodes (what a remote writer sends), checked against what is stored;
        returns ``(file, duplicate)``. Rows that do not continue their episodes raise :class:`InputError`, a key
        used before for another request :class:`~trajstore.errors.ConflictError`. See
        :mod:`trajstore.operations.ingest`."""
        self.table.log.writable("ingest")
        out = append_rows(self.table, rows, run_id=run_id, env_id=env_id, idempotency_key=idempotency_key)
        if out[0] is not None and not out[1] and self.ingest_upkeep is not None:  # compacted by the service
            self.ingest_upkeep.wrote(run_id, env_id)
        return out

    # --- the committed state ------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The latest committed version of the log (-1 for a store nothing was written to); for a store opened
        at a version, that version."""
        return self.table.log.latest_number()

    @property
    def read_only(self) -> bool:
        """Whether this store is pinned to an old version (``open(uri, version=N)``): it reads, never writes."""
        return self.table.log.pinned is not None

    def at(self, *, version: int | None = None, as_of: datetime | None = None) -> Store:
        """This store, read-only, exactly as it was at ``version`` (or the latest version committed at or before
        ``as_of``): every read (stats, episodes, sql, scan, returns, runs) sees that version's files."""
        pinned = resolve_version(StepsTable(self.table.location), version=version, as_of=as_of)
        # one bound on the queries at once, whatever version they read
        return Store(self.location, settings=self.settings, pinned=pinned, sql_gate=self.sql_gate)

    def history(self, *, limit: int | None = None) -> pa.Table:
        """One row per committed version, oldest first: ``version, timestamp, operation, rows_added,
        rows_removed, files_added, files_removed, run_ids`` (see :mod:`trajstore.storage.history`)."""
        return history(self.table, limit=limit)

    def files(self) -> list[DataFile]:
        """The committed Parquet files of the latest version."""
        return self.engine.files()

    def run_ids(self) -> list[str]:
        """The runs the store holds (from the committed file list: no file is read)."""
        return self.engine.run_ids()

    def schema(self, env_id: str | None = None) -> pa.Schema:
        """The Arrow types of the stored columns, fixed sizes kept (of one environment's files with ``env_id``);
        an empty schema for an empty store."""
        return self.engine.stored_schema(env_id) or pa.schema([])

    def decoding_sql(self, *, source: str = "stored_steps", dialect: str = "duckdb") -> str:
        """SQL that decodes this version's stored columns into the steps trajstore's readers give, for another
        engine to run unchanged over the relation ``source`` (the table's stored rows): DuckDB's (see
        :func:`~trajstore.query.snapshot.decoding_sql`) or, with ``dialect="spark"``, Spark SQL's (see
        :mod:`~trajstore.query.spark_sql`)."""
        if dialect not in ("duckdb", "spark"):
            raise InputError(f"dialect: expected 'duckdb' or 'spark', got {dialect!r}")
        files = self.engine.files()
        if dialect == "spark":
            return spark_sql.decoding_sql(files, self.engine.file_schemas(files), source=source)
        return decoding_sql(files, self.engine.file_schemas(files), source=source)

    def stored_columns(self) -> list[dict[str, Any]]:
        """The Delta table's columns as stored: ``name``, ``type`` (as the log records it) and, where a column is
        not simply its field's values under its field's name, ``declared`` (what it holds: its field, how it is
        stored, its type; see :func:`~trajstore.storage.encoding.declaration`)."""
        state = self.table.log.read()
        if state is None:
            return []
        return [{"name": f.name, "type": describe(f.type), "declared": state.declarations.get(f.name)}
                for f in state.schema]

    def image_leaves(self, env_id: str | None = None) -> list[ImageLeaf]:
        """The observation leaves that are pictures (see :mod:`trajstore.query.pictures`; of one environment's
        files with ``env_id``), their declared frame stacks taken from the files' formats; empty without images."""
        return stored_image_leaves(self.engine, env_id)

    def log_lag(self) -> tuple[int, int]:
        """The log's latest version and how many versions it is past its last checkpoint (what opening it
        replays; see :mod:`trajstore.operations.upkeep`)."""
        return self.engine.log_lag()

    def health(self, *, newest: bool = False) -> list[str]:
        """Problems that stop this store from being served: an unreadable log, committed files missing or of
        another size than the log says (cheap checks of every file; ``trajstore check`` reads them all). With
        ``newest``, only the files the latest commit added are looked at (a liveness probe's cost)."""
        return self.engine.health(newest=newest)

    # --- lifecycle: delete, retention, derived columns (see trajstore.operations.*) --------------------------

    def delete(self, *, run_id: Names = None, where: str | None = None, dry_run: bool = False) -> DeleteReport:
        """Delete whole episodes in one commit: every episode of ``run_id`` and/or every episode whose steps
        ``where`` (a condition over ``steps``) all select; refused if it selects part of an episode. Returns
        what was deleted (see :mod:`trajstore.operations.delete`). Deleting a whole run (``run_id`` without
        ``where``) also ends its description."""
        report = delete_op.delete(self.engine, run_id=run_id, where=where, dry_run=dry_run)
        if run_id is not None and where is None and not dry_run:
            self.engine.descriptions.forget(names_of(run_id))
        return report

    def vacuum(self, *, older_than: float | str | timedelta = "7d", dry_run: bool = False) -> VacuumReport:
        """Delete the files no version committed within ``older_than`` (seconds, a timedelta, or ``"7d"``,
        ``"12h"``, ``"30m"``) needs: files deleted or compacted away before then, and files no commit ever
        listed (see :mod:`trajstore.operations.vacuum`). With ``dry_run``, only list them."""
        return vacuum_op.vacuum(self.engine, self.layouts, older_than=older_than, dry_run=dry_run)

    def set_log_retention(self, log_retention: float | str | timedelta, *,
                          checkpoint_interval: int | None = None) -> RetentionReport:
        """Keep each version's log entries ``log_retention`` long (``"7d"``, ``"1h"``, at least a minute), and, if
        given, checkpoint every ``checkpoint_interval`` versions: the Delta table properties
        ``delta.logRetentionDuration`` / ``delta.checkpointInterval`` of every table of the store, which other
        engines honour too. An older version can no longer be read (see :mod:`trajstore.operations.retention`)."""
        return retention_op.set_log_retention(self.engine, log_retention, checkpoint_interval=checkpoint_interval)

    def log_retention(self) -> RetentionReport:
        """Each table's log retention and checkpoint interval, and the versions its log still reads."""
        return retention_op.report(self.engine)

    def add_column(self, name: str, expression: str | Callable[[pa.Table], Any], *,
                   where: str | None = None) -> AddColumnReport:
        """Write a derived column ``name`` into the stored steps, in one commit: ``expression`` is DuckDB SQL
        over the steps' columns (``"reward * 0.5 + 0.1"``) or a function of a pyarrow Table of a file's steps
        returning an array. With ``where`` (a condition over ``steps``), only those rows get a value, the
        others null (see :mod:`trajstore.operations.add_column`)."""
        return add_column_op.add_column(self.engine, name, expression, where=where)

    # --- SQL ----------------------------------------------------------------------------------------

    def snapshot(self, *, config: dict[str, Any] | None = None, run_id: Names = None,
                 env_id: Names = None) -> Snapshot:
        """A DuckDB connection with ``steps``, ``episodes`` and ``runs`` views over the latest committed version
        (of the files of ``run_id``/``env_id`` only, where every column has its own type: over environments whose
        columns differ in type, such a column is a VARIANT)."""
        return self.engine.snapshot(self.engine.selected_files(run_id, env_id), config=config, runs=True)

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
        return sql_worker.sandboxed_sql(self.engine, query, limits, encode=encode, run_id=run_id, env_id=env_id)

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
        return episodes.episodes(self.engine, run_id=run_id, env_id=env_id, complete=complete, where=where,
                                 filter=filter, gamma=gamma, order_by=order_by, limit=limit, offset=offset)

    @_reader
    def episode_page(self, *, where: str | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                     gamma: float | None = None, order_by: str = "episode_id", limit: int,
                     offset: int = 0, after: int | None = None) -> tuple[pa.Table, int]:
        """One page of :meth:`episodes` and how many episodes the filter selects in all, in one query.

        With ``after`` (the previous page's last ``episode_id``: a keyset cursor; ``order_by`` must then be
        ``episode_id`` or ``-episode_id``), the page after that episode, whatever its depth."""
        return episodes.episode_page(self.engine, where=where, filter=filter, gamma=gamma, order_by=order_by,
                                     limit=limit, offset=offset, after=after)

    @_reader
    def curves(self, *, run_id: Names = None, env_id: Names = None, where: str | None = None,
               filter: EpisodeFilter | None = None, gamma: float | None = None,  # noqa: A002
               metric: str | None = None) -> pa.Table:
        """Learning curves: the complete episodes of each ``(run_id, env_id)`` in the order they ended, with
        ``total_env_steps``, the env steps of all the series' writers when each ended (counted over every
        episode of the series, whatever ``where``/``filter`` keep; see :mod:`trajstore.query.curves`).
        With ``gamma`` adds ``discounted_return``; with ``metric`` (an ``episodes`` column or ``agg(column)``
        of a step column, :mod:`~trajstore.query.metrics`) a ``metric`` column of its values."""
        return curves.curves(self.engine, run_id=run_id, env_id=env_id, where=where, filter=filter, gamma=gamma,
                             metric=metric)

    @_reader
    def binned_curves(self, *, x: str = "env_steps", y: str = "episode_return", bins: int = 800,
                      gamma: float | None = None, run_id: Names = None, env_id: Names = None,
                      where: str | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                      metric: str | None = None, by: str | None = None) -> pa.Table:
        """Learning curves in ``bins`` bins along ``x`` (``env_steps``, ``wall_time``, ``policy_version`` or
        ``episode_index``), one series per ``(run_id, env_id)``: per non-empty bin ``lo, hi`` (its edges, shared
        by all series, as ``numpy.histogram_bin_edges``), ``count``, ``mean`` and ``p10, p50, p90`` of ``y``
        (``episode_return``, ``episode_length``, or ``discounted_return`` with ``gamma``), or of ``metric`` (any
        metric, ``"last(is_success)"``: episodes without a value left out). The size of the answer depends on
        ``bins`` and the number of series, not on the number of episodes. With ``by="agent_id"`` (or
        ``"agent_group"``), one series per ``(run_id, env_id, agent)`` of the multi-agent episodes, of each agent's
        own return or length, in a column named ``by``."""
        return curves.binned_curves(self.engine, x=x, y=y, bins=bins, gamma=gamma, run_id=run_id, env_id=env_id,
                                    where=where, filter=filter, metric=metric, by=by)

    @_reader
    def histogram(self, *, y: str = "episode_return", bins: int = 60, gamma: float | None = None,
                  run_id: Names = None, env_id: Names = None, where: str | None = None,
                  filter: EpisodeFilter | None = None, metric: str | None = None,  # noqa: A002
                  density: bool = False) -> pa.Table:
        """The distribution of ``y`` (or of any ``metric``) over the complete episodes of each ``(run_id,
        env_id)`` in at most ``bins`` bins shared by all series: ``run_id, env_id, bin, lo, hi, count`` per
        non-empty bin, with ``density`` also each bin's density (``numpy.histogram(density=True)``'s, per series:
        runs of different sizes compare). Whole-number values (returns of +1 rewards, lengths) are binned on
        whole numbers; others on ``numpy.histogram_bin_edges``."""
        return curves.histogram(self.engine, y=y, bins=bins, gamma=gamma, run_id=run_id, env_id=env_id,
                                where=where, filter=filter, metric=metric, density=density)

    @_reader
    def latest_stats(self, last: int = 100, *, gamma: float | None = None, run_id: Names = None,
                     env_id: Names = None, where: str | None = None,
                     filter: EpisodeFilter | None = None) -> pa.Table:  # noqa: A002
        """Statistics of the ``last`` complete episodes of each ``(run_id, env_id)`` to end (the dashboard's
        runs table): ``run_id, env_id, n_traj, return_*, len_*`` (and ``discounted_return_*`` with ``gamma``),
        one row per series with complete episodes; read from the same learning curves :meth:`binned_curves`
        keeps, so its cost does not grow with the store once they are (see
        :func:`~trajstore.query.curves.latest_of`)."""
        return curves.latest_stats(self.engine, last, gamma=gamma, run_id=run_id, env_id=env_id, where=where,
                                   filter=filter)

    @_reader
    def stats(self, *, by: Names = None, gamma: float | None = None, where: str | None = None,
              filter: EpisodeFilter | None = None, run_id: Names = None,  # noqa: A002
              env_id: Names = None, include_incomplete: bool = False, metric: str | None = None) -> pa.Table:
        """Episode statistics (``n_traj, return_*, len_*`` and ``discounted_return_*`` with ``gamma``).

        One row per group of ``by`` (one row overall without it). Complete episodes only unless
        ``include_incomplete``. With ``metric`` (an ``episodes`` column, or ``agg(column)`` of a step column:
        ``"last(is_success)"``, see :mod:`~trajstore.query.metrics`), also ``metric_n`` (episodes with a value)
        and ``metric_{min,mean,std,max}``: ``metric_mean`` of ``last(is_success)`` is a success rate. Means and
        standard deviations are summed in parallel, in no fixed order: two calls can differ in their last bits
        (compare them with a tolerance, not ``==``).
        """
        return stats.stats(self.engine, by=by, gamma=gamma, where=where, filter=filter, run_id=run_id,
                           env_id=env_id, include_incomplete=include_incomplete, metric=metric)

    def compare(self, by: Names, *, metric: str = "episode_return", task: str = "env_id", last: int = 100,
                mode: str | None = None, normalize: Mapping[str, Sequence[float]] | None = None,
                statistics: Sequence[str] = compare_op.STATISTICS, ci: float = 0.95, reps: int = 2000,
                seed: int = 0, run_id: Names = None, where: Where | None = None) -> pa.Table:
        """Which group of runs is better, and how sure: rliable's ``iqm``, ``median``, ``mean`` and
        ``optimality_gap`` (with ``normalize``) of each group's runs × tasks scores, with stratified bootstrap
        intervals (see :mod:`~trajstore.query.compare`). ``by``: what the groups differ in (``"config.algo"``,
        columns of ``episodes``); a run's score on a task is the mean ``metric`` (an ``episodes`` column, or
        ``agg(column)`` of a step column: ``"last(is_success)"``) of its ``last`` complete episodes there
        (``mode="eval"``: evaluation episodes only). One row per (group, statistic): the ``by`` values,
        ``statistic``, ``value``, ``ci_low``, ``ci_high``, ``n_runs``, ``n_tasks``."""
        found = compare_op.scores(self.engine, by, metric=metric, task=task, last=last, mode=mode,
                                  normalize=normalize, run_id=run_id, where=where)
        return compare_op.computed("compare", found, statistics=statistics, ci=ci, reps=reps, seed=seed)

    def scores(self, by: Names, *, metric: str = "episode_return", task: str = "env_id", last: int = 100,
               mode: str | None = None, normalize: Mapping[str, Sequence[float]] | None = None,
               run_id: Names = None, where: Where | None = None) -> pa.Table:
        """What :meth:`compare` compares: each run's score on each task (the mean ``metric`` of its ``last``
        complete episodes there, normalized with ``normalize``), one row per group, task and run: the ``by``
        values, ``task``, ``run_id``, ``score``."""
        return compare_op.scores(self.engine, by, metric=metric, task=task, last=last, mode=mode,
                                 normalize=normalize, run_id=run_id, where=where).table()

    def probability_of_improvement(self, x: Any, y: Any, *, by: Names, metric: str = "episode_return",
                                   task: str = "env_id", last: int = 100, mode: str | None = None,
                                   normalize: Mapping[str, Sequence[float]] | None = None, ci: float = 0.95,
                                   reps: int = 2000, seed: int = 0, run_id: Names = None,
                                   where: Where | None = None) -> dict[str, Any]:
        """P(a run of group ``x`` beats one of group ``y`` on the same task), averaged over tasks, as rliable
        computes it, with its interval: ``{"x", "y", "value", "ci_low", "ci_high", "n_tasks"}`` (scores as in
        :meth:`compare`)."""
        found = compare_op.scores(self.engine, by, metric=metric, task=task, last=last, mode=mode,
                                  normalize=normalize, run_id=run_id, where=where)
        return compare_op.probability_of_improvement(found, x, y, ci=ci, reps=reps, seed=seed)

    def performance_profile(self, by: Names, *, thresholds: Sequence[float], metric: str = "episode_return",
                            task: str = "env_id", last: int = 100, mode: str | None = None,
                            normalize: Mapping[str, Sequence[float]] | None = None, ci: float = 0.95,
                            reps: int = 2000, seed: int = 0, run_id: Names = None,
                            where: Where | None = None) -> pa.Table:
        """Each group's performance profile: the fraction of its runs scoring above each of ``thresholds``,
        averaged over tasks, with intervals; one row per (group, threshold): the ``by`` values, ``threshold``,
        ``value``, ``ci_low``, ``ci_high`` (scores as in :meth:`compare`)."""
        found = compare_op.scores(self.engine, by, metric=metric, task=task, last=last, mode=mode,
                                  normalize=normalize, run_id=run_id, where=where)
        return compare_op.computed("profile", found, thresholds, ci=ci, reps=reps, seed=seed)

    def group_curves(self, by: Names, *, metric: str = "episode_return", task: str = "env_id", bins: int = 50,
                     aggregate: str = "iqm", ci: float = 0.95, reps: int = 1000, seed: int = 0,
                     mode: str | None = None, run_id: Names = None, where: Where | None = None) -> pa.Table:
        """Learning curves across seeds: each group's runs (``by``, as in :meth:`compare`) on each task, binned by
        ``env_steps``, their ``aggregate`` (``iqm`` or ``mean``) per bin with a bootstrap band over the runs. One
        row per (group, task, non-empty bin): the ``by`` values, ``task``, ``bin``, ``lo``, ``hi``, ``value``,
        ``ci_low``, ``ci_high``, ``n_runs`` (see :func:`~trajstore.query.compare.group_curves`)."""
        return compare_op.group_curves(self.engine, by, metric=metric, task=task, bins=bins, aggregate=aggregate,
                                       ci=ci, reps=reps, seed=seed, mode=mode, run_id=run_id, where=where)

    def runs(self) -> pa.Table:
        """One row per ``(run_id, env_id)``: its episodes, complete episodes, steps and last write time."""
        return episodes.runs(self.engine)

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
        return follow.follow(self.engine, columns, run_id=run_id, env_id=env_id, since=since, episodes=episodes,
                             poll=poll, timeout=timeout)

    def commit_rows(self, version: int, columns: Sequence[str] | None = None, *, run_id: Names = None,
                    env_id: Names = None, episodes: bool = False) -> Commit | None:
        """What :meth:`follow` yields for the commit of ``version`` (``rows`` empty when it appended none of
        the selected runs' rows); None while there is no such version (for a store opened at a version, a
        version after it). ``episodes`` finds the completed episodes among this store's files."""
        return follow.commit_rows(self.engine, version, columns, run_id=run_id, env_id=env_id, episodes=episodes)

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
        return scan.scan(self.engine, columns, batch_size=batch_size, max_batch_bytes=max_batch_bytes,
                         run_id=run_id, env_id=env_id, episode_id=episode_id, where=where, filter=filter)

    @_reader
    def scan_plan(self, columns: Sequence[str] | None = None, *, run_id: Names = None, env_id: Names = None,
                  episode_id: Ids = None, where: str | None = None,
                  filter: EpisodeFilter | None = None) -> ScanPlan:  # noqa: A002
        """What :meth:`scan` reads: the committed files, their types, the columns and the episode ids (None:
        every episode of the files), resolved on one snapshot. Another engine (Ray) can read the plan's files
        in pieces, with :func:`~trajstore.query.scan.scan_steps`, and get exactly the rows of :meth:`scan`."""
        return scan.scan_plan(self.engine, columns, run_id=run_id, env_id=env_id, episode_id=episode_id,
                              where=where, filter=filter)

    @_reader
    def iter_batches(self, *, batch_size: int = 4096, columns: Sequence[str] | None = None, shuffle: bool = False,
                     seed: int | None = None, shuffle_buffer: int = 65_536, drop_last: bool = False,
                     format: BatchFormat = "numpy", run_id: Names = None, env_id: Names = None,  # noqa: A002
                     episode_id: Ids = None, where: str | None = None,
                     filter: EpisodeFilter | None = None) -> Iterator[Any]:  # noqa: A002
        """Batches of ``batch_size`` steps for a training loop, read straight from the files: the same
        arguments and batches as :meth:`Client.iter_batches <trajstore.remote.client.Client.iter_batches>`.

        ``format`` is ``"numpy"`` (a dict of ``(n, …)`` arrays), ``"jax"``, ``"torch"`` (CPU tensors sharing the
        arrays' memory; text columns stay numpy) or ``"arrow"`` (record batches).
        With ``shuffle``, rows are drawn at random from a buffer of ``shuffle_buffer`` rows, reproducibly for a
        given ``seed``; memory stays bounded by that buffer.
        """
        check_batching(batch_size, shuffle_buffer, format)
        reader = self.scan(columns, run_id=run_id, env_id=env_id, episode_id=episode_id, where=where, filter=filter,
                           batch_size=max(batch_size, 8192), max_batch_bytes=self.settings.stream_batch_bytes)
        with contextlib.closing(reader):
            yield from training_batches(reader, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                        shuffle_buffer=shuffle_buffer, drop_last=drop_last, format=format)

    @_reader
    def steps_page(self, columns: Sequence[str] | None = None, *, filter: EpisodeFilter | None = None,  # noqa: A002
                   where: str | None = None, limit: int = 100, offset: int = 0,
                   after: Sequence[Any] | None = None) -> pa.Table:
        """One page of the selected steps in ``(episode_id, step)`` order (``columns``, or all); with ``after``
        (the ``(episode_id, step)`` of the previous page's last row, ``(episode_id, step, agent_id)`` where it was
        an agent's: a keyset cursor) the page after it, read without counting off the rows before it. The agents of
        a multi-agent step come one row each, by ``agent_id`` (then always among the columns)."""
        return episodes.steps_page(self.engine, columns, filter=filter, where=where, limit=limit, offset=offset,
                                   after=after)

    def episode_steps(self, episode_id: int, columns: Sequence[str] | None = None, *,
                      limit: int | None = None, agent_id: Names = None) -> pa.Table:
        """Every step of one episode in order (``step`` and ``columns``, or every column), the first ``limit`` with
        ``limit``; empty if there is no such episode. A multi-agent episode has a row per agent and step (with
        ``agent_id``); ``agent_id`` (one or several) keeps those agents' rows."""
        return episodes.episode_steps(self.engine, episode_id, columns, limit=limit, agent_id=agent_id)

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
        return returns.returns(self.engine, gamma=gamma, per=per, run_id=run_id, env_id=env_id,
                               episode_id=episode_id, where=where, filter=filter, limit=limit)

    # --- training loaders: windows and n-step transitions (trajstore.loaders) -----------------------------

    @_reader
    def sequences(self, length: int, *, columns: Sequence[str] | None = None, stride: int | None = None,
                  pad: bool = False, gamma: float | None = None, batch_size: int = 256, shuffle: bool = False,
                  seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1, run_id: Names = None,
                  where: str | None = None, format: LoaderFormat = "numpy",  # noqa: A002
                  resume: Mapping[str, Any] | None = None,
                  weight_by: str | None = None, num_samples: int | None = None,
                  filter: EpisodeFilter | None = None,  # noqa: A002
                  max_batch_bytes: int | None = None, agent_id: Names = None) -> Batches:
        """Batches of fixed-length windows inside episodes: each column ``(n, length, …)``, ``mask``,
        ``episode_id``, ``start``; see :mod:`trajstore.loaders.sequences`.

        Windows start at steps ``0, stride, …`` (``stride`` defaults to ``length``); ``pad`` adds the partial
        ones at episode ends, zero-padded and masked. ``columns`` defaults to ``obs, action, reward, terminated,
        truncated`` (and ``return_to_go`` when ``gamma`` is given). ``shuffle`` permutes all windows by
        ``(seed, epoch)``; ``rank``/``world_size`` take one shard; ``weight_by`` (a step column, read at a window's
        first step, or an ``episodes`` column such as ``episode_return``) draws ``num_samples`` windows (default:
        as many as there are) with replacement in proportion to it. The iterator's ``state_dict()``, passed back as
        ``resume``, continues right after the last batch it gave. Reads one committed version. With
        ``max_batch_bytes``, an :class:`InputError` before anything is read when one batch would take more.

        Multi-agent episodes need ``agent_id`` (one agent or several): each agent's rows of an episode, in ``step``
        order, are then a trajectory of their own (a window never leaves it; ``start`` counts the agent's rows),
        the trajectories of every agent named are the items (shuffled together; their spaces must match), and
        batches carry ``agent_id`` (``str``); see :mod:`trajstore.loaders.agents`.
        """
        source = loader_source(self.engine, self.layouts, run_id=run_id, where=where, filter=filter,
                               agent_id=agent_id)
        sampling = Sampling(batch_size, shuffle, seed, epoch, rank, world_size, weight_by, num_samples)
        return load_sequences(source, length, columns=columns, stride=stride, pad=pad, gamma=gamma,
                              sampling=sampling, format=format, resume=resume, max_batch_bytes=max_batch_bytes)

    @_reader
    def transitions(self, n: int, *, gamma: float, columns: Sequence[str] | None = None, batch_size: int = 256,
                    shuffle: bool = False, seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
                    run_id: Names = None, where: str | None = None, format: LoaderFormat = "numpy",  # noqa: A002
                    resume: Mapping[str, Any] | None = None, weight_by: str | None = None,
                    num_samples: int | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                    max_batch_bytes: int | None = None, agent_id: Names = None) -> Batches:
        """Batches of n-step transitions, one per step: ``columns`` at t (default ``obs``, ``action``), the
        n-step ``reward``, ``next_obs``, ``terminated``, ``discount``, ``episode_id``, ``step``; see
        :mod:`trajstore.loaders.transitions`. Order, shards, sampling, resume, ``max_batch_bytes`` and ``agent_id``
        (transitions inside each agent's own trajectory, with ``agent_id``) as for :meth:`sequences`."""
        source = loader_source(self.engine, self.layouts, run_id=run_id, where=where, filter=filter,
                               agent_id=agent_id)
        sampling = Sampling(batch_size, shuffle, seed, epoch, rank, world_size, weight_by, num_samples)
        return load_transitions(source, n, gamma=gamma, columns=columns, sampling=sampling, format=format,
                                resume=resume, max_batch_bytes=max_batch_bytes)


# --- operations over a whole store (trajstore.check, trajstore.compact, trajstore.remove_orphans) ------------

def check(store: Store, *, deep: bool = False) -> CheckReport:
    """Check one committed snapshot of ``store``: committed files readable, episodes whole and unique; orphan
    files and small files reported. Never raises for a damaged store, reports instead (see
    :mod:`trajstore.operations.check`)."""
    return check_op.check(store.engine, deep=deep)


def remove_orphans(store: Store, *, older_than_s: float = 3600.0) -> list[str]:
    """Delete the files of ``store`` no version lists that are at least ``older_than_s`` old (see
    :func:`trajstore.operations.check.remove_orphans`); returns them."""
    return check_op.remove_orphans(store.engine, older_than_s=older_than_s)


def compact(store: Store, *, run_id: Names = None, env_id: Names = None,
            target_bytes: int = compact_op.TARGET_BYTES, progress: bool = True) -> CompactReport:
    """Rewrite the partitions of ``store`` (of ``run_id``/``env_id``, or all) whose files could be fewer, one
    commit each (see :mod:`trajstore.operations.compact`)."""
    return compact_op.compact(store.engine, run_id=run_id, env_id=env_id, target_bytes=target_bytes,
                              progress=progress)
