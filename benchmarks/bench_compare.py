"""store.compare against rliable (issue 31): 2,000 stratified bootstrap replications over 100 runs × 10 tasks.

    python benchmarks/bench_compare.py                   # writes the compare section of docs/benchmarks.md
    python benchmarks/bench_compare.py --out /dev/stdout

A store of 2 configs × 50 seeds × 10 tasks (1,000 runs of one task each, so 100 runs per task; 100 episodes of 10
steps per run, 1M steps) is written once into ``.cache/bench-compare``. Measured, medians of ``--repeats``,
methods interleaved: ``store.compare(by="config.algo")`` end to end on a new ``Store`` each time (reading the
scores out of the episodes, then the four statistics with intervals), also with the files' summaries removed first
(the first read of a store, which computes them); the statistics alone on the same score
matrices (trajstore.query.compare); and rliable's ``get_interval_estimates`` on those matrices with the same four
statistics and replications (its point estimates checked equal to trajstore's).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from report import load_average, machine_info, output_options, publish  # noqa: E402

import trajstore  # noqa: E402
from trajstore.query import compare as cmp  # noqa: E402
from trajstore.query.engine import Engine  # noqa: E402
from trajstore.settings import Settings  # noqa: E402
from trajstore.storage.location import locate  # noqa: E402
from trajstore.storage.summaries import FOLDER as SUMMARIES  # noqa: E402
from trajstore.storage.table import StepsTable  # noqa: E402

ALGOS, SEEDS, TASKS, EPISODES, LENGTH, REPS = ("a", "b"), 50, 10, 100, 10, 2000
STORE = REPO / ".cache" / "bench-compare" / "store"


def write_store(path: Path) -> trajstore.Store:
    """One writer per run: ``EPISODES`` episodes of ``LENGTH`` steps, rewards drawn around the run's level."""
    if (path / "done").exists():
        return trajstore.open(path)
    import shutil

    shutil.rmtree(path, ignore_errors=True)
    store = trajstore.open(path, create=True)
    rng = np.random.default_rng(0)
    T = EPISODES * LENGTH
    terminated = np.zeros((T, 1), bool)
    terminated[LENGTH - 1::LENGTH] = True
    obs = np.zeros((T + 1, 1, 2), np.float32)
    for a, algo in enumerate(ALGOS):
        for seed in range(SEEDS):
            for task in range(TASKS):
                level = rng.normal(1.0 + 0.2 * a + 0.1 * task, 0.3)
                reward = rng.normal(level, 0.5, (T, 1)).astype(np.float32)
                with store.writer(run_id=f"{algo}-{seed}-{task}", env_id=f"Task{task}-v0",
                                  config={"algo": algo, "seed": seed}) as w:
                    w.add_batch({"obs": obs[:-1], "next_obs": obs[1:], "action": np.zeros((T, 1), np.int64),
                                 "reward": reward, "terminated": terminated, "truncated": np.zeros((T, 1), bool)})
    (path / "done").write_text("")
    return store


def rliable_statistics(matrix: np.ndarray) -> np.ndarray:
    from rliable import metrics

    return np.array([metrics.aggregate_iqm(matrix), metrics.aggregate_median(matrix), metrics.aggregate_mean(matrix),
                     metrics.aggregate_optimality_gap(matrix)])


def timed(fn: Callable[[], Any]) -> float:
    started = time.perf_counter()
    fn()
    return time.perf_counter() - started


