"""Discounted returns and per-step return-to-go, exact in float64 at any episode length and gamma.

``G_t = r_t + gamma * G_{t+1}`` is evaluated by its own recursion (one compiled pass), never by
the ``sum(r * gamma**k) / gamma**t`` window trick, which overflows on long episodes. :func:`returns` gives them
for the selected episodes of one committed version: per episode computed in DuckDB
(``sum(reward * gamma ** step)``, exact), per step by the recursion over the rewards it reads.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

import numba
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore.errors import InputError
from trajstore.query import sql

if TYPE_CHECKING:
    from trajstore.query.engine import Engine
    from trajstore.query.filters import EpisodeFilter, Ids, Names
    from trajstore.query.snapshot import Snapshot


def check_gamma(gamma: float) -> float:
    try:
        g = float(gamma)
    except (TypeError, ValueError):
        raise InputError(f"gamma must be a number in [0, 1], got {gamma!r}") from None
    if not 0.0 <= g <= 1.0:
        raise InputError(f"gamma must be in [0, 1], got {gamma}")
    return g


def discounted_sum(rewards: np.ndarray, gamma: float) -> float:
    """``sum_t gamma**t * r_t`` of one episode (the first reward undiscounted), like imitation's."""
    g = check_gamma(gamma)
    out = _rtg_sorted(np.asarray(rewards, np.float64), np.array([0], np.int64), g)
    return float(out[0]) if len(out) else 0.0


def episodes_return_to_go(reward: np.ndarray, starts: np.ndarray, gamma: float) -> np.ndarray:
    """Return-to-go (float64) of rewards laid out episode after episode, each episode's first row at ``starts``."""
    g = check_gamma(gamma)
    return _rtg_sorted(np.ascontiguousarray(reward, np.float64), np.ascontiguousarray(starts, np.int64), g)


def return_to_go(episode_id: np.ndarray, step: np.ndarray, reward: np.ndarray,
                 gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-step return-to-go for rows in any order whose episodes are stored as runs of consecutive steps.

    Returns ``(order, G)``: ``order`` sorts the rows by ``(episode_id, step)`` and ``G[i]`` is the
    return-to-go of row ``order[i]``.
    """
    order = np.empty(len(episode_id), np.int64)
    return order, sorted_return_to_go(episode_id, step, reward, gamma, columns=False, order=order).return_to_go


@dataclass
class SortedReturns:
    """Rows sorted by ``(episode_id, step)`` with their return-to-go.

    The input rows fall into pieces (runs of consecutive steps of one episode) beginning at ``starts``;
    ``piece_order`` lists the pieces in sorted order, so :meth:`reorder` sorts any other column.
    """

    episode_id: np.ndarray
    step: np.ndarray
    reward: np.ndarray
    return_to_go: np.ndarray
    starts: np.ndarray
    piece_order: np.ndarray

    def reorder(self, values: np.ndarray) -> np.ndarray:
        """Another column of the input rows, sorted like the rows (a block copy per piece)."""
        values = np.ascontiguousarray(values)
        out = np.empty_like(values)
        _reorder(values, self.starts, self.piece_order, out)
        return out


def sorted_return_to_go(episode_id: np.ndarray, step: np.ndarray, reward: np.ndarray, gamma: float, *,
                        columns: bool = True, order: np.ndarray | None = None) -> SortedReturns:
    """Like :func:`return_to_go`, with (if ``columns``) the input columns sorted too, in one compiled pass.

    ``step`` and ``reward`` keep their dtypes (e.g. int32 and float32); ``G`` is float64. A given
    ``order`` array is filled with the input row of each sorted row.
    """
    g = check_gamma(gamma)
    episode_id = np.ascontiguousarray(episode_id, np.int64)
    step = np.ascontiguousarray(step)
    step = step if step.dtype.kind in "iu" else step.astype(np.int64)
    reward = np.ascontiguousarray(reward)
    reward = reward if reward.dtype in (np.float32, np.float64) else reward.astype(np.float64)
    starts = _piece_starts(episode_id, step)
    piece_order = np.lexsort((step[starts], episode_id[starts]))
    m = len(episode_id) if columns else 0
    # outputs allocated by numpy (which asks for huge pages) rather than inside the compiled code
    out = SortedReturns(np.empty(m, np.int64), np.empty(m, step.dtype), np.empty(m, reward.dtype),
                        np.empty(len(episode_id), np.float64), starts, piece_order)
    _sorted_rtg(starts, piece_order, episode_id, step, reward, g, out.return_to_go,
                np.empty(0, np.int64) if order is None else order, out.episode_id, out.step, out.reward)
    return out


@numba.njit(cache=True)
def _sorted_rtg(starts: np.ndarray, piece_order: np.ndarray, episode_id: np.ndarray, step: np.ndarray,
                reward: np.ndarray, gamma: float, out: np.ndarray, order: np.ndarray, ids: np.ndarray,
                steps: np.ndarray, rewards: np.ndarray) -> None:
    """Walk the pieces from the last in ``piece_order`` to the first, evaluating ``G_t = r_t + gamma G_{t+1}``
    and writing each row's ``G`` at its sorted position in ``out`` (and its input row in ``order``, its
    columns in ``ids, steps, rewards``, unless those are empty)."""
    n = len(episode_id)
    with_order, columns = len(order) == n, len(ids) == n
    pos, g, later_id = n, 0.0, 0
    for k in range(len(piece_order) - 1, -1, -1):
        p = piece_order[k]
        lo, hi = starts[p], starts[p + 1] if p + 1 < len(starts) else n
        if k == len(piece_order) - 1 or episode_id[lo] != later_id:
            g = 0.0  # the piece after this one in sorted order belongs to another episode
        later_id = episode_id[lo]
        for i in range(hi - 1, lo - 1, -1):
            g = reward[i] + gamma * g
            pos -= 1
            out[pos] = g
            if with_order:
                order[pos] = i
            if columns:
                ids[pos], steps[pos], rewards[pos] = episode_id[i], step[i], reward[i]


@numba.njit(cache=True)
def _reorder(values: np.ndarray, starts: np.ndarray, piece_order: np.ndarray, out: np.ndarray) -> None:
    pos = 0
    for p in piece_order:
        lo, hi = starts[p], starts[p + 1] if p + 1 < len(starts) else len(values)
        out[pos:pos + hi - lo] = values[lo:hi]
        pos += hi - lo


@numba.njit(cache=True)
def _piece_starts(episode_id: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Row indices where a run of consecutive steps of one episode begins."""
    n = len(episode_id)
    out = np.empty(n, np.int64)
    k = 0
    for i in range(n):
        if i == 0 or episode_id[i] != episode_id[i - 1] or step[i] != step[i - 1] + 1:
            out[k] = i
            k += 1
    return out[:k]


