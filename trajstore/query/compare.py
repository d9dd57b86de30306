"""Which configuration is better, and how sure we are: rliable's aggregate statistics (Agarwal et al., NeurIPS 2021)
over the runs × tasks scores of each group of runs, with stratified bootstrap confidence intervals.

The score of one run on one task is the mean ``metric`` (:mod:`~trajstore.query.metrics`) of its last ``last``
complete episodes in that task (``task``: a column of the ``episodes`` view, ``env_id`` by default), latest by
``env_steps`` then by episode end; ``mode="eval"`` keeps evaluation episodes only; ``normalize={task: (low, high)}``
maps each score to ``(x - low) / (high - low)``. A group (runs sharing their ``by`` values, e.g.
``by="config.algo"``) holds one score per run and task: its score matrix.

Statistics, as rliable defines them over a group's matrix: ``mean`` and ``median`` of the per-task mean scores,
``iqm`` the 25% trimmed mean of every score pooled (``scipy.stats.trim_mean``), ``optimality_gap`` the mean shortfall
of the scores below 1.0 (``1 - mean(min(x, 1))``; only with ``normalize``, else null). Intervals: percentile
intervals of ``reps`` stratified bootstrap replications (each task's runs resampled with replacement, tasks kept), as
rliable's ``get_interval_estimates``; the probability of improvement resamples the two groups independently
(rliable's ``StratifiedIndependentBootstrap``). Tasks may hold different numbers of runs (rliable asks for a full
matrix; equal counts give its numbers).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError
from trajstore.query import budget, sql, sql_worker
from trajstore.query.curves import bin_edges, bin_index
from trajstore.query.engine import Engine
from trajstore.query.filters import Names, names_of
from trajstore.query.metrics import Metric
from trajstore.query.snapshot import check_names
from trajstore.storage import run_config

STATISTICS = ("iqm", "median", "mean", "optimality_gap")
MODES = ("train", "eval")


@dataclass(frozen=True)
class Scores:
    """The scores of each group: group values -> per-task arrays of run scores (tasks sorted), and its runs."""

    by: list[str]
    tasks: list[str]
    groups: dict[tuple[Any, ...], list[np.ndarray]]
    runs: dict[tuple[Any, ...], int]
    normalized: bool
    run_ids: dict[tuple[Any, ...], list[list[str]]]  # per group and task, the run of each score

    def table(self) -> pa.Table:
        """One row per group, task and run: the ``by`` values, ``task``, ``run_id`` and ``score`` (normalized
        where the scores are)."""
        rows: dict[str, list[Any]] = {k: [] for k in [*self.by, "task", "run_id", "score"]}
        for group, matrix in self.groups.items():
            for task, values, runs in zip(self.tasks, matrix, self.run_ids[group]):
                for value, run in zip(values.tolist(), runs):
                    for k, v in zip(self.by, group):
                        rows[k].append(v)
                    rows["task"].append(task)
                    rows["run_id"].append(run)
                    rows["score"].append(value)
        return pa.table({**{k: rows[k] for k in self.by}, "task": pa.array(rows["task"], pa.string()),
                         "run_id": pa.array(rows["run_id"], pa.string()),
                         "score": pa.array(rows["score"], pa.float64())})


def scores(engine: Engine, by: Names, *, metric: str = "episode_return", task: str = "env_id", last: int = 100,
           mode: str | None = None, normalize: Mapping[str, Sequence[float]] | None = None, run_id: Names = None,
           where: sql.Where | None = None) -> Scores:
    """Every group's score matrix (see the module's docstring); a group without a score on a task another group
    has is an :class:`InputError` naming both."""
    keys = _keys(by)
    if not isinstance(last, int) or isinstance(last, bool) or last < 1:
        raise InputError(f"last: expected a positive number of episodes, got {last!r}")
    table = _query(engine, keys, metric, task, mode, run_id, where,
                   lambda name, conds, source: sql.run_scores(keys, task, name, last=last, conds=conds, source=source))
    return _matrices(table, keys, normalize)


def _keys(by: Names) -> list[str]:
    keys = names_of(by)
    if not keys:
        raise InputError("by: name what the groups differ in, e.g. by=\"config.algo\"")
    return keys


def _query(engine: Engine, keys: list[str], metric: str, task: str, mode: str | None, run_id: Names,
           where: sql.Where | None, select: Callable[[str, list[str], str], str]) -> pa.Table:
    """``select(metric column, conditions, source)`` over the ``episodes`` view of the runs ``run_id`` with the
    group's config values and the metric as columns."""
    if mode is not None and mode not in MODES:
        raise InputError(f"mode: expected one of {MODES} or None, got {mode!r}")
    paths = {k: path for k in keys if (path := run_config.config_key(k)) is not None}
    with engine.query_snapshot(episodes="if-cached", run_id=run_id) as snap:
        snap.check_columns([k for k in keys if k not in paths])
        snap.check_columns([task], field="task")
        chosen = Metric.parse(metric, snap.episode_columns, snap.step_columns)
        source = "episodes"
        if paths:
            snap.use_runs(engine.runs_table(snap.files, paths))
            source = sql.with_config(source, paths)
        source = chosen.source(source)
        if where is not None and not isinstance(where, str):  # parsed (REST): its columns named before it runs
            check_names(where.columns, [*snap.episode_columns, *paths], view="episodes", field="where")
        conds = sql.conditions(where=where)
        if mode is not None:
            if "mode" not in snap.step_columns:
                raise InputError(f"mode: no episode of these runs records a mode; mode={mode!r} selects nothing")
            conds.append(f"mode = {sql.literal(mode)}")
        return snap.arrow(select(chosen.name, conds, source))


