"""Learning curves: where each episode lies in its ``(run_id, env_id)`` series, counted over all its writers.

Each writer records ``env_steps``, its own env steps over all its envs at every stored step (see
``schemas/step.v1.json``); a series may have had many writers (remote workers, processes, a training loop
opening a writer per iteration), each counting from 0. :func:`total_env_steps` walks a series' episodes in
wall-time order (``ended_at``, then ``env_steps``) and adds, for each one, its writer's steps since that writer's
previous episode, so that the total at an episode is the steps all the series' writers had taken when it ended
(up to each writer's latest stored episode end).

Writers are told apart within one ``worker_id`` (``host:pid`` by default, shared by the writers a process opens
one after the other): a writer's count never decreases, so a drop starts a new writer; and a writer's episode
ids share one random token (see :mod:`trajstore.write.episode_ids`) that it replaces only after using 2**24
ids, so an unseen token is a new writer unless the token before it had used at least half of its ids. Episodes
without ``env_steps`` (written before it was recorded) add their length.
"""

from __future__ import annotations

from typing import Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore.errors import InputError
from trajstore.query import sql
from trajstore.query.engine import Engine
from trajstore.query.filters import EpisodeFilter, Names
from trajstore.query.metrics import Metric
from trajstore.query.returns import check_gamma
from trajstore.write.episode_ids import COUNTER_BITS

SPENT_TOKEN = 1 << (COUNTER_BITS - 1)  # counters a token must have reached before it can be a writer's older one


def total_env_steps(walk: pa.Table) -> np.ndarray:
    """The series' env steps at each episode of ``walk``: every episode of some series, sorted by
    ``run_id, env_id, ended_at, env_steps, episode_id`` (:data:`trajstore.query.sql.WALK`)."""
    n = walk.num_rows
    if n == 0:
        return np.zeros(0, np.int64)
    series = _run_starts_of(_codes(walk["run_id"])) | _run_starts_of(_codes(walk["env_id"]))
    worker = _codes(walk["worker_id"])
    group = np.cumsum(series) * (worker.max() + 2) + worker + 1  # one group per (series, worker_id)
    ids = walk["episode_id"].to_numpy()
    known = walk["env_steps"].is_valid().to_numpy(zero_copy_only=False)
    steps = pc.fill_null(walk["env_steps"], 0).to_numpy().astype(np.int64)
    token_first, token_counter = _token_marks(group, ids >> COUNTER_BITS, ids & ((1 << COUNTER_BITS) - 1))
    order = np.argsort(group, kind="stable")  # each writer group's episodes together, in walk order
    first = _run_starts_of(group[order])
    s, k = steps[order], known[order]
    prev, prev_known, prev_counter = _shifted(s), _shifted(k), _shifted(token_counter[order])
    new_writer = first | ~prev_known | (s < prev) | (token_first[order] & (prev_counter < SPENT_TOKEN))
    added = np.empty(n, np.int64)
    added[order] = np.where(~k, walk["episode_length"].to_numpy()[order], np.where(new_writer, s, s - prev))
    return _cumsum_per_run(added, series)


def _codes(column: pa.ChunkedArray) -> np.ndarray:
    """One integer per distinct value of ``column`` (-1 for null)."""
    indices = pc.dictionary_encode(column.combine_chunks()).indices
    return pc.fill_null(indices, -1).to_numpy().astype(np.int64)


def _run_starts_of(values: np.ndarray) -> np.ndarray:
    """True where ``values`` differs from the value before it (and at the first)."""
    return np.r_[True, values[1:] != values[:-1]]


def _shifted(values: np.ndarray) -> np.ndarray:
    """``values`` one place later (the first place repeats the first value; callers mask it)."""
    return np.r_[values[:1], values[:-1]]