@numba.njit(cache=True)
def _rtg_sorted(reward: np.ndarray, episode_starts: np.ndarray, gamma: float) -> np.ndarray:
    """Return-to-go over rows sorted by (episode, step); ``episode_starts`` marks each episode's first row."""
    n = len(reward)
    out = np.empty(n, np.float64)
    e = len(episode_starts) - 1
    g = 0.0
    for i in range(n - 1, -1, -1):
        g = reward[i] + gamma * g
        out[i] = g
        if e >= 0 and i == episode_starts[e]:
            g = 0.0
            e -= 1
    return out


# --- the returns of one committed version --------------------------------------------------------------------

def returns(engine: Engine, *, gamma: float, per: Literal["episode", "step"] = "episode", run_id: Names = None,
            env_id: Names = None, episode_id: Ids = None, where: sql.Where | None = None,
            filter: EpisodeFilter | None = None, limit: int | None = None) -> pa.Table:  # noqa: A002
    """Discounted return per episode, or return-to-go per step, sorted by ``episode_id`` (per step by
    ``(episode_id, step)``, ``run_id`` and ``env_id`` dictionary-encoded); with ``limit``, the first ``limit``
    rows (per step, only the episodes they reach are read). Per step in a store with multi-agent episodes, each
    row has its ``agent_id`` and each agent's return-to-go is over its own rewards (rows of one step in
    ``agent_id`` order); per episode, an episode's return is its agents' rewards together."""
    if limit is not None and limit < 0:
        raise InputError(f"limit: must be a number of rows >= 0, got {limit}")
    g = check_gamma(gamma)
    if per not in ("episode", "step"):
        raise InputError(f"per: must be 'episode' or 'step', got {per!r}")
    with engine.query_snapshot() as snap:
        if per == "episode":
            conds = sql.conditions(run_id=run_id, env_id=env_id, where=where, episode_id=episode_id, filter=filter)
            src = sql.subquery(snap.episodes_select(discounted=True))
            return snap.arrow(sql.episode_returns(conds, source=src, limit=limit), {"gamma": g})
        conds = sql.conditions(run_id=run_id, env_id=env_id, episode_id=episode_id) + \
            sql.step_conditions(filter, where)
        if limit is not None:
            conds.append(_first_episodes(snap, conds, limit))
        rows = snap.arrow(sql.step_rewards(snap.files, conds, agents=snap.agents))
    out = _per_agent_return_to_go(rows, g) if snap.agents else _with_return_to_go(rows, g)
    return out if limit is None else out.slice(0, limit)


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


def _per_agent_return_to_go(rows: pa.Table, gamma: float) -> pa.Table:
    """:func:`_with_return_to_go` of each agent's rows apart (single-agent rows, ``agent_id`` null, as one
    more), with ``agent_id``; sorted by ``(episode_id, step, agent_id)``."""
    agent = rows["agent_id"]
    parts = []
    for name in pc.unique(agent).to_pylist():
        mine = pc.is_null(agent) if name is None else pc.fill_null(pc.equal(agent, name), False)
        part = _with_return_to_go(rows.filter(mine).drop_columns(["agent_id"]), gamma)
        parts.append(part.append_column("agent_id", pa.array([name] * part.num_rows, agent.type)))
    if not parts:
        return _with_return_to_go(rows.drop_columns(["agent_id"]), gamma).append_column(
            "agent_id", pa.array([], agent.type))
    out = pa.concat_tables(parts, promote_options="permissive")
    return out.sort_by([("episode_id", "ascending"), ("step", "ascending"), ("agent_id", "ascending")])


def _reordered(column: pa.ChunkedArray, s: SortedReturns) -> pa.Array:
    """``column`` sorted like ``s``; for a dictionary column only its indices move (if they differ at all)."""
    arr = column.combine_chunks()
    if pa.types.is_dictionary(arr.type) and arr.null_count == 0:
        idx = arr.indices.to_numpy()
        if len(idx) == 0 or idx.min() == idx.max():  # one value throughout: sorting changes nothing
            return arr
        return pa.DictionaryArray.from_arrays(s.reorder(idx), arr.dictionary)
    return arr.take(pa.array(s.reorder(np.arange(len(arr)))))
