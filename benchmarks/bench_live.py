"""A million episodes, live (issue 15): the dashboard's first plot before (every episode from ``/curves``) and
after (binned on the server), ``follow`` latency, and deep ``/steps`` pages by offset and by cursor.

    python benchmarks/bench_live.py                   # 100k and 1M episodes; writes its section of docs/benchmarks.md
    python benchmarks/bench_live.py --sizes 20000     # quick run: prints the section only

The stores are written with the library writer directly: 4 runs x 4 policy versions, 2,000 envs, episodes of
1–8 steps (uniform), a 1-float observation, so a million episodes are ~4.5M steps written in seconds.
First plot: the requests the page makes before its first plot with data, timed over HTTP in the order the
page makes them (concurrent ones counted by the slowest), warm server (each request made once before), and
their bytes; before = the page before this issue (/ready, /runs, /episodes, /curves), after = this page
(/ready, /runs, /episodes, /curves/binned, two /curves/histogram, /stats). With Chromium present, the page
itself is also opened (warm: the second load of a context) and its own ``trajstore-plots`` mark is reported.
"""

from __future__ import annotations

import argparse
import contextlib
import statistics
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))
sys.path.insert(0, str(HERE))

import httpx  # noqa: E402
import numpy as np  # noqa: E402
from report import cpu_model, git_commit, load_average, out_path, publish  # noqa: E402

import trajstore  # noqa: E402
from tests.api.helpers import serve  # noqa: E402
from trajstore.api.app import create_app  # noqa: E402
from trajstore.api.cursor import encode  # noqa: E402
from trajstore.api.settings import ServiceSettings  # noqa: E402

SECTION = "live"
SIZES = (100_000, 1_000_000)
CHROMIUM = Path("/usr/bin/chromium")
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
ENVS, HORIZON, RUNS, VERSIONS = 2000, 250, 4, 4


def build_store(path: Path, episodes: int) -> float:
    """``episodes`` complete episodes (about; whole horizons) written with the library writer; seconds taken."""
    store = trajstore.open(path, create=True)
    rng = np.random.default_rng(0)
    per_writer = episodes / (RUNS * VERSIONS)
    T = max(8, int(per_writer / ENVS * 4.5))
    t0 = time.perf_counter()
    for r in range(RUNS):
        for v in range(VERSIONS):
            lengths = rng.integers(1, 9, size=(ENVS, T))
            ends = np.cumsum(lengths, axis=1) - 1
            done = np.zeros((T, ENVS), bool)
            for b in range(ENVS):
                done[ends[b][ends[b] < T], b] = True
            valid = np.arange(T)[:, None] <= np.where(done.any(0), T - 1 - np.argmax(done[::-1], 0), -1)[None, :]
            with store.writer(run_id=f"run-{r}", env_id="Tiny-v0", policy_version=v) as w:
                for t in range(0, T, HORIZON):
                    s = slice(t, t + HORIZON)
                    n = done[s].shape[0]
                    w.add_batch({"obs": rng.standard_normal((n, ENVS, 1), dtype=np.float32),
                                 "next_obs": rng.standard_normal((n, ENVS, 1), dtype=np.float32),
                                 "action": rng.integers(0, 2, (n, ENVS)),
                                 "reward": (rng.random((n, ENVS)) * (1 + r + v)).astype(np.float32),
                                 "terminated": done[s], "truncated": np.zeros((n, ENVS), bool), "valid": valid[s]})
    return time.perf_counter() - t0


BEFORE = [["/ready"], ["/runs", "/episodes?order_by=-ended_at&limit=25", "/curves"]]
AFTER = [["/ready"], ["/runs", "/episodes?order_by=-ended_at&limit=25", "/curves/binned?bins=1330",
                      "/curves/histogram?y=episode_return&bins=60", "/curves/histogram?y=episode_length&bins=60",
                      "/stats?by=run_id,env_id"]]