def _matrices(table: pa.Table, keys: list[str], normalize: Mapping[str, Sequence[float]] | None) -> Scores:
    rows = table.to_pydict()
    if not rows["task"]:
        raise InputError("compare: no complete episode has a score here (check run_id, where, mode and metric)")
    tasks = sorted({str(t) for t in rows["task"]})
    bounds = _bounds(normalize, tasks)
    cells: dict[tuple[Any, ...], dict[str, list[float]]] = {}
    labels: dict[tuple[Any, ...], dict[str, list[str]]] = {}
    runs: dict[tuple[Any, ...], set[str]] = {}
    for i, task in enumerate(rows["task"]):
        group = tuple(rows[k][i] for k in keys)
        score = rows["score"][i]
        if score is None:  # the metric is null in every episode kept
            continue
        if bounds is not None:
            low, high = bounds[str(task)]
            score = (score - low) / (high - low)
        cells.setdefault(group, {}).setdefault(str(task), []).append(float(score))
        labels.setdefault(group, {}).setdefault(str(task), []).append(str(rows["run_id"][i]))
        runs.setdefault(group, set()).add(rows["run_id"][i])
    missing = [f"{_named(keys, g)} on {', '.join(repr(t) for t in tasks if t not in c)}"
               for g, c in sorted(cells.items(), key=lambda kv: _order(kv[0])) if set(c) != set(tasks)]
    if missing:
        raise InputError(f"compare: some groups have no score on a task others have: {'; '.join(missing)} "
                         "(no complete episode there); select the tasks every group ran with where= or run_id=")
    groups = {g: [np.asarray(c[t], np.float64) for t in tasks] for g, c in sorted(cells.items(),
                                                                                  key=lambda kv: _order(kv[0]))}
    return Scores(keys, tasks, groups, {g: len(r) for g, r in runs.items()}, bounds is not None,
                  {g: [labels[g][t] for t in tasks] for g in groups})