def run(repeats: int) -> dict[str, Any]:
    import warnings

    from rliable import library as rly

    warnings.filterwarnings("ignore", message="random_state is deprecated")
    t0 = time.perf_counter()
    store = write_store(STORE)
    written_s = time.perf_counter() - t0
    bounds = {f"Task{t}-v0": (0.0, 30.0) for t in range(TASKS)}  # normalized: the optimality gap is computed too
    location, settings = locate(store.uri), Settings.from_env()  # the query layer, as a Store opens it
    engine = Engine(StepsTable.of_store(location, settings), location, settings)
    found = cmp.scores(engine, "config.algo", normalize=bounds)
    matrices = {g[0]: np.stack(m, axis=1) for g, m in found.groups.items()}  # (runs, tasks) each
    assert all(m.shape == (SEEDS, TASKS) for m in matrices.values()), {k: m.shape for k, m in matrices.items()}
    ours = cmp.compare(found, reps=REPS)
    points, _ = rly.get_interval_estimates(matrices, rliable_statistics, reps=REPS)
    for algo, point in points.items():
        got = [r["value"] for r in ours.to_pylist() if r["config.algo"] == algo]
        np.testing.assert_allclose(got, point, rtol=1e-9, err_msg=algo)

    times: dict[str, list[float]] = {"end": [], "first": [], "stats": [], "rliable": []}
    for _ in range(repeats):
        times["end"].append(timed(lambda: trajstore.open(STORE).compare("config.algo", normalize=bounds, reps=REPS)))
        shutil.rmtree(STORE / SUMMARIES, ignore_errors=True)  # as if no reader had opened the files yet
        times["first"].append(timed(lambda: trajstore.open(STORE).compare("config.algo", normalize=bounds,
                                                                         reps=REPS)))
        times["stats"].append(timed(lambda: cmp.compare(found, reps=REPS)))
        times["rliable"].append(timed(lambda: rly.get_interval_estimates(matrices, rliable_statistics, reps=REPS)))
    return {"written_s": written_s, **{k: statistics.median(v) for k, v in times.items()},
            "runs": {k: v for k, v in times.items()}}


def report(res: dict[str, Any], machine: dict[str, str], repeats: int) -> str:
    end, stats, rl = res["end"], res["stats"], res["rliable"]
    rows = [
        ("`store.compare(by=\"config.algo\", normalize=…)`, a new Store: scores read from the episodes + statistics",
         end),
        ("the same, the first read of the files (no summaries yet: computed from the steps and kept)", res["first"]),
        ("the four statistics with intervals on the score matrices (`trajstore.query.compare.compare`)", stats),
        ("rliable `get_interval_estimates` on the same matrices, the same four statistics", rl),
    ]
    lines = [
        f"Generated by `python benchmarks/bench_compare.py --repeats {repeats}` on {machine['date']}. Every number "
        "below was measured in that one run; medians of the runs listed, the methods interleaved.",
        "",
        f"2 configs × {SEEDS} seeds × {TASKS} tasks ({len(ALGOS) * SEEDS * TASKS:,} runs of one task each: "
        f"{len(ALGOS) * SEEDS} runs per task, {SEEDS} per config; {EPISODES} episodes of {LENGTH} steps per run); "
        f"IQM, median, mean and optimality gap of each config, each with a 95% interval from {REPS:,} stratified "
        "bootstrap replications. Point estimates checked equal to rliable's.",
        "",
        "| target | measured | required | result |",
        "|---|---:|---:|---|",
        f"| `store.compare` end to end (s) | {end:.3f} | ≤ 1.0 | {'PASS' if end <= 1.0 else '**FAIL**'} |",
        f"| statistics vs rliable on the same matrices | {stats / rl:.3f}× | ≤ 1.0× | "
        f"{'PASS' if stats <= rl else '**FAIL**'} |",
        "",
        "| method | median s | runs (s) |",
        "|---|---:|---|",
    ]
    keys = ("end", "first", "stats", "rliable")
    for (name, value), key in zip(rows, keys):
        lines.append(f"| {name} | {value:.4f} | {', '.join(f'{x:.4f}' for x in res['runs'][key])} |")
    lines += ["", f"End to end, `store.compare` reads the summaries of the {len(ALGOS) * SEEDS * TASKS:,} committed "
              "files (one per run and task: each a partition of its own; their footers and their episodes' fragments, "
              "kept beside the table by the first reader, see docs/architecture.md), adds the fragments up into the "
              "`episodes` rows, binds the views over the files (one footer read: the files share one schema), then "
              "ranks each run's last episodes; the statistics are the small rest (third row). The second row is the "
              "first read of the files, which summarizes their 1M steps once (one DuckDB query) and keeps the "
              "summaries; before summaries, every read aggregated the steps into episodes in the same way."]
    lines += ["", "### Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in machine.items()]
    lines.append(f"| load average at end | {load_average()} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    output_options(parser, "every run", check=False)
    args = parser.parse_args(argv)
    machine = machine_info(REPO)
    res = run(args.repeats)
    publish(args.out or REPO / "docs" / "benchmarks.md", "compare", report(res, machine, args.repeats))
    return 0


if __name__ == "__main__":
    sys.exit(main())
