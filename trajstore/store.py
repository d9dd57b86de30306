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
import dataclasses
import json
import logging
import os
import uuid
import warnings
from datetime import datetime, timedelta
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Iterator, Literal, Mapping, Sequence

import pyarrow as pa
import pyarrow.fs as pafs

from trajstore.errors import (
    InputError,
    StoreAccessError,
    StoreDamagedError,
    StoreExistsError,
    StoreNotFoundError,
)
from trajstore.loaders.layout_store import LayoutStore
from trajstore.loaders.loader import BatchStream
from trajstore.loaders.replay import Replay, open_replay
from trajstore.loaders.sequences import Sampling
from trajstore.loaders.sequences import sequences as load_sequences
from trajstore.loaders.source import loader_source
from trajstore.loaders.transitions import transitions as load_transitions
from trajstore.maintenance import Maintenance
from trajstore.operations import compact as compact_op
from trajstore.operations.handoff import handed_files
from trajstore.operations.upkeep import CompactionPolicy, Upkeep
from trajstore.plumbing import Plumbing, checked_read
from trajstore.query import compare as compare_op
from trajstore.query import curves, episodes, follow, returns, scan, stats
from trajstore.query.batches import BatchFormat, check_batching, training_batches
from trajstore.query.engine import Engine
from trajstore.query.filters import EpisodeFilter, Ids, Names, both, check_runs, filtered
from trajstore.query.follow import Commit
from trajstore.query.snapshot import Snapshot
from trajstore.query.sql import Where
from trajstore.settings import Settings
from trajstore.storage import run_config
from trajstore.storage.history import history, resolve_version
from trajstore.storage.location import Location, explain, locate
from trajstore.storage.table import StepsTable
from trajstore.write.writer import Writer

if TYPE_CHECKING:
    from trajstore.operations.check import CheckReport
    from trajstore.operations.compact import CompactReport

log = logging.getLogger(__name__)

MARKER = "trajstore.json"
FORMAT_VERSION = 1


def open(uri: str | Path, create: bool = False, *, storage_options: Mapping[str, Any] | None = None,  # noqa: A001
         settings: Settings | None = None, version: int | None = None, as_of: datetime | None = None,
         log_retention: float | str | timedelta | None = None) -> Store:
    """Open the store at ``uri``, or make one there with ``create=True``.

    With ``version=N`` (see :meth:`Store.history`) or ``as_of=datetime`` (the latest version committed then), the
    store is read-only and every read sees it exactly as it was at that version.

    Args:
        uri: A local directory, or ``s3://bucket/prefix``.
        create: Make the store if there is none at ``uri`` (safe when several processes make it at once).
        storage_options: For S3, the ``AWS_*`` keys deltalake uses (``AWS_ENDPOINT_URL``, ``AWS_ACCESS_KEY_ID``,
            ``AWS_SECRET_ACCESS_KEY``, ``AWS_REGION``, …) and the request bounds ``connect_timeout``, ``timeout``
            and ``max_retries``; each key not given is taken from the environment variable of that name.
        settings: The library's options; by default read once from the ``TRAJSTORE_*`` environment variables.
        version: Open read-only at this version of the log.
        as_of: Open read-only at the latest version committed at or before this time.
        log_retention: How long the log keeps each version (``"7d"``, ``"1h"``; a new store's default: 7 days),
            set on every table of the store before it is returned: see :meth:`Maintenance.log_retention
            <trajstore.maintenance.Maintenance.log_retention>`.

    Returns:
        The store.

    Raises:
        StoreNotFoundError: There is no store at ``uri`` and ``create`` is False, or ``version`` asks for a version
            of a store nothing was committed to.
        StoreExistsError: ``uri`` is a file, or a folder of other things, not a store.
        StoreAccessError: The location cannot be reached or refuses us: a missing bucket, wrong keys, an object
            store that does not answer in time.
        VersionNotFoundError: ``version`` is not in the log, or a vacuum removed its files.

    Examples:
        >>> import trajstore
        >>> store = trajstore.open("./trajdata", create=True)
        >>> store.version  # nothing committed yet
        -1
        >>> trajstore.open("./trajdata").uri == store.uri
        True
    """
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
        store.maintain.log_retention(log_retention)
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
    return checked_read(self._engine, lambda: method(self, *args, **kwargs), kwargs)


_reader = filtered(around=_read)


