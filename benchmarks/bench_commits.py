"""A store after many small commits (issues 22, 30): queries against the same rows written fresh, 10 → 10,000 commits.

    python benchmarks/bench_commits.py                      # 10, 100, 1,000, 3,000 commits; writes docs/benchmarks.md
    python benchmarks/bench_commits.py --commits 10 100 1000 3000 10000   # the whole curve (~25 min here)
    python benchmarks/bench_commits.py --commits 10 100 --out /dev/stdout  # a quick look

For each point, 8 writer processes (spawned, as Ray workers would be: one run, one env, a worker_id each) commit
N small batches in all (16 time steps x 4 envs = 64 steps, 3-float obs; ``flush`` after each) at the same time,
with the default upkeep (``TRAJSTORE_COMPACT_*``, ``TRAJSTORE_CHECKPOINT_INTERVAL``). Then the store is copied and
a new store is written holding the same rows fresh (each partition's rows in one file, one commit: a log of a few
versions; checked to hold the same steps), and on each, with a new
``Store`` (or service) per measurement, so no cache of an earlier one helps: ``open`` (``trajstore.open`` + the
committed file list), ``stats``, ``episodes``, ``/stats`` and the dashboard's first plot (the requests the page makes
before its first plot, one after the other, on a new app), medians of 3. ``follow`` catch-up is the time per
commit of reading the last 100 commits (the fresh store has none to follow: its ratio is against the 10-commit
point). The writers' ``add_batch`` + ``flush`` latency is reported with the upkeep on, and at the largest point
that is at most 1,000 commits also with it off (``TRAJSTORE_COMPACT_SMALL_FILES=0``) in the same run.

    python benchmarks/bench_commits.py --commits 20000 --retention 10m --writers 2   # issue 49: a log that stays small

With ``--retention``, the store is created with that log retention (``trajstore.open(..., log_retention=)``) and the
writers' own upkeep checkpoints and removes expired entries as it would in service. A store reaches 20,000 commits in
hours or days, a run here in minutes: so that an entry's age is what it would be, whenever a version lands every entry
of ``_delta_log`` is given the modification time it would have if the commits had come every ``--spacing`` (3 s:
20,000 commits over ~17 hours; Delta's log clean-up reads an entry's age from it), the latest one now. A
tombstone's age (a file a compaction replaced) is the time written in its entry, which cannot be moved: so the store
then rests for its retention and one writer makes a checkpoint interval's commits (:func:`rest`), after which it holds
the tombstones a store written over those hours would; the queries are measured right after the writers stop too.
Reported besides: the ``_delta_log`` entries of each store at the end (target: bounded by the retention, about
retention / spacing + a checkpoint interval, not the commit count), the tombstones in its checkpoint, and each query
within 1.5× the fresh store.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import shutil
import statistics
import sys
import tempfile
import threading
import time
from pathlib import Path
from typing import Any, Callable

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402
from report import cpu_model, load_average, machine_info, output_options, publish  # noqa: E402

import trajstore  # noqa: E402
from trajstore.store import plumbing  # noqa: E402

WRITERS = 8
T, B = 16, 4
REPEATS = 3
FOLLOWED = 100
FIRST_PLOT = ["/ready", "/runs", "/episodes?order_by=-ended_at&limit=25", "/curves/binned?bins=1330",
              "/curves/histogram?y=episode_return&bins=60", "/curves/histogram?y=episode_length&bins=60",
              "/stats?by=run_id,env_id"]


def _writer(path: str, worker: int, commits: int, start: float, env: dict[str, str], out: Any) -> None:
    """One writer process: ``commits`` small commits, each add_batch + flush timed."""
    os.environ.update(env)
    store = trajstore.open(path)
    rng = np.random.default_rng(worker)
    lat = []
    while time.time() < start:
        time.sleep(0.001)
    with store.writer(run_id="bench", env_id="Small-v0", worker_id=f"w{worker}", flush_bytes=1 << 40) as w:
        for _ in range(commits):
            batch = {"obs": rng.random((T, B, 3), np.float32), "action": rng.integers(0, 2, (T, B)),
                     "reward": rng.random((T, B), np.float32), "next_obs": rng.random((T, B, 3), np.float32),
                     "terminated": rng.random((T, B)) < 0.05, "truncated": np.zeros((T, B), bool)}
            t0 = time.perf_counter()
            w.add_batch(batch)
            w.flush()
            lat.append(time.perf_counter() - t0)
        upkeep = w.upkeep
        out.put({"lat": lat, "compactions": len(upkeep.compactions) if upkeep else 0,
             "errors": upkeep.errors if upkeep else []})


class Ageing:
    """Keeps each ``_delta_log`` entry of the store at ``path`` as old as it would be if the commits came every
    ``spacing_s`` seconds: whenever a version lands, version ``v``'s files are given the modification time
    ``now - (latest - v) * spacing_s`` (what Delta's log clean-up reads an entry's age from)."""

    def __init__(self, path: Path, spacing_s: float) -> None:
        self.log, self.spacing, self.latest = path / "steps" / "_delta_log", spacing_s, -1
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while not self._stop.wait(0.02):
            self.age()

    def age(self) -> None:
        entries = [(int(e.name.split(".", 1)[0]), e.path) for e in os.scandir(self.log)
                   if e.name.split(".", 1)[0].isdigit() and e.name.endswith((".json", ".parquet"))]
        latest = max((v for v, _ in entries), default=-1)
        if latest == self.latest:
            return
        self.latest, now = latest, time.time()
        for version, path in entries:
            when = now - (latest - version) * self.spacing
            try:
                os.utime(path, (when, when))
            except FileNotFoundError:  # removed by a clean-up meanwhile
                pass

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.age()


def log_entries(path: Path) -> int:
    """The versions (commit entries) the ``_delta_log`` of a store's steps table holds."""
    return sum(1 for name in os.listdir(path / "steps" / "_delta_log") if name.endswith(".json") and name[0].isdigit())


