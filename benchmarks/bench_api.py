"""The service benchmark of issue 4: streaming steps over loopback, the JSON page endpoint, ``/stats``
latency and server memory, side by side in one run.

    python benchmarks/bench_api.py                    # 10M steps, writes the api section of docs/benchmarks.md
    python benchmarks/bench_api.py --steps 200000     # quick run (< 1 min); prints the section, writes no doc
    python benchmarks/bench_api.py --steps 200000 --out /tmp/bench.md

The store (CartPole-sized synthetic steps from ``benchmarks/data.py``, written with the library's writer) is
built once per size and kept in ``--cache-dir``. The service runs as ``trajstore serve`` in its own process,
so that its memory can be sampled (``/proc/<pid>/status`` every 50 ms) and the client does not share its GIL.
The client (``Client.iter_batches``) and the pyarrow baselines run in this process, their repeats interleaved
in rotating order so that load from other processes hits all alike.
"""

from __future__ import annotations

import argparse
import gc
import json
import os
import resource
import shlex
import shutil
import signal
import socket
import statistics
import subprocess
import sys
import threading
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
FULL_STEPS = 10_000_000
JSON_ROWS = 50_000  # the JSON endpoint is read for at most this many rows (a tenth of smaller stores)
RUN_ID, ENV_ID = "bench-api", "CartPole-v1"
COLUMNS = ["obs", "action", "reward"]
MIB = 2**20
sys.path.insert(0, str(HERE))
sys.path.insert(0, str(REPO))

import report  # noqa: E402
from timing import status_kib  # noqa: E402


def _log(msg: str) -> None:
    print(f"[bench:api] {msg}", file=sys.stderr, flush=True)


def _cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime


# --- the store, built once per size ---------------------------------------------------------------------------

def cached_store(steps: int, *, envs: int, horizon: int, cache_dir: Path, rebuild: bool = False) -> tuple[Path, dict]:
    """A store of ``steps`` synthetic CartPole steps under ``cache_dir``, written now unless already there."""
    from data import make_rollout

    import trajstore

    root = cache_dir / f"api-{steps}-B{envs}-T{horizon}"
    marker = root / "built.json"
    if marker.exists() and not rebuild:
        info = json.loads(marker.read_text())
        if sum(f.rows for f in trajstore.open(root / "store").maintain.files()) == info["steps"]:
            _log(f"reusing the store in {root}")
            return root / "store", info
    shutil.rmtree(root, ignore_errors=True)
    _log(f"generating {steps:,} steps (B={envs}) and writing them to {root}")
    rollout = make_rollout(steps, envs=envs, horizon=horizon)
    store = trajstore.open(root / "store", create=True)
    t0 = time.perf_counter()
    with store.writer(run_id=RUN_ID, env_id=ENV_ID) as writer:
        for batch in rollout.batches:
            writer.add_batch(batch)
    seconds = time.perf_counter() - t0
    files = store.maintain.files()
    info = {"steps": rollout.steps, "envs": envs, "horizon": rollout.horizon, "batches": len(rollout.batches),
            "complete_episodes": rollout.complete_episodes, "files": len(files),
            "stored_mb": sum(f.size for f in files) / MIB, "write_seconds": seconds}
    marker.write_text(json.dumps(info))
    return root / "store", info


# --- the server in its own process, and its memory -------------------------------------------------------------

def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _proc_cpu(pid: int) -> float:
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")


