"""Run trajstore's benchmarks and write their sections of ``docs/benchmarks.md``.

    python benchmarks/run.py                    # every benchmark at full size, writes docs/benchmarks.md
    python benchmarks/run.py --only store       # one of: store (issue 2), jax (3), api (4), dashboard (5), s3 (13),
                                                # loaders (22), live (15), export (20), atari (21),
                                                # compare (31), agents (32), replay (50)
    python benchmarks/run.py --steps 200000     # quick smoke run; prints the sections, writes no doc
    python benchmarks/run.py --steps 200000 --out /tmp/bench.md
"""

from __future__ import annotations

import argparse
import shlex
import sys
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FULL_STEPS = 10_000_000
sys.path.insert(0, str(HERE))

import bench_store  # noqa: E402
import report  # noqa: E402


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=FULL_STEPS, help="number of steps (default: %(default)s)")
    p.add_argument("--envs", type=int, default=1000, help="B, envs per batch (default: %(default)s)")
    p.add_argument("--horizon", type=int, default=250, help="T, steps per batch (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5,
                   help="runs per method (default: %(default)s; at least 7 for the ones well under a second)")
    p.add_argument("--imitation-steps", type=int, default=1_000_000,
                   help="rows for the imitation-style Python baseline (default: %(default)s)")
    report.output_options(p, f"runs of {FULL_STEPS:,} steps or more", check=False)
    p.add_argument("--workdir", type=Path, default=None, help="where to put the temporary stores")
    p.add_argument("--check", action="store_true", help="exit with status 1 when a target is not met")
    p.add_argument("--only", default="store,jax,api,dashboard,s3,loaders,live,export,atari,compare,agents,replay",
                   help="comma-separated benchmarks to run (default: %(default)s)")
    return p


def run_others(names: list[str], steps: int, out: Path | None, check: bool) -> int:
    """The JAX, service and dashboard benchmarks, each through its own command line."""
    import bench_api
    import bench_atari
    import bench_dashboard
    import bench_export
    import bench_jax
    import bench_live
    import bench_loaders
    import bench_s3

    status = 0
    tail = (["--out", str(out)] if out is not None else []) + (["--check"] if check else [])
    if "jax" in names:
        status |= bench_jax.main(["--steps", str(steps)] + tail)
    if "api" in names:
        status |= bench_api.main(["--steps", str(steps)] + (["--out", str(out)] if out is not None else []))
    if "dashboard" in names:
        episodes = ["--episodes", str(max(1_000, steps // 100))] if steps < FULL_STEPS else []
        status |= bench_dashboard.main(episodes + (["--out", str(out)] if out is not None else []))
    if "s3" in names:
        s3_steps = ["--steps", str(min(steps, bench_s3.FULL_STEPS))]
        status |= bench_s3.main(s3_steps + (["--out", str(out)] if out is not None else []) + (["--check"] if check
                                                                                                 else []))
    if "loaders" in names:
        status |= bench_loaders.main((["--quick"] if steps < FULL_STEPS else []) +
                                     (["--out", str(out)] if out is not None else []) + (["--check"] if check else []))
    if "export" in names:
        sizes = [] if steps >= FULL_STEPS else ["--sizes", ",".join(str(max(10_000, s * steps // FULL_STEPS))
                                                                   for s in bench_export.FULL_SIZES)]
        status |= bench_export.main(sizes + (["--out", str(out)] if out is not None else []) +
                                    (["--check"] if check else []))
    if "live" in names:
        sizes = ["--sizes", str(max(10_000, steps // 100))] if steps < FULL_STEPS else []
        status |= bench_live.main(sizes + (["--out", str(out)] if out is not None else []))
    if "compare" in names and out is not None:  # one size only: a full run's
        import bench_compare

        status |= bench_compare.main(["--out", str(out)])
    if "agents" in names and out is not None:  # one size only
        import bench_agents

        status |= bench_agents.main(["--out", str(out)])
    if "replay" in names:
        import bench_replay

        status |= bench_replay.main((["--quick"] if steps < FULL_STEPS else []) +
                                    (["--out", str(out)] if out is not None else []) + (["--check"] if check else []))
    if "atari" in names:
        atari_steps = ["--steps", str(min(steps, bench_atari.FULL_STEPS))]
        status |= bench_atari.main(atari_steps + (["--out", str(out)] if out is not None else []) +
                                   (["--check"] if check else []))
    return status


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    names = [n.strip() for n in args.only.split(",") if n.strip()]
    out = report.out_path(args.out, args.steps >= FULL_STEPS, REPO)
    status = run_store(args, argv, out) if "store" in names else 0
    return status | run_others(names, args.steps, out, args.check)


def run_store(args: argparse.Namespace, argv: list[str] | None, out: Path | None) -> int:
    repeats = max(1, args.repeats)
    machine = report.machine_info(REPO)
    with tempfile.TemporaryDirectory(prefix="trajstore-bench-", dir=args.workdir) as work:
        res = bench_store.run(args.steps, envs=args.envs, horizon=args.horizon, repeats=repeats,
                              imitation_steps=args.imitation_steps, work=Path(work))
    machine["load average at end"] = report.load_average()
    command = "python benchmarks/run.py" + ("".join(f" {shlex.quote(a)}" for a in (argv or sys.argv[1:])))
    body = bench_store.to_markdown(res, machine, command)
    report.publish(out, "store", body)
    for t in res.targets:
        print(f"{'PASS' if t.passed else 'FAIL'}  {t.what}: {t.fmt.format(t.measured)}")
    return 1 if args.check and not all(t.passed for t in res.targets) else 0


if __name__ == "__main__":
    sys.exit(main())
