"""Episode statistics with the names of ``imitation.data.rollout.rollout_stats``: ``n_traj``,
``return_{min,mean,std,max}``, ``len_{min,mean,std,max}`` (std as ``numpy.std``, population) and, for a ``gamma``
given at query time, ``discounted_return_*``; grouped by any columns of the ``episodes`` view. Computed in DuckDB
(:func:`trajstore.query.sql.stats`) over one committed version, from the materialized ``episodes`` rows when the
engine holds them."""

from __future__ import annotations

import pyarrow as pa

from trajstore.errors import InputError
from trajstore.query import sql
from trajstore.query.engine import Engine
from trajstore.query.filters import EpisodeFilter, Names, names_of
from trajstore.query.metrics import Metric
from trajstore.query.returns import check_gamma
from trajstore.storage import run_config


def stats(engine: Engine, *, by: Names = None, gamma: float | None = None, where: sql.Where | None = None,
          filter: EpisodeFilter | None = None, run_id: Names = None,  # noqa: A002
          env_id: Names = None, include_incomplete: bool = False, metric: str | None = None) -> pa.Table:
    """One row per group of ``by`` (one row overall without it; ``config.<path>`` names a value of each run's
    config, :mod:`~trajstore.storage.run_config`); complete episodes only unless
    ``include_incomplete``. With ``metric`` (:mod:`~trajstore.query.metrics`: ``"last(is_success)"``), also
    ``metric_n`` (the episodes it has a value for) and ``metric_{min,mean,std,max}`` over them. Means and
    standard deviations are summed in parallel, in no fixed order: two calls can differ in their last bits.
    ``by`` with ``agent_id`` or ``agent_group`` (the id's part before its last ``_``) gives statistics per agent of
    the multi-agent episodes: each agent's return and length (``agent_episodes``) in place of the episode's."""
    arguments = (by, gamma, where, filter, run_id, env_id, include_incomplete, metric)
    if any(run_config.config_key(k) is not None for k in names_of(by)):  # run configs change without the files
        return _stats(engine, *arguments)
    # a page's statistics, once per version
    return engine.memo(f"stats {arguments!r}", lambda: _stats(engine, *arguments), local=True)


def _stats(engine: Engine, by: Names, gamma: float | None, where: sql.Where | None, filter: EpisodeFilter | None,  # noqa: A002
           run_id: Names, env_id: Names, include_incomplete: bool, metric: str | None) -> pa.Table:
    keys = names_of(by)
    paths = {k: path for k in keys if (path := run_config.config_key(k)) is not None}  # by="config.algo"
    agents = [k for k in keys if k in sql.AGENT_KEYS]
    alone = bool(agents) and _agents_alone(keys, where, filter, paths, metric)  # the episodes rows are not read
    with engine.query_snapshot(episodes="if-cached" if gamma is None and not alone else None) as snap:
        if keys:
            snap.check_columns([k for k in keys if k not in paths and k not in agents])
        if agents and gamma is not None:
            raise InputError(f"gamma: discounted returns per agent are not computed; leave out gamma or group "
                             f"by other columns than {agents}")
        conds = sql.conditions(run_id=run_id, env_id=env_id, where=where, filter=filter)
        source = "episodes" if snap.episodes_materialized else sql.subquery(
            snap.episodes_select(discounted=gamma is not None))
        if alone:
            source = sql.agent_rows()  # one group-by over the steps, not two and a join
        elif agents:
            source = sql.per_agent(source)
        if paths:
            snap.use_runs(engine.runs_table(snap.files, paths))
            source = sql.with_config(source, paths)
        measured = None
        if metric is not None:
            measured = Metric.parse(metric, snap.episode_columns, snap.step_columns)
            source = measured.source(source)
        q = sql.stats(keys, discounted=gamma is not None, conds=conds, include_incomplete=include_incomplete,
                      source=source, metric=None if measured is None else measured.name)
        return snap.arrow(q, {"gamma": check_gamma(gamma)} if gamma is not None else {})


def _agents_alone(keys: list[str], where: sql.Where | None, filter: EpisodeFilter | None,  # noqa: A002
                  paths: dict[str, tuple[str, ...]], metric: str | None) -> bool:
    """Whether statistics per agent need no column of ``episodes``: grouped and filtered by the columns of
    ``agent_episodes`` (:data:`~trajstore.query.sql.AGENT_ROW_COLUMNS`) alone, no ``where`` (any column), lineage
    filter, config value or metric."""
    return (where is None and not paths and metric is None and (filter is None or not any(filter.lineage.values()))
            and all(k in sql.AGENT_ROW_COLUMNS for k in keys))