def _bounds(normalize: Mapping[str, Sequence[float]] | None, tasks: list[str]) -> dict[str, tuple[float, float]] | None:
    if normalize is None:
        return None
    if not isinstance(normalize, Mapping):
        raise InputError(f"normalize: expected {{task: (low, high)}}, got {type(normalize).__name__}")
    lacking = [t for t in tasks if t not in normalize]
    if lacking:
        raise InputError(f"normalize: no (low, high) for task(s) {', '.join(map(repr, lacking))}")
    out = {}
    for t in tasks:
        try:
            low, high = (float(v) for v in normalize[t])
        except (TypeError, ValueError):
            raise InputError(f"normalize: {t!r}: expected (low, high), got {normalize[t]!r}") from None
        if not np.isfinite([low, high]).all() or high == low:
            raise InputError(f"normalize: {t!r}: expected finite low != high, got ({low}, {high})")
        out[t] = (low, high)
    return out


def _named(keys: list[str], group: tuple[Any, ...]) -> str:
    return ", ".join(f"{k}={v!r}" for k, v in zip(keys, group))


def _order(group: tuple[Any, ...]) -> tuple[Any, ...]:
    return tuple((v is None, str(v)) for v in group)


# --- statistics over a group's matrix: each takes per-task arrays shaped (..., runs) -------------------------------

def _task_means(matrix: Sequence[np.ndarray]) -> np.ndarray:
    return np.stack([m.mean(axis=-1) for m in matrix], axis=-1)


def _pooled(matrix: Sequence[np.ndarray]) -> np.ndarray:
    return np.concatenate(list(matrix), axis=-1)


def iqm(matrix: Sequence[np.ndarray]) -> np.ndarray:
    """The interquartile mean of every score pooled (``scipy.stats.trim_mean(x, 0.25)``)."""
    pooled = np.sort(_pooled(matrix), axis=-1)
    n = pooled.shape[-1]
    cut = int(0.25 * n)
    return pooled[..., cut:n - cut].mean(axis=-1)


def median(matrix: Sequence[np.ndarray]) -> np.ndarray:
    return np.median(_task_means(matrix), axis=-1)


def mean(matrix: Sequence[np.ndarray]) -> np.ndarray:
    return _task_means(matrix).mean(axis=-1)


def optimality_gap(matrix: Sequence[np.ndarray], gamma: float = 1.0) -> np.ndarray:
    return gamma - np.minimum(_pooled(matrix), gamma).mean(axis=-1)


FUNCTIONS: dict[str, Callable[[Sequence[np.ndarray]], np.ndarray]] = {
    "iqm": iqm, "median": median, "mean": mean, "optimality_gap": optimality_gap}


def resampled(matrix: Sequence[np.ndarray], reps: int, rng: np.random.Generator) -> list[np.ndarray]:
    """``reps`` stratified bootstrap replications of a matrix: each task's runs drawn with replacement,
    ``(reps, runs)`` per task."""
    return [m[rng.integers(0, len(m), size=(reps, len(m)))] for m in matrix]


def computed(function: str, *args: Any, **kwargs: Any) -> pa.Table:
    """``function`` (a name of :data:`~trajstore.query.sql_worker.COMPUTATIONS`: a bootstrap over scores already
    read) of ``args``: here, or in a worker process when the current budget asks for one (the service's requests:
    their memory capped, their time enforced, the service's interpreter left to cheap requests)."""
    limits = budget.current()
    if limits.worker_bytes is not None:
        return sql_worker.compute(function, args, kwargs, limits)
    _, name = sql_worker.COMPUTATIONS[function].split(":")  # a function of this module
    return globals()[name](*args, **kwargs)


REP_BLOCK = 256  # replications drawn and reduced at a time: what one request holds at once, whatever its reps
DRAWN_BYTES = 4 * 8  # per resampled score: its index, its value, and the copies a statistic makes (a sort)


