"""The store benchmark of issue 2: writer, statistics and return-to-go against baselines, in one run.

Everything is measured side by side on the same rollout and the same committed files; repeats of a
method and of its baseline are interleaved so that load from other processes hits both alike.
"""

from __future__ import annotations

import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

import baselines as base
import duckdb
import numpy as np
import pyarrow as pa
from data import Rollout, make_rollout
from timing import Timing

import trajstore
from trajstore.query.returns import return_to_go

GAMMA = 0.99
TARGET_STEPS = 10_000_000
FAST_REPEATS = 7  # at least this many runs of the methods that take well under a second
RUN_ID, ENV_ID = "bench", "CartPole-v1"
STAT_KEYS = ("n_traj", "return_min", "return_mean", "return_std", "return_max",
             "len_min", "len_mean", "len_std", "len_max")


@dataclass
class Target:
    """A target judged on median wall times; ``best`` and ``cpu`` are the same figure from the fastest runs
    and from median CPU times, shown to tell slowness from interference by other processes."""

    what: str
    measured: float
    required: float
    higher_is_better: bool
    fmt: str
    best: float | None = None
    cpu: float | None = None

    @property
    def passed(self) -> bool:
        return self.measured >= self.required if self.higher_is_better else self.measured <= self.required

    def show(self, value: float | None) -> str:
        return "—" if value is None else self.fmt.format(value)


@dataclass
class Results:
    rollout: dict[str, Any]
    writer: list[Timing]
    stats: list[Timing]
    returns: list[Timing]
    errors: dict[str, float]
    targets: list[Target]
    notes: list[str]


def _log(msg: str) -> None:
    print(f"[bench:store] {msg}", flush=True)


# --- writer --------------------------------------------------------------------------------------------------

def _write_store(rollout: Rollout, root: Path) -> trajstore.Store:
    store = trajstore.open(root, create=True)
    with store.writer(run_id=RUN_ID, env_id=ENV_ID) as w:
        for batch in rollout.batches:
            w.add_batch(batch)
    return store


def _interleaved(rounds: int, methods: list[tuple[Timing, Callable[[], Any]]]) -> None:
    """Run every method once per round, rotating which goes first, so drifting load hits all alike."""
    for i in range(rounds):
        k = i % len(methods)
        for timing, fn in methods[k:] + methods[:k]:
            timing.add(fn)


def bench_writer(rollout: Rollout, work: Path, repeats: int) -> tuple[list[Timing], trajstore.Store]:
    """The writer against bare ``pq.write_table`` of the user's own rows: the columns the user hands the writer
    (episode ids and steps as the store numbers them, every next_obs whole), already in one Arrow table, tuned as a
    user would tune the write (two settings; the target takes the faster). The store's rows re-written, lineage
    columns and all, is shown too, as it was measured before (issue 51): not a baseline, since that write does the
    store's extra work too."""
    n = rollout.steps
    writer = Timing("trajstore `store.writer().add_batch` × batches + `close()`", n,
                    note="segmentation + validation + Arrow conversion + lineage columns + Parquet + summaries + "
                    "fsync + Delta commit")
    own = "the user's own columns (episode_id, step, obs, action, reward, next_obs, terminated, truncated)"
    fair = Timing("bare `pq.write_table` of the user's rows (zstd, dictionary on action/terminated/truncated, "
                  "1Mi row groups)", n, note=f"{own} already in one Arrow table; one file, no fsync")
    plain = Timing("bare `pq.write_table` of the user's rows (zstd, no dictionary, 1Mi row groups)", n,
                   note="the same rows and file")
    rewritten = Timing("secondary, not a baseline: the store's rows re-written (lineage columns too; zstd, the "
                       "store's dictionaries, 1Mi row groups)", n,
                       note="the figure published before issue 51: the write does the store's extra columns too")
    # an untimed first run: the store the queries read, the rows for the bare writes, and warm-up
    # (imports, compiled kernels loaded from numba's cache, the page cache)
    store = _write_store(rollout, work / "store")
    # the user's rows as trajstore's readers give them back: every next_obs whole, the store's episode order
    stored = store.scan().read_all().drop_columns(["run_id", "env_id"])
    if stored.num_rows != n:
        raise AssertionError(f"writer stored {stored.num_rows} rows, expected {n}")
    rows = stored.select(list(base.USER_COLUMNS))

    def write_again() -> None:
        _write_store(rollout, work / "again")
        shutil.rmtree(work / "again")

    def bare(fn: Callable[[Path], None]) -> Callable[[], None]:
        return lambda: (fn(work / "bare.parquet"), (work / "bare.parquet").unlink())

    _interleaved(repeats, [(writer, write_again), (fair, bare(lambda p: base.write_user_rows(rows, p))),
                           (plain, bare(lambda p: base.write_user_rows(rows, p, dictionary=False))),
                           (rewritten, bare(lambda p: base.write_table_tuned(stored, p)))])
    _log(f"writer runs (s): {_runs(writer)}; user's rows: {_runs(fair)}, no dictionary: {_runs(plain)}; "
         f"store's rows re-written: {_runs(rewritten)}")
    return [writer, fair, plain, rewritten], store