def tombstones(path: Path) -> int:
    """The ``remove`` actions (files replaced by a compaction, kept as tombstones) of the newest checkpoint of a
    store's steps table."""
    import pyarrow.parquet as pq

    checkpoints = sorted((path / "steps" / "_delta_log").glob("*.checkpoint.parquet"))
    if not checkpoints:
        return 0
    removes = pq.read_table(checkpoints[-1], columns=["remove"])["remove"]
    return len(removes) - removes.null_count


def write_store(path: Path, commits: int, *, upkeep: bool, writers: int = WRITERS, retention: str | None = None,
                spacing_s: float = 3.0, first_worker: int = 0) -> dict[str, Any]:
    """``commits`` commits from ``writers`` processes at once (worker ids from ``first_worker`` on); their
    latencies and the wall time. With ``retention``, the store keeps its log that long and its entries are aged
    (:class:`Ageing`)."""
    trajstore.open(path, create=True, log_retention=retention)
    env = {} if upkeep else {"TRAJSTORE_COMPACT_SMALL_FILES": "0"}
    ctx = mp.get_context("spawn")  # deltalake's runtime does not survive fork
    out = ctx.Queue()
    start = time.time() + 3.0
    ageing = Ageing(path, spacing_s) if retention else None
    share = [commits // writers + (i < commits % writers) for i in range(writers)]
    procs = [ctx.Process(target=_writer, args=(str(path), first_worker + i, share[i], start, env, out))
             for i in range(writers)]
    for p in procs:
        p.start()
    results = [out.get(timeout=4 * 3600) for _ in procs]
    for p in procs:
        p.join()
    if ageing is not None:
        ageing.close()
    lat = sorted(x for r in results for x in r["lat"])
    return {"wall_s": max(time.time() - start, 0.0), "lat_median_ms": 1000 * statistics.median(lat),
            "lat_p99_ms": 1000 * lat[int(0.99 * (len(lat) - 1))],
            "compactions": sum(r["compactions"] for r in results), "errors": [e for r in results for e in r["errors"]]}


def rest(path: Path, retention: str, spacing_s: float, *, first_worker: int) -> None:
    """The store after a pause of its retention and a checkpoint interval's commits by one more writer (its upkeep
    checkpoints). A tombstone's age (the ``remove`` of a file a compaction replaced) is read from the time written in
    its log entry, which :class:`Ageing` cannot move: right after the run, the tombstones of its last ``retention``
    of real time are still within the retention, where in the commits' simulated time only the last ``retention``'s
    would be. After the pause they are gone, as they would be in that time, and the commits of the pause's end
    leave tombstones of their own, as a live store's last minutes do."""
    from trajstore.durations import seconds

    time.sleep(seconds(retention, "retention"))
    interval = trajstore.open(path).maintain.log_retention().checkpoint_interval
    write_store(path, interval, upkeep=True, writers=1, retention=retention, spacing_s=spacing_s,
                first_worker=first_worker)


def _median(fn: Callable[[], Any]) -> float:
    times = []
    for _ in range(REPEATS):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


def measure(path: Path) -> dict[str, float]:
    """Seconds of each query on a new Store (or service) each time."""
    from fastapi.testclient import TestClient

    from trajstore.api.app import create_app
    from trajstore.api.settings import ServiceSettings

    def service(urls: list[str]) -> None:
        with TestClient(create_app(ServiceSettings(store=str(path)))) as client:
            for url in urls:
                assert client.get(url).status_code == 200, url

    def follow() -> float:
        store = trajstore.open(path)
        oldest = store.history()["version"][0].as_py()  # the oldest version the log still reads (its retention)
        since = max(-1, oldest, store.version - FOLLOWED)
        t0 = time.perf_counter()
        n = sum(1 for _ in store.follow(["reward"], since=since, timeout=0))
        return (time.perf_counter() - t0) / max(1, store.version - since) if n else float("nan")

    return {
        "open": _median(lambda: trajstore.open(path).maintain.files()),
        "stats": _median(lambda: trajstore.open(path).stats()),
        "episodes": _median(lambda: trajstore.open(path).episodes()),
        "/stats": _median(lambda: service(["/stats"])),
        "first plot": _median(lambda: service(FIRST_PLOT)),
        "follow/commit": statistics.median(follow() for _ in range(REPEATS)),
    }


def fresh_copy(path: Path, to: Path) -> None:
    """A new store holding the aged store's rows as if written fresh: each partition's rows in one file (ordered by
    episode and step, as compaction writes them), committed once; its log a handful of versions."""
    from trajstore.operations.compact import merged, upgraded
    from trajstore.settings import Settings
    from trajstore.storage.location import locate
    from trajstore.storage.table import StepsTable

    aged = trajstore.open(path)
    trajstore.open(to, create=True)
    table = StepsTable.of_store(locate(str(to)), Settings.from_env())  # the storage layer, as a Store opens it
    partitions: dict[tuple[str, str], list[Any]] = {}
    for f in aged.maintain.files():
        partitions.setdefault((f.run_id, f.env_id), []).append(f)
    for (run_id, env_id), files in partitions.items():
        fmt = plumbing(aged).file_schemas(files[:1])[0].format
        table.append(upgraded(table, merged(files), fmt), run_id=run_id, env_id=env_id)


def same_rows(path: Path, other: Path) -> None:
    """The two stores hold the same steps (count, keys, rewards, observations)."""
    query = ("SELECT count(*) AS n, count(DISTINCT (episode_id, step)) AS keys, sum(reward::DOUBLE) AS r, "
             "sum(list_sum(obs)::DOUBLE) AS o, sum(list_sum(next_obs)::DOUBLE) AS x FROM steps")
    a, b = (trajstore.open(p).sql(query).to_pylist() for p in (path, other))
    if a != b:
        raise AssertionError(f"the fresh copy holds other rows: {a} vs {b}")


def run(points: list[int], work: Path, *, writers: int = WRITERS, retention: str | None = None,
        spacing_s: float = 3.0) -> tuple[list[dict[str, Any]], dict[str, Any] | None]:
    rows = []
    for n in points:
        path = work / f"c{n}"
        written = write_store(path, n, upkeep=True, writers=writers, retention=retention, spacing_s=spacing_s)
        at_once = None
        if retention is not None:
            at_once = {**measure(path), "tombstones": tombstones(path)}
            rest(path, retention, spacing_s, first_worker=writers)
        store = trajstore.open(path)
        files, version, lag = len(store.maintain.files()), store.version, plumbing(store).log_lag()[1]
        fresh_copy(path, work / f"c{n}-fresh")
        same_rows(path, work / f"c{n}-fresh")
        rows.append({"commits": n, "files": files, "version": version, "lag": lag, **written,
                     "log_entries": log_entries(path), "tombstones": tombstones(path),
                     "fresh_log_entries": log_entries(work / f"c{n}-fresh"),
                     "fresh_version": trajstore.open(work / f"c{n}-fresh").version,
                     "aged": measure(path), "compacted": measure(work / f"c{n}-fresh"),
                     **({} if at_once is None else {"at_once": at_once})})
        print(json.dumps(rows[-1]), flush=True)
        shutil.rmtree(work / f"c{n}-fresh")
        shutil.rmtree(path)
    off_n = max([n for n in points if n <= 1000], default=None) if retention is None else None
    off = None
    if off_n is not None:
        path = work / f"off{off_n}"
        off = {"commits": off_n, **write_store(path, off_n, upkeep=False),
               "files": len(trajstore.open(path).maintain.files()),
               "aged": measure(path)}
        print(json.dumps(off), flush=True)
        shutil.rmtree(path)
    return rows, off


def report(rows: list[dict[str, Any]], off: dict[str, Any] | None) -> str:
    names = list(rows[0]["aged"])
    base_follow = rows[0]["aged"]["follow/commit"]
    lines = ["## A store after many small commits (issue 22)", "",
             "`python benchmarks/bench_commits.py` (see its docstring): 8 writer processes commit N batches of 64 "
             "steps at once (one partition, default upkeep), then each query runs on a new `Store`/service, "
             "median of 3; the ratio is against a store holding the same rows written fresh (one file per partition, "
             "a log of a few versions, checked to hold the same steps) measured in the same run "
             "(follow: seconds per commit of catching up on the last 100, against the 10-commit point). "
             "Target: ≤ 2× at 10,000 commits.", "",
             "| commits | files (fresh: 1) | versions past checkpoint | " + " | ".join(names) + " |",
             "|---|---|---|" + "---|" * len(names)]
    for r in rows:
        cells = []
        for k in names:
            aged = r["aged"][k]
            base = base_follow if k == "follow/commit" else r["compacted"][k]
            cells.append(f"{aged * 1000:.1f} ms ({aged / base:.2f}×)")
        lines.append(f"| {r['commits']:,} | {r['files']} | {r['lag']} | " + " | ".join(cells) + " |")
    lines += ["", "Fresh stores (ms): " + "; ".join(
        f"{r['commits']:,}: " + ", ".join(f"{k} {r['compacted'][k] * 1000:.1f}" for k in names if k != "follow/commit")
        for r in rows), ""]
    lines += ["Writers (`add_batch` + `flush` of 64 steps, all 8 processes): " + "; ".join(
        f"{r['commits']:,} commits: median {r['lat_median_ms']:.1f} ms, p99 {r['lat_p99_ms']:.1f} ms, "
        f"{r['compactions']} compactions committed" for r in rows) + "."]
    if off is not None:
        on = next(r for r in rows if r["commits"] == off["commits"])
        lines += ["", f"Upkeep off (`TRAJSTORE_COMPACT_SMALL_FILES=0`), {off['commits']:,} commits, same run: "
                  f"writers median {off['lat_median_ms']:.1f} ms, p99 {off['lat_p99_ms']:.1f} ms (on: "
                  f"{on['lat_median_ms']:.1f} / {on['lat_p99_ms']:.1f}); {off['files']} files; " + ", ".join(
                      f"{k} {off['aged'][k] * 1000:.1f} ms ({off['aged'][k] / on['aged'][k]:.1f}× the store with "
                      "upkeep)" for k in names if k != "follow/commit") + "."]
    lines += ["", f"Machine: {cpu_model()}, {os.cpu_count()} cores (shared; load average {load_average()}); "
              f"trajstore commit {machine_info(REPO)['trajstore commit']}."]
    return "\n".join(lines)


def retention_report(rows: list[dict[str, Any]], args: argparse.Namespace) -> str:
    names = [k for k in rows[0]["aged"] if k != "follow/commit"]
    lines = ["## A log that stays small (issue 49)", "",
             f"`python benchmarks/bench_commits.py --commits {' '.join(str(r['commits']) for r in rows)} --retention "
             f"{args.retention} --writers {args.writers}` (see its docstring): {args.writers} writer processes commit "
             f"batches of 64 steps into a store created with a {args.retention} log retention, each log entry aged as "
             f"if the commits came every {args.spacing}; then the store rests for its retention and one writer makes "
             "a checkpoint interval's commits (the tombstones' own age is real time, which the ageing cannot move). "
             "Each query on a new `Store`/service, median of 3, against a store holding the same rows written fresh, "
             "in the same run; the ratio right after the writers stopped is given too. Targets: each ≤ 1.5×; the "
             "log's entries bounded by the retention, not the commit count.", "",
             "| commits | log entries (fresh) | versions past checkpoint | tombstones in the checkpoint | "
             + " | ".join(names) + " | follow, per commit |", "|---:|---:|---:|---:|" + "---:|" * (len(names) + 1)]
    for r in rows:
        cells = [f"{r['aged'][k] * 1000:.1f} ms ({r['aged'][k] / r['compacted'][k]:.2f}×)" for k in names]
        lines.append(f"| {r['commits']:,} | {r['log_entries']:,} ({r['fresh_log_entries']}) | {r['lag']} | "
                     f"{r['tombstones']:,} | " + " | ".join(cells) + f" | {r['aged']['follow/commit'] * 1000:.1f} ms |")
    worst = max(r["aged"][k] / r["compacted"][k] for r in rows for k in names)
    lines += ["", f"Worst ratio {worst:.2f}× ({'PASS' if worst <= 1.5 else '**FAIL**'})."]
    for r in rows:
        if "at_once" in r:
            lines += ["", f"Right after the writers stopped ({r['commits']:,} commits; {r['at_once']['tombstones']:,} "
                      "tombstones in the checkpoint): " + ", ".join(
                          f"{k} {r['at_once'][k] * 1000:.1f} ms ({r['at_once'][k] / r['compacted'][k]:.2f}×)"
                          for k in names) + "."]
    lines += ["", "Writers (`add_batch` + `flush` of 64 steps): " + "; ".join(
                  f"{r['commits']:,} commits in {r['wall_s']:.0f} s: median {r['lat_median_ms']:.1f} ms, p99 "
                  f"{r['lat_p99_ms']:.1f} ms, {r['compactions']:,} compactions" for r in rows) + ".",
              "", f"Machine: {cpu_model()}, {os.cpu_count()} cores (shared; load average {load_average()}); "
              f"trajstore commit {machine_info(REPO)['trajstore commit']}."]
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--commits", type=int, nargs="+", default=[10, 100, 1000, 3000])
    parser.add_argument("--work", type=Path, default=None, help="folder for the stores (default: a temporary one)")
    parser.add_argument("--writers", type=int, default=WRITERS, help=f"writer processes (default {WRITERS})")
    parser.add_argument("--retention", default=None, help="the stores' log retention, e.g. 10m (issue 49)")
    parser.add_argument("--spacing", default="3s", help="with --retention: the time between commits simulated")
    output_options(parser, "runs up to 1,000 commits or more", check=False)
    args = parser.parse_args()
    if args.work is not None:
        args.work.mkdir(parents=True, exist_ok=True)
    from trajstore.durations import seconds

    with tempfile.TemporaryDirectory(dir=args.work) as work:
        rows, off = run(sorted(args.commits), Path(work), writers=args.writers, retention=args.retention,
                        spacing_s=seconds(args.spacing, "spacing"))
    out = args.out or (REPO / "docs" / "benchmarks.md" if max(args.commits) >= 1000 else None)
    if args.retention:
        publish(out, "commits-retention", retention_report(rows, args))
    else:
        publish(out, "commits", report(rows, off))


if __name__ == "__main__":
    main()