class Store:
    """Entry point for writing and querying one store. Every query reads one committed snapshot.

    What a researcher calls, and nothing else: open (:meth:`at`, :meth:`history`), write (:meth:`writer`,
    :meth:`set_run`), read (:meth:`runs`, :meth:`episodes`, :meth:`stats`, :meth:`returns`, :meth:`curves`,
    :meth:`scan`, :meth:`iter_batches`, :meth:`follow`), query (:meth:`sql`, :meth:`snapshot`), train
    (:meth:`sequences`, :meth:`transitions`), compare (:meth:`compare` and its kin), and maintain
    (:attr:`maintain`: delete, add_column, compact, vacuum, check). A :class:`~trajstore.remote.client.Client`
    offers the same reads under the same names, arguments and return types. What serving a store takes beyond that
    is :func:`plumbing`'s.

    The filter keywords of the read methods are the same everywhere, and the same as the Client's:
    ``run_id``/``env_id``/``episode_id`` (one or several), ``complete``/``terminated``/``truncated``,
    ``min_return``/``max_return``/``min_length``/``max_length``, the lineage columns (``policy_version``,
    ``mode``, ``worker_id``, ``seed``, ``env_index``), ``filter`` (all of them as a typed
    :class:`~trajstore.query.filters.EpisodeFilter`, as the REST service builds from its parameters) and
    ``where`` (a condition over the ``episodes`` view: your own SQL here, the REST service's parsed condition
    through the Client). A run the store does not hold is a :class:`~trajstore.errors.RunNotFoundError` naming it
    and the runs it holds.
    """

    def __init__(self, location: Location | str | Path, *, settings: Settings | None = None,
                 pinned: int | None = None) -> None:
        self._settings = settings or Settings.from_env()
        self._location = locate(location, settings=self._settings)
        self._steps = StepsTable.of_store(self._location, self._settings, pinned=pinned)
        self._engine = Engine(self._steps, self._location, self._settings)
        self._layouts = LayoutStore(self._location, cache=self._settings.layout_cache,  # loader layouts, kept
                                    shared=self._settings.store_layouts, keep=self._settings.loader_layouts)
        # compacts what ingest commits (its thread starts with the first); a store read at a version takes none
        upkeep = None if pinned is not None else Upkeep(self._steps, CompactionPolicy.of(self._settings))
        self._maintenance = Maintenance(self._engine, self._layouts)
        self._plumbing = Plumbing(self._engine, self._layouts, upkeep)

    @property
    def uri(self) -> str:
        """Where the store is: a local directory's absolute path, or ``s3://bucket/prefix``."""
        return self._location.uri

    @property
    def root(self) -> Any:
        """The store's directory as a :class:`~pathlib.Path` for a local store, else its URI."""
        return Path(self._location.root) if self._location.is_local else self._location.uri

    @property
    def maintain(self) -> Maintenance:
        """The store's maintenance (:class:`~trajstore.maintenance.Maintenance`): ``delete``, ``add_column``,
        ``compact``, ``vacuum``, ``log_retention``, ``remove_orphans``, ``check``, ``files``, ``stored_columns``,
        ``decoding_sql`` — changes and checks of the table as a whole, grouped apart from the reads as deltalake
        groups ``dt.optimize`` and ``dt.alter``."""
        return self._maintenance

    def __repr__(self) -> str:
        return f"Store({self.uri!r})"

    def __getattr__(self, name: str) -> Any:
        """The Store's methods until trajstore 0.1 that moved (to :attr:`maintain`, to :func:`plumbing`, to
        :meth:`curves`): still there for one release, each with a :class:`DeprecationWarning` naming where it went."""
        moved = _MOVED.get(name)
        if moved is None or name.startswith("_"):
            raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")
        where, get = moved
        warnings.warn(f"Store.{name} is deprecated and goes in the next release: use {where}", DeprecationWarning,
                      stacklevel=2)
        return get(self)

    # --- writing ------------------------------------------------------------------------------------

    def writer(self, *, run_id: str, env_id: str, config: Mapping[str, Any] | None = None,
               tags: Sequence[str] | None = None, notes: str | None = None, **options: Any) -> Writer:
        """A :class:`Writer` appending episodes to ``run_id``/``env_id``; use it as a context manager.

        The first writer of a run describes it with ``config``, ``tags`` and ``notes`` (committed before the writer
        is made; see :mod:`~trajstore.storage.run_config`); a later one adds its tags and must give the same config
        (change it with :meth:`set_run`).

        Args:
            run_id: The run (an experiment); no ``/`` and no control characters.
            env_id: The environment; runs of several environments share a store.
            config: The run's configuration, plain JSON (hyperparameters, algorithm), grouped by as
                ``by="config.<path>"``.
            tags: Labels of the run.
            notes: Free text about the run.
            **options: The writer's options (``observation_space``, ``action_space``, ``autoreset``, ``frame_stack``,
                ``flush_bytes``, ``worker_id``; see :class:`Writer`), ``committer`` (a :class:`trajstore.Committer`,
                or the ``address`` of one in another process: the writer writes its files itself and hands them
                over, to be committed with other writers' in groups; see :mod:`trajstore.operations.handoff`) and
                lineage: any other keyword (``policy_version=3``) is a column holding that value in every row the
                writer stores.

        Returns:
            The writer; its rows become visible when it flushes (when its buffer passes ``flush_bytes``, and on
            ``flush()`` and ``close()``).

        Raises:
            InputError: A run or env id, a lineage name or value, or a config that the store cannot hold (the
                message names it); a config that differs from the run's stored one.
            ReadOnlyError: The store was opened at a version.

        Examples:
            >>> import numpy as np
            >>> store = trajstore.open("./trajdata", create=True)
            >>> with store.writer(run_id="exp1", env_id="Toy-v0", config={"lr": 3e-4}, policy_version=0) as w:
            ...     stored = w.add_batch({"obs": np.zeros((3, 2, 4)), "action": np.zeros((3, 2), int),
            ...                           "reward": np.ones((3, 2)), "next_obs": np.zeros((3, 2, 4)),
            ...                           "terminated": np.array([[0, 0], [1, 0], [0, 1]], bool),
            ...                           "truncated": np.zeros((3, 2), bool)})
            >>> stored, store.stats()["n_traj"][0].as_py()
            (6, 2)
        """
        self._steps.log.writable("writer")
        options.setdefault("flush_bytes", self._settings.flush_bytes)
        sink = handed_files(self._steps, options.pop("committer", None))  # the committer's upkeep, if handed
        options.setdefault("upkeep", Upkeep(self._steps, CompactionPolicy.of(self._settings))
                           if sink is self._steps else None)
        writer = Writer(sink, run_id=run_id, env_id=env_id, **options)  # checks the names first
        try:
            self._plumbing.describe_run(run_id, config=config, tags=tags, notes=notes)
        except BaseException:
            writer.close()  # nothing written: nothing committed
            raise
        return writer

    def set_run(self, run_id: str, *, config: Mapping[str, Any] | None = None, tags: Sequence[str] | None = None,
                notes: str | None = None) -> dict[str, Any]:
        """Change what describes ``run_id`` (a run with steps, or one described before; else
        :class:`~trajstore.errors.RunNotFoundError`): each of ``config``, ``tags``, ``notes`` given replaces the
        stored one, None leaves it; returns what describes it now (:meth:`run_info`). One row of the store's ``runs``
        table: the store read at an earlier version keeps the earlier description (see
        :mod:`~trajstore.storage.run_config`)."""
        self.run_info(run_id)  # a run the store holds, or has described
        change = run_config.given(config=config, tags=tags, notes=notes)
        self._engine.descriptions.change(run_id, change, replace=True, what="set_run")
        return self.run_info(run_id)

    def run_info(self, run_id: str) -> dict[str, Any]:
        """What describes ``run_id`` at the version this store reads: ``config`` (a dict), ``tags``, ``notes``,
        ``created`` (when first described; None for a run never described), ``trajstore_version``,
        ``git_commit`` and ``host`` of the program that first described it, and ``problem``: what of its stored
        description cannot be used (left out), or None."""
        infos = self._engine.descriptions.infos()
        check_runs([run_id], {*self._engine.run_ids(), *infos}, self.uri)
        return infos.get(run_id) or run_config.undescribed()

    # --- the committed state ------------------------------------------------------------------------

    @property
    def version(self) -> int:
        """The latest committed version of the log (-1 for a store nothing was written to); for a store opened
        at a version, that version."""
        return self._steps.log.latest_number()

    @property
    def read_only(self) -> bool:
        """Whether this store is pinned to an old version (``open(uri, version=N)``): it reads, never writes."""
        return self._steps.log.pinned is not None

    def at(self, *, version: int | None = None, as_of: datetime | None = None) -> Store:
        """This store, read-only, exactly as it was at ``version`` (or the latest version committed at or before
        ``as_of``): every read (stats, episodes, sql, scan, returns, runs) sees that version's files."""
        pinned = resolve_version(StepsTable(self._steps.location), version=version, as_of=as_of)
        return Store(self._location, settings=self._settings, pinned=pinned)

    def history(self, *, limit: int | None = None) -> pa.Table:
        """One row per committed version, oldest first: ``version, timestamp, operation, rows_added,
        rows_removed, files_added, files_removed, run_ids`` (see :mod:`trajstore.storage.history`)."""
        return history(self._steps, limit=limit)

    def schema(self, env_id: str | None = None) -> pa.Schema:
        """The Arrow types of the stored columns, fixed sizes kept (of one environment's files with ``env_id``);
        an empty schema for an empty store."""
        return self._engine.stored_schema(env_id) or pa.schema([])

    def health(self) -> dict[str, Any]:
        """Whether this store's version can be read: ``{"status": "ready", "store", "version", "files"}`` when its
        log reads and every committed file is there with the size the log says (cheap checks; ``maintain.check()``
        reads them all), else a :class:`~trajstore.errors.StoreDamagedError` naming the first problem. The same as
        :meth:`Client.health <trajstore.remote.client.Client.health>` (the service's ``GET /ready``)."""
        problems = self._engine.health()
        if problems:
            more = f" (and {len(problems) - 1} more)" if len(problems) > 1 else ""
            raise StoreDamagedError(f"{problems[0]}{more}; run `trajstore check --store {self.root}` to list every "
                                    "damaged file")
        return {"status": "ready", "store": str(self.root), "version": self.version,
                "files": len(self._engine.files())}

    # --- SQL ----------------------------------------------------------------------------------------

    def snapshot(self, *, config: dict[str, Any] | None = None, run_id: Names = None,
                 env_id: Names = None) -> Snapshot:
        """A DuckDB connection with ``steps``, ``episodes`` and ``runs`` views over the latest committed version
        (of the files of ``run_id``/``env_id`` only, where every column has its own type; see :meth:`sql` for a
        column that environments type differently)."""
        return self._engine.snapshot(self._engine.selected_files(run_id, env_id), config=config, runs=True)

    def sql(self, query: str, params: dict[str, Any] | None = None, *, run_id: Names = None,
            env_id: Names = None) -> pa.Table:
        """Run your own SQL over the ``steps``, ``episodes`` and ``runs`` views; the trusted path.

        This runs in your own process, unsandboxed: any statement, and any file you can read or write. For SQL from
        others use the service's sandbox (``POST /sql``,
        :meth:`Client.sql <trajstore.remote.client.Client.sql>`). The views read one committed version.

        Args:
            query: DuckDB SQL.
            params: Values for the query's ``$name`` parameters.
            run_id: Only these runs' steps in the views (one id or several).
            env_id: Only these environments' steps in the views. Over environments whose columns differ in type,
                such a column is a ``VARIANT`` in SQL; over one environment every column has its own type.

        Returns:
            The result as an Arrow table. It never holds a ``VARIANT``: such a column of the answer comes in its
            values' own type where they are of one (a query that selects one environment's rows, ``WHERE run_id =
            'cp'``: CartPole's int actions), else as each value's JSON text (``1`` beside ``[0.5]``).

        Raises:
            QueryError: The query failed (DuckDB's message).
            RunNotFoundError: A ``run_id`` the store does not hold.

        Examples:
            >>> from trajstore.rollout import gym_rollout
            >>> store = trajstore.open("./trajdata", create=True)
            >>> result = gym_rollout(store, "CartPole-v1", run_id="demo", episodes=10, seed=0, progress=False)
            >>> store.sql("SELECT count(*) AS n FROM episodes WHERE complete AND run_id = $run",
            ...           {"run": "demo"})["n"].to_pylist()
            [10]
        """
        with self.snapshot(run_id=run_id, env_id=env_id) as snap:
            return snap.arrow(query, params)

    # --- runs, episodes and statistics --------------------------------------------------------------

    def runs(self, *, last: int | None = None, gamma: float | None = None) -> pa.Table:
        """One row per ``(run_id, env_id)``: its episodes, complete episodes, steps and last write time; with
        ``last``, the statistics of its ``last`` complete episodes to end too (``n_traj, return_*, len_*``, and
        ``discounted_return_*`` with ``gamma``; null for a series without complete episodes)."""
        table = episodes.runs(self._engine)
        if last is None:
            if gamma is not None:
                raise InputError("gamma: only with last= (the discounted return of each series' last episodes)")
            return table
        return _joined(table, curves.latest_stats(self._engine, last, gamma=gamma))

    @_reader
    def episodes(self, *, run_id: Names = None, env_id: Names = None, complete: bool | None = None,
                 where: Where | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                 gamma: float | None = None, order_by: str = "episode_id", limit: int | None = None,
                 offset: int = 0) -> pa.Table:
        """One row per episode (the ``episodes`` view), filtered and ordered.

        The columns: ``run_id, env_id, episode_id, episode_length, episode_return, terminated, truncated,
        complete, first_step, last_step, started_at, ended_at, n_agents, env_steps`` and the lineage columns. Also
        takes every filter keyword of the Store's readers (``min_return=``, ``mode=``, …; see :class:`Store`).

        Args:
            run_id: Only these runs (one id or several).
            env_id: Only these environments.
            complete: True for complete episodes only, False for unfinished ones only.
            where: Your own condition over the ``episodes`` view (SQL).
            filter: The filter keywords as one :class:`~trajstore.query.filters.EpisodeFilter`.
            gamma: Add ``discounted_return`` for this discount in [0, 1].
            order_by: A column of ``episodes``, ``-`` prefixed for descending; several comma-separated.
            limit: At most this many rows.
            offset: Skip this many rows first.

        Returns:
            An Arrow table, one row per selected episode.

        Raises:
            RunNotFoundError: A ``run_id`` the store does not hold.
            UnknownColumnError: ``order_by`` names no column of ``episodes``.
            InputError: ``gamma`` outside [0, 1], or a ``where`` that fails (the message names ``where``).

        Examples:
            >>> from trajstore.rollout import gym_rollout
            >>> store = trajstore.open("./trajdata", create=True)
            >>> result = gym_rollout(store, "CartPole-v1", run_id="demo", episodes=10, seed=0, progress=False)
            >>> top = store.episodes(run_id="demo", complete=True, order_by="-episode_return", limit=3)
            >>> top.num_rows, top["episode_return"][0].as_py() >= top["episode_return"][2].as_py()
            (3, True)
        """
        return episodes.episodes(self._engine, run_id=run_id, env_id=env_id, complete=complete, where=where,
                                 filter=filter, gamma=gamma, order_by=order_by, limit=limit, offset=offset)

    def episode_steps(self, episode_id: int, columns: Sequence[str] | None = None, *,
                      limit: int | None = None, agent_id: Names = None) -> pa.Table:
        """Every step of one episode in order (``step`` and ``columns``, or every column), the first ``limit`` with
        ``limit``; empty if there is no such episode. A multi-agent episode has a row per agent and step (with
        ``agent_id``); ``agent_id`` (one or several) keeps those agents' rows."""
        return episodes.episode_steps(self._engine, episode_id, columns, limit=limit, agent_id=agent_id)

    @_reader
    def stats(self, *, by: Names = None, gamma: float | None = None, where: Where | None = None,
              filter: EpisodeFilter | None = None, run_id: Names = None,  # noqa: A002
              env_id: Names = None, include_incomplete: bool = False, metric: str | None = None) -> pa.Table:
        """Episode statistics, with the names of ``imitation``'s ``rollout_stats``.

        ``n_traj``, ``return_{min,mean,std,max}``, ``len_{min,mean,std,max}`` (std as ``numpy.std``), and
        ``discounted_return_*`` with ``gamma``; one row per group of ``by`` (one row overall without it). Complete
        episodes only unless ``include_incomplete``. With ``metric`` (an ``episodes`` column, or ``agg(column)`` of a
        step column: ``"last(is_success)"``, see :mod:`~trajstore.query.metrics`), also ``metric_n`` (episodes with a
        value) and ``metric_{min,mean,std,max}``: ``metric_mean`` of ``last(is_success)`` is a success rate. Also
        takes every filter keyword of the Store's readers (see :class:`Store`).

        Means and standard deviations are summed in parallel, in no fixed order: two calls can differ in their last
        bits (compare them with a tolerance, not ``==``).

        Args:
            by: Group by these columns of ``episodes`` (``"run_id"``, ``["run_id", "env_id"]``, ``"agent_group"``),
                or by a run's config (``"config.lr"``).
            gamma: Add ``discounted_return_*`` for this discount in [0, 1].
            where: Your own condition over the ``episodes`` view (SQL).
            filter: The filter keywords as one :class:`~trajstore.query.filters.EpisodeFilter`.
            run_id: Only these runs (one id or several).
            env_id: Only these environments.
            include_incomplete: Count unfinished episodes too.
            metric: Also the statistics of this per-episode metric.

        Returns:
            An Arrow table: the ``by`` columns, then the statistics.

        Raises:
            RunNotFoundError: A ``run_id`` the store does not hold.
            InputError: ``gamma`` outside [0, 1], an unknown ``by`` or ``metric``, or a ``where`` that fails.

        Examples:
            >>> from trajstore.rollout import gym_rollout
            >>> store = trajstore.open("./trajdata", create=True)
            >>> result = gym_rollout(store, "CartPole-v1", run_id="demo", episodes=10, seed=0, progress=False)
            >>> stats = store.stats(by="run_id", gamma=0.99)
            >>> stats["run_id"].to_pylist(), stats["n_traj"].to_pylist()
            (['demo'], [10])
            >>> "discounted_return_mean" in stats.column_names
            True
        """
        return stats.stats(self._engine, by=by, gamma=gamma, where=where, filter=filter, run_id=run_id,
                           env_id=env_id, include_incomplete=include_incomplete, metric=metric)

    @_reader
    def returns(self, *, gamma: float, per: Literal["episode", "step"] = "episode", run_id: Names = None,
                env_id: Names = None, episode_id: Ids = None, where: Where | None = None,
                filter: EpisodeFilter | None = None, limit: int | None = None) -> pa.Table:  # noqa: A002
        """Discounted return per episode, or return-to-go per step, computed in float64 from the stored rewards.

        Per episode, ``sum_t gamma**t * r_t``; per step, ``G_t = r_t + gamma G_{t+1}``: exact at any episode length
        and any ``gamma`` in [0, 1]. Rows come sorted by ``episode_id`` (per step by ``(episode_id, step)``, with
        ``run_id`` and ``env_id`` dictionary-encoded: the same values, a byte per row). Also takes every filter
        keyword of the Store's readers (see :class:`Store`).

        Args:
            gamma: The discount, in [0, 1].
            per: ``"episode"`` (``discounted_return`` per episode) or ``"step"`` (``return_to_go`` per step).
            run_id: Only these runs (one id or several).
            env_id: Only these environments.
            episode_id: Only these episodes.
            where: Your own condition over the ``episodes`` view (SQL).
            filter: The filter keywords as one :class:`~trajstore.query.filters.EpisodeFilter`.
            limit: The first ``limit`` rows; per step, only the episodes they reach are read.

        Returns:
            An Arrow table: ``run_id, env_id, episode_id, episode_length, episode_return, discounted_return,
            complete`` per episode, or ``run_id, env_id, episode_id, step, reward, return_to_go`` per step.

        Raises:
            InputError: ``gamma`` outside [0, 1], or ``per`` not one of the two.
            RunNotFoundError: A ``run_id`` the store does not hold.

        Examples:
            >>> from trajstore.rollout import gym_rollout
            >>> store = trajstore.open("./trajdata", create=True)
            >>> result = gym_rollout(store, "CartPole-v1", run_id="demo", episodes=10, seed=0, progress=False)
            >>> per_step = store.returns(gamma=1.0, per="step", run_id="demo")
            >>> first = store.returns(gamma=1.0, run_id="demo", limit=1)
            >>> per_step["return_to_go"][0].as_py() == first["episode_return"][0].as_py()
            True
        """
        return returns.returns(self._engine, gamma=gamma, per=per, run_id=run_id, env_id=env_id,
                               episode_id=episode_id, where=where, filter=filter, limit=limit)

    @_reader
    def curves(self, *, by: Names = None, run_id: Names = None, env_id: Names = None, where: Where | None = None,
               filter: EpisodeFilter | None = None, gamma: float | None = None,  # noqa: A002
               metric: str | None = None, task: str | None = None, bins: int | None = None,
               aggregate: str | None = None, ci: float | None = None, reps: int | None = None,
               seed: int | None = None, mode: str | None = None) -> pa.Table:
        """Learning curves.

        Without ``by``: the complete episodes of each ``(run_id, env_id)`` in the order they ended, with
        ``total_env_steps``, the env steps of all the series' writers when each ended (counted over every episode
        of the series, whatever ``where``/``filter`` keep; see :mod:`trajstore.query.curves`). With ``gamma`` adds
        ``discounted_return``; with ``metric`` (an ``episodes`` column or ``agg(column)`` of a step column,
        :mod:`~trajstore.query.metrics`) a ``metric`` column of its values.

        With ``by`` (what groups of runs differ in, as for :meth:`compare`: ``"config.algo"``), learning curves
        across seeds: each group's runs on each ``task`` (default ``env_id``), binned by ``env_steps`` in ``bins``
        bins (50), their ``aggregate`` (``iqm``, the default, or ``mean``) of ``metric`` (``episode_return``) per
        bin with a bootstrap band over the runs (``ci`` 0.95, ``reps`` 1000, ``seed`` 0; ``mode="eval"``:
        evaluation episodes only). One row per (group, task, non-empty bin): the ``by`` values, ``task``, ``bin``,
        ``lo``, ``hi``, ``value``, ``ci_low``, ``ci_high``, ``n_runs`` (see
        :func:`~trajstore.query.compare.group_curves`). ``GET /curves?by=…`` answers the same.
        """
        across = {"task": task, "bins": bins, "aggregate": aggregate, "ci": ci, "reps": reps, "seed": seed,
                  "mode": mode}
        if by is None:
            given = [k for k, v in across.items() if v is not None]
            if given:
                raise InputError(f"{given[0]}: only with by= (learning curves across the seeds of each group of "
                                 "runs); without by, curves are each run's episodes")
            return curves.curves(self._engine, run_id=run_id, env_id=env_id, where=where, filter=filter,
                                 gamma=gamma, metric=metric)
        if filter is not None:  # runs chosen by a filter (as the service builds one) choose runs here too
            run_id = both(run_id, filter.run_id)
            filter = None if dataclasses.replace(filter, run_id=None).is_empty() else filter  # noqa: A001
        refused = [k for k, v in {"env_id": env_id, "filter": filter, "gamma": gamma}.items() if v is not None]
        if refused:
            raise InputError(f"{refused[0]}: not with by= (curves across seeds select runs with run_id=, where= "
                             "and mode=, and group tasks by task=)")
        return compare_op.group_curves(self._engine, by, metric=metric or "episode_return", task=task or "env_id",
                                       bins=50 if bins is None else bins, aggregate=aggregate or "iqm",
                                       ci=0.95 if ci is None else ci, reps=1000 if reps is None else reps,
                                       seed=0 if seed is None else seed, mode=mode, run_id=run_id, where=where)

    # --- comparisons (rliable's definitions) ---------------------------------------------------------

    def compare(self, by: Names, *, metric: str = "episode_return", task: str = "env_id", last: int = 100,
                mode: str | None = None, normalize: Mapping[str, Sequence[float]] | None = None,
                statistics: Sequence[str] | None = None, ci: float = 0.95, reps: int = 2000,
                seed: int = 0, run_id: Names = None, where: Where | None = None) -> pa.Table:
        """Which group of runs is better, and how sure: rliable's ``iqm``, ``median``, ``mean`` and
        ``optimality_gap`` (with ``normalize``) of each group's runs × tasks scores, with stratified bootstrap
        intervals (see :mod:`~trajstore.query.compare`); ``statistics`` chooses some of them (default: all four).
        ``by``: what the groups differ in (``"config.algo"``, columns of ``episodes``); a run's score on a task is
        the mean ``metric`` (an ``episodes`` column, or ``agg(column)`` of a step column: ``"last(is_success)"``)
        of its ``last`` complete episodes there (``mode="eval"``: evaluation episodes only). One row per (group,
        statistic): the ``by`` values, ``statistic``, ``value``, ``ci_low``, ``ci_high``, ``n_runs``,
        ``n_tasks``."""
        found = compare_op.scores(self._engine, by, metric=metric, task=task, last=last, mode=mode,
                                  normalize=normalize, run_id=run_id, where=where)
        return compare_op.computed("compare", found, statistics=compare_op.STATISTICS if statistics is None
                                   else statistics, ci=ci, reps=reps, seed=seed)

    def scores(self, by: Names, *, metric: str = "episode_return", task: str = "env_id", last: int = 100,
               mode: str | None = None, normalize: Mapping[str, Sequence[float]] | None = None,
               run_id: Names = None, where: Where | None = None) -> pa.Table:
        """What :meth:`compare` compares: each run's score on each task (the mean ``metric`` of its ``last``
        complete episodes there, normalized with ``normalize``), one row per group, task and run: the ``by``
        values, ``task``, ``run_id``, ``score``."""
        return compare_op.scores(self._engine, by, metric=metric, task=task, last=last, mode=mode,
                                 normalize=normalize, run_id=run_id, where=where).table()

    def probability_of_improvement(self, x: str, y: str, *, by: Names, metric: str = "episode_return",
                                   task: str = "env_id", last: int = 100, mode: str | None = None,
                                   normalize: Mapping[str, Sequence[float]] | None = None, ci: float = 0.95,
                                   reps: int = 2000, seed: int = 0, run_id: Names = None,
                                   where: Where | None = None) -> dict[str, Any]:
        """P(a run of group ``x`` beats one of group ``y`` on the same task), averaged over tasks, as rliable
        computes it, with its interval: ``{"x", "y", "value", "ci_low", "ci_high", "n_tasks"}`` (scores as in
        :meth:`compare`)."""
        found = compare_op.scores(self._engine, by, metric=metric, task=task, last=last, mode=mode,
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
        found = compare_op.scores(self._engine, by, metric=metric, task=task, last=last, mode=mode,
                                  normalize=normalize, run_id=run_id, where=where)
        return compare_op.computed("profile", found, thresholds, ci=ci, reps=reps, seed=seed)

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
        return follow.follow(self._engine, columns, run_id=run_id, env_id=env_id, since=since, episodes=episodes,
                             poll=poll, timeout=timeout)

    # --- steps --------------------------------------------------------------------------------------

    @_reader
    def scan(self, columns: Sequence[str] | None = None, *, run_id: Names = None, env_id: Names = None,
             episode_id: Ids = None, where: Where | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
             batch_size: int = 65_536, max_batch_bytes: int | None = None) -> pa.RecordBatchReader:
        """The steps of the chosen episodes as a stream of record batches, read straight from the committed files.

        The same rows and types as ``SELECT columns FROM steps`` with these filters, in storage order, at pyarrow's
        speed (see :mod:`trajstore.query.scan`). Also takes every filter keyword of the Store's readers (see
        :class:`Store`).

        Args:
            columns: The columns to read; all without it.
            run_id: Only these runs (one id or several).
            env_id: Only these environments; environments whose columns differ in type cannot be read together.
            episode_id: Only these episodes.
            where: Your own condition over the ``episodes`` view (SQL), as for :meth:`episodes`.
            filter: The filter keywords as one :class:`~trajstore.query.filters.EpisodeFilter`.
            batch_size: At most this many rows a batch.
            max_batch_bytes: Fewer rows where rows are so wide that a batch would pass this many bytes.

        Returns:
            A ``pyarrow.RecordBatchReader``.

        Raises:
            RunNotFoundError: A ``run_id`` the store does not hold.
            UnknownColumnError: A column ``steps`` does not have.
            InputError: Environments whose columns cannot be one (the message names them), or a failing ``where``.

        Examples:
            >>> from trajstore.rollout import gym_rollout
            >>> store = trajstore.open("./trajdata", create=True)
            >>> result = gym_rollout(store, "CartPole-v1", run_id="demo", episodes=10, seed=0, progress=False)
            >>> reader = store.scan(["episode_id", "step", "reward"], run_id="demo")
            >>> reader.read_all().num_rows == result.steps
            True
        """
        return scan.scan(self._engine, columns, batch_size=batch_size, max_batch_bytes=max_batch_bytes,
                         run_id=run_id, env_id=env_id, episode_id=episode_id, where=where, filter=filter)

    @_reader
    def iter_batches(self, *, batch_size: int = 4096, columns: Sequence[str] | None = None, shuffle: bool = False,
                     seed: int | None = None, shuffle_buffer: int = 65_536, drop_last: bool = False,
                     format: BatchFormat = "numpy", run_id: Names = None, env_id: Names = None,  # noqa: A002
                     episode_id: Ids = None, where: Where | None = None,
                     filter: EpisodeFilter | None = None) -> Iterator[Any]:  # noqa: A002
        """Batches of ``batch_size`` steps for a training loop, read straight from the files.

        The same arguments and batches as :meth:`Client.iter_batches <trajstore.remote.client.Client.iter_batches>`.
        With ``shuffle``, rows are drawn at random from a buffer of ``shuffle_buffer`` rows, reproducibly for a
        given ``seed``; memory stays bounded by that buffer. Also takes every filter keyword of the Store's readers
        (see :class:`Store`).

        Args:
            batch_size: Steps per batch.
            columns: The columns to read; all without it.
            shuffle: Draw rows at random from a buffer.
            seed: The shuffle's seed.
            shuffle_buffer: Rows in the shuffle's buffer.
            drop_last: Leave out a last batch shorter than ``batch_size``.
            format: ``"numpy"`` (a dict of ``(n, …)`` arrays), ``"jax"``, ``"torch"`` (CPU tensors sharing the
                arrays' memory; text columns stay numpy) or ``"arrow"`` (record batches).
            run_id: Only these runs (one id or several).
            env_id: Only these environments.
            episode_id: Only these episodes.
            where: Your own condition over the ``episodes`` view (SQL).
            filter: The filter keywords as one :class:`~trajstore.query.filters.EpisodeFilter`.

        Yields:
            One batch at a time, in ``format``.

        Raises:
            InputError: A ``batch_size``, ``shuffle_buffer`` or ``format`` out of range (raised at the first batch).
            RunNotFoundError: A ``run_id`` the store does not hold.

        Examples:
            >>> from trajstore.rollout import gym_rollout
            >>> store = trajstore.open("./trajdata", create=True)
            >>> result = gym_rollout(store, "CartPole-v1", run_id="demo", episodes=10, seed=0, progress=False)
            >>> batch = next(store.iter_batches(batch_size=32, columns=["obs", "reward"], shuffle=True, seed=0))
            >>> batch["obs"].shape, batch["reward"].shape
            ((32, 4), (32,))
        """
        check_batching(batch_size, shuffle_buffer, format)
        reader = self.scan(columns, run_id=run_id, env_id=env_id, episode_id=episode_id, where=where, filter=filter,
                           batch_size=max(batch_size, 8192), max_batch_bytes=self._settings.stream_batch_bytes)
        with contextlib.closing(reader):
            yield from training_batches(reader, batch_size=batch_size, shuffle=shuffle, seed=seed,
                                        shuffle_buffer=shuffle_buffer, drop_last=drop_last, format=format)

    # --- training loaders: windows and n-step transitions (trajstore.loaders) -----------------------------

    @_reader
    def sequences(self, length: int, *, columns: Sequence[str] | None = None, stride: int | None = None,
                  pad: bool = False, gamma: float | None = None, batch_size: int = 256, shuffle: bool = False,
                  seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1, run_id: Names = None,
                  where: Where | None = None, format: BatchFormat = "numpy",  # noqa: A002
                  resume: Mapping[str, Any] | None = None,
                  weight_by: str | None = None, num_samples: int | None = None,
                  filter: EpisodeFilter | None = None,  # noqa: A002
                  max_batch_bytes: int | None = None, agent_id: Names = None) -> BatchStream:
        """Batches of fixed-length windows inside episodes, for recurrent policies, R2D2 or a Decision Transformer.

        Each column comes as ``(n, length, …)``, with ``mask``, ``episode_id`` and ``start`` (see
        :mod:`trajstore.loaders.sequences`). Windows start at steps ``0, stride, …`` and never cross an episode's
        end. Reads one committed version. Also takes every filter keyword of the Store's readers (see
        :class:`Store`).

        Multi-agent episodes need ``agent_id`` (one agent or several): each agent's rows of an episode, in ``step``
        order, are then a trajectory of their own (a window never leaves it; ``start`` counts the agent's rows),
        the trajectories of every agent named are the items (shuffled together; their spaces must match), and
        batches carry ``agent_id`` (``str``); see :mod:`trajstore.loaders.agents`.

        Args:
            length: Steps per window.
            columns: Step columns to read; by default ``obs, action, reward, terminated, truncated`` (and
                ``return_to_go`` when ``gamma`` is given).
            stride: Steps between window starts; ``length`` by default.
            pad: Add the partial windows at episode ends, zero-padded and masked.
            gamma: The discount of the ``return_to_go`` column.
            batch_size: Windows per batch.
            shuffle: Permute all windows by ``(seed, epoch)``.
            seed: The shuffle's seed.
            epoch: The epoch, for a new order each epoch.
            rank: This shard, of ``world_size``.
            world_size: How many shards the windows are split into.
            run_id: Only these runs (one id or several).
            where: Your own condition over the ``episodes`` view (SQL).
            format: ``"numpy"``, ``"jax"``, ``"torch"`` or ``"arrow"``.
            resume: An iterator's ``state_dict()``: continue right after the last batch it gave.
            weight_by: Draw windows with replacement in proportion to this column (a step column read at a window's
                first step, or an ``episodes`` column such as ``episode_return``).
            num_samples: How many windows ``weight_by`` draws; as many as there are by default.
            filter: The filter keywords as one :class:`~trajstore.query.filters.EpisodeFilter`.
            max_batch_bytes: Refuse, before anything is read, a batch that would take more bytes.
            agent_id: The agents whose trajectories to read, in a multi-agent run.

        Returns:
            An iterator of batches, with ``state_dict()``.

        Raises:
            InputError: An argument out of range, a ``resume`` state of other arguments or other data, a batch
                past ``max_batch_bytes``, a multi-agent run without ``agent_id``, or agents of other spaces.
            RunNotFoundError: A ``run_id`` the store does not hold.

        Examples:
            >>> from trajstore.rollout import gym_rollout
            >>> store = trajstore.open("./trajdata", create=True)
            >>> result = gym_rollout(store, "CartPole-v1", run_id="demo", episodes=10, seed=0, progress=False)
            >>> windows = store.sequences(8, pad=True, batch_size=4, shuffle=True, run_id="demo")
            >>> batch = next(windows)
            >>> batch["obs"].shape, batch["mask"].shape, batch["start"].shape
            ((4, 8, 4), (4, 8), (4,))
            >>> rest = store.sequences(8, pad=True, batch_size=4, shuffle=True, run_id="demo",
            ...                        resume=windows.state_dict())
        """
        source = loader_source(self._engine, self._layouts, run_id=run_id, where=where, filter=filter,
                               agent_id=agent_id)
        sampling = Sampling(batch_size, shuffle, seed, epoch, rank, world_size, weight_by, num_samples)
        return load_sequences(source, length, columns=columns, stride=stride, pad=pad, gamma=gamma,
                              sampling=sampling, format=format, resume=resume, max_batch_bytes=max_batch_bytes)

    @_reader
    def transitions(self, n: int, *, gamma: float, columns: Sequence[str] | None = None, batch_size: int = 256,
                    shuffle: bool = False, seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
                    run_id: Names = None, where: Where | None = None, format: BatchFormat = "numpy",  # noqa: A002
                    resume: Mapping[str, Any] | None = None, weight_by: str | None = None,
                    num_samples: int | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                    max_batch_bytes: int | None = None, agent_id: Names = None) -> BatchStream:
        """Batches of n-step transitions, one per step, for DQN-style training.

        Each batch holds ``columns`` at step t (default ``obs``, ``action``), the n-step ``reward``, ``next_obs`` n
        steps later (or at the episode's end), ``terminated``, the ``discount`` to apply to the value of
        ``next_obs``, ``episode_id`` and ``step``; see :mod:`trajstore.loaders.transitions`. Also takes every filter
        keyword of the Store's readers (see :class:`Store`).

        Args:
            n: Steps per transition.
            gamma: The discount of the n-step reward.
            columns: Step columns at t; ``obs`` and ``action`` by default.
            batch_size: Transitions per batch.
            shuffle: Permute all transitions by ``(seed, epoch)``.
            seed: The shuffle's seed.
            epoch: The epoch, for a new order each epoch.
            rank: This shard, of ``world_size``.
            world_size: How many shards the transitions are split into.
            run_id: Only these runs (one id or several).
            where: Your own condition over the ``episodes`` view (SQL).
            format: ``"numpy"``, ``"jax"``, ``"torch"`` or ``"arrow"``.
            resume: An iterator's ``state_dict()``: continue right after the last batch it gave.
            weight_by: Draw transitions with replacement in proportion to this column.
            num_samples: How many transitions ``weight_by`` draws.
            filter: The filter keywords as one :class:`~trajstore.query.filters.EpisodeFilter`.
            max_batch_bytes: Refuse, before anything is read, a batch that would take more bytes.
            agent_id: The agents whose trajectories to read, in a multi-agent run: transitions stay inside each
                agent's own trajectory.

        Returns:
            An iterator of batches, with ``state_dict()``.

        Raises:
            InputError: An argument out of range, ``gamma`` outside [0, 1], or a ``resume`` state of other arguments
                or other data.
            RunNotFoundError: A ``run_id`` the store does not hold.

        Examples:
            >>> from trajstore.rollout import gym_rollout
            >>> store = trajstore.open("./trajdata", create=True)
            >>> result = gym_rollout(store, "CartPole-v1", run_id="demo", episodes=10, seed=0, progress=False)
            >>> batch = next(store.transitions(3, gamma=0.99, batch_size=4, run_id="demo"))
            >>> sorted(batch)
            ['action', 'discount', 'episode_id', 'next_obs', 'obs', 'reward', 'step', 'terminated']
        """
        source = loader_source(self._engine, self._layouts, run_id=run_id, where=where, filter=filter,
                               agent_id=agent_id)
        sampling = Sampling(batch_size, shuffle, seed, epoch, rank, world_size, weight_by, num_samples)
        return load_transitions(source, n, gamma=gamma, columns=columns, sampling=sampling, format=format,
                                resume=resume, max_batch_bytes=max_batch_bytes)

    @_reader
    def replay(self, columns: Sequence[str] | None = None, *, length: int | None = None, n: int | None = None,
               gamma: float | None = None, where: str | None = None, run_id: Names = None, agent_id: Names = None,
               priorities: str | None = "default", alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6,
               capacity: int | None = None, follow: bool = False, seed: int = 0, stride: int | None = None,
               pad: bool = False, version: int | None = None, commit_interval: float | str | None = "5s",
               commit_updates: int | None = 100_000, poll: float = 1.0, max_batch_bytes: int | None = None,
               filter: EpisodeFilter | None = None) -> Replay:  # noqa: A002
        """A prioritized replay (Schaul et al.) over the selected episodes' steps, windows of ``length`` (``stride``,
        ``pad`` as for :meth:`sequences`) or ``n``-step transitions (as :meth:`transitions`): ``sample(batch_size)``
        gives the matching loader's batch plus ``index``, ``episode_id``, ``start``, ``probability`` and ``weight``;
        ``update(index, priority)`` sets priorities (``P(i) ∝ (priority + eps)^alpha``, weights with ``beta``).
        ``capacity`` keeps the newest items, ``follow`` adds those of later commits (looked for every ``poll`` s).
        Priorities are committed to the store's ``priorities`` table under the name ``priorities`` (``commit()``,
        ``close()``, every ``commit_interval`` or ``commit_updates`` updates; None: in memory only), and a replay of
        that name resumes from them (from version ``version`` of that table with it). See
        :mod:`trajstore.loaders.replay`."""
        return open_replay(self._engine, self._layouts, columns, length=length, n=n, gamma=gamma, stride=stride,
                           pad=pad, run_id=run_id, where=where, filter=filter, agent_id=agent_id,
                           priorities=priorities, alpha=alpha, beta=beta, eps=eps, capacity=capacity,
                           follow=follow, poll=poll, seed=seed, version=version, commit_interval=commit_interval,
                           commit_updates=commit_updates, max_batch_bytes=max_batch_bytes)


def _joined(runs: pa.Table, latest: pa.Table) -> pa.Table:
    """``runs`` (one row per ``(run_id, env_id)``) with the columns of ``latest`` (per series too) added, in the
    order of ``runs``; nulls for a series ``latest`` has no row of."""
    keys = list(zip(latest["run_id"].to_pylist(), latest["env_id"].to_pylist()))
    at = {key: i for i, key in enumerate(keys)}
    order = pa.array([at.get(key) for key in zip(runs["run_id"].to_pylist(), runs["env_id"].to_pylist())],
                     pa.int64())
    for name in latest.column_names[2:]:
        runs = runs.append_column(latest.schema.field(name), latest[name].take(order))
    return runs


def _plumbed(name: str) -> tuple[str, Callable[[Store], Any]]:
    return f"trajstore.store.plumbing(store).{name}", lambda store: getattr(plumbing(store), name)


def _maintained(name: str) -> tuple[str, Callable[[Store], Any]]:
    return f"store.maintain.{name}", lambda store: getattr(store.maintain, name)


def _steps_where(name: str) -> tuple[str, Callable[[Store], Any]]:
    """A method whose ``where`` was a condition over steps: called the old way (``where`` over steps), its new place
    named (where ``where`` is over episodes and ``steps_where`` over steps)."""
    def old(store: Store) -> Callable[..., Any]:
        new = getattr(store.maintain, name)

        def call(*args: Any, where: str | None = None, **kwargs: Any) -> Any:
            return new(*args, steps_where=where, **kwargs)
        return call
    return f"store.maintain.{name} (where a condition over steps is steps_where=, and where= is over episodes)", old


def _group_curves(store: Store) -> Callable[..., pa.Table]:
    def call(by: Names, **kwargs: Any) -> pa.Table:
        return store.curves(by=by, **kwargs)
    return call


# What the Store held until trajstore 0.1 and where it went: (the new place, in words; how to reach it).
_MOVED: dict[str, tuple[str, Callable[[Store], Any]]] = {
    "delete": _steps_where("delete"), "add_column": _steps_where("add_column"),
    **{name: _maintained(name) for name in ("vacuum", "files", "stored_columns", "decoding_sql")},
    "group_curves": ("store.curves(by=…)", _group_curves),
    **{name: _plumbed(name) for name in ("sandboxed_sql", "log_lag", "episode_page",
                                          "steps_page", "scan_plan", "commit_rows", "ingest", "image_leaves",
                                          "describe_run", "run_infos", "run_ids", "binned_curves", "histogram",
                                          "latest_stats")},
}


def plumbing(store: Store) -> Plumbing:
    """What serving ``store`` takes beyond its researcher's methods (:class:`~trajstore.plumbing.Plumbing`: the SQL
    sandbox and its places, ingest, pages, one commit's rows, the dashboard's binned curves, …): for the service, the
    CLI, exports and integrations."""
    return store._plumbing


# --- operations over a whole store (trajstore.check, trajstore.compact, trajstore.remove_orphans) ------------

def check(store: Store, *, deep: bool = False) -> CheckReport:
    """``store.maintain.check(deep=deep)``: check one committed snapshot of ``store`` (see
    :meth:`Maintenance.check <trajstore.maintenance.Maintenance.check>`)."""
    return store.maintain.check(deep=deep)


def remove_orphans(store: Store, *, older_than_s: float = 3600.0) -> list[str]:
    """``store.maintain.remove_orphans(older_than_s=…)``: delete the files of ``store`` no version lists that are at
    least ``older_than_s`` old; returns them."""
    return store.maintain.remove_orphans(older_than_s=older_than_s)


def compact(store: Store, *, run_id: Names = None, env_id: Names = None,
            target_bytes: int = compact_op.TARGET_BYTES, progress: bool = True) -> CompactReport:
    """``store.maintain.compact(…)``: rewrite the partitions of ``store`` (of ``run_id``/``env_id``, or all) whose
    files could be fewer, one commit each."""
    return store.maintain.compact(run_id=run_id, env_id=env_id, target_bytes=target_bytes, progress=progress)