class Server:
    """``trajstore serve --store PATH`` on a free port of 127.0.0.1, in a child process; a context manager."""

    def __init__(self, store: Path, log_path: Path, env: dict[str, str] | None = None) -> None:
        self.port = _free_port()
        self.url = f"http://127.0.0.1:{self.port}"
        self._log = open(log_path, "wb")
        cmd = [sys.executable, "-m", "trajstore.cli", "serve", "--store", str(store), "--port", str(self.port)]
        environ = {**os.environ, "PYTHONPATH": str(REPO), **(env or {})}
        self.proc = subprocess.Popen(cmd, cwd=REPO, env=environ, stdout=self._log, stderr=subprocess.STDOUT)
        self.pid = self.proc.pid

    def wait_ready(self, timeout: float = 60.0) -> None:
        import httpx

        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"the server exited with status {self.proc.returncode}; see {self._log.name}")
            try:
                if httpx.get(self.url + "/health", timeout=1).status_code == 200:
                    return
            except httpx.TransportError:
                pass
            time.sleep(0.05)
        raise RuntimeError(f"the server did not answer /health within {timeout} s; see {self._log.name}")

    def rss(self) -> int:
        return status_kib("VmRSS", self.pid) * 1024

    def rss_anon(self) -> int:
        """Resident memory that is the process's own (not pages of files or libraries it has mapped)."""
        return status_kib("RssAnon", self.pid) * 1024

    def hwm(self) -> int:
        return status_kib("VmHWM", self.pid) * 1024

    def cpu(self) -> float:
        return _proc_cpu(self.pid)

    def __enter__(self) -> Server:
        try:
            self.wait_ready()
        except BaseException:
            self.stop()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self._log.close()


class RssSampler:
    """Samples a process's resident memory every ``interval`` seconds in a background thread."""

    def __init__(self, read: Callable[[], int], interval: float = 0.05) -> None:
        self.read, self.interval = read, interval
        self.samples: list[tuple[float, int]] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            try:
                self.samples.append((time.perf_counter(), self.read()))
            except (OSError, KeyError):
                return
            self._stop.wait(self.interval)

    def sample(self) -> None:
        """One sample now, besides the thread's: a stream shorter than the interval still gets its own."""
        try:
            self.samples.append((time.perf_counter(), self.read()))
        except (OSError, KeyError):
            pass

    def between(self, t0: float, t1: float) -> list[int]:
        return [rss for t, rss in self.samples if t0 <= t <= t1]

    def __enter__(self) -> RssSampler:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join()


# --- the methods ----------------------------------------------------------------------------------------------

@dataclass
class Timing:
    """Repeated wall-clock timings of one method reading ``rows`` rows, with the CPU time it took."""

    name: str
    rows: int
    note: str = ""
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)  # this process
    server_cpu: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rate(self) -> float:
        return self.rows / self.median

    def cpu_per_row(self, cpu: list[float]) -> float:
        """Median CPU seconds per row (of this process, or of the server)."""
        return statistics.median(cpu) / self.rows if cpu else 0.0


@dataclass
class StreamRun:
    """One ``iter_batches`` pass: when each batch arrived (rows so far), for memory by stream progress."""

    start: float
    end: float = 0.0
    marks: list[tuple[float, int]] = field(default_factory=list)


def _to_numpy(batch: Any) -> dict[str, Any]:
    from trajstore.schema import to_numpy

    return {name: to_numpy(batch.column(i)) for i, name in enumerate(batch.schema.names)}


def read_pyarrow_dataset(paths: list[str], batch_size: int) -> int:
    """``pyarrow.dataset`` over the committed files: streamed record batches (readahead, threads), to numpy."""
    import pyarrow.dataset as ds

    rows = 0
    for batch in ds.dataset(paths, format="parquet").to_batches(columns=COLUMNS, batch_size=batch_size):
        rows += len(_to_numpy(batch)["reward"])
    return rows


def read_pyarrow_files(paths: list[str], batch_size: int) -> int:
    """``pyarrow.parquet.ParquetFile.iter_batches`` file after file, to numpy."""
    import pyarrow.parquet as pq

    rows = 0
    for path in paths:
        for batch in pq.ParquetFile(path).iter_batches(batch_size=batch_size, columns=COLUMNS):
            rows += len(_to_numpy(batch)["reward"])
    return rows


def read_scan(store_path: Path, batch_size: int) -> int:
    """The server's own read (``Store.scan`` of the columns, as ``api/routes/steps.py`` runs it) in this
    process, without HTTP or IPC: how fast the server can make the rows."""
    import trajstore

    rows = 0
    for batch in trajstore.open(store_path).scan(COLUMNS, batch_size=batch_size):
        rows += len(_to_numpy(batch)["reward"])
    return rows


