"""The read engine of one store: what every read shares — the table, one DuckDB database, the caches of one committed
version — and the judgment of a committed file that cannot be read.

A :class:`~trajstore.store.Store` holds one :class:`Engine` and its read methods each make one call into the module
named after their topic (:mod:`~trajstore.query.episodes`, :mod:`~trajstore.query.stats`,
:mod:`~trajstore.query.curves`, :mod:`~trajstore.query.scan`, :mod:`~trajstore.query.returns`,
:mod:`~trajstore.query.follow`, :func:`~trajstore.query.sql_worker.sandboxed_sql`, the loaders), which take the
engine; the operations
that change a store (:mod:`trajstore.operations`) take it too. What it keeps:

- **cursors of the process's one DuckDB database** (:meth:`Engine.cursor`), each a connection with views of its own
  (temporary: every store of the process shares the database, never its views);
- **the ``episodes`` rows of the latest version**, materialized once when a page's queries ask for them
  (:meth:`Engine.query_snapshot`), so that runs, episodes, curves and stats aggregate the steps once — in a local
  store combined from its files' summaries (:mod:`~trajstore.query.summarized`), not from the steps;
- **the types of the steps** of the last few file lists asked about (:meth:`Engine.step_types`), and **the learning
  curves** of the last few selections (:meth:`Engine.memo`).

One lock (``_cache_lock``) guards the caches; a version's episodes are combined once (``_episodes_lock``) and a
memo computed once (concurrent requests wait for it).
"""

from __future__ import annotations

import contextlib
import logging
import threading
from concurrent.futures import Future
from typing import Any, Callable, Iterator, Literal, Sequence, TypeVar

import duckdb
import pyarrow as pa

from trajstore.errors import (
    StoreAccessError,
    StoreDamagedError,
    TrajstoreError,
    UnsupportedTableError,
    VersionNotFoundError,
    first_line,
)
from trajstore.query import foreign, sql, summarized
from trajstore.query.filters import Names, check_runs, names_of, selected
from trajstore.query.groups import StepTypes, group_files, step_types
from trajstore.query.snapshot import Snapshot, cursor, damaged_file
from trajstore.settings import Settings
from trajstore.storage import priorities_log, run_config
from trajstore.storage.encoding import FileSchema
from trajstore.storage.history import vacuumed
from trajstore.storage.location import Location
from trajstore.storage.log import DataFile
from trajstore.storage.summaries import Summary
from trajstore.storage.table import StepsTable

log = logging.getLogger(__name__)
T = TypeVar("T")
_NONE = object()  # no value kept

MEMO_KEPT = 16  # selections whose results (learning curves, their bins) are kept per version
TYPES_KEPT = 8  # file selections whose step types are kept
EPISODE_CACHE_ROWS = 2_000_000  # larger episodes views are aggregated per query instead of kept in memory