def bootstrap(matrices: Sequence[Sequence[np.ndarray]], reps: int, rng: np.random.Generator,
              statistic: Callable[..., np.ndarray], *, extra_bytes: int = 0) -> np.ndarray:
    """``statistic(*replicated)`` over ``reps`` stratified replications of each matrix (:func:`resampled`), drawn
    and reduced :data:`REP_BLOCK` replications at a time, so that memory does not grow with ``reps`` (the draws do
    not depend on it either): the values stacked, ``(reps, …)``. Within the current budget
    (:mod:`~trajstore.query.budget`): a block that needs more memory than it allows (``extra_bytes`` per
    replication beyond the resampled scores) is refused before it is drawn, and the time is checked between
    blocks."""
    limits = budget.current()
    scores = sum(len(m) for matrix in matrices for m in matrix)
    limits.afford(min(reps, REP_BLOCK) * (scores * DRAWN_BYTES + extra_bytes),
                  hint="compare fewer runs or tasks at once (run_id=, where=), or ask for fewer thresholds")
    values = []
    for start in range(0, reps, REP_BLOCK):
        limits.check_time()
        values.append(statistic(*[resampled(m, min(REP_BLOCK, reps - start), rng) for m in matrices]))
    return np.concatenate(values)


def interval(values: np.ndarray, ci: float) -> tuple[float, float]:
    """The percentile interval holding ``ci`` of bootstrap ``values``."""
    low, high = np.percentile(values, [50 * (1 - ci), 50 * (1 + ci)])
    return float(low), float(high)


def check_bootstrap(ci: float, reps: int) -> None:
    if not isinstance(ci, (int, float)) or isinstance(ci, bool) or not 0 < ci < 1:
        raise InputError(f"ci: expected a confidence level between 0 and 1 (0.95), got {ci!r}")
    if not isinstance(reps, int) or isinstance(reps, bool) or not 1 <= reps <= 1_000_000:
        raise InputError(f"reps: expected a number of bootstrap replications from 1 to 1,000,000, got {reps!r}")


def compare(found: Scores, *, statistics: Sequence[str] = STATISTICS, ci: float = 0.95, reps: int = 2000,
            seed: int = 0) -> pa.Table:
    """One row per group and statistic: the group's ``by`` values, ``statistic``, ``value``, ``ci_low``,
    ``ci_high``, ``n_runs``, ``n_tasks``."""
    check_bootstrap(ci, reps)
    names = [statistics] if isinstance(statistics, str) else list(statistics)
    unknown = [s for s in names if s not in FUNCTIONS]
    if unknown or not names:
        raise InputError(f"statistics: unknown {unknown or names}; expected some of {list(STATISTICS)}")
    rows: dict[str, list[Any]] = {k: [] for k in [*found.by, "statistic", "value", "ci_low", "ci_high", "n_runs",
                                                  "n_tasks"]}
    rng = np.random.default_rng(seed)
    for group, matrix in found.groups.items():
        boot = bootstrap([matrix], reps, rng, lambda m: np.stack([FUNCTIONS[n](m) for n in names], axis=-1))
        for j, name in enumerate(names):
            if name == "optimality_gap" and not found.normalized:
                value, low, high = None, None, None  # a gap to 1.0 means something for normalized scores only
            else:
                value = float(FUNCTIONS[name](matrix))
                low, high = interval(boot[:, j], ci)
            for k, v in zip(found.by, group):
                rows[k].append(v)
            rows["statistic"].append(name)
            rows["value"].append(value)
            rows["ci_low"].append(low)
            rows["ci_high"].append(high)
            rows["n_runs"].append(found.runs[group])
            rows["n_tasks"].append(len(found.tasks))
    return pa.table({k: pa.array(v, type=pa.float64() if k in ("value", "ci_low", "ci_high") else None)
                     for k, v in rows.items()})


def group_of(found: Scores, value: Any, what: str) -> tuple[Any, ...]:
    """The group ``value`` names (its ``by`` value, or a tuple of them for several keys)."""
    wanted = tuple(value) if isinstance(value, (tuple, list)) else (value,)
    for group in found.groups:
        if len(group) == len(wanted) and all(g == w or str(g) == str(w) for g, w in zip(group, wanted)):
            return group
    raise InputError(f"{what}: no group {value!r} of {', '.join(found.by)}; the groups: "
                     f"{', '.join(repr(g[0] if len(g) == 1 else g) for g in found.groups)}")


