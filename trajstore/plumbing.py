"""What the service, the CLI, the exports and the integrations need of a store beyond the researcher's façade.

A :class:`~trajstore.store.Store` is what a researcher calls: open, write, read, query, train, compare, maintain.
Serving it takes more — the SQL sandbox, appends of rows a remote writer cut
into episodes (and their compaction), keyset pages, the rows of one commit and the commits as they come, cheap
checks of the latest version's files, the dashboard's binned curves, the sources of the exports' layouts — and
that lives here, one :class:`Plumbing` per store, reached with :func:`trajstore.store.plumbing` (never through the
Store's own attributes, which are private). Each method makes one call into the module named after its topic, with
the read engine of the store that made it.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Callable, Iterator, Mapping, Sequence

import pyarrow as pa

from trajstore.errors import QueryError, caller_sql_error
from trajstore.loaders.source import Source, loader_source
from trajstore.operations.group_commit import GroupCommitter
from trajstore.operations.ingest import append_rows
from trajstore.operations.upkeep import CompactionPolicy, Upkeep
from trajstore.query import curves, episodes, follow, sandbox, scan, sql_worker
from trajstore.query.filters import EpisodeFilter, Ids, Names, filtered
from trajstore.query.follow import Commit, new_commits
from trajstore.query.pictures import ImageLeaf, stored_image_leaves
from trajstore.query.scan import ScanPlan
from trajstore.storage import run_config

if TYPE_CHECKING:
    from trajstore.loaders.layout_store import LayoutStore
    from trajstore.query.engine import Engine
    from trajstore.query.groups import StepTypes
    from trajstore.settings import Settings
    from trajstore.storage.encoding import FileSchema
    from trajstore.storage.log import DataFile, LogCommit


def checked_read(engine: Engine, call: Callable[[], Any], kwargs: Mapping[str, Any]) -> Any:
    """How a reader is called (:func:`~trajstore.query.filters.filtered`'s ``around``, for the Store's readers and
    these): a run the store does not hold (``run_id=``, or in ``filter``) is a
    :class:`~trajstore.errors.RunNotFoundError` naming it and the runs there are, before anything is read; a query
    that fails because of the caller's own ``where`` condition is an :class:`~trajstore.errors.InputError` naming
    ``where`` (DuckDB's first line, without the SQL trajstore built around it)."""
    flt = kwargs.get("filter")
    engine.check_runs(kwargs.get("run_id"), flt.run_id if flt is not None else None)
    try:
        return call()
    except QueryError as exc:
        if not kwargs.get("where") or type(exc) is not QueryError:
            raise
        raise caller_sql_error(exc, "where", f"in {str(kwargs['where'])!r}") from None


def _read(self: Plumbing, method: Callable[..., Any], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
    return checked_read(self._engine, lambda: method(self, *args, **kwargs), kwargs)


_reader = filtered(around=_read)


class Plumbing:
    """What serving one store takes beyond its researcher's methods (see the module's description)."""

    def __init__(self, engine: Engine, layouts: LayoutStore, upkeep: Upkeep | None) -> None:
        self._engine, self._layouts, self._upkeep = engine, layouts, upkeep

    def __repr__(self) -> str:
        return f"Plumbing({self._engine.uri!r})"

    # --- what the store is and how it is reached ----------------------------------------------------------------

    @property
    def settings(self) -> Settings:
        """The settings the store was opened with."""
        return self._engine.settings

    @property
    def storage_options(self) -> dict[str, Any]:
        """The options deltalake and pyarrow reach an object store with (empty for a local store)."""
        location = self._engine.location
        return {} if location.is_local else dict(location.storage_options)

    @property
    def pinned(self) -> int | None:
        """The version a read-only store is pinned to (None: the latest, read afresh by every read)."""
        return self._engine.table.log.pinned

    def run_ids(self) -> list[str]:
        """The runs the store holds (from the committed file list: no file is read)."""
        return self._engine.run_ids()

    def check_runs(self, *selections: Names) -> None:
        """A :class:`~trajstore.errors.RunNotFoundError` naming a run of ``selections`` the store does not hold."""
        self._engine.check_runs(*selections)

    def file_schemas(self, files: Sequence[DataFile]) -> list[FileSchema]:
        """Each committed file's schema and format, read once per file (another tool's partitions checked)."""
        return self._engine.file_schemas(files)

    def step_types(self, files: Sequence[DataFile]) -> StepTypes:
        """What readers return for the steps of ``files`` (:func:`~trajstore.query.groups.step_types`)."""
        return self._engine.step_types(files)

    # --- the service's health -----------------------------------------------------------------------------------

    def log_lag(self) -> tuple[int, int]:
        """The log's latest version and how many versions it is past its last checkpoint (what opening it
        replays; see :mod:`trajstore.operations.upkeep`)."""
        return self._engine.log_lag()

    def problems(self, *, newest: bool = False) -> list[str]:
        """Problems that stop this store from being served: an unreadable log, committed files missing or of
        another size than the log says (cheap checks of every file; ``trajstore check`` reads them all). With
        ``newest``, only the files the latest commit added are looked at (a liveness probe's cost)."""
        return self._engine.health(newest=newest)

    # --- SQL from others ------------------------------------------------------------------------------------------

    def sandboxed_sql(self, query: str, limits: sandbox.Limits | None = None, *,
                      encode: sandbox.Encoder | None = None, run_id: Names = None,
                      env_id: Names = None) -> sandbox.Result:
        """Run one untrusted, read-only SELECT over the views (of ``run_id``/``env_id`` only, as for
        :meth:`Store.sql <trajstore.store.Store.sql>`), bounded by ``limits``, and with ``encode`` write the body of
        its answer within them too (see :mod:`~trajstore.query.sandbox`).

        The views read the committed files through registered pyarrow datasets: the connection the query runs
        on can read no file at all. With ``limits.worker_bytes`` (the default) the query runs in a worker
        process that cannot take more memory than that (:mod:`~trajstore.query.sql_worker`); the body is
        encoded here. How many run at once is the caller's to bound (the service: ``sql_max_concurrent``)."""
        return sql_worker.sandboxed_sql(self._engine, query, limits, encode=encode, run_id=run_id, env_id=env_id)

    # --- writes a remote writer sends -----------------------------------------------------------------------------

    def ingest(self, rows: pa.Table, *, run_id: str, env_id: str, idempotency_key: str | None = None,
               idempotency_sequence: int | None = None) -> tuple[str | None, bool]:
        """Append rows already cut into episodes (what a remote writer sends), checked against what is stored;
        returns ``(file, duplicate)``. Rows that do not continue their episodes raise
        :class:`~trajstore.errors.InputError`, a key used before for another request
        :class:`~trajstore.errors.ConflictError` (with ``idempotency_sequence``, the key names a writer and the
        number one of its requests). See :mod:`trajstore.operations.ingest`. What is appended is
        compacted on a thread of the store's (as writers compact their own)."""
        table = self._engine.table
        table.log.writable("ingest")
        out = append_rows(table, rows, run_id=run_id, env_id=env_id, idempotency_key=idempotency_key,
                          idempotency_sequence=idempotency_sequence)
        if out[0] is not None and not out[1] and self._upkeep is not None:
            self._upkeep.wrote(run_id, env_id)
        return out

    def group_committer(self, *, interval_s: float, group_bytes: int,
                        upkeep: Upkeep | None = None) -> GroupCommitter:
        """A committer of ingest requests (and writers' hand-overs) in groups: at most one commit per ``interval_s``,
        sooner once ``group_bytes`` of rows wait, each request acknowledged once its group landed; what it appends is
        compacted by ``upkeep`` (by default the store's, as :meth:`ingest`'s is). See
        :mod:`trajstore.operations.group_commit`."""
        return GroupCommitter(self._engine.table, interval_s=interval_s, group_bytes=group_bytes,
                              upkeep=upkeep or self._upkeep)

    def new_upkeep(self, what: str) -> Upkeep:
        """An upkeep of the store's table of its own (compaction, checkpoints, the log's retention; its caller closes
        it), for ``what`` commits to it: a :class:`~trajstore.errors.ReadOnlyError` naming ``what`` for a store read
        at a version."""
        self._engine.table.log.writable(what)
        return Upkeep(self._engine.table, CompactionPolicy.of(self._engine.settings))

    def describe_run(self, run_id: str, *, config: Mapping[str, Any] | None = None,
                     tags: Sequence[str] | None = None, notes: str | None = None,
                     provenance: Mapping[str, str | None] | None = None) -> None:
        """What a writer of ``run_id`` does with its ``config``, ``tags``, ``notes`` (:meth:`Store.writer
        <trajstore.store.Store.writer>`), for a remote writer: the first describes the run, with ``created`` and
        the program's version, git commit and host (``provenance``: those a remote program reports of itself); a
        later one adds its tags, keeps stored notes, and must give the same config. See
        :mod:`~trajstore.storage.run_config`."""
        change = run_config.given(config=config, tags=tags, notes=notes)
        self._engine.descriptions.change(run_id, change, replace=False, what="writer", provenance=provenance)

    def run_infos(self) -> dict[str, dict[str, Any]]:
        """:meth:`Store.run_info <trajstore.store.Store.run_info>` of every run the store holds, by run id (each
        table read once)."""
        infos = self._engine.descriptions.infos()
        return {r: infos.get(r) or run_config.undescribed() for r in self._engine.run_ids()}

    # --- pages, commits and streams -------------------------------------------------------------------------------

    @_reader
    def episode_page(self, *, where: str | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                     gamma: float | None = None, order_by: str = "episode_id", limit: int,
                     offset: int = 0, after: int | None = None) -> tuple[pa.Table, int]:
        """One page of :meth:`Store.episodes <trajstore.store.Store.episodes>` and how many episodes the filter
        selects in all, in one query. With ``after`` (the previous page's last ``episode_id``: a keyset cursor;
        ``order_by`` must then be ``episode_id`` or ``-episode_id``), the page after that episode, whatever its
        depth."""
        return episodes.episode_page(self._engine, where=where, filter=filter, gamma=gamma, order_by=order_by,
                                     limit=limit, offset=offset, after=after)

    @_reader
    def steps_page(self, columns: Sequence[str] | None = None, *, filter: EpisodeFilter | None = None,  # noqa: A002
                   where: str | None = None, limit: int = 100, offset: int = 0,
                   after: Sequence[Any] | None = None) -> pa.Table:
        """One page of the selected steps in ``(episode_id, step)`` order (``columns``, or all); with ``after``
        (the ``(episode_id, step)`` of the previous page's last row, ``(episode_id, step, agent_id)`` where it was
        an agent's: a keyset cursor) the page after it, read without counting off the rows before it. The agents of
        a multi-agent step come one row each, by ``agent_id`` (then always among the columns)."""
        return episodes.steps_page(self._engine, columns, filter=filter, where=where, limit=limit, offset=offset,
                                   after=after)

    @_reader
    def scan_plan(self, columns: Sequence[str] | None = None, *, run_id: Names = None, env_id: Names = None,
                  episode_id: Ids = None, where: str | None = None,
                  filter: EpisodeFilter | None = None) -> ScanPlan:  # noqa: A002
        """What :meth:`Store.scan <trajstore.store.Store.scan>` reads: the committed files, their types, the columns
        and the episode ids (None: every episode of the files), resolved on one snapshot. Another engine (Ray) can
        read the plan's files in pieces, with :func:`~trajstore.query.scan.scan_steps`, and get exactly the rows of
        ``scan``."""
        return scan.scan_plan(self._engine, columns, run_id=run_id, env_id=env_id, episode_id=episode_id,
                              where=where, filter=filter)

    def commit_rows(self, version: int, columns: Sequence[str] | None = None, *, run_id: Names = None,
                    env_id: Names = None, episodes: bool = False) -> Commit | None:
        """What :meth:`Store.follow <trajstore.store.Store.follow>` yields for the commit of ``version`` (``rows``
        empty when it appended none of the selected runs' rows); None while there is no such version (for a store
        opened at a version, a version after it). ``episodes`` finds the completed episodes among this store's
        files."""
        return follow.commit_rows(self._engine, version, columns, run_id=run_id, env_id=env_id, episodes=episodes)

    def new_commits(self, *, since: int, poll: float,
                    sleep: Callable[[float], bool | None]) -> Iterator[LogCommit]:
        """Every commit of the log after version ``since``, in order, as it gets them (see
        :func:`~trajstore.query.follow.new_commits`): what the service announces to its listeners."""
        return new_commits(self._engine.table, since=since, poll=poll, sleep=sleep)

    # --- the dashboard ----------------------------------------------------------------------------------------------

    @_reader
    def binned_curves(self, *, x: str = "env_steps", y: str = "episode_return", bins: int = 800,
                      gamma: float | None = None, run_id: Names = None, env_id: Names = None,
                      where: str | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                      metric: str | None = None, by: str | None = None) -> pa.Table:
        """Learning curves in ``bins`` bins along ``x`` (``env_steps``, ``wall_time``, ``policy_version`` or
        ``episode_index``), one series per ``(run_id, env_id)``: per non-empty bin ``lo, hi`` (its edges, shared
        by all series, as ``numpy.histogram_bin_edges``), ``count``, ``mean`` and ``p10, p50, p90`` of ``y``
        (``episode_return``, ``episode_length``, or ``discounted_return`` with ``gamma``), or of ``metric``. With
        ``by="agent_id"`` (or ``"agent_group"``), one series per ``(run_id, env_id, agent)`` of the multi-agent
        episodes (see :func:`~trajstore.query.curves.binned_curves`)."""
        return curves.binned_curves(self._engine, x=x, y=y, bins=bins, gamma=gamma, run_id=run_id, env_id=env_id,
                                    where=where, filter=filter, metric=metric, by=by)

    @_reader
    def histogram(self, *, y: str = "episode_return", bins: int = 60, gamma: float | None = None,
                  run_id: Names = None, env_id: Names = None, where: str | None = None,
                  filter: EpisodeFilter | None = None, metric: str | None = None,  # noqa: A002
                  density: bool = False) -> pa.Table:
        """The distribution of ``y`` (or of any ``metric``) over the complete episodes of each ``(run_id,
        env_id)`` in at most ``bins`` bins shared by all series: ``run_id, env_id, bin, lo, hi, count`` per
        non-empty bin, with ``density`` each bin's density too (see :func:`~trajstore.query.curves.histogram`)."""
        return curves.histogram(self._engine, y=y, bins=bins, gamma=gamma, run_id=run_id, env_id=env_id,
                                where=where, filter=filter, metric=metric, density=density)

    @_reader
    def latest_stats(self, last: int = 100, *, gamma: float | None = None, run_id: Names = None,
                     env_id: Names = None, where: str | None = None,
                     filter: EpisodeFilter | None = None) -> pa.Table:  # noqa: A002
        """Statistics of the ``last`` complete episodes of each ``(run_id, env_id)`` to end (the dashboard's runs
        table, and :meth:`Store.runs <trajstore.store.Store.runs>` with ``last``): ``run_id, env_id, n_traj,
        return_*, len_*`` (and ``discounted_return_*`` with ``gamma``), read from the learning curves the engine
        keeps (see :func:`~trajstore.query.curves.latest_of`)."""
        return curves.latest_stats(self._engine, last, gamma=gamma, run_id=run_id, env_id=env_id, where=where,
                                   filter=filter)

    def image_leaves(self, env_id: str | None = None) -> list[ImageLeaf]:
        """The observation leaves that are pictures (see :mod:`trajstore.query.pictures`; of one environment's
        files with ``env_id``), their declared frame stacks taken from the files' formats; empty without images."""
        return stored_image_leaves(self._engine, env_id)

    # --- exports -----------------------------------------------------------------------------------------------------

    def loader_source(self, *, run_id: Names, where: str | None, agent_id: Names = None,
                      complete_only: bool = False, agent_field: str = "agent_id") -> Source:
        """The selected steps of the latest version, pinned, laid out through the store's loader layouts (see
        :func:`~trajstore.loaders.source.loader_source`): what an export reads."""
        return loader_source(self._engine, self._layouts, run_id=run_id, where=where, filter=None,
                             agent_id=agent_id, complete_only=complete_only, agent_field=agent_field)
