"""Multi-agent episodes (issue 32): recording a PettingZoo ParallelEnv against stepping it alone, and statistics
per agent against statistics per run.

    python benchmarks/bench_agents.py                   # writes the agents and agents-stats sections of
                                                        # docs/benchmarks.md (1,000,000 agent-episodes)
    python benchmarks/bench_agents.py --out /dev/stdout
    python benchmarks/bench_agents.py --only stats --agent-episodes 20000   # a small check: prints its section

Recording: mpe2's simple_spread, 3 agents, random actions. Both routes step a copy of the same env through the same
episodes with the same actions (drawn beforehand, one array per episode), taking turns step by step, each call timed
on its own (a change in the machine's load falls on both alike); the recorded route wraps its copy in
``RecordParallelToStore`` over a fresh local store and includes making the recorder and closing it (every row
committed). The median over ``--repeats`` of each run's ratio.

Statistics: a store of ``--agent-episodes`` agent-episodes (8 agents an episode, 1 to 3 env steps each, in 4 runs)
written by ``AgentWriter``; ``store.stats(by="agent_id")`` (each agent's return and length, one row per agent) timed
against ``store.stats(by="run_id")`` (one row per run) on the same store, interleaved, medians of ``--repeats``, each
on a Store just opened (a Store keeps a version's statistics once computed).
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
import warnings
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from report import load_average, machine_info, out_path, output_options, publish  # noqa: E402

import trajstore  # noqa: E402

EPISODES, CYCLES, TARGET = 200, 25, 1.10
AGENT_EPISODES, AGENTS, RUNS = 1_000_000, 8, 4
STATS_TARGET = 1.25  # "as fast as by run": within the spread of two group-bys over the same steps


def actions(n_agents: int) -> np.ndarray:
    return np.random.default_rng(0).integers(0, 5, (EPISODES, CYCLES, n_agents))


def lockstep(chosen: np.ndarray) -> tuple[float, float, int]:
    """Two copies of the env stepped with the same actions, one alone and one through the recorder, each call
    timed on its own and the two taking turns step by step (so a change in the machine's load falls on both
    alike): the seconds of each route (the recorder's ``close``, committing every row, included) and its rows."""
    from mpe2 import simple_spread_v3

    from trajstore.integrations.pettingzoo import RecordParallelToStore

    folder = Path(tempfile.mkdtemp(prefix="bench-agents-"))
    try:
        store = trajstore.open(folder / "store", create=True)
        bare = simple_spread_v3.parallel_env(max_cycles=CYCLES)
        clock = time.perf_counter
        started = clock()
        rec = RecordParallelToStore(simple_spread_v3.parallel_env(max_cycles=CYCLES), store, run_id="bench")
        recorded = clock() - started
        alone = 0.0
        agents = list(bare.possible_agents)
        for e in range(EPISODES):
            t0 = clock()
            bare.reset(seed=e)
            t1 = clock()
            rec.reset(seed=e)
            t2 = clock()
            alone, recorded = alone + t1 - t0, recorded + t2 - t1
            t = 0
            while bare.agents:
                act = {a: int(chosen[e, t, agents.index(a)]) for a in bare.agents}
                t0 = clock()
                bare.step(act)
                t1 = clock()
                rec.step(act)
                t2 = clock()
                alone, recorded = alone + t1 - t0, recorded + t2 - t1
                t += 1
        t0 = clock()
        rec.close()
        recorded += clock() - t0
        rows = store.sql("SELECT count(*) FROM steps")[0][0].as_py()
        return alone, recorded, rows
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def run(repeats: int) -> dict[str, Any]:
    warnings.filterwarnings("ignore", category=DeprecationWarning)
    chosen = actions(3)
    lockstep(chosen)  # warm-up: imports, first compilations
    times: dict[str, list[float]] = {"alone": [], "recorded": [], "ratio": []}
    rows = 0
    for _ in range(repeats):
        alone, recorded, rows = lockstep(chosen)
        times["alone"].append(alone)
        times["recorded"].append(recorded)
        times["ratio"].append(recorded / alone)
    assert rows == EPISODES * CYCLES * 3, rows
    return {"rows": rows, **{k: statistics.median(v) for k, v in times.items()}, "runs": times}


def agent_store(folder: Path, agent_episodes: int) -> trajstore.Store:
    """A store of about ``agent_episodes`` agent-episodes: ``AGENTS`` agents an episode acting 1 to 3 env steps
    (2 floats of observation, a discrete action, a random reward; every agent ends at the episode's last step), the
    episodes spread over ``RUNS`` runs."""
    from trajstore.write.agents import AgentWriter

    store = trajstore.open(folder, create=True)
    agents = [f"agent_{i}" for i in range(AGENTS)]
    rng = np.random.default_rng(0)
    episodes = -(-agent_episodes // AGENTS)
    obs = np.zeros(2, np.float32)
    for r in range(RUNS):
        lengths = rng.integers(1, 4, episodes // RUNS + (r < episodes % RUNS))
        rewards = rng.normal(size=(len(lengths), 3, AGENTS)).astype(np.float32)
        with AgentWriter(store, run_id=f"run-{r}", env_id="Team-v0", agents=agents) as w:
            for e, length in enumerate(lengths.tolist()):
                for t in range(length):
                    done = t == length - 1
                    w.add(t, {a: (obs, i % 5, float(rewards[e, t, i]), obs, done, False)
                              for i, a in enumerate(agents)})
                w.end_episode()
    return store


def run_stats(repeats: int, agent_episodes: int) -> dict[str, Any]:
    """Build the store, then time stats by agent and by run on it, interleaved."""
    folder = Path(tempfile.mkdtemp(prefix="bench-agent-stats-"))
    try:
        started = time.perf_counter()
        agent_store(folder / "store", agent_episodes)
        built = time.perf_counter() - started
        store = trajstore.open(folder / "store")
        counts = store.sql("SELECT count(*) AS rows, count(DISTINCT episode_id) AS episodes FROM steps").to_pylist()[0]
        groups = {"agent_id": AGENTS, "run_id": RUNS}
        for by in groups:  # warm-up: the file list, footers, DuckDB's first plans
            assert store.stats(by=by).num_rows == groups[by]
        times: dict[str, list[float]] = {by: [] for by in groups}
        for _ in range(repeats):
            for by in groups:  # each on a Store just opened: a Store keeps a version's statistics once computed
                started = time.perf_counter()
                table = trajstore.open(folder / "store").stats(by=by)
                times[by].append(time.perf_counter() - started)
                assert sum(table["n_traj"].to_pylist()) == (counts["episodes"] * (AGENTS if by == "agent_id" else 1))
        return {"built": built, **counts, "agent_episodes": counts["episodes"] * AGENTS,
                **{by: statistics.median(v) for by, v in times.items()}, "runs": times}
    finally:
        shutil.rmtree(folder, ignore_errors=True)


def stats_report(res: dict[str, Any], machine: dict[str, str], repeats: int, size: int) -> str:
    ratio = res["agent_id"] / res["run_id"]
    lines = [
        f"Generated by `python benchmarks/bench_agents.py --only stats --agent-episodes {size} --repeats {repeats}` "
        f"on {machine['date']}. Every number below was measured in that one run; medians of the runs listed, the "
        "two groupings interleaved.",
        "",
        f"{res['agent_episodes']:,} agent-episodes ({res['episodes']:,} episodes of {AGENTS} agents acting 1 to 3 "
        f"env steps, {res['rows']:,} agent rows, {RUNS} runs) written by `AgentWriter` in {res['built']:.1f} s. "
        "`store.stats(by=\"agent_id\")` (one row per agent: its own returns and lengths) against "
        "`store.stats(by=\"run_id\")` (one row per run) on the same store, each timed call on a Store just "
        "opened (`trajstore.open(path).stats(by=...)`: a Store keeps a version's statistics once computed, so a "
        "repeated call on one Store times a lookup).",
        "",
        "| target | measured | required | result |",
        "|---|---:|---:|---|",
        f"| stats by agent vs by run | {ratio:.3f}× | ≤ {STATS_TARGET:.2f}× | "
        f"{'PASS' if ratio <= STATS_TARGET else '**FAIL**'} |",
        "",
        "| grouping | median s | agent-episodes/s | runs (s) |",
        "|---|---:|---:|---|",
    ]
    for by in ("agent_id", "run_id"):
        lines.append(f"| `by=\"{by}\"` | {res[by]:.3f} | {res['agent_episodes'] / res[by]:,.0f} | "
                     f"{', '.join(f'{x:.3f}' for x in res['runs'][by])} |")
    lines += ["", "### Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in machine.items()]
    lines.append(f"| load average at end | {load_average()} |")
    return "\n".join(lines)


def report(res: dict[str, Any], machine: dict[str, str], repeats: int) -> str:
    ratio = res["ratio"]
    lines = [
        f"Generated by `python benchmarks/bench_agents.py --repeats {repeats}` on {machine['date']}. Every number "
        "below was measured in that one run; medians of the runs listed.",
        "",
        f"mpe2 `simple_spread_v3` (3 agents, `max_cycles={CYCLES}`), {EPISODES} episodes with the same random "
        f"actions in both routes: {res['rows']:,} agent rows. Recorded: wrapped in `RecordParallelToStore` over a "
        "new local store, making the recorder and closing it (every row committed) included. In each run the two "
        "routes step two copies of the env in turn, step by step, and each call is timed on its own, so that a "
        "change in the machine's load falls on both alike; the ratio is the median of the runs' ratios.",
        "",
        "| target | measured | required | result |",
        "|---|---:|---:|---|",
        f"| recording vs stepping alone | {ratio:.3f}× | ≤ {TARGET:.2f}× | "
        f"{'PASS' if ratio <= TARGET else '**FAIL**'} |",
        "",
        "| route | median s | agent rows/s | runs (s) |",
        "|---|---:|---:|---|",
    ]
    for key, name in (("alone", "stepping the env alone"), ("recorded", "stepping it through the recorder")):
        lines.append(f"| {name} | {res[key]:.3f} | {res['rows'] / res[key]:,.0f} | "
                     f"{', '.join(f'{x:.3f}' for x in res['runs'][key])} |")
    lines.append(f"| ratio of each run | {ratio:.3f} |  | {', '.join(f'{x:.3f}' for x in res['runs']['ratio'])} |")
    lines += ["", "### Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in machine.items()]
    lines.append(f"| load average at end | {load_average()} |")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--only", choices=["recording", "stats"], help="run one of the two measurements")
    parser.add_argument("--agent-episodes", type=int, default=AGENT_EPISODES,
                        help="agent-episodes of the statistics' store (default: %(default)s)")
    output_options(parser, f"every recording run, and statistics over {AGENT_EPISODES:,} agent-episodes", check=False)
    args = parser.parse_args(argv)
    machine = machine_info(REPO)
    if args.only != "stats":
        res = run(args.repeats)
        publish(args.out or REPO / "docs" / "benchmarks.md", "agents", report(res, machine, args.repeats))
    if args.only != "recording":
        res = run_stats(args.repeats, args.agent_episodes)
        publish(out_path(args.out, args.agent_episodes >= AGENT_EPISODES, REPO), "agents-stats",
                stats_report(res, machine, args.repeats, args.agent_episodes))
    return 0


if __name__ == "__main__":
    sys.exit(main())