def improvement(x: Sequence[np.ndarray], y: Sequence[np.ndarray]) -> np.ndarray:
    """P(X > Y) averaged over tasks (ties count half; the Mann-Whitney U over ``nx * ny``), per replication."""
    out = []
    for a, b in zip(x, y):
        diff = a[..., :, None] - b[..., None, :]
        out.append(((diff > 0).sum(axis=(-2, -1)) + 0.5 * (diff == 0).sum(axis=(-2, -1))) / (a.shape[-1] * b.shape[-1]))
    return np.mean(out, axis=0)


def probability_of_improvement(found: Scores, x: Any, y: Any, *, ci: float = 0.95, reps: int = 2000,
                               seed: int = 0) -> dict[str, Any]:
    """P(a run of group ``x`` scores higher than one of group ``y`` on the same task), averaged over tasks, with
    its interval (the two groups resampled independently, each within its tasks)."""
    row = computed("improvement", found, x, y, ci=ci, reps=reps, seed=seed).to_pylist()[0]
    return {"x": x, "y": y, **row}


def improvement_table(found: Scores, x: Any, y: Any, *, ci: float = 0.95, reps: int = 2000,
                      seed: int = 0) -> pa.Table:
    """:func:`probability_of_improvement` as one row: ``value``, ``ci_low``, ``ci_high``, ``n_tasks``."""
    check_bootstrap(ci, reps)
    gx, gy = group_of(found, x, "x"), group_of(found, y, "y")
    rng = np.random.default_rng(seed)
    value = float(improvement(found.groups[gx], found.groups[gy]))
    pairs = max(len(a) * len(b) for a, b in zip(found.groups[gx], found.groups[gy]))
    boot = bootstrap([found.groups[gx], found.groups[gy]], reps, rng, improvement, extra_bytes=pairs * 10)
    low, high = interval(boot, ci)
    return pa.table({"value": [value], "ci_low": [low], "ci_high": [high], "n_tasks": [len(found.tasks)]})


def profile(matrix: Sequence[np.ndarray], thresholds: np.ndarray) -> np.ndarray:
    """The fraction of runs scoring above each threshold, averaged over tasks: ``(..., thresholds)``."""
    return np.mean([(m[..., None] > thresholds).mean(axis=-2) for m in matrix], axis=0)


def performance_profile(found: Scores, thresholds: Sequence[float], *, ci: float = 0.95, reps: int = 2000,
                        seed: int = 0) -> pa.Table:
    """One row per group and threshold: the group's ``by`` values, ``threshold``, ``value`` (the fraction of runs
    scoring above it, averaged over tasks), ``ci_low``, ``ci_high``."""
    check_bootstrap(ci, reps)
    taus = np.asarray(thresholds, np.float64).reshape(-1)
    if not len(taus) or not np.isfinite(taus).all():
        raise InputError(f"thresholds: expected finite scores, got {thresholds!r}")
    rows: dict[str, list[Any]] = {k: [] for k in [*found.by, "threshold", "value", "ci_low", "ci_high"]}
    rng = np.random.default_rng(seed)
    for group, matrix in found.groups.items():
        value = profile(matrix, taus)
        # each score of a task against each threshold (a bool), then each task's fraction above each (a double)
        compared = max(len(m) for m in matrix) * len(taus) + len(matrix) * len(taus) * 8
        boot = bootstrap([matrix], reps, rng, lambda m: profile(m, taus), extra_bytes=compared)
        for j, tau in enumerate(taus):
            low, high = interval(boot[:, j], ci)
            for k, v in zip(found.by, group):
                rows[k].append(v)
            rows["threshold"].append(float(tau))
            rows["value"].append(float(value[j]))
            rows["ci_low"].append(low)
            rows["ci_high"].append(high)
    return pa.table(rows)


