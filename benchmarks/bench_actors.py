"""Many actors, one service (issue 49): K simulated actors send real ``RemoteWriter`` requests into one ``trajstore
serve``, which commits them in groups; against one local ``Writer`` storing the same rows in the same run.

    python benchmarks/bench_actors.py                          # K = 1, 16, 256, 1,000; writes docs/benchmarks.md
    python benchmarks/bench_actors.py --actors 1 16 --out /dev/stdout     # a quick look
    python benchmarks/bench_actors.py --actors 256 --store s3  # the service over SeaweedFS (tests/seaweed.py)

Each actor is a thread of this process with a ``RemoteWriter`` of its own (one run for all, a ``worker_id`` each, as
``trajstore.ray.rollout``'s workers; one env each), adding CartPole-
sized rows (4-float obs, one env) and flushing every 128 steps, ``--rounds`` times; the service runs in a process of
its own (``trajstore serve --commit-interval``), its resident memory sampled every 50 ms. Reported: stored steps/s
(all actors' steps over the wall time from the first request to the last acknowledgement), the service's commits/s
(appends in the store's history over that time), p50/p99 of an acknowledgement (a flush: its request sent, the
group committed, the answer back), the CPU time the service and the actors' process used over the run (user and
system: what serving and sending the requests cost, whatever the load of the machine), the service's peak RSS in the
first and the second half of the run. The baseline is one local ``Writer`` storing the same rows (every actor's
batches side by side as the envs of one batch, one commit) in the same run. Targets at K >= 256: stored steps/s >=
50% of the baseline, commits/s <= 1/commit_interval, p99 ack <= 2 s. The RSS of a fresh service's first burst
is reported by halves, not judged: it is mostly the service warming up to K requests; RSS flat is judged by
``--waves`` below.

With ``--store s3`` each K runs twice in the same run, into a local store and into an ``s3://`` store on SeaweedFS
(tests/seaweed.py, started here on 127.0.0.1): target, the s3 figure >= 50% of the local one.

    python benchmarks/bench_actors.py --ray 1 8 32            # trajstore.ray.rollout's workers and one committer

With ``--ray``, ``trajstore.ray.rollout`` runs CartPole with N workers (a local Ray with N CPUs, so that all run at
once; 8 envs and ``--ray-steps`` steps each, flushing every ``TRAJSTORE_FLUSH_BYTES`` = 64 KiB), its workers' files
committed by one committer: reported are the flushes (files the workers wrote), the commits that carried them, commits
per flush round (a round: each worker's flush once; target about 1, where N racing writers would make N) and the
steps stored per second of the whole rollout.

    python benchmarks/bench_actors.py --actors 256 --waves 30 --log-retention 2m --out docs/benchmarks.md  # memory

With ``--waves``, K new actors (a run of their own each wave) send ``--rounds`` flushes each into one service, wave
after wave: each wave's stored steps/s and the service's peak RSS. The halves of one run above compare a service's
first burst of K concurrent requests with what follows, which is mostly its warm-up; the waves show whether anything
grows with the requests served once it is warm. Two things legitimately grow first, and the waves are judged after
them:

- **The warm-up** (``--warmup``, 5 waves): the service's thread pool, buffers and allocator arenas grow to K
  concurrent requests, and the committer's bounded caches (the episode ends of its last versions) fill.
- **What the store's retention keeps**: the log snapshot holds every version's tombstones and idempotency keys until
  they expire (``log_retention``, 7 days by default), so within a run shorter than the retention it grows with the
  commits by design. ``--log-retention`` (a store created with it) lets a run outlast its retention and show the
  steady state; ``2m`` is passed by the 8th wave or so.

Target (RSS flat): every wave after the warm-up and the five waves that follow it peaks within 10% of those five
waves' median peak. Also given: the slope of the RSS after each wave, fitted from the end of the warm-up on.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import httpx  # noqa: E402
import numpy as np  # noqa: E402
from report import cpu_model, load_average, machine_info, output_options, publish  # noqa: E402

import trajstore  # noqa: E402
from trajstore.durations import seconds  # noqa: E402
from trajstore.remote.writer import RemoteWriter  # noqa: E402

STEPS = 128  # per flush
API_KEY = "bench-actors-key"


def batch(rng: np.random.Generator) -> dict[str, Any]:
    """128 CartPole-sized steps of one env, time-major."""
    return {"obs": rng.normal(size=(STEPS, 1, 4)).astype(np.float32), "action": rng.integers(0, 2, (STEPS, 1)),
            "reward": np.ones((STEPS, 1), np.float32), "next_obs": rng.normal(size=(STEPS, 1, 4)).astype(np.float32),
            "terminated": rng.random((STEPS, 1)) < 0.05, "truncated": np.zeros((STEPS, 1), bool)}


def cpu_s(pid: int) -> float:
    """CPU seconds (user and system) process ``pid`` has used so far."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
        return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
    except (OSError, IndexError, ValueError):
        return float("nan")