def _token_marks(group: np.ndarray, token: np.ndarray, counter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per episode: whether it is the first (in walk order) of its token in its writer group, and the highest
    id counter of that token so far."""
    order = np.lexsort((token, group))  # stable: walk order within each (group, token)
    starts = _run_starts_of(group[order]) | _run_starts_of(token[order])
    offset = np.cumsum(starts) << COUNTER_BITS  # later runs above earlier ones: one running max does all
    running = np.maximum.accumulate(offset + counter[order]) - offset
    first, highest = np.empty(len(order), bool), np.empty(len(order), np.int64)
    first[order], highest[order] = starts, running
    return first, highest


def _cumsum_per_run(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Running sums of ``values`` that start again at every ``starts``."""
    total = np.cumsum(values)
    start = np.maximum.accumulate(np.where(starts, np.arange(len(values)), 0))
    return total - (total - values)[start]


# --- binned curves ----------------------------------------------------------------------------------------------

AXES = ("env_steps", "wall_time", "policy_version", "episode_index")
METRICS = ("episode_return", "episode_length", "discounted_return")
QUANTILES = (0.1, 0.5, 0.9)  # per bin, with DuckDB's quantile_cont: numpy's "linear" percentile
MAX_BINS = 100_000
METRIC = "metric"  # the column of the curves that holds a metric= asked for
POINTS = "curve_points"  # the name the episodes' (series, bin, y) are registered under for DuckDB


def check_binning(x: str, y: str, bins: int, gamma: float | None) -> None:
    """Raise an :class:`InputError` naming the argument when ``x``/``y``/``bins`` are not ones binning knows."""
    if x not in AXES:
        raise InputError(f"x: must be one of {', '.join(AXES)}, got {x!r}")
    if y not in METRICS:
        raise InputError(f"y: must be one of {', '.join(METRICS)}, got {y!r}")
    if y == "discounted_return" and gamma is None:
        raise InputError("y: discounted_return needs gamma (a discount factor in [0, 1])")
    if isinstance(bins, bool) or not isinstance(bins, (int, np.integer)) or not 1 <= bins <= MAX_BINS:
        raise InputError(f"bins: must be a whole number in [1, {MAX_BINS}], got {bins!r}")


def x_values(curve: pa.Table, axis: str) -> np.ndarray:
    """Where each episode of ``curve`` (:meth:`Store.curves <trajstore.store.Store.curves>` rows, each series'
    episodes together in the order they ended) lies along ``axis``, as float64 (NaN where not stored):
    ``env_steps`` (all the series' writers), ``wall_time`` (Unix seconds), ``policy_version``, or
    ``episode_index`` (0, 1, … within each series)."""
    if axis == "env_steps":
        return curve["total_env_steps"].to_numpy().astype(np.float64)
    if axis == "wall_time":
        micros = pc.cast(curve["ended_at"], pa.int64()).cast(pa.float64())
        return pc.fill_null(pc.divide(micros, 1e6), np.nan).to_numpy()
    if axis == "policy_version":
        if "policy_version" not in curve.column_names:
            return np.full(curve.num_rows, np.nan)
        return pc.fill_null(curve["policy_version"].cast(pa.float64()), np.nan).to_numpy()
    starts = series_starts(curve)
    index = np.arange(curve.num_rows)
    return (index - np.maximum.accumulate(np.where(starts, index, 0))).astype(np.float64)


def series_starts(curve: pa.Table) -> np.ndarray:
    """True at the first episode of each ``(run_id, env_id)`` series of ``curve``."""
    if curve.num_rows == 0:
        return np.zeros(0, bool)
    return _run_starts_of(_codes(curve["run_id"])) | _run_starts_of(_codes(curve["env_id"]))


def bin_edges(values: np.ndarray, bins: int) -> np.ndarray:
    """``bins + 1`` edges over the finite ``values``, as ``numpy.histogram_bin_edges(values, bins)`` gives them
    (an empty or one-valued range widened as numpy does)."""
    finite = values[np.isfinite(values)]
    if not len(finite):
        return np.linspace(0.0, 1.0, bins + 1)
    while bins > 1:  # numpy refuses more bins than the floats between the ends hold (returns of ~1e17 that differ
        try:         # by 16 hold one): as many as they do
            return np.histogram_bin_edges(finite, bins)
        except ValueError:
            bins //= 2
    low, high = float(finite.min()), float(finite.max())
    if low == high:  # numpy widens by 0.5, which rounds away at such magnitudes: by the float spacing there
        low, high = low - max(0.5, float(np.spacing(abs(low)))), high + max(0.5, float(np.spacing(abs(high))))
    return np.array([low, high])


def bin_index(values: np.ndarray, edges: np.ndarray) -> np.ndarray:
    """The bin of each value as ``numpy.histogram`` counts it: ``[e_i, e_{i+1})``, the last bin closed;
    -1 for NaN and values outside the edges."""
    index = np.searchsorted(edges, values, side="right") - 1
    index[values == edges[-1]] = len(edges) - 2
    index[~np.isfinite(values) | (values < edges[0]) | (values > edges[-1])] = -1
    return index.astype(np.int64)


def bin_stats(con: duckdb.DuckDBPyConnection, curve: pa.Table, y: np.ndarray, index: np.ndarray,
              edges: np.ndarray, *, quantiles: Sequence[float] = QUANTILES,
              series: Sequence[str] = ("run_id", "env_id")) -> pa.Table:
    """Per series (the columns ``series`` of ``curve``) and non-empty bin of ``index``: the ``series`` columns,
    ``bin, lo, hi, count`` and, with ``quantiles``, ``mean`` and ``p10, p50, p90`` of ``y`` (aggregated by DuckDB
    on ``con``)."""
    points = pa.table({**{k: curve[k] for k in series}, "bin": pa.array(index, pa.int64()),
                       "y": pa.array(y, pa.float64())})
    con.register(POINTS, points)
    try:
        out = con.sql(sql.bin_stats(POINTS, quantiles, series)).to_arrow_table()
    finally:
        con.unregister(POINTS)
    at = out["bin"].to_numpy()
    out = out.add_column(len(series) + 1, "lo", pa.array(edges[:-1][at], pa.float64()))
    return out.add_column(len(series) + 2, "hi", pa.array(edges[1:][at], pa.float64()))


def y_values(curve: pa.Table, metric: str) -> np.ndarray:
    """The values of ``metric`` for each episode of ``curve`` as float64 (NaN where null)."""
    return pc.fill_null(curve[metric].cast(pa.float64()), np.nan).to_numpy()


# --- the latest episodes of each series ---------------------------------------------------------------------------

LATEST_VALUES = (("return", "episode_return"), ("len", "episode_length"), ("discounted_return", "discounted_return"))


def latest_of(curve: pa.Table, last: int) -> pa.Table:
    """Per ``(run_id, env_id)`` series of ``curve`` (rows of :meth:`Store.curves <trajstore.store.Store.curves>`:
    each series' complete episodes together, in the order they ended), the statistics of its ``last`` latest
    episodes: ``n_traj`` and ``{return,len}_{mean,std,min,max}`` (std as ``numpy.std``), and
    ``discounted_return_*`` when ``curve`` has that column. One row per series, in ``curve``'s order."""
    if isinstance(last, bool) or not isinstance(last, (int, np.integer)) or last < 1:
        raise InputError(f"last: must be a whole number of episodes >= 1, got {last!r}")
    starts = np.flatnonzero(series_starts(curve))
    ends = np.r_[starts[1:], curve.num_rows].astype(np.int64)
    firsts = np.maximum(starts, ends - int(last))
    out: dict[str, object] = {"run_id": curve["run_id"].take(starts), "env_id": curve["env_id"].take(starts),
                              "n_traj": pa.array(ends - firsts, pa.int64())}
    for prefix, column in LATEST_VALUES:
        if column not in curve.column_names:
            continue
        values = curve[column].to_numpy().astype(np.float64)
        parts = [values[a:b] for a, b in zip(firsts, ends)]
        for name, stat in (("mean", np.mean), ("std", np.std), ("min", np.min), ("max", np.max)):
            out[f"{prefix}_{name}"] = pa.array([float(stat(p)) for p in parts], pa.float64())
    return pa.table(out)


# --- the curves of one committed version --------------------------------------------------------------------

CURVE_POINT = "curve_point"  # the column curves() keeps its rows by


def curves(engine: Engine, *, run_id: Names = None, env_id: Names = None, where: sql.Where | None = None,
           filter: EpisodeFilter | None = None, gamma: float | None = None,  # noqa: A002
           metric: str | None = None) -> pa.Table:
    """The complete episodes of each ``(run_id, env_id)`` in the order they ended, with ``total_env_steps``
    (:func:`total_env_steps`: counted over every episode of the series, whatever ``where``/``filter`` keep);
    with ``gamma`` adds ``discounted_return``, with ``metric`` (:mod:`~trajstore.query.metrics`) a column
    ``metric`` of its values (float64, null where an episode has none)."""
    with engine.query_snapshot(episodes="fill" if gamma is None else None) as snap:
        series = sql.conditions(run_id=run_id, env_id=env_id)
        chosen = sql.conditions(where=where, filter=filter)
        params = {"gamma": check_gamma(gamma)} if gamma is not None else {}
        src = "episodes" if gamma is None else \
            sql.subquery(snap.episodes_select(discounted=True))
        if metric is not None:
            src = Metric.parse(metric, snap.episode_columns, snap.step_columns, name=METRIC).source(src)
        if snap.materialized is not None and src == "episodes" and not series and not chosen:
            return walked(snap.materialized)  # every episode, the kept rows sorted here: no SQL sort
        walk = snap.arrow(sql.curve_episodes(series, chosen, source=src, flag=CURVE_POINT), params)
    walk = walk.append_column("total_env_steps", pa.array(total_env_steps(walk), pa.int64()))
    return plain_text(walk.filter(walk[CURVE_POINT]).drop_columns([CURVE_POINT]))


TOTAL_COLUMNS = ("run_id", "env_id", "worker_id", "episode_id", "env_steps", "episode_length")  # total_env_steps'


def walked(episodes: pa.Table) -> pa.Table:
    """What :func:`curves` gives of every episode of ``episodes`` (rows of the view, text maybe
    dictionary-encoded), without conditions: the complete episodes in :data:`~trajstore.query.sql.WALK` order (text
    in byte order, nulls last, as DuckDB orders them) with their ``total_env_steps``; one numpy sort of the keys
    instead of DuckDB's of every column, and every column taken once, of the complete episodes only (the series'
    env steps count the others too: they are walked in the few columns that count them)."""
    keys = []
    for name in reversed(sql.WALK):
        column = episodes[name]
        if pa.types.is_string(column.type) or pa.types.is_dictionary(column.type):
            keys.append(_text_rank(column))
        else:
            values = pc.cast(column, pa.int64()) if pa.types.is_timestamp(column.type) else column
            keys.append(pc.fill_null(values, np.iinfo(np.int64).max).to_numpy().astype(np.int64))
    order = np.lexsort(keys)
    total = total_env_steps(episodes.select(list(TOTAL_COLUMNS)).take(pa.array(order, pa.int64())))
    kept = pc.fill_null(episodes["complete"], False).to_numpy(zero_copy_only=False)[order]
    rows = episodes.take(pa.array(order[kept], pa.int64()))
    return plain_text(rows.append_column("total_env_steps", pa.array(total[kept], pa.int64())))


def _text_rank(column: pa.ChunkedArray) -> np.ndarray:
    """Each value's place among the column's distinct values in (byte) order, as SQL orders text; nulls last."""
    encoded = column.combine_chunks()
    if not pa.types.is_dictionary(encoded.type):
        encoded = pc.dictionary_encode(encoded)
    names = encoded.dictionary.to_pylist()
    rank = np.empty(len(names) + 1, np.int64)
    rank[np.argsort(np.asarray(names, dtype=object), kind="stable") if names else []] = np.arange(len(names))
    rank[len(names)] = len(names)
    return rank[pc.fill_null(encoded.indices, len(names)).to_numpy().astype(np.int64)]


def plain_text(table: pa.Table) -> pa.Table:
    """``table`` with its dictionary-encoded columns decoded (the types the view's SQL gives)."""
    for i, f in enumerate(table.schema):
        if pa.types.is_dictionary(f.type):
            table = table.set_column(i, f.name, table.column(i).cast(f.type.value_type))
    return table


def kept_curves(engine: Engine, **selection: object) -> pa.Table:
    """:func:`curves` of ``selection``, kept by the engine for the latest version (:meth:`Engine.memo
    <trajstore.query.engine.Engine.memo>`): a page draws several plots of one selection."""
    selection = {k: v for k, v in selection.items() if v is not None}  # None is every option's default: one key
    return engine.memo(f"curves {sorted(selection.items())!r}", lambda: curves(engine, **selection))  # type: ignore[arg-type]


def binned_curves(engine: Engine, *, x: str = "env_steps", y: str = "episode_return", bins: int = 800,
                  gamma: float | None = None, metric: str | None = None, by: str | None = None,
                  **selection: object) -> pa.Table:
    """Learning curves in ``bins`` bins along ``x``, one series per ``(run_id, env_id)``: per non-empty bin its
    edges (shared by all series), ``count``, ``mean`` and ``p10, p50, p90`` of ``y`` (or of ``metric``, any
    metric of :mod:`~trajstore.query.metrics`; episodes without a value are left out). With ``by`` (``agent_id``
    or ``agent_group``), one series per ``(run_id, env_id, agent)`` of the multi-agent episodes instead
    (:func:`binned_agent_curves`)."""
    if by is not None:
        if gamma is not None or metric is not None or y == "discounted_return":
            raise InputError(f"by: curves per agent bin each agent's own return or length (agent_return, "
                             f"agent_length), not discounted returns or metrics; give by={by!r} without gamma "
                             "and metric")
        key = f"binned by {by!r} {x!r} {y!r} {bins} {sorted(selection.items())!r}"
        return engine.memo(key, lambda: binned_agent_curves(engine, by=by, x=x, y=y, bins=bins, **selection),
                           local=True)
    check_binning(x, y, bins, gamma)
    key = f"binned {x!r} {y!r} {bins} {gamma!r} {metric!r} {sorted(selection.items())!r}"
    return engine.memo(key, lambda: _binned(engine, x, y, bins, gamma, metric, selection), local=True)


def _binned(engine: Engine, x: str, y: str, bins: int, gamma: float | None, metric: str | None,
            selection: dict[str, object]) -> pa.Table:
    column, measured = _measured(y, metric)
    curve = kept_curves(engine, gamma=gamma, metric=measured, **selection)
    xs = x_values(curve, x)
    edges = bin_edges(xs, bins)
    ys = y_values(curve, column)
    index = bin_index(xs, edges)
    index[~np.isfinite(ys)] = -1
    return bin_stats(engine.cursor(), curve, ys, index, edges)


AGENT_VALUES = {"episode_return": "agent_return", "episode_length": "agent_length"}  # y: an agent's own


def agent_curves(engine: Engine, *, by: str = "agent_id", **selection: object) -> pa.Table:
    """Per-agent learning curves: each complete episode of the (kept) learning curves once per agent that acted
    in it, with the agent (``by``: ``agent_id``, or ``agent_group`` pooling the agents of a group), its
    ``agent_return`` and ``agent_length``, and ``curve_row``, the episode's row of the curves (where it lies along
    every axis); the series ``(run_id, env_id, agent)`` together, each in the order its episodes ended.
    Single-agent episodes have no rows here."""
    curve = kept_curves(engine, **selection)
    names = {k: selection.get(k) for k in ("run_id", "env_id")}
    with engine.query_snapshot() as snap:
        agents = snap.arrow(sql.agent_curve_rows(by, sql.conditions(**names)))  # type: ignore[arg-type]
    if agents.num_rows == 0:  # single-agent runs only: no join over every episode of the curves
        return agents.append_column("curve_row", pa.array([], pa.int64()))
    rows = pa.table({"run_id": curve["run_id"], "env_id": curve["env_id"], "episode_id": curve["episode_id"],
                     "curve_row": pa.array(np.arange(curve.num_rows), pa.int64())})
    # the agents' rows are the join's build side (Acero's right): usually far fewer than the curves' episodes
    joined = rows.join(agents, keys=["run_id", "env_id", "episode_id"], join_type="inner")
    joined = joined.select(agents.column_names + ["curve_row"])
    return joined.sort_by([("run_id", "ascending"), ("env_id", "ascending"), (by, "ascending"),
                           ("curve_row", "ascending")])


def binned_agent_curves(engine: Engine, *, by: str = "agent_id", x: str = "env_steps", y: str = "episode_return",
                        bins: int = 800, **selection: object) -> pa.Table:
    """:func:`binned_curves` per agent: per ``(run_id, env_id, agent)`` series (the agent under the name ``by``)
    and non-empty bin along ``x`` (where each agent's episode lies in its run, as for the episode curves), the
    ``count``, ``mean`` and ``p10, p50, p90`` of the agent's own return (``y="episode_return"``) or length
    (``"episode_length"``)."""
    check_binning(x, y, bins, None)
    if y not in AGENT_VALUES:
        raise InputError(f"y: curves per agent show episode_return or episode_length (each agent's own), got {y!r}")
    curve = kept_curves(engine, **selection)
    agents = agent_curves(engine, by=by, **selection)
    xs = x_values(curve, x)[agents["curve_row"].to_numpy()]
    edges = bin_edges(xs, bins)
    ys = y_values(agents, AGENT_VALUES[y])
    index = bin_index(xs, edges)
    index[~np.isfinite(ys)] = -1
    return bin_stats(engine.cursor(), agents, ys, index, edges, series=("run_id", "env_id", by))


def histogram(engine: Engine, *, y: str = "episode_return", bins: int = 60, gamma: float | None = None,
              metric: str | None = None, density: bool = False, **selection: object) -> pa.Table:
    """The distribution of ``y`` (or of ``metric``) over the complete episodes of each ``(run_id, env_id)`` in
    at most ``bins`` bins shared by all series: ``run_id, env_id, bin, lo, hi, count`` per non-empty bin, and
    with ``density`` the ``density`` of each bin (its count over the series' episodes and the bin's width, as
    ``numpy.histogram(density=True)``: series of different sizes compare). Whole-number values are binned on
    whole numbers (:func:`whole_edges`); others as ``numpy.histogram_bin_edges``."""
    check_binning("episode_index", y, bins, gamma)
    key = f"histogram {y!r} {bins} {gamma!r} {metric!r} {density} {sorted(selection.items())!r}"
    return engine.memo(key, lambda: _histogram(engine, y, bins, gamma, metric, density, selection), local=True)


def _histogram(engine: Engine, y: str, bins: int, gamma: float | None, metric: str | None, density: bool,
               selection: dict[str, object]) -> pa.Table:
    column, measured = _measured(y, metric)
    curve = kept_curves(engine, gamma=gamma, metric=measured, **selection)
    ys = y_values(curve, column)
    edges = whole_edges(ys, bins)
    edges = bin_edges(ys, bins) if edges is None else edges
    out = bin_stats(engine.cursor(), curve, ys, bin_index(ys, edges), edges, quantiles=())
    return with_density(out) if density else out


def _measured(y: str, metric: str | None) -> tuple[str, str | None]:
    """The column of the curves that holds what is binned, and the metric the curves must compute for it
    (None: a column they always have)."""
    if metric is None or metric == y:
        return y, None
    if y != "episode_return":
        raise InputError(f"metric: give y or metric, not both (y={y!r}, metric={metric!r})")
    if metric in ("episode_return", "episode_length"):
        return metric, None
    return METRIC, metric


def whole_edges(values: np.ndarray, bins: int) -> np.ndarray | None:
    """Where every finite value is a whole number: edges halfway between whole numbers, each bin as many whole
    numbers wide (the fewest that keep to ``bins`` bins), so no bin holds more whole numbers than another (a
    bin of width 1.85 over returns 0..110 holds one or two of them: dips that are not in the data). None for
    other values."""
    finite = values[np.isfinite(values)]
    if not len(finite) or not np.all(finite == np.round(finite)) or np.abs(finite).max() >= 2.0 ** 52:
        return None  # past 2**52 a half is not a float: edges between whole numbers round onto them
    low, high = float(finite.min()), float(finite.max())
    span = high - low + 1
    width = max(1.0, float(np.ceil(span / bins)))
    return low - 0.5 + width * np.arange(int(np.ceil(span / width)) + 1)


def with_density(table: pa.Table) -> pa.Table:
    """``table`` (rows of :func:`histogram`) with ``density``: each bin's count over its series' total count and
    the bin's width; null for a bin of no width (values so large that their bin edges round to one float, such as
    returns of 1e17 that differ by less than 16: no density is defined there)."""
    if table.num_rows == 0:
        return table.append_column("density", pa.array([], pa.float64()))
    series = np.cumsum(series_starts(table)) - 1
    counts = table["count"].to_numpy().astype(np.float64)
    totals = np.bincount(series, weights=counts)[series]
    widths = (table["hi"].to_numpy() - table["lo"].to_numpy())
    defined = widths > 0
    density = np.divide(counts, totals * widths, out=np.zeros_like(counts), where=defined)
    return table.append_column("density", pa.array(density, pa.float64(), mask=~defined))


def latest_stats(engine: Engine, last: int = 100, *, gamma: float | None = None, **selection: object) -> pa.Table:
    """Statistics of the ``last`` complete episodes of each ``(run_id, env_id)`` to end (:func:`latest_of`),
    read from the kept learning curves (and kept)."""
    return engine.memo(f"latest {last} {gamma!r} {sorted(selection.items())!r}",
                       lambda: latest_of(kept_curves(engine, gamma=gamma, **selection), last), local=True)
