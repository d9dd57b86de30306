"""Episodes and their steps, as rows: the ``episodes`` view filtered, ordered and paged (:func:`episodes`,
:func:`episode_page`), one row per ``(run_id, env_id)`` (:func:`runs`), the steps of the selected episodes a page at
a time (:func:`steps_page`) and every step of one episode (:func:`episode_steps`). Each reads one committed
version through the store's :class:`~trajstore.query.engine.Engine`; its SQL comes from :mod:`trajstore.query.sql`.
"""

from __future__ import annotations

from typing import Any, Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError
from trajstore.query import sql
from trajstore.query.engine import Engine
from trajstore.query.filters import EpisodeFilter, Names, names_of
from trajstore.query.returns import check_gamma
from trajstore.query.snapshot import check_names
from trajstore.storage.log import files_holding

TOTAL = "total_episodes"  # the column a page's query counts every selected episode in


def episodes(engine: Engine, *, run_id: Names = None, env_id: Names = None, complete: bool | None = None,
             where: sql.Where | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
             gamma: float | None = None, order_by: str = "episode_id", limit: int | None = None,
             offset: int = 0, total: str | None = None) -> pa.Table:
    """One row per episode (the ``episodes`` view), filtered, in ``order_by`` order (a column, ``-`` prefixed for
    descending, or several comma-separated: ``-complete,-ended_at``; ties by ``episode_id``); with ``gamma`` adds
    ``discounted_return``; with ``total``, a column of that name counting every selected episode (whatever
    ``limit``)."""
    with engine.query_snapshot(episodes="fill" if gamma is None else None) as snap:
        keys = order_keys(order_by)
        known = snap.columns("episodes") + (["discounted_return"] if gamma is not None else [])
        check_names([name for name, _ in keys], known, view="episodes", field="order_by")
        conds = sql.conditions(run_id=run_id, env_id=env_id, where=where, filter=filter)
        if complete is not None:
            conds.append("complete" if complete else "NOT complete")
        params = {"gamma": check_gamma(gamma)} if gamma is not None else {}
        src = "episodes" if gamma is None else \
            sql.subquery(snap.episodes_select(discounted=True))
        if total is not None and snap.episodes_materialized:  # a count and a top-N, not every row ranked and counted
            rows = snap.arrow(sql.episodes(conds, source=src, order_by=keys, limit=limit, offset=offset), params)
            count = snap.arrow(sql.count_rows(conds, source=src), params)["n"][0].as_py()
            return rows.append_column(total, pa.array([count] * rows.num_rows, pa.int64()))
        return snap.arrow(sql.episodes(conds, source=src, order_by=keys, limit=limit, offset=offset, total=total),
                          params)


def order_keys(order_by: str) -> list[tuple[str, bool]]:
    """The ``(column, descending)`` keys of ``order_by``: comma-separated columns, each ``-`` prefixed for
    descending; an :class:`InputError` naming ``order_by`` for an empty one."""
    if not isinstance(order_by, str):
        raise InputError(f"order_by: expected a column name (- prefixed for descending; several comma-separated), "
                         f"got {order_by!r}")
    parts = [part.strip() for part in order_by.split(",")]
    if not all(part.lstrip("-") for part in parts):
        raise InputError(f"order_by: an empty column name in {order_by!r}; expected columns, each - prefixed for "
                         "descending, comma-separated (-complete,-ended_at)")
    return [(part.lstrip("-"), part.startswith("-")) for part in parts]


def episode_page(engine: Engine, *, where: str | None = None, filter: EpisodeFilter | None = None,  # noqa: A002
                 gamma: float | None = None, order_by: str = "episode_id", limit: int, offset: int = 0,
                 after: int | None = None) -> tuple[pa.Table, int]:
    """One page of :func:`episodes` and how many episodes the filter selects in all, in one query. With
    ``after`` (the previous page's last ``episode_id``: a keyset cursor; ``order_by`` must then be ``episode_id``
    or ``-episode_id``), the page after that episode, whatever its depth."""
    if after is not None:
        if order_by.lstrip("-") != "episode_id":
            raise InputError(f"cursor: pages with a cursor are in episode_id order (order_by=episode_id or "
                             f"-episode_id), got order_by={order_by!r}")
        key = sql.after_key(["episode_id"], [int(after)], descending=order_by.startswith("-"))
        rows = episodes(engine, where=f"({where}) AND {key}" if where else key, filter=filter, gamma=gamma,
                        order_by=order_by, limit=limit)
        return rows, _total(engine, where, filter)
    rows = episodes(engine, where=where, filter=filter, gamma=gamma, order_by=order_by, limit=limit,
                    offset=offset, total=TOTAL)
    total = rows[TOTAL][0].as_py() if rows.num_rows else None
    if total is None:  # an empty page says nothing about the rows before it
        total = _total(engine, where, filter)
    return rows.drop_columns([TOTAL]), total