def rss_kib(pid: int) -> int:
    try:
        with open(f"/proc/{pid}/status") as f:
            return next(int(line.split()[1]) for line in f if line.startswith("VmRSS:"))
    except (OSError, StopIteration):
        return 0


class Service:
    """``trajstore serve`` in a process of its own, its RSS sampled."""

    def __init__(self, uri: str, interval: str, env: dict[str, str]) -> None:
        import socket

        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        self.url = f"http://127.0.0.1:{port}"
        self.proc = subprocess.Popen([sys.executable, "-m", "trajstore.cli", "serve", "--store", uri, "--port",
                                      str(port), "--commit-interval", interval],
                                     env={**os.environ, **env, "TRAJSTORE_API_KEY": API_KEY,
                                          "TRAJSTORE_SQL_MAX_CONCURRENT": "1",
                                          "PYTHONPATH": str(REPO)}, stdout=subprocess.DEVNULL)
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.2)
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._sample, daemon=True)
        self._thread.start()

    def _sample(self) -> None:
        while not self._stop.wait(0.05):
            self.samples.append((time.monotonic(), rss_kib(self.proc.pid)))

    def close(self) -> None:
        self._stop.set()
        self.proc.terminate()
        self.proc.wait(30)


def actors_run(uri: str, storage_options: dict[str, str] | None, k: int, rounds: int, interval: str,
               env: dict[str, str]) -> dict[str, Any]:
    """K actors into one service: stored steps/s, commits/s, ack latencies, RSS."""
    trajstore.open(uri, create=True, storage_options=storage_options)
    service = Service(uri, interval, env)
    lat: list[float] = []
    errors: list[str] = []
    writers = []
    try:
        for i in range(k):  # connected (GET /ingest, the schema) before the clock starts
            writers.append(RemoteWriter(service.url, api_key=API_KEY, run_id="actors", env_id="CartPole-v1",
                                        worker_id=f"actor-{i}", flush_bytes=1 << 40))
        barrier = threading.Barrier(k + 1)

        def actor(i: int) -> None:
            rng = np.random.default_rng(i)
            batches = [batch(rng) for _ in range(rounds)]
            barrier.wait()
            try:
                for b in batches:
                    writers[i].add_batch(b)
                    t0 = time.perf_counter()
                    writers[i].flush()
                    lat.append(time.perf_counter() - t0)
            except Exception as exc:  # noqa: BLE001 - counted and reported
                errors.append(f"{type(exc).__name__}: {exc}")

        threads = [threading.Thread(target=actor, args=(i,), daemon=True) for i in range(k)]
        for t in threads:
            t.start()
        barrier.wait()
        started, start_mono = time.time(), time.monotonic()
        cpu0, own0 = cpu_s(service.proc.pid), cpu_s(os.getpid())
        for t in threads:
            t.join()
        wall = time.monotonic() - start_mono
        cpu, own = cpu_s(service.proc.pid) - cpu0, cpu_s(os.getpid()) - own0
        for w in writers:
            w.close()
    finally:
        service.close()
    store = trajstore.open(uri, storage_options=storage_options)
    commits = [r for r in store.history().to_pylist() if r["operation"] == "append"
               and r["timestamp"].timestamp() >= started - 0.5]
    stored = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
    during = [s for t, s in service.samples if start_mono <= t <= start_mono + wall]
    half = len(during) // 2
    lat.sort()
    return {"k": k, "steps": stored, "expected": k * rounds * STEPS, "wall": wall, "steps_s": stored / wall,
            "commits": len(commits), "commits_s": len(commits) / wall,
            "p50": lat[len(lat) // 2] if lat else float("nan"),
            "p99": lat[min(len(lat) - 1, int(len(lat) * 0.99))] if lat else float("nan"),
            "cpu": cpu, "actors_cpu": own,
            "rss1": max(during[:half], default=0) / 1024, "rss2": max(during[half:], default=0) / 1024,
            "errors": errors[:3], "n_errors": len(errors)}


def baseline(uri: str, storage_options: dict[str, str] | None, k: int, rounds: int) -> float:
    """One local Writer storing the same rows: steps/s."""
    store = trajstore.open(uri, create=True, storage_options=storage_options)
    batches = [batch(np.random.default_rng(i)) for i in range(k) for _ in range(rounds)]
    rows = {key: np.concatenate([b[key] for b in batches], axis=1) for key in batches[0]}  # (128, k*rounds) envs
    t0 = time.perf_counter()
    with store.writer(run_id="baseline", env_id="CartPole-v1") as w:
        w.add_batch(rows)
    return k * rounds * STEPS / (time.perf_counter() - t0)


def report(rows: list[dict[str, Any]], interval: str, target_store: str) -> str:
    limit = 1 / seconds(interval, "commit_interval")
    s3 = target_store == "s3"
    lines = ["## Many actors, one service" + (" on s3://" if s3 else "") + " (issue 49)", "",
             f"`python benchmarks/bench_actors.py` (see its docstring), store: {target_store}, commit interval "
             f"{interval}. K actors (threads with a `RemoteWriter` each) flush 128 CartPole-sized steps per request "
             "into one `trajstore serve` (a process of its own); the baseline is one `Writer` in the benchmark's "
             "process storing the same rows in " + ("an s3:// store of the same server" if s3 else "a local store")
             + " in the same run.", "",
             "| K | steps stored | stored steps/s | " + ("vs local, same run (≥ 50%) | " if s3 else "")
             + f"vs one local Writer | commits/s (≤ {limit:g}) | ack p50 | ack p99 (≤ 2 s) | CPU: service / actors | "
             "service RSS, 1st / 2nd half | errors |",
             "|---:|---:|---:|" + ("---:|" if s3 else "") + "---:|---:|---:|---:|---|---|---:|"]
    for r in rows:
        lines.append(f"| {r['k']:,} | {r['steps']:,} of {r['expected']:,} | {r['steps_s']:,.0f} | "
                     + (f"{r['steps_s'] / r['local']:.0%} ({r['local']:,.0f}) | " if s3 else "") +
                     f"{r['steps_s'] / r['baseline']:.0%} | {r['commits_s']:.2f} | {r['p50'] * 1000:.0f} ms | "
                     f"{r['p99'] * 1000:.0f} ms | {r['cpu']:.1f} / {r['actors_cpu']:.1f} s | "
                     f"{r['rss1']:.0f} / {r['rss2']:.0f} MiB | "
                     f"{r['n_errors']} |")
    lines += ["", "Baseline (one `Writer`, same rows, same run): " + "; ".join(
        f"K={r['k']:,}: {r['baseline']:,.0f} steps/s" for r in rows) + "."]
    targets = [r for r in rows if r["k"] >= 256]
    if targets:
        lines += ["", "Targets at K ≥ 256: " + "; ".join(
            f"K={r['k']:,}: steps/s {'PASS' if r['steps_s'] >= 0.5 * r['baseline'] else '**FAIL**'}, commits "
            f"{'PASS' if r['commits_s'] <= limit * 1.05 else '**FAIL**'}, p99 "
            f"{'PASS' if r['p99'] <= 2 else '**FAIL**'}"
            + (f", vs local {'PASS' if r['steps_s'] >= 0.5 * r['local'] else '**FAIL**'}" if s3 else "")
            for r in targets) + ". RSS: the halves of a fresh service's first burst are mostly its warm-up; RSS "
                  "flat is judged wave after wave (`--waves`)."]
    lines += ["", f"Machine: {cpu_model()}, {os.cpu_count()} cores (shared with other work; load average "
              f"{load_average()} at the end); trajstore commit {machine_info(REPO)['trajstore commit']}."]
    return "\n".join(lines)


def _actor(writer: RemoteWriter, batches: list[dict[str, np.ndarray]]) -> None:
    for b in batches:
        writer.add_batch(b)
        writer.flush()


def waves_run(uri: str, k: int, rounds: int, waves: int, interval: str,
              log_retention: str | None = None) -> list[dict[str, Any]]:
    """``waves`` times, K new actors (a run of their own each wave) send ``rounds`` flushes each into one service:
    each wave's stored steps/s and the service's peak RSS during it and after it. ``log_retention``: the new store's
    (its default when None)."""
    trajstore.open(uri, create=True, log_retention=log_retention)
    service = Service(uri, interval, {})
    out = []
    try:
        for n in range(waves):
            writers = [RemoteWriter(service.url, api_key=API_KEY, run_id=f"wave-{n}", env_id="CartPole-v1",
                                    worker_id=f"actor-{i}", flush_bytes=1 << 40) for i in range(k)]
            batches = [[batch(np.random.default_rng(n * 100_000 + i)) for _ in range(rounds)] for i in range(k)]

            threads = [threading.Thread(target=_actor, args=(w, b), daemon=True) for w, b in zip(writers, batches)]
            first, t0 = len(service.samples), time.monotonic()
            for t in threads:
                t.start()
            for t in threads:
                t.join()
            wall = time.monotonic() - t0
            for w in writers:
                w.close()
            during = [s for _, s in service.samples[first:]]
            out.append({"wave": n + 1, "steps_s": k * rounds * STEPS / wall, "peak": max(during, default=0) / 1024,
                        "after": rss_kib(service.proc.pid) / 1024})
            print(out[-1], flush=True)
    finally:
        service.close()
    stored = trajstore.open(uri).sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
    if stored != waves * k * rounds * STEPS:
        raise AssertionError(f"{stored} steps stored of {waves * k * rounds * STEPS}")
    return out


def slope(ys: list[float]) -> float:
    """Least-squares slope of ``ys`` against 0, 1, 2, …; 0 for fewer than two points."""
    if len(ys) < 2:
        return 0.0
    return float(np.polyfit(np.arange(len(ys)), ys, 1)[0])


def waves_verdict(rows: list[dict[str, Any]], warmup: int) -> dict[str, Any] | None:
    """The reference (median peak of the five waves after the warm-up), the worst later peak against it, and the
    slope of the RSS after each wave from the warm-up's end on; None when the run is too short to judge."""
    settled, later = rows[warmup:warmup + 5], rows[warmup + 5:]
    if len(settled) < 5 or not later:
        return None
    ref = float(np.median([r["peak"] for r in settled]))
    return {"ref": ref, "worst": max(r["peak"] for r in later) / ref - 1,
            "slope": slope([r["after"] for r in rows[warmup:]])}


def waves_report(rows: list[dict[str, Any]], k: int, rounds: int, interval: str, warmup: int = 5,
                 log_retention: str | None = None) -> str:
    retention = f" --log-retention {log_retention}" if log_retention else ""
    lines = ["## Many actors, wave after wave: the service's memory (issue 49)", "",
             f"`python benchmarks/bench_actors.py --actors {k} --rounds {rounds} --waves {len(rows)}{retention}` "
             f"(see its docstring): {len(rows)} waves of {k} new actors (a run each wave) flush {rounds} × 128 "
             f"CartPole-sized steps each into one `trajstore serve` (commit interval {interval}), one wave after the "
             f"other, into a store whose log retention is {log_retention or 'the default (7 days)'}; every step "
             "checked stored once at the end.", "",
             "| wave | stored steps/s | service peak RSS during the wave | after it |", "|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['wave']} | {r['steps_s']:,.0f} | {r['peak']:.0f} MiB | {r['after']:.0f} MiB |")
    verdict = waves_verdict(rows, warmup)
    lines.append("")
    if verdict is None:
        lines.append(f"Target (RSS flat) not judged: it needs more than {warmup + 5} waves.")
    else:
        lines.append(
            f"Warm-up: waves 1–{warmup}, the first wave's peak {rows[0]['peak']:.0f} MiB. Target (RSS flat): every "
            f"wave from the {warmup + 6}th on peaks within 10% of the median peak of waves {warmup + 1}–{warmup + 5} "
            f"({verdict['ref']:.0f} MiB): worst {verdict['worst']:+.1%} "
            f"({'PASS' if verdict['worst'] <= 0.10 else '**FAIL**'}). The RSS after each wave, fitted from wave "
            f"{warmup + 1} on: {verdict['slope']:+.2f} MiB a wave.")
    lines += ["", f"Machine: {cpu_model()}, {os.cpu_count()} cores (shared with other work; load average "
              f"{load_average()} at the end); trajstore commit {machine_info(REPO)['trajstore commit']}."]
    return "\n".join(lines)


def ray_run(workers: int, steps: int, interval: str) -> dict[str, Any]:
    """``trajstore.ray.rollout`` with ``workers`` workers into a new local store: flushes, commits, steps/s."""
    os.environ["TRAJSTORE_FLUSH_BYTES"] = str(64 << 10)  # before Ray starts: its workers inherit it
    import ray

    import trajstore.ray

    if ray.is_initialized():
        ray.shutdown()
    ray.init(num_cpus=workers, include_dashboard=False, log_to_driver=False)
    try:
        with tempfile.TemporaryDirectory() as work:
            uri = str(Path(work) / "store")
            t0 = time.perf_counter()
            trajstore.ray.rollout(uri, "CartPole-v1", num_workers=workers, steps=steps * workers, num_envs=8,
                                  run_id="ray", progress=False, commit_interval=interval)
            wall = time.perf_counter() - t0
            store = trajstore.open(uri)
            appends = [r for r in store.history().to_pylist() if r["operation"] == "append"]
            stored = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
    finally:
        ray.shutdown()
    flushes = sum(r["files_added"] for r in appends)
    row = {"workers": workers, "steps": stored, "wall": wall, "steps_s": stored / wall, "flushes": flushes,
           "commits": len(appends), "per_round": len(appends) / max(1.0, flushes / workers)}
    print(row, flush=True)
    return row


def ray_report(rows: list[dict[str, Any]], interval: str) -> str:
    lines = ["## Many Ray workers, one committer (issue 49)", "",
             "`python benchmarks/bench_actors.py --ray 1 8 32` (see its docstring): `trajstore.ray.rollout` of "
             f"CartPole-v1, 8 envs per worker, flushing every 64 KiB; commit interval {interval}; a local store.", "",
             "| workers | steps stored | flushes (files written) | commits | commits per flush round (≈ 1) | "
             "whole rollout | stored steps/s |", "|---:|---:|---:|---:|---:|---:|---:|"]
    for r in rows:
        lines.append(f"| {r['workers']} | {r['steps']:,} | {r['flushes']:,} | {r['commits']:,} | "
                     f"{r['per_round']:.2f} | {r['wall']:.1f} s | {r['steps_s']:,.0f} |")
    lines += ["", f"Machine: {cpu_model()}, {os.cpu_count()} cores (shared with other work; load average "
              f"{load_average()} at the end); trajstore commit {machine_info(REPO)['trajstore commit']}."]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--actors", type=int, nargs="+", default=[1, 16, 256, 1000])
    parser.add_argument("--rounds", type=int, default=4, help="flushes per actor (default 4)")
    parser.add_argument("--commit-interval", default="250ms")
    parser.add_argument("--store", choices=["local", "s3"], default="local")
    parser.add_argument("--ray", type=int, nargs="+", default=None, help="worker counts of trajstore.ray.rollout")
    parser.add_argument("--ray-steps", type=int, default=65_536, help="steps per Ray worker (default 65,536)")
    parser.add_argument("--waves", type=int, default=None, help="with one K: that many waves into one service")
    parser.add_argument("--warmup", type=int, default=5, help="waves the RSS target leaves out (default 5)")
    parser.add_argument("--log-retention", default=None,
                        help="with --waves: the new store's log retention (default: trajstore's, 7 days)")
    output_options(parser, "runs of K up to 1,000", check=False)
    args = parser.parse_args(argv)
    rows = []
    if args.ray:
        rows = [ray_run(n, args.ray_steps, args.commit_interval) for n in args.ray]
        out = args.out or (REPO / "docs" / "benchmarks.md" if max(args.ray) >= 32 else None)
        publish(out, "actors-ray", ray_report(rows, args.commit_interval))
        return 0
    if args.waves:
        with tempfile.TemporaryDirectory() as work:
            rows = waves_run(str(Path(work) / "waves"), args.actors[0], args.rounds, args.waves, args.commit_interval,
                             args.log_retention)
        publish(args.out, "actors-waves", waves_report(rows, args.actors[0], args.rounds, args.commit_interval,
                                                       args.warmup, args.log_retention))
        return 0
    with tempfile.TemporaryDirectory() as work:
        s3 = None
        if args.store == "s3":
            from tests import seaweed

            s3 = seaweed.start(Path(work) / "seaweed")
        try:
            for k in args.actors:
                local = str(Path(work) / f"actors-{k}")
                row = actors_run(local, None, k, args.rounds, args.commit_interval, {})
                row["baseline"] = baseline(str(Path(work) / f"b-{k}"), None, k, args.rounds)
                if s3 is not None:  # the same K into an s3:// store, against the local figure just measured
                    opts = dict(s3.storage_options)
                    row = {**actors_run(f"s3://{s3.bucket()}/actors-{k}", opts, k, args.rounds,
                                        args.commit_interval, dict(opts)),
                           "baseline": baseline(f"s3://{s3.bucket()}/b-{k}", opts, k, args.rounds),
                           "local": row["steps_s"]}
                print(row, flush=True)
                rows.append(row)
        finally:
            if s3 is not None:
                s3.stop()
    out = args.out or (REPO / "docs" / "benchmarks.md" if max(args.actors) >= 1000 else None)
    publish(out, "actors" if args.store == "local" else "actors-s3", report(rows, args.commit_interval, args.store))
    return 0


if __name__ == "__main__":
    sys.exit(main())