class Engine:
    """The read engine over the ``steps`` table ``table`` of the store at ``location``."""

    def __init__(self, table: StepsTable, location: Location, settings: Settings) -> None:
        self.table, self.location, self.settings = table, location, settings
        self.descriptions = run_config.Descriptions(location, table.log)  # what describes each run, at this version
        # the priorities replays committed (their own table: read at its latest version, whatever steps' is)
        self.priorities = priorities_log.PrioritiesLog(location.child(priorities_log.FOLDER),
                                                       rule=table.log.retention)  # the same retention as steps
        self._cache_lock = threading.Lock()
        self._episodes_lock = threading.Lock()  # one combination of a version's episodes at a time
        self._episodes: tuple[tuple[str, ...], pa.Table] | None = None
        self._types: dict[tuple[str, ...], StepTypes] = {}
        self._memo: dict[tuple[tuple[str, ...], str], Any] = {}
        self._flights: dict[tuple[tuple[str, ...], str], Future[Any]] = {}  # memos being computed

    @property
    def uri(self) -> str:
        return self.location.uri

    # --- the committed files ---------------------------------------------------------------------------------

    def files(self) -> list[DataFile]:
        """The committed files of the version this engine reads (the latest, or the pinned one)."""
        return self.table.files()

    def run_ids(self) -> list[str]:
        """The runs the store holds (from the committed file list: no file is read)."""
        return sorted({f.run_id for f in self.files()})

    def check_runs(self, *selections: Names) -> None:
        """A :class:`~trajstore.errors.RunNotFoundError` naming each run of ``selections`` the store does not
        hold (:func:`~trajstore.query.filters.check_runs`)."""
        if any(s is not None for s in selections):
            check_runs(selections, self.run_ids(), self.uri)

    def selected_files(self, run_id: Names, env_id: Names) -> list[DataFile]:
        """The committed files of ``run_id``/``env_id`` (all when None); a run the store does not hold is a
        :class:`~trajstore.errors.RunNotFoundError`, as for every reader."""
        self.check_runs(run_id)
        runs, envs = names_of(run_id) or None, names_of(env_id) or None
        return [f for f in self.files() if selected(f.run_id, runs) and selected(f.env_id, envs)]

    def file_schemas(self, files: Sequence[DataFile]) -> list[FileSchema]:
        """:meth:`StepsTable.schemas <trajstore.storage.table.StepsTable.schemas>`, a file that cannot be read
        judged by :meth:`judged`; partitions holding files another tool wrote checked first
        (:func:`~trajstore.query.foreign.check_partitions`)."""
        try:
            schemas = self.table.schemas(files)
        except StoreDamagedError as exc:
            raise self.judged(exc) from exc
        foreign.check_partitions(files, schemas, self.table.log.added_in)
        return schemas

    def stored_schema(self, env_id: str | None) -> pa.Schema | None:
        """:meth:`StepsTable.stored_schema <trajstore.storage.table.StepsTable.stored_schema>`, its file that cannot
        be read judged by :meth:`judged`."""
        try:
            return self.table.stored_schema(env_id=env_id)
        except StoreDamagedError as exc:
            raise self.judged(exc) from exc

    # --- DuckDB ----------------------------------------------------------------------------------------------

    def snapshot(self, files: list[DataFile], *, con: duckdb.DuckDBPyConnection | None = None,
                 config: dict[str, Any] | None = None, registered: bool | None = None,
                 runs: bool = False, episodes: pa.Table | None = None, copies: bool = True,
                 fill: bool = True) -> Snapshot:
        """A snapshot over ``files``: DuckDB reads a local store's files itself (``read_parquet``), a remote
        store's from this machine's copies of them (:meth:`~trajstore.storage.table.StepsTable.local_copies`, made
        now where missing unless not ``fill``; not with ``copies`` False: what reads the bucket's own bytes,
        ``check``), else through pyarrow datasets over its filesystem (``registered``); all in the files' own
        types. With
        ``runs``, also the ``runs`` view of the runs of ``files`` (one more read of the log) and the ``priorities`` view
        (the replays' priorities, :mod:`~trajstore.storage.priorities_log`); with ``episodes``, its
        ``episodes`` view reads those rows (the view's own, materialized earlier)."""
        local = self.table.local_copies(files, fill=fill) if copies and registered is None else None
        registered = not self.location.is_local if registered is None else registered
        return Snapshot(files, con=con, config=config, store=self.uri, schemas=self.file_schemas(files),
                        registered=registered, judge=self.judged, location=self.location, local=local,
                        runs=self.runs_table(files) if runs else None, episodes=episodes,
                        priorities=self.priority_rows() if runs else None)

    def priority_rows(self) -> Any:
        """The rows of the ``priorities`` table's latest version as a pyarrow dataset (what its view reads)."""
        return priorities_log.dataset(self.priorities.location, self.priorities.file_paths())

    def runs_table(self, files: Sequence[DataFile], groups: dict[str, tuple[str, ...]] | None = None) -> pa.Table:
        """The rows of the ``runs`` view of the runs of ``files`` (:func:`~trajstore.storage.run_config.table`); with
        ``groups`` (``by`` names -> config paths), each run's value of each as text, to group episodes by (a run
        whose stored config cannot be used is in the null group, and named in a warning)."""
        infos, runs = self.descriptions.infos(), {f.run_id for f in files}
        for run_id in sorted(runs) if groups else ():
            if run_id in infos and infos[run_id]["problem"]:
                log.warning("%s: grouped as a run without a config: %s", self.uri, infos[run_id]["problem"])
        return run_config.table(infos, runs, groups)

    def query_snapshot(self, *, episodes: Literal["fill", "if-cached"] | None = None, run_id: Names = None,
                       env_id: Names = None) -> Snapshot:
        """A snapshot on a cursor of this engine's own DuckDB database, for the queries trajstore builds itself.

        With ``episodes``, its ``episodes`` view reads the view's rows materialized once per committed version
        (the file list), so that the queries of one page (runs, episodes, curves, stats) aggregate the steps once,
        not each: ``"fill"`` materializes them when they are not yet, ``"if-cached"`` only uses them when they
        are. With ``run_id``/``env_id``, the views hold those files only (every column in its own type); the
        materialized episodes are then not used. A local store with summaries (:mod:`~trajstore.query.summarized`)
        combines the rows of any selection from its files' summaries either way, which costs a fraction of
        aggregating the steps."""
        restricted = run_id is not None or env_id is not None
        files = self.selected_files(run_id, env_id) if restricted else self.files()
        if episodes is not None and files and self.table.summaries is not None:
            # kept in memory for a local store only, whose files are checked before a kept answer (still_there)
            return self._summarized(files, keep=not restricted and self.location.is_local)
        snap = self.snapshot(files, con=self.cursor())
        if episodes is not None and not restricted:
            table = self._materialized_episodes(snap, fill=episodes == "fill")
            if table is not None:
                snap.use_episodes(table)
        return snap

    def cursor(self) -> duckdb.DuckDBPyConnection:
        """A cursor of this process's DuckDB database (:func:`~trajstore.query.snapshot.cursor`)."""
        return cursor()

    def _summarized(self, files: list[DataFile], *, keep: bool) -> Snapshot:
        """A snapshot of ``files`` whose ``episodes`` view reads its rows combined from the files' summaries
        (:mod:`~trajstore.query.summarized`), kept for the latest version with ``keep`` (one combination at a time,
        for concurrent requests)."""
        key = tuple(f.path for f in files)
        cached = self._kept_episodes(key)
        if cached is not None:
            self.still_there(files)
            return self.snapshot(files, con=self.cursor(), episodes=cached)
        with self._episodes_lock if keep else contextlib.nullcontext():
            cached = self._kept_episodes(key)  # combined by the request this one waited for
            if cached is not None:
                return self.snapshot(files, con=self.cursor(), episodes=cached)
            found = summarized.read(self.table, files)
            snap = self.snapshot(files, con=self.cursor(), fill=len(found) < len(files))  # steps read: to summarize
            try:
                rows = self._summarized_rows(snap, found)
            except BaseException:
                snap.close()
                raise
            if keep:
                with self._cache_lock:
                    self._episodes = (key, rows) if rows.num_rows <= EPISODE_CACHE_ROWS else None
        snap.use_episodes(rows)
        return snap

    def _kept_episodes(self, key: tuple[str, ...]) -> pa.Table | None:
        with self._cache_lock:
            return self._episodes[1] if self._episodes is not None and self._episodes[0] == key else None

    def _summarized_rows(self, snap: Snapshot, found: dict[str, Summary]) -> pa.Table:
        """The rows of ``snap``'s ``episodes`` view from its files' summaries; aggregated from the steps (with a
        warning) where they cannot be combined. Every file is checked to be there, of its committed size, first: a
        summary describes a file that is."""
        self.verify_sizes(snap.files)
        try:
            return summarized.episode_rows(snap, self.table, found, self.table.schemas(snap.files))
        except (StoreDamagedError, StoreAccessError, VersionNotFoundError):
            raise
        except summarized.NotLocalError as exc:
            log.info("%s: %s; aggregating the steps", self.uri, exc)
            return snap.arrow(sql.select_all("episodes"))
        except Exception as exc:  # noqa: BLE001 - a cache: the view aggregates the steps instead
            log.warning("%s: the episodes cannot be combined from the files' summaries (%s); aggregating the steps",
                        self.uri, first_line(exc))
            return snap.arrow(sql.select_all("episodes"))

    def _materialized_episodes(self, snap: Snapshot, *, fill: bool) -> pa.Table | None:
        key = tuple(f.path for f in snap.files)  # committed files never change: the list names the version
        with self._cache_lock:  # one materialization per version, even for concurrent requests
            cached = self._episodes
            if cached is not None and cached[0] == key:
                return cached[1]
            if not fill:
                return None
            table = snap.arrow(sql.select_all("episodes"))
            self._episodes = (key, table) if table.num_rows <= EPISODE_CACHE_ROWS else None
            return table

    def step_types(self, files: Sequence[DataFile]) -> StepTypes:
        """What readers return for the steps of ``files`` (see :func:`~trajstore.query.groups.step_types`), kept
        for the last file lists asked about."""
        key = tuple(f.path for f in files)
        with self._cache_lock:
            cached = self._types.get(key)
        if cached is not None:
            return cached
        if files:
            types = step_types(group_files(files, self.file_schemas(files)))
        else:  # an empty store: the typed nulls of the empty view
            with self.snapshot([], con=self.cursor()) as own:
                types = StepTypes(own.arrow(sql.select_all("steps", limit=0)).schema, {})
        with self._cache_lock:
            self._types = {k: v for k, v in self._types.items() if len(k) <= len(key) * 4 + 64}
            while len(self._types) >= TYPES_KEPT:
                self._types.pop(next(iter(self._types)))
            self._types[key] = types
        return types

    def memo(self, selection: str, compute: Callable[[], T], *, local: bool = False) -> T:
        """``compute()`` for ``selection`` (a key), kept for the latest committed version and the last
        :data:`MEMO_KEPT` selections (a page draws several plots of one selection, and many viewers look at the
        same runs). Computed once: a request asking while another computes it waits for that value. A kept value
        is answered while the version's files are there (:meth:`still_there`); with ``local``, values are kept
        only where that costs no request (a local store), else computed each time."""
        if local and not self.location.is_local:
            return compute()
        files = self.files()
        key = (tuple(f.path for f in files), selection)
        with self._cache_lock:
            kept = self._memo.get(key, _NONE)
        if kept is not _NONE:
            self.still_there(files)
            return kept  # type: ignore[no-any-return]
        with self._cache_lock:
            if key in self._memo:
                return self._memo[key]  # type: ignore[no-any-return]
            flight = self._flights.get(key)
            computing = flight is None
            if flight is None:
                flight = self._flights[key] = Future()
        if not computing:  # another request computes it: its value (or its error), once
            return flight.result()  # type: ignore[no-any-return]
        try:
            value = compute()
        except BaseException as exc:
            flight.set_exception(exc)
            raise
        finally:
            with self._cache_lock:
                self._flights.pop(key, None)
        with self._cache_lock:
            self._memo = {k: v for k, v in self._memo.items() if k[0] == key[0]}
            while len(self._memo) >= MEMO_KEPT:
                self._memo.pop(next(iter(self._memo)))
            self._memo[key] = value
        flight.set_result(value)
        return value

    # --- a committed file that cannot be read ----------------------------------------------------------------

    def verify_sizes(self, files: Sequence[DataFile]) -> None:
        """Raise a :class:`StoreDamagedError` before a stream starts if a file it needs is missing or resized
        (a :class:`~trajstore.errors.VersionNotFoundError` if a vacuum removed it: see :meth:`judged`)."""
        for f, problem in zip(files, self.table.size_problems(files)):
            if problem:
                raise self.judged(StoreDamagedError.of_file(f.uri, problem.split(": ", 1)[1], self.uri))

    def still_there(self, files: Sequence[DataFile]) -> None:
        """Before answering from what was kept of ``files`` (a local store's): each is there, of its committed
        size, else the error of a read of it (:meth:`verify_sizes`: a version a vacuum removed is gone, whatever was
        kept of it). A few microseconds a file; an object store's files are not asked."""
        if self.location.is_local:
            self.verify_sizes(files)

    def damage_named(self, reader: pa.RecordBatchReader, files: Sequence[DataFile]) -> Iterator[pa.RecordBatch]:
        """``reader``'s batches; a read error about a committed file becomes a :class:`StoreDamagedError`
        (or :class:`~trajstore.errors.VersionNotFoundError`)."""
        try:
            yield from reader
        except (OSError, pa.ArrowException) as exc:
            raise self.damage(exc, files) or exc
        finally:
            reader.close()

    def damage(self, exc: BaseException, files: Sequence[DataFile], *,
               version: int | None = None) -> TrajstoreError | None:
        """The error to raise for a read error ``exc`` about one of ``files`` (committed files of ``version``,
        by default the version this engine reads), judged by :meth:`judged`, or the :class:`StoreAccessError` of a
        store that failed or did not answer while they were read; None if it is about none of them."""
        found = damaged_file(exc, files, self.uri, location=self.location)
        return found if not isinstance(found, StoreDamagedError) else self.judged(found, version=version)

    def judged(self, error: StoreDamagedError, *, version: int | None = None) -> TrajstoreError:
        """What a committed file that cannot be read means: a :class:`~trajstore.errors.VersionNotFoundError`
        when a vacuum removed it (it is gone and the latest version no longer lists it: only the older version
        this read needed it; :func:`~trajstore.storage.history.vacuumed`), else ``error`` itself: the store is
        damaged. ``version`` is the version whose file it is (default: the one this engine is pinned to, or for
        the latest, the version the read began at)."""
        if error.path is None:
            return error
        path = error.path if self.location.is_local else error.path.removeprefix("s3://")
        at = self.table.log.pinned if version is None else version
        return vacuumed(self.table, path, version=at) or error

    # --- the log's state -------------------------------------------------------------------------------------

    def log_lag(self) -> tuple[int, int]:
        """The log's latest version and how many versions it is past its last checkpoint (what opening it
        replays; see :mod:`trajstore.operations.upkeep`)."""
        version = self.table.log.latest_number()
        return version, self.table.log.versions_since_checkpoint(version)

    def health(self, *, newest: bool = False) -> list[str]:
        """Problems that stop this store from being served: an unreadable log, a latest version that needs what
        trajstore does not read (:mod:`~trajstore.storage.protocol`), committed files missing or of
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
        except UnsupportedTableError as exc:  # a version trajstore does not read: what it needs, and what to do
            return [str(exc)]
        except Exception as exc:  # noqa: BLE001 - an unreadable log is the finding
            return [f"the commit log of {self.uri} cannot be read: {first_line(exc)}"]
        return [p for p in map(self.table.size_problem, files) if p]