def _total(engine: Engine, where: str | None, filter: EpisodeFilter | None) -> int:  # noqa: A002
    total = episodes(engine, where=where, filter=filter, total=TOTAL, limit=1)[TOTAL]
    return total[0].as_py() if len(total) else 0


def runs(engine: Engine) -> pa.Table:
    """One row per ``(run_id, env_id)``: its episodes, complete episodes, steps and last write time."""
    def compute() -> pa.Table:
        with engine.query_snapshot(episodes="fill") as snap:
            return snap.arrow(sql.RUNS)

    return engine.memo("runs", compute, local=True)  # every page asks, every version once


def steps_page(engine: Engine, columns: Sequence[str] | None = None, *,
               filter: EpisodeFilter | None = None,  # noqa: A002
               where: str | None = None, limit: int = 100, offset: int = 0,
               after: Sequence[Any] | None = None) -> pa.Table:
    """One page of the selected steps in ``(episode_id, step)`` order (``columns``, or all); with ``after`` (the
    ``(episode_id, step)`` of the previous page's last row, or ``(episode_id, step, agent_id)`` of an agent's row:
    a keyset cursor) the page after it, read without counting off the rows before it. Where the selection holds
    agents' rows, the agents of one step come in ``agent_id`` order and ``columns`` always holds ``agent_id``."""
    restrict = {} if filter is None else {"run_id": filter.run_id, "env_id": filter.env_id}
    names = list(columns or ())
    with engine.query_snapshot(episodes="if-cached", **restrict) as snap:  # the selected envs' own types
        snap.check_columns(names, view="steps", field="columns")
        if snap.agents and names and "agent_id" not in names:
            names.append("agent_id")
        conds = sql.step_conditions(filter, where)
        if after is not None:
            conds.append(_after_step(after, agents=snap.agents))
        return snap.arrow(sql.steps(names, conds, limit=limit, offset=offset, agents=snap.agents))


def _after_step(after: Sequence[Any], *, agents: bool) -> str:
    """The rows after a step's key: ``(episode_id, step)``, or with an agent ``(episode_id, step, agent_id)``
    (a single-agent step is one row; a multi-agent step, one row per agent, by ``agent_id``)."""
    if len(after) not in (2, 3):
        raise InputError(f"after: expected (episode_id, step) or (episode_id, step, agent_id), got {after!r}")
    key: list[Any] = [int(after[0]), int(after[1])]
    if len(after) == 3 and after[2] is not None and agents:
        return sql.after_key(["episode_id", "step", "agent_id"], [*key, str(after[2])])
    return sql.after_key(["episode_id", "step"], key)


def episode_steps(engine: Engine, episode_id: int, columns: Sequence[str] | None = None, *,
                  limit: int | None = None, agent_id: Names = None) -> pa.Table:
    """Every step of one episode in order (``step`` and ``columns``, or every column; a column only other
    environments store is null), the first ``limit`` with ``limit``; empty if there is no such episode. The
    rows of a multi-agent episode come one per agent and step (by ``agent_id`` within a step, which ``columns``
    then always holds); ``agent_id`` keeps those agents' rows."""
    committed = engine.files()
    names = list(dict.fromkeys(["step", *columns])) if columns else []  # step once, even when asked for
    known = engine.step_types(committed).schema
    check_names(names, known.names, view="steps", field="columns")
    files = files_holding(committed, np.array([int(episode_id)], np.int64))  # its environment's types alone
    if len({(f.run_id, f.env_id) for f in files}) > 1:  # id ranges of large files overlap: ask which partition
        with engine.snapshot(files, con=engine.cursor()) as snap:
            found = snap.arrow(sql.partition_of(int(episode_id))).to_pylist()
        files = [f for f in files if found and (f.run_id, f.env_id) == (found[0]["run_id"], found[0]["env_id"])]
    with engine.snapshot(files, con=engine.cursor()) as snap:
        if snap.agents and names and "agent_id" not in names:
            names.insert(1, "agent_id")
        held = [n for n in names if n in snap.step_columns]
        conds = sql.conditions(episode_id=int(episode_id))
        if agent_id is not None:  # no agent's rows where none has an agent_id
            conds.append(sql.in_list("agent_id", names_of(agent_id)) if snap.agents else "false")
        rows = snap.arrow(sql.steps(held, conds, limit=limit, agents=snap.agents))
    for name in names:  # a column only other environments store: null here
        if name not in rows.column_names:
            rows = rows.append_column(known.field(name), pa.nulls(rows.num_rows, known.field(name).type))
    return rows.select(names) if names else rows