def fair_baseline(writer: list[Timing]) -> Timing:
    """The faster (by median) of the two bare writes of the user's own rows."""
    return min(writer[1:3], key=lambda t: t.median)


def _runs(t: Timing) -> str:
    return ", ".join(f"{s:.2f}" for s in t.seconds)


# --- statistics ----------------------------------------------------------------------------------------------

def _same_stats(a: dict[str, Any], b: dict[str, Any], what: str, rtol: float = 1e-9) -> None:
    for k in STAT_KEYS:
        if not np.isclose(float(a[k]), float(b[k]), rtol=rtol, atol=rtol):
            raise AssertionError(f"{what}: {k} differs: {a[k]} vs {b[k]}")


def bench_stats(store: trajstore.Store, rollout: Rollout, repeats: int,
                imitation_steps: int) -> tuple[list[Timing], list[str]]:
    n = rollout.steps
    paths = [f.path for f in sorted(store.maintain.files(), key=lambda f: f.modified_ms)]
    con = duckdb.connect()
    sql = base.duckdb_stats_sql(paths)
    expected = base.duckdb_stats(con, sql)  # also warms up both (and the page cache)
    got = store.stats().to_pylist()[0]
    _same_stats(got, expected, "store.stats() vs DuckDB")
    if got["n_traj"] != rollout.complete_episodes:
        raise AssertionError(f"store.stats() counted {got['n_traj']} episodes, expected {rollout.complete_episodes}")

    cols = base.read_rows(paths, ["episode_id", "reward", "terminated", "truncated"])
    eid, rew = cols["episode_id"].to_numpy(), cols["reward"].to_numpy()
    done = cols["terminated"].to_numpy() | cols["truncated"].to_numpy()
    m = min(n, imitation_steps)
    sub = (eid[:m], rew[:m], done[:m])
    # imitation sums float32 rewards in float32, hence the tolerance
    _same_stats(base.imitation_style_stats(*sub), base.grouped_loop_stats(*sub), "imitation-style", rtol=1e-5)
    _same_stats(base.grouped_loop_stats(eid, rew, done), expected, "grouped loop")

    ours = Timing("trajstore `store.stats()`", n, note="a new `Store` each run (a Store keeps a version's "
                  "statistics): reads the Delta log and the files' summaries the writer wrote, aggregates")
    hand = Timing("hand-written DuckDB `GROUP BY episode_id` over the committed file list", n,
                  note="file list and connection prepared outside the timing")
    imitation = Timing("imitation-style: per-row Python appends per episode, arrays, `rollout_stats` loop", m,
                       note=f"on the first {m:,} rows, already in memory as numpy")
    grouped = Timing("numpy sort + split into per-episode arrays, Python loop over episodes", n,
                     note="rows already in memory as numpy")
    _interleaved(max(repeats, FAST_REPEATS), [(ours, lambda: trajstore.open(store.root).stats()),
                                              (hand, lambda: base.duckdb_stats(con, sql)),
                                              (imitation, lambda: base.imitation_style_stats(*sub))])
    _interleaved(max(1, repeats // 2), [(grouped, lambda: base.grouped_loop_stats(eid, rew, done))])
    con.close()
    notes = []
    if m < n:
        notes.append(f"The imitation-style baseline runs on the first {m:,} of the {n:,} rows (a Python loop "
                     "per row is linear in the rows); it is compared by steps/s.")
    return [ours, hand, grouped, imitation], notes


# --- return-to-go --------------------------------------------------------------------------------------------

def bench_returns(store: trajstore.Store, rollout: Rollout,
                  repeats: int) -> tuple[list[Timing], dict[str, float]]:
    n = rollout.steps
    paths = [f.path for f in sorted(store.maintain.files(), key=lambda f: f.modified_ms)]
    cols = base.read_rows(paths, ["episode_id", "step", "reward"])
    eid, step, rew = (cols[c].to_numpy() for c in ("episode_id", "step", "reward"))

    ref_order, ref = base.rtg_lfilter_per_episode(eid, step, rew, GAMMA)
    ours = Timing(f"trajstore `store.returns(gamma={GAMMA}, per=\"step\")`", n,
                  note="DuckDB read of the rows + kernel + rows reordered by (episode_id, step)")
    kernel = Timing("trajstore kernel `returns.return_to_go` alone", n,
                    note="numba; rows in file order, already in memory")
    looped = Timing("numpy/scipy: sort, `lfilter` per episode (float64)", n, note="also the float64 reference")
    vector = Timing("numpy/scipy: sort, one `lfilter` over all rows, boundary carry subtracted (float64)", n)

    out = store.returns(gamma=GAMMA, per="step")  # warm-up: numba's compile cache, DuckDB, page cache
    errors = {"store.returns": _check_rtg(out, eid, step, ref_order, ref)}
    order, g = return_to_go(eid, step, rew, GAMMA)
    if not np.array_equal(order, ref_order):
        raise AssertionError("return_to_go: row order differs from the (episode_id, step) sort")
    errors["returns.return_to_go"] = base.max_relative_error(g, ref)
    _interleaved(max(repeats, FAST_REPEATS), [(ours, lambda: store.returns(gamma=GAMMA, per="step")),
                                              (kernel, lambda: return_to_go(eid, step, rew, GAMMA))])
    _interleaved(repeats, [(vector, lambda: base.rtg_lfilter_global(eid, step, rew, GAMMA))])
    _interleaved(max(1, repeats // 2), [(looped, lambda: base.rtg_lfilter_per_episode(eid, step, rew, GAMMA))])
    errors["numpy one-lfilter"] = base.max_relative_error(base.rtg_lfilter_global(eid, step, rew, GAMMA)[1], ref)
    return [ours, kernel, looped, vector], errors


def _check_rtg(out: pa.Table, eid: np.ndarray, step: np.ndarray, ref_order: np.ndarray,
               ref: np.ndarray) -> float:
    if out.num_rows != len(ref):
        raise AssertionError(f"store.returns gave {out.num_rows} rows, expected {len(ref)}")
    if not (np.array_equal(out["episode_id"].to_numpy(), eid[ref_order])
            and np.array_equal(out["step"].to_numpy(), step[ref_order])):
        raise AssertionError("store.returns: rows are not ordered by (episode_id, step)")
    return base.max_relative_error(out["return_to_go"].to_numpy(), ref)


# --- the whole run -------------------------------------------------------------------------------------------

def run(steps: int, *, envs: int, horizon: int, repeats: int, imitation_steps: int, work: Path,
        seed: int = 0) -> Results:
    t0 = time.perf_counter()
    rollout = make_rollout(steps, envs=envs, horizon=horizon, seed=seed)
    _log(f"generated {rollout.steps:,} steps in {len(rollout.batches)} batches of (T={rollout.horizon}, "
         f"B={rollout.envs}), {rollout.complete_episodes:,} complete episodes "
         f"({time.perf_counter() - t0:.1f}s)")
    writer, store = bench_writer(rollout, work, repeats)
    stats, notes = bench_stats(store, rollout, repeats, imitation_steps)
    _log("stats done")
    returns, errors = bench_returns(store, rollout, repeats)
    _log("returns done")
    files = store.maintain.files()
    info = {"steps": rollout.steps, "envs": rollout.envs, "horizon": rollout.horizon,
            "batches": len(rollout.batches), "complete_episodes": rollout.complete_episodes,
            "truncated_episodes": rollout.truncated_episodes, "input_mb": rollout.bytes / 2**20,
            "files": len(files), "stored_mb": sum(f.size for f in files) / 2**20, "repeats": repeats}
    return Results(info, writer, stats, returns, errors, _targets(writer, stats, returns, errors), notes)


def _targets(writer: list[Timing], stats: list[Timing], returns: list[Timing],
             errors: dict[str, float]) -> list[Target]:
    ours, hand, _, imitation = stats
    secs: dict[str, Callable[[Timing], float]] = {"median": lambda t: t.median, "best": lambda t: min(t.seconds),
                                                  "cpu": lambda t: t.cpu_median}

    def each(fn: Callable[[Callable[[Timing], float]], float]) -> dict[str, float]:
        measured, best, cpu = (fn(secs[k]) for k in ("median", "best", "cpu"))
        return {"measured": measured, "best": best, "cpu": cpu}

    per_step = lambda t, f: f(t) / t.steps  # noqa: E731
    return [
        Target("writer throughput / bare `pq.write_table` of the user's own rows (the faster tuning)",
               required=0.80, higher_is_better=True, fmt="{:.0%}",
               **each(lambda f: f(fair_baseline(writer)) / f(writer[0]))),
        Target("`store.stats()` time / hand-written DuckDB time", required=1.5, higher_is_better=False,
               fmt="{:.2f}×", **each(lambda f: f(ours) / f(hand))),
        Target("`store.stats()` speed-up over imitation-style (per step)", required=10.0, higher_is_better=True,
               fmt="{:.0f}×", **each(lambda f: per_step(imitation, f) / per_step(ours, f))),
        Target("`store.returns(per=\"step\")` throughput (M steps/s)", required=20.0, higher_is_better=True,
               fmt="{:.1f}", **each(lambda f: returns[0].steps / f(returns[0]) / 1e6)),
        Target("return-to-go max relative error vs float64 reference",
               max(errors["store.returns"], errors["returns.return_to_go"]), 1e-5, False, "{:.1e}"),
    ]


# --- markdown ------------------------------------------------------------------------------------------------

def _timing_table(rows: list[Timing], baseline: Timing, ratio_label: str) -> list[str]:
    out = [f"| method | median s | steps/s | {ratio_label} | CPU s | runs (s) | notes |",
           "|---|---:|---:|---:|---:|---|---|"]
    for t in rows:
        runs = ", ".join(f"{s:.3f}" for s in t.seconds)
        out.append(f"| {t.name} | {t.median:.3f} | {t.rate / 1e6:.2f}M | {t.rate / baseline.rate:.2f}× "
                   f"| {t.cpu_median:.3f} | {runs} | {t.note} |")
    return out


def to_markdown(res: Results, machine: dict[str, str], command: str) -> str:
    r = res.rollout
    lines = ["## Store: writer, statistics, return-to-go (issue 2)", "",
             f"Generated by `{command}` on {machine['date']}. Every number below was measured in that one run; "
             f"times are medians of the runs listed (repeats of a method and of its baseline interleaved).", "",
             "### Targets", ""]
    if r["steps"] < TARGET_STEPS:
        lines += [f"The targets are set for {TARGET_STEPS:,} steps; at {r['steps']:,} fixed costs (Delta log, "
                  "DuckDB connections, thread start-up) dominate, so results here say little.", ""]
    lines += ["| target | measured (medians) | required | result | from the fastest runs | from CPU times |",
              "|---|---:|---:|---|---:|---:|"]
    for t in res.targets:
        req = ("≥ " if t.higher_is_better else "≤ ") + t.fmt.format(t.required)
        lines.append(f"| {t.what} | {t.show(t.measured)} | {req} | {'PASS' if t.passed else '**FAIL**'} "
                     f"| {t.show(t.best)} | {t.show(t.cpu)} |")
    lines += ["", "A target is judged on median wall times. The last two columns compute the same figure from "
              "each method's fastest run and from median CPU times; when they pass and the median does not, "
              "other processes slowed the run down (see the load averages under Machine)."]
    lines += ["", "### Data", "",
              f"{r['steps']:,} CartPole-sized steps (obs and next_obs float32[4], action int64, reward float32 1.0, "
              f"terminated/truncated bool) generated as {r['batches']} time-major batches of (T={r['horizon']}, "
              f"B={r['envs']}) with same-step autoreset; episode lengths geometric with mean 100, capped at 500 "
              f"(truncated). {r['complete_episodes']:,} complete episodes ({r['truncated_episodes']:,} truncated) "
              f"plus {r['envs']:,} still running at the end; episodes cross batch boundaries. "
              f"Input arrays {r['input_mb']:.0f} MiB; the store holds {r['files']} committed files, "
              f"{r['stored_mb']:.0f} MiB (observations are random, so they barely compress).", "",
              "### Writer", ""]
    lines += _timing_table(res.writer, fair_baseline(res.writer), "vs the user's rows")
    lines += ["", "### Episode statistics (`n_traj`, `return_*`, `len_*`)", ""]
    lines += _timing_table(res.stats, res.stats[1], "vs DuckDB")
    lines += ["", f"### Per-step return-to-go (gamma = {GAMMA})", ""]
    lines += _timing_table(res.returns, res.returns[2], "vs looped numpy")
    lines += ["", "| result | max relative error vs float64 reference |", "|---|---:|"]
    lines += [f"| {k} | {v:.1e} |" for k, v in res.errors.items()]
    notes = [
        "The writer's baseline is what a user would write by hand from the columns they hand the writer: episode_id, "
        "step, obs, action, reward, next_obs (every one whole, as trajstore's readers give them back), terminated, "
        "truncated, already in one Arrow table in the store's row order (building it is not timed), written with "
        "`pq.write_table` as a user would tune it: zstd and 1Mi-row groups, dictionaries on action, terminated and "
        "truncated or on no column; the target takes the faster of the two. It writes one file with no fsync, no "
        "commit, no check. The writer also numbers episodes and steps, checks every step, adds the lineage columns "
        "(wall_time, env_steps, env_index, worker_id), writes next_obs only where it is not the next step's obs "
        "(`next_obs_sparse`), writes each file's episode summary, fsyncs each file and commits it; its time runs from "
        "the first `add_batch` to the end of `close()`. The loaders' array copies are made by the first loader that "
        "reads a file, not by the writer (unless `TRAJSTORE_WRITER_ARRAYS=1`). The last row re-writes the store's "
        "rows with their lineage columns, the baseline published before issue 51: it does the store's extra work "
        "too, so it is shown only for comparison.",
        "`store.stats()` is timed end to end on a new `Store` each run (Delta log, DuckDB connection, query): "
        "it reads no step, but each file's summary (its episodes' partial aggregates, which the writer wrote "
        "beside the table with the file, from the rows in memory) and combines them; the writer's time above "
        "includes writing them. The hand-written DuckDB query groups the steps of the committed files, its file "
        "list and connection given for free. Results of all statistics methods are checked to agree.",
        "The Python baselines start from rows already in memory as numpy arrays (their read is not timed), "
        "which favours them.",
        "The float64 reference for return-to-go is scipy's `lfilter` run per episode (the recursion "
        "`G_t = r_t + gamma G_{t+1}` in float64); `store.returns` is also checked to be ordered by "
        "(episode_id, step). It returns run_id and env_id dictionary-encoded (DuckDB ENUMs), so the 10M-row "
        "result holds a byte per row for them instead of a string.",
        "The machine has few cores and other work may run at the same time: ratios from one run are more "
        "trustworthy than absolute numbers. CPU s is the process's CPU time (all threads) for one run, the "
        "median over runs: it is less disturbed by other processes than wall time, but counts work that "
        "overlaps in wall time (the writer orders and encodes each buffer on a thread of its own, two at a time) "
        "and misses I/O waits.",
    ] + res.notes
    lines += ["", "### Notes", ""] + [f"- {n}" for n in notes]
    lines += ["", "### Machine", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in machine.items()]
    return "\n".join(lines) + "\n"