def page_fetches(url: str, stages: list[list[str]]) -> tuple[float, int]:
    """Seconds and bytes of the page's fetches: stages one after the other, the requests of a stage at once."""
    total_s, total_b = 0.0, 0
    with httpx.Client(base_url=url, timeout=600) as c, ThreadPoolExecutor(8) as pool:
        for stage in stages:
            t0 = time.perf_counter()
            bodies = list(pool.map(lambda p: c.get(p).content, stage))
            total_s += time.perf_counter() - t0
            total_b += sum(len(b) for b in bodies)
    return total_s, total_b


def assets(url: str) -> int:
    with httpx.Client(base_url=url) as c:
        return sum(len(c.get(p).content) for p in ("/dashboard", "/dashboard/assets/dashboard.js",
                                                   "/dashboard/assets/dashboard.css"))


def browser_first_plot(url: str) -> float | None:
    """The page's own first-plot mark (ms from navigation), warm (second load in one context)."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        return None
    if not CHROMIUM.is_file():
        return None
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        page = browser.new_context(viewport={"width": 1400, "height": 1000}).new_page()
        marks = []
        for _ in range(3):
            page.goto(url + "/dashboard")
            page.wait_for_function("() => window.trajstoreDashboard && trajstoreDashboard.ready", timeout=600_000)
            marks.append(page.evaluate("() => performance.getEntriesByName('trajstore-plots', 'mark')[0].startTime"))
        browser.close()
    return statistics.median(marks[1:])


def follow_latency(store: trajstore.Store, url: str, commits: int = 20) -> dict[str, float]:
    """Commit → delivery, median and max in ms, for Store.follow and Client.follow (each its own writer)."""
    out = {}
    for name in ("store", "client"):
        since, landed, got = store.version, {}, {}
        source = store.follow(["step"], since=since, poll=0.5, timeout=10) if name == "store" else \
            trajstore.Client(url).follow(["step"], since=since, timeout=10)

        def consume(src: Any = source, got: dict[int, float] = got) -> None:
            for c in src:
                got[c.version] = time.perf_counter()
                if len(got) == commits:
                    return

        reader = threading.Thread(target=consume)
        reader.start()
        rng = np.random.default_rng(1)
        with store.writer(run_id=f"follow-{name}", env_id="Tiny-v0") as w:
            for _ in range(commits):
                time.sleep(0.3)
                w.add_batch({"obs": rng.standard_normal((4, 8, 1), dtype=np.float32),
                             "next_obs": rng.standard_normal((4, 8, 1), dtype=np.float32),
                             "action": rng.integers(0, 2, (4, 8)), "reward": np.ones((4, 8), np.float32),
                             "terminated": np.ones((4, 8), bool), "truncated": np.zeros((4, 8), bool)})
                w.flush()
                landed[store.version] = time.perf_counter()
        reader.join(30)
        lat = [1000 * (got[v] - landed[v]) for v in landed if v in got]
        out[name] = (statistics.median(lat), max(lat), len(lat))
    return out


def deep_pages(store: trajstore.Store, url: str) -> dict[str, float]:
    """Median ms of a 100-row JSON /steps page: first, last by offset, last by cursor."""
    n = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
    key = store.sql(f"SELECT episode_id, step FROM steps ORDER BY episode_id, step LIMIT 1 OFFSET {n - 101}")
    cursor = encode([key["episode_id"][0].as_py(), key["step"][0].as_py()])
    base = "/steps?format=json&limit=100&columns=episode_id,step,reward"
    paths = {"first": base, "last, offset": f"{base}&offset={n - 100}", "last, cursor": f"{base}&cursor={cursor}"}
    out = {"steps": n}
    with httpx.Client(base_url=url, timeout=600) as c:
        for name, path in paths.items():
            c.get(path)
            times = []
            for _ in range(5):
                t0 = time.perf_counter()
                r = c.get(path)
                times.append(1000 * (time.perf_counter() - t0))
            assert r.status_code == 200 and len(r.json()["items"]) == 100, r.text[:200]
            out[name] = statistics.median(times)
    return out


def run_size(episodes: int, work: Path, repeats: int) -> dict[str, Any]:
    path = work / f"store-{episodes}"
    write_s = build_store(path, episodes)
    store = trajstore.open(path)
    res: dict[str, Any] = {"episodes": store.stats()["n_traj"][0].as_py(), "write_s": write_s}
    with contextlib.contextmanager(serve)(create_app(ServiceSettings(store=str(path)))) as live:
        for name, stages in (("before", BEFORE), ("after", AFTER)):
            page_fetches(live.url, stages)  # warm: each request once first
            runs = [page_fetches(live.url, stages) for _ in range(repeats)]
            res[name] = (statistics.median(r[0] for r in runs), runs[0][1])
        res["assets"] = assets(live.url)
        res["browser_ms"] = browser_first_plot(live.url)
        res["pages"] = deep_pages(live.app.state.store, live.url)
        res["follow"] = follow_latency(live.app.state.store, live.url)
    return res


def to_markdown(results: list[dict[str, Any]], command: str) -> str:
    lines = ["## A million episodes, live (issue 15)", "",
             f"`{command}` at trajstore commit {git_commit(REPO)} on {cpu_model()} (load average at the end "
             f"{load_average()}; 2 cores shared with other sessions: "
             "expect noise). Stores written directly with the library writer (4 runs x 4 policy versions, 2,000 "
             "envs, episodes of 1–8 steps). First plot = the page's fetches before its first plot with data, timed "
             "over HTTP on a warm server (concurrent requests counted by the slowest), bytes = their bodies; page "
             "assets (HTML, JS, CSS) listed apart, Plotly.js (its basic bundle, 396 kB gzipped, cached for good by the "
             "browser) not counted; the dashboard benchmark counts every byte of a first visit. "
             "Browser = the page's own `trajstore-plots` mark in Chromium, warm.", "",
             "| episodes | first plot before (`/curves`) | after (binned) | ratio | bytes before | bytes after | "
             "page assets | browser first plot (after) |", "|---|---|---|---|---|---|---|---|"]
    for r in results:
        b, a = r["before"], r["after"]
        browser = f"{r['browser_ms']:.0f} ms" if r["browser_ms"] is not None else "n/a"
        lines.append(f"| {r['episodes']:,} | {b[0]:.2f} s | {a[0]:.3f} s | {b[0] / a[0]:.0f}x faster | "
                     f"{b[1] / 1e6:.1f} MB | {a[1] / 1e3:.0f} kB | {r['assets'] / 1e3:.0f} kB | {browser} |")
    lines += ["", "| episodes (steps) | `/steps` page 1 | last page, offset | last page, cursor | cursor / page 1 |",
              "|---|---|---|---|---|"]
    for r in results:
        p = r["pages"]
        lines.append(f"| {r['episodes']:,} ({p['steps']:,}) | {p['first']:.0f} ms | {p['last, offset']:.0f} ms | "
                     f"{p['last, cursor']:.0f} ms | {p['last, cursor'] / p['first']:.2f} |")
    lines += ["", "| episodes | follow: commit → delivery | median | max | commits |", "|---|---|---|---|---|"]
    for r in results:
        for name, (med, worst, n) in r["follow"].items():
            how = "`Store.follow` (poll ≤ 0.5 s)" if name == "store" else "`Client.follow` (SSE, watcher ≤ 0.25 s)"
            lines.append(f"| {r['episodes']:,} | {how} | {med:.0f} ms | {worst:.0f} ms | {n} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--sizes", default=",".join(map(str, SIZES)), help="episodes per store (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--out", type=Path, default=None)
    p.add_argument("--workdir", type=Path, default=None)
    args = p.parse_args(argv)
    sizes = [int(s) for s in args.sizes.split(",")]
    out = out_path(args.out, max(sizes) >= SIZES[-1], REPO)
    with tempfile.TemporaryDirectory(prefix="trajstore-bench-live-", dir=args.workdir) as work:
        results = [run_size(n, Path(work), args.repeats) for n in sizes]
    command = "python benchmarks/bench_live.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    publish(out, SECTION, to_markdown(results, command))
    return 0


if __name__ == "__main__":
    sys.exit(main())