# --- learning curves across runs ------------------------------------------------------------------------------

AGGREGATES = ("mean", "iqm")


def group_curves(engine: Engine, by: Names, *, metric: str = "episode_return", task: str = "env_id",
                 bins: int = 50, aggregate: str = "iqm", ci: float = 0.95, reps: int = 1000, seed: int = 0,
                 mode: str | None = None, run_id: Names = None, where: sql.Where | None = None) -> pa.Table:
    """Learning curves of each group of runs on each task: the complete episodes binned by ``env_steps`` (``bins``
    bins shared by all, as ``numpy.histogram``); in each bin a run's value is the mean ``metric`` of its episodes
    there, and the group's the ``aggregate`` (``mean`` or ``iqm``) of its runs' values, with a percentile
    bootstrap band over its runs. One row per (group, task, non-empty bin): the ``by`` values, ``task``, ``bin``,
    ``lo``, ``hi``, ``value``, ``ci_low``, ``ci_high``, ``n_runs`` (the runs with an episode in the bin)."""
    keys = _keys(by)
    check_bootstrap(ci, reps)
    if aggregate not in AGGREGATES:
        raise InputError(f"aggregate: expected one of {AGGREGATES}, got {aggregate!r}")
    if not isinstance(bins, int) or isinstance(bins, bool) or not 1 <= bins <= 10_000:
        raise InputError(f"bins: expected a number of bins from 1 to 10,000, got {bins!r}")
    points = _query(engine, keys, metric, task, mode, run_id, where,
                    lambda name, conds, source: sql.episode_points(keys, task, name, conds=conds, source=source))
    return computed("group_curves", points, keys, bins=bins, aggregate=aggregate, ci=ci, reps=reps, seed=seed)


def curves_of_points(points: pa.Table, keys: list[str], *, bins: int, aggregate: str, ci: float, reps: int,
                     seed: int) -> pa.Table:
    """The rows of :func:`group_curves` from each complete episode's point (``x``: its ``env_steps``, ``y``: its
    metric, its run, task and ``keys`` values)."""
    x = points["x"].to_numpy(zero_copy_only=False).astype(np.float64)
    y = points["y"].to_numpy(zero_copy_only=False).astype(np.float64)
    edges = bin_edges(x, bins)
    index = bin_index(x, edges)
    columns = {k: points[k].to_pylist() for k in [*keys, "run_id", "task"]}
    rows: dict[str, list[Any]] = {k: [] for k in [*keys, "task", "bin", "lo", "hi", "value", "ci_low", "ci_high",
                                                  "n_runs"]}
    per_run: dict[tuple[Any, ...], dict[int, dict[str, list[float]]]] = {}
    for i in np.flatnonzero((index >= 0) & np.isfinite(y)):
        group = tuple(columns[k][i] for k in keys) + (columns["task"][i],)
        per_run.setdefault(group, {}).setdefault(int(index[i]), {}).setdefault(columns["run_id"][i], []).append(y[i])
    reduce = iqm if aggregate == "iqm" else mean
    rng = np.random.default_rng(seed)
    for group in sorted(per_run, key=_order):
        for b, runs in sorted(per_run[group].items()):
            values = np.array([np.mean(np.sort(runs[r])) for r in sorted(runs)])  # an order of its own: repeatable
            boot = bootstrap([[values]], reps, rng, lambda m: reduce(m))
            low, high = interval(boot, ci)
            for k, v in zip([*keys, "task"], group):
                rows[k].append(v)
            rows["bin"].append(b)
            rows["lo"].append(float(edges[b]))
            rows["hi"].append(float(edges[b + 1]))
            rows["value"].append(float(reduce([values])))
            rows["ci_low"].append(low)
            rows["ci_high"].append(high)
            rows["n_runs"].append(len(values))
    return pa.table(rows)