def read_client(url: str, batch_size: int, run: StreamRun) -> int:
    """``Client.iter_batches`` over the whole store, numpy batches; records when each batch arrived."""
    from trajstore.remote.client import Client

    rows = 0
    with Client(url, timeout=120) as client:
        for batch in client.iter_batches(batch_size=batch_size, columns=COLUMNS, format="numpy"):
            rows += len(batch["reward"])
            run.marks.append((time.perf_counter(), rows))
    return rows


def read_http_body(url: str, batch_size: int) -> int:
    """The same ``/steps`` request as ``iter_batches`` makes, its body received by the client's own reader
    and thrown away (no Arrow decoding): the cost of HTTP alone on the client. Returns the body's size."""
    from trajstore.remote.client import Client

    size = 0
    with Client(url, timeout=120) as client, \
            client._stream("/steps", {"columns": COLUMNS, "batch_rows": batch_size}) as body:
        while chunk := body.read(1 << 20):
            size += len(chunk)
    return size


def read_json_pages(url: str, rows: int) -> tuple[int, list[float], int]:
    """The first ``rows`` steps through ``/steps?format=json``, page after page at the largest page size the
    server allows, decoded and turned into numpy arrays like a client would. Returns rows, page times, page size."""
    import httpx

    got, times, offset, limit = 0, [], 0, 1_000_000
    with httpx.Client(base_url=url, timeout=120) as http:
        while got < rows:
            t0 = time.perf_counter()
            r = http.get("/steps", params={"format": "json", "columns": COLUMNS, "limit": limit, "offset": offset})
            r.raise_for_status()
            page = r.json()
            items = page["items"]
            arrays = {c: np.asarray([row[c] for row in items]) for c in COLUMNS}
            times.append(time.perf_counter() - t0)
            limit = page["limit"]
            if not items:
                break
            got += len(arrays["reward"])
            offset += len(items)
    return got, times, limit


def stats_latency(url: str, repeats: int) -> tuple[float, list[float], dict[str, Any]]:
    """``GET /stats`` (JSON): the first call, then ``repeats`` more."""
    import httpx

    times = []
    with httpx.Client(base_url=url, timeout=120) as http:
        for _ in range(repeats + 1):
            t0 = time.perf_counter()
            r = http.get("/stats", headers={"Accept": "application/json"})
            r.raise_for_status()
            body = r.json()
            times.append(time.perf_counter() - t0)
    return times[0], times[1:], body[0] if body else {}


# --- one run: everything side by side -------------------------------------------------------------------------

@dataclass
class Target:
    what: str
    measured: float
    required: float
    higher_is_better: bool
    fmt: str

    @property
    def passed(self) -> bool:
        return self.measured >= self.required if self.higher_is_better else self.measured <= self.required


@dataclass
class Results:
    data: dict[str, Any]
    timings: list[Timing]  # client, pyarrow.dataset, pyarrow.parquet, Store.scan in-process, HTTP body only
    json: dict[str, Any]
    stats: dict[str, Any]
    memory: dict[str, Any]
    targets: list[Target]


def run(steps: int, *, envs: int = 1000, horizon: int = 250, batch_size: int = 65_536, repeats: int = 5,
        json_rows: int | None = None, stats_repeats: int = 7, cache_dir: Path, work: Path,
        rebuild: bool = False) -> Results:
    """Build (or reuse) the store, start the server, then measure everything against it."""
    import trajstore

    path, data = cached_store(steps, envs=envs, horizon=horizon, cache_dir=cache_dir, rebuild=rebuild)
    paths = [f.path for f in trajstore.open(path).maintain.files()]
    n = data["steps"]
    json_rows = min(json_rows or max(n // 10, 10_000), JSON_ROWS, n)
    timings = [Timing("`Client.iter_batches` over loopback", n,
                      f"`batch_size={batch_size}`, `format=\"numpy\"`, server in another process"),
               Timing("pyarrow.dataset", n, f"`ds.dataset(files).to_batches(columns, batch_size={batch_size})`"),
               Timing("pyarrow.parquet", n, f"`ParquetFile(f).iter_batches(batch_size={batch_size}, columns)` "
                                            "file by file"),
               Timing("`Store.scan`, no HTTP", n, "the server's read of the files (pyarrow dataset scanner) and "
                                                  "batch size, run in this process (diagnostic)"),
               Timing("HTTP body only", n, "the same `/steps` request, body received by the client's reader "
                                           "(`http.client`) and dropped, no Arrow decoding (diagnostic)")]
    with Server(path, work / "server.log") as server, RssSampler(server.rss) as sampler, \
            RssSampler(server.rss_anon) as anon:
        time.sleep(1.0)
        idle = statistics.median(sampler.between(0, time.perf_counter()))
        streams: list[StreamRun] = []
        body_size: dict[str, int] = {}
        methods = _methods(server.url, path, paths, batch_size, n, streams, body_size, [sampler, anon])
        _log("warm-up: one untimed pass of each method")
        for method in methods:
            method()
        time.sleep(1.0)
        t = time.perf_counter()
        warm = statistics.median(sampler.between(t - 0.9, t))
        del streams[:]
        for r in range(repeats):
            for i in [(r + k) % len(methods) for k in range(len(methods))]:
                _timed(timings[i], methods[i], server)
                _log(f"repeat {r + 1}/{repeats}: {timings[i].name}: {timings[i].seconds[-1]:.2f}s "
                     f"({n / timings[i].seconds[-1] / 1e6:.2f}M rows/s)")
        memory = _memory(sampler, streams, n, idle=idle, warm=warm)
        own = [rss for s in streams for rss in anon.between(s.start, s.end)]
        memory["anon"] = {"warm": statistics.median(anon.between(t - 0.9, t)), "peak": max(own),
                          "quantiles": {q: float(np.quantile(own, q / 100)) for q in (10, 50, 90, 99)}}
        _log(f"JSON pages for the first {json_rows:,} rows")
        got, page_times, limit = read_json_pages(server.url, json_rows)
        json_res = {"rows": got, "seconds": sum(page_times), "pages": len(page_times), "limit": limit,
                    "page_median": statistics.median(page_times), "first_page": page_times[0],
                    "last_page": page_times[-1]}
        _log("/stats latency")
        cold, times, body = stats_latency(server.url, stats_repeats)
        stats = {"cold": cold, "times": times, "median": statistics.median(times), "body": body}
        memory["hwm_end"] = server.hwm()
    data["stream_mb"] = body_size["bytes"] / MIB
    return Results(data, timings, json_res, stats, memory, _targets(timings, json_res, stats, memory))


def _methods(url: str, store: Path, paths: list[str], batch_size: int, rows: int, streams: list[StreamRun],
             body: dict[str, int], samplers: list[RssSampler]) -> list[Callable[[], int]]:
    """The methods in the order of the timings; each returns the rows it read. Each client stream is sampled
    by ``samplers`` as it starts and ends, however short it is."""
    def client() -> int:
        streams.append(StreamRun(time.perf_counter()))
        for sampler in samplers:
            sampler.sample()
        got = read_client(url, batch_size, streams[-1])
        for sampler in samplers:
            sampler.sample()
        streams[-1].end = time.perf_counter()
        return got

    def http_body() -> int:
        body["bytes"] = read_http_body(url, batch_size)
        return rows

    return [client, lambda: read_pyarrow_dataset(paths, batch_size), lambda: read_pyarrow_files(paths, batch_size),
            lambda: read_scan(store, batch_size), http_body]


def _timed(timing: Timing, method: Callable[[], int], server: Server) -> None:
    gc.collect()
    c0, s0, t0 = _cpu(), server.cpu(), time.perf_counter()
    rows = method()
    timing.seconds.append(time.perf_counter() - t0)
    timing.cpu.append(_cpu() - c0)
    timing.server_cpu.append(server.cpu() - s0)
    if rows != timing.rows:
        raise RuntimeError(f"{timing.name} read {rows:,} rows, expected {timing.rows:,}")


def _memory(sampler: RssSampler, streams: list[StreamRun], rows: int, *, idle: float, warm: float) -> dict[str, Any]:
    """Server RSS while streaming, by tenth of the stream (rows delivered so far), over every timed stream."""
    deciles: list[list[int]] = [[] for _ in range(10)]
    during: list[int] = []
    per_run = []
    for s in streams:
        marks = [(s.start, 0)] + s.marks
        i = 0
        samples = sorted((t, rss) for t, rss in sampler.samples if s.start <= t <= s.end)
        for t, rss in samples:
            while i + 1 < len(marks) and marks[i + 1][0] <= t:
                i += 1
            deciles[min(9, marks[i][1] * 10 // rows)].append(rss)
        during += [rss for _, rss in samples]
        per_run.append(max((rss for _, rss in samples), default=0))
    peaks = [max(d) if d else None for d in deciles]
    first = peaks[0] or 0
    return {"idle": idle, "warm": warm, "peak": max(during), "peak_first_tenth": first, "decile_peaks": peaks,
            "per_run_peaks": per_run, "samples": len(during),
            "quantiles": {q: float(np.quantile(during, q / 100)) for q in (10, 50, 90, 99)},
            "growth": max(during) - first}


def _targets(timings: list[Timing], json_res: dict[str, Any], stats: dict[str, Any],
             memory: dict[str, Any]) -> list[Target]:
    client, *direct = timings[:3]
    best = max(direct, key=lambda t: t.rate)
    json_rate = json_res["rows"] / json_res["seconds"]
    return [
        Target(f"`iter_batches` throughput / {best.name} (faster direct read)", client.rate / best.rate, 0.5,
               True, "{:.0%}"),
        Target("`iter_batches` throughput / JSON endpoint throughput", client.rate / json_rate, 20.0, True,
               "{:.0f}×"),
        Target("`GET /stats` latency, median (s)", stats["median"], 1.0, False, "{:.3f}"),
        Target("server RSS growth from the first tenth of the stream to the whole stream (MiB)",
               memory["growth"] / MIB, FLAT_MIB, False, "{:.1f}"),
    ]


FLAT_MIB = 32.0


# --- markdown ------------------------------------------------------------------------------------------------

def _mib(x: float | None) -> str:
    return "–" if x is None else f"{x / MIB:.0f}"


def cpu_breakdown(timings: list[Timing]) -> list[tuple[str, float]]:
    """CPU seconds per million rows of each stage of ``iter_batches``, from the diagnostic methods."""
    client, _, parquet, scan, body = timings
    per_m = {t.name: (t.cpu_per_row(t.cpu) * 1e6, t.cpu_per_row(t.server_cpu) * 1e6) for t in timings}
    c_here, c_server = per_m[client.name]
    return [("server: scan of the Parquet files to Arrow batches", per_m[scan.name][0]),
            ("server: IPC, HTTP and socket (server total minus the scan)", c_server - per_m[scan.name][0]),
            ("client: HTTP receive (`http.client`)", per_m[body.name][0]),
            ("client: IPC decode, rebatch, numpy (client total minus HTTP)", c_here - per_m[body.name][0]),
            ("total of `iter_batches`", c_here + c_server),
            ("pyarrow.parquet, for comparison", per_m[parquet.name][0])]


def to_markdown(res: Results, machine: dict[str, str], command: str) -> str:
    d, js, st, mem = res.data, res.json, res.stats, res.memory
    client = res.timings[0]
    lines = ["## Service: streaming, JSON pages, `/stats`, server memory (issue 4)", "",
             f"Generated by `{command}` on {machine['date']}. Every number below was measured in that one run, "
             "against one `trajstore serve` process on 127.0.0.1; times are medians of the runs listed "
             "(repeats of the stream and of its baselines interleaved).", "",
             "### Targets", "", "| target | measured | required | result |", "|---|---:|---:|---|"]
    for t in res.targets:
        req = ("≥ " if t.higher_is_better else "≤ ") + t.fmt.format(t.required)
        lines.append(f"| {t.what} | {t.fmt.format(t.measured)} | {req} | {'PASS' if t.passed else '**FAIL**'} |")
    lines += ["", "### Data", "",
              f"{d['steps']:,} CartPole-sized steps (obs and next_obs float32[4], action int64, reward float32, "
              f"terminated/truncated bool; episodes of mean length 100) from `benchmarks/data.py`, "
              f"{d['batches']} time-major batches of (T={d['horizon']}, B={d['envs']}) written with "
              f"`store.writer(...).add_batch` into {d['files']} committed files ({d['stored_mb']:.0f} MiB). "
              f"Every method reads the columns {', '.join(f'`{c}`' for c in COLUMNS)} of every step; as an Arrow IPC "
              f"stream they are {d['stream_mb']:.0f} MiB.", "",
              "### Throughput", "",
              "| method | median s | rows/s | `iter_batches` / this | CPU s per 1M rows: here + server "
              "| runs (s) | notes |", "|---|---:|---:|---:|---:|---|---|"]
    for t in res.timings:
        runs = ", ".join(f"{s:.2f}" for s in t.seconds)
        cpu = t.cpu_per_row(t.cpu) * 1e6
        server = t.cpu_per_row(t.server_cpu) * 1e6
        cost = f"{cpu:.3f} + {server:.3f}" if t.server_cpu and server > 0.01 else f"{cpu:.3f}"
        lines.append(f"| {t.name} | {t.median:.3f} | {t.rate / 1e6:.2f}M | {client.rate / t.rate:.0%} "
                     f"| {cost} | {runs} | {t.note} |")
    json_rate = js["rows"] / js["seconds"]
    lines.append(f"| `GET /steps?format=json` pages | {js['seconds']:.2f} for {js['rows']:,} rows | "
                 f"{json_rate / 1e3:.1f}k | {client.rate / json_rate:.0f}× | – | one pass | "
                 f"{js['pages']} pages of `limit={js['limit']}` (the server's maximum) from offset 0, "
                 f"decoded and turned into numpy; page time median {js['page_median'] * 1e3:.0f} ms, "
                 f"first {js['first_page'] * 1e3:.0f} ms, last {js['last_page'] * 1e3:.0f} ms |")
    lines += ["", "### Where the time goes", "",
              "CPU seconds per million rows (medians), from the diagnostic rows above. On a machine whose cores "
              "are busy, the stream's throughput relative to a direct read tends to the ratio of these totals.",
              "", "| stage | CPU s per 1M rows |", "|---|---:|"]
    lines += [f"| {part} | {cost:.3f} |" for part, cost in cpu_breakdown(res.timings)]
    times = ", ".join(f"{x:.3f}" for x in st["times"])
    lines += ["", "### `/stats` latency", "",
              f"`GET /stats` (JSON, all {st['body'].get('n_traj', 0):,} complete episodes): median "
              f"**{st['median']:.3f} s** over {len(st['times'])} calls ({times}); the first call took "
              f"{st['cold']:.3f} s.", "",
              "### Server memory while streaming", "",
              f"RSS of the server process sampled every 50 ms ({mem['samples']} samples during the "
              f"{len(mem['per_run_peaks'])} timed streams of {d['steps']:,} rows). MiB:", "",
              "| idle after start | idle after warm-up | peak, first tenth of the stream | peak, whole streams "
              "| p10 / p50 / p90 / p99 during | peak of each stream | VmHWM at the end |",
              "|---:|---:|---:|---:|---:|---:|---:|",
              f"| {_mib(mem['idle'])} | {_mib(mem['warm'])} | {_mib(mem['peak_first_tenth'])} | {_mib(mem['peak'])} "
              f"| {' / '.join(_mib(v) for v in mem['quantiles'].values())} "
              f"| {', '.join(_mib(v) for v in mem['per_run_peaks'])} | {_mib(mem['hwm_end'])} |", "",
              "Peak RSS by tenth of the stream (rows delivered so far), MiB: "
              + " · ".join(_mib(v) for v in mem["decile_peaks"]) + ".", "",
              "The server's own memory (`RssAnon`: RSS without mapped files and libraries) during the streams, MiB: "
              f"{_mib(mem['anon']['warm'])} idle after warm-up; p10 / p50 / p90 / p99 "
              f"{' / '.join(_mib(v) for v in mem['anon']['quantiles'].values())}; peak {_mib(mem['anon']['peak'])}.",
              ""]
    notes = [
        "The first target compares with the faster of the two pyarrow reads in this run. The direct reads get "
        "the committed file list for free and skip the HTTP and IPC layers entirely; "
        "they convert each record batch to numpy with the same `trajstore.schema.to_numpy` the client uses, "
        "but do not rebatch to exact sizes (the client does).",
        "The server reads with `Store.scan`: pyarrow's dataset scanner over the committed file list, two files "
        "ahead; each batch is written as an Arrow IPC message and sent as one HTTP chunk. The client receives "
        "with `http.client` and decodes with `pyarrow.ipc.open_stream`, then rebatches to exact sizes.",
        "`iter_batches` is timed from the request to the last batch, including the server's snapshot and "
        "scan set-up. CPU time is that of this process (client, baselines, all their threads) and of the server "
        "process; when other work keeps the cores busy, throughput follows the CPU cost rather than the "
        "parallelism of the pipeline.",
        "The JSON endpoint pages with `ORDER BY episode_id, step LIMIT … OFFSET …`, so every page is a query "
        "over the whole store: it is read for the first rows only (its rate does not improve with more).",
        f"`VmHWM` includes the `/stats` and JSON queries that ran after the streams. \"Flat\" means the peak "
        f"over whole streams exceeds the peak during their first tenth by at most {FLAT_MIB:.0f} MiB.",
        "The machine has 2 cores and other work may run at the same time; server and client share them. "
        "Ratios from one run are more trustworthy than absolute numbers.",
    ]
    lines += ["### Notes", ""] + [f"- {n}" for n in notes]
    lines += ["", "### Machine", "", "| | |", "|---|---|"] + [f"| {k} | {v} |" for k, v in machine.items()]
    return "\n".join(lines) + "\n"


# --- command line --------------------------------------------------------------------------------------------

def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=FULL_STEPS, help="steps in the store (default: %(default)s)")
    p.add_argument("--envs", type=int, default=1000, help="B, envs per batch (default: %(default)s)")
    p.add_argument("--horizon", type=int, default=250, help="T, steps per batch (default: %(default)s)")
    p.add_argument("--batch-size", type=int, default=65_536, help="rows per batch (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=5, help="runs per method (default: %(default)s)")
    p.add_argument("--json-rows", type=int, default=None,
                   help=f"rows to read through the JSON endpoint (default: a tenth of the steps, at most "
                        f"{JSON_ROWS:,})")
    p.add_argument("--cache-dir", type=Path, default=Path(os.environ.get("TMPDIR", "/tmp")) / "trajstore-bench-cache",
                   help="where stores are kept between runs (default: %(default)s)")
    p.add_argument("--rebuild", action="store_true", help="write the store again even if it is cached")
    report.output_options(p, f"runs of {FULL_STEPS:,} steps or more")
    return p


def main(argv: list[str] | None = None) -> int:
    import tempfile

    args = _parser().parse_args(argv)
    out = report.out_path(args.out, args.steps >= FULL_STEPS, REPO)
    machine = report.machine_info(REPO)
    with tempfile.TemporaryDirectory(prefix="trajstore-bench-api-") as work:
        res = run(args.steps, envs=args.envs, horizon=args.horizon, batch_size=args.batch_size, repeats=args.repeats,
                  json_rows=args.json_rows, cache_dir=args.cache_dir, work=Path(work), rebuild=args.rebuild)
    command = "python benchmarks/bench_api.py" + "".join(f" {shlex.quote(a)}" for a in
                                                           (sys.argv[1:] if argv is None else argv))
    body = to_markdown(res, machine, command)
    report.publish(out, "api", body)
    for t in res.targets:
        print(f"{'PASS' if t.passed else 'FAIL'}  {t.what}: {t.fmt.format(t.measured)}")
    return 1 if args.check and not all(t.passed for t in res.targets) else 0


if __name__ == "__main__":
    sys.exit(main())
