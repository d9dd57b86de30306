"""The dashboard with a million episodes in the store: first paint, bytes fetched and episode drill-down, measured
in the browser.

    python benchmarks/bench_dashboard.py                      # 1M episodes, writes its section of docs/benchmarks.md
    python benchmarks/bench_dashboard.py --episodes 5000      # quick run: prints the section only
    python benchmarks/bench_dashboard.py --store /tmp/st1m    # keep (or reuse) the generated store

Headless Chromium (Debian's ``/usr/bin/chromium``) driven by Playwright opens ``/dashboard`` served by uvicorn
over a store written with the library writer (synthetic learning runs: 4 runs x 8 policy versions, value and
log_prob extras). Times come from the page itself: the Paint Timing API (first contentful paint) and the
``performance.mark`` calls of ``dashboard.js`` (tables with data on screen, plots drawn), all measured from
navigation start; the drill-down time runs from the click to the three step plots drawn. Each repeat uses a
fresh browser context (cold cache: Plotly.js compiled from scratch), then reloads it (warm cache); before them, each
repeat's first visit is made to a service just started (nothing of the store read yet). The bytes
fetched are the Resource Timing API's ``transferSize`` of the page and everything it fetched (headers included,
bodies as sent: compressed where the service compresses them).
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
import tempfile
import time
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
REPO = HERE.parent
sys.path.insert(0, str(REPO))

import httpx  # noqa: E402

import trajstore  # noqa: E402
from tests.api.conftest import serve  # noqa: E402
from tests.api.dashboard.synthetic import write_learning_runs  # noqa: E402
from trajstore.api.app import create_app  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
from report import cpu_model, git_commit, out_path, output_options, publish  # noqa: E402

from trajstore.api.settings import ServiceSettings  # noqa: E402

CHROMIUM = "/usr/bin/chromium"
CHROMIUM_ARGS = ["--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update"]
FULL_EPISODES = 1_000_000
TARGET_S = 2.0
PLOT_TARGET_S = 1.0  # issue 31: the first plot (the learning curves) on screen
PLOT_PATHS = ("/curves/binned", "/curves/histogram", "/runs")  # what the plots are drawn from
TARGET_BYTES = 2_000_000  # the first load at FULL_EPISODES episodes, everything included
SECTION = "dashboard"
PAGE_TIMES = """() => {
  const mark = (name) => { const m = performance.getEntriesByName(name, "mark")[0]; return m ? m.startTime : null; };
  const paint = performance.getEntriesByName("first-contentful-paint")[0];
  const api = {}, fetched = {};
  for (const e of [performance.getEntriesByType("navigation")[0], ...performance.getEntriesByType("resource")]) {
    const kind = new URL(e.name).pathname.startsWith("/dashboard") ? "page and assets" : "API answers";
    fetched[kind] = (fetched[kind] || 0) + e.transferSize;
    if (e.name.includes("/plotly.min.js")) fetched.plotly = e.transferSize;
  }
  for (const e of performance.getEntriesByType("resource")) {
    const path = new URL(e.name).pathname;
    if (!path.startsWith("/dashboard")) {
      const prev = api[path];  // a path asked twice (the two histograms): its bytes added, its last end kept
      api[path] = { ms: e.responseEnd - e.startTime, end: Math.max(e.responseEnd, prev ? prev.end : 0),
                    bytes: e.encodedBodySize + (prev ? prev.bytes : 0) };
    }
  }
  return { fcp: paint ? paint.startTime : null, tables: mark("trajstore-tables"), first: mark("trajstore-first-plot"),
           plots: mark("trajstore-plots"), api,
           fetched };
}"""


@dataclass
class Result:
    episodes: int
    steps: int
    build_s: float | None
    fresh: list[dict[str, Any]] = field(default_factory=list)  # the first load of a freshly started service
    cold: list[dict[str, Any]] = field(default_factory=list)
    warm: list[dict[str, Any]] = field(default_factory=list)
    drill: list[float] = field(default_factory=list)
    drill_longest: list[float] = field(default_factory=list)
    longest_steps: int = 0
    api_alone: dict[str, list[float]] = field(default_factory=dict)
    load_start: tuple[float, ...] = field(default_factory=os.getloadavg)  # (1, 5, 15 minutes) when the run began


def build_store(path: Path, episodes: int) -> float | None:
    """The synthetic store at ``path`` (reused when it already exists); seconds spent writing it, or None."""
    if (path / "steps" / "_delta_log").exists():
        return None
    store = trajstore.open(path, create=True)
    t = time.perf_counter()
    write_learning_runs(store, episodes=episodes, runs=4, num_envs=64, versions=8)
    return time.perf_counter() - t


def _open(page: Any, url: str) -> dict[str, Any]:
    page.goto(url + "/dashboard")
    page.wait_for_function("() => window.trajstoreDashboard && (trajstoreDashboard.ready || "
                           "trajstoreDashboard.errors.length > 0)", timeout=300_000)
    errors = page.evaluate("() => trajstoreDashboard.errors")
    if errors:
        raise RuntimeError(f"the dashboard reported errors: {errors}")
    return page.evaluate(PAGE_TIMES)


def _drill(page: Any, row: int) -> float:
    """Click row ``row`` of the episodes table; the page's own click-to-plots time in ms."""
    page.evaluate("() => { trajstoreDashboard.timings.episode_ms = null; }")
    target = page.locator("#episodes tbody tr").nth(row)
    episode_id = target.get_attribute("data-episode-id")
    target.click()
    page.wait_for_function("(id) => trajstoreDashboard.episode && trajstoreDashboard.episode.id === id && "
                           "trajstoreDashboard.timings.episode_ms", arg=episode_id, timeout=120_000)
    return page.evaluate("() => trajstoreDashboard.timings.episode_ms")


def measure_fresh(url: str, res: Result) -> None:
    """One first visit (cold browser cache) to the service just started: nothing read of the store yet."""
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
        res.fresh.append(_open(ctx.new_page(), url))
        ctx.close()
        browser.close()


def measure(url: str, res: Result, repeats: int) -> None:
    from playwright.sync_api import sync_playwright

    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=CHROMIUM, args=CHROMIUM_ARGS)
        for _ in range(repeats):
            ctx = browser.new_context(viewport={"width": 1400, "height": 1000})
            page = ctx.new_page()
            page.on("console", lambda m: m.type == "error" and print(f"console error: {m.text}", file=sys.stderr))
            res.cold.append(_open(page, url))
            res.warm.append(_open(page, url))
            res.drill += [_drill(page, row) for row in (0, 5, 10)]
            loads = page.evaluate("() => trajstoreDashboard.table.loads")
            page.click("#episodes th[data-sort=episode_length]")  # toggles to descending: the longest first
            page.wait_for_function("(n) => trajstoreDashboard.table.loads > n", arg=loads)
            res.longest_steps = int(page.locator("#episodes tbody tr td:nth-child(5)").first.inner_text()
                                    .replace(",", ""))
            res.drill_longest.append(_drill(page, 0))
            ctx.close()
        browser.close()


def run(episodes: int, *, repeats: int, store_path: Path | None, work: Path) -> Result:
    path = store_path or work / "store"
    build_s = build_store(path, episodes)
    store = trajstore.open(path)
    row = store.sql("SELECT count(*) AS n, sum(episode_length)::BIGINT AS steps FROM episodes").to_pylist()[0]
    res = Result(episodes=row["n"], steps=row["steps"], build_s=build_s)
    for _ in range(repeats):  # a service started for each first visit
        with contextlib.contextmanager(serve)(create_app(ServiceSettings(store=str(path)))) as live:
            measure_fresh(live.url, res)
    with contextlib.contextmanager(serve)(create_app(ServiceSettings(store=str(path)))) as live:
        res.api_alone = time_api(live.url, repeats)
        measure(live.url, res, repeats)
    return res


def time_api(url: str, repeats: int) -> dict[str, list[float]]:
    """ms of each request of the page's first load, made alone, one after the other (``repeats`` times)."""
    paths = ["/ready", "/runs?last=100", "/curves/binned?x=env_steps&y=episode_return&bins=800",
             "/curves/histogram?y=episode_return&bins=60", "/stats?by=run_id,env_id",
             "/episodes?order_by=-ended_at&limit=25"]
    out = {}
    with httpx.Client(base_url=url, timeout=300) as client:
        for path in paths:
            times = []
            for _ in range(repeats):
                t = time.perf_counter()
                client.get(path).raise_for_status()
                times.append((time.perf_counter() - t) * 1000)
            out[path.split("?")[0]] = times
    return out


def _bm(values: list[float]) -> str:
    """``best / median`` in seconds: the best run shows the page with the least interference from other jobs."""
    return f"{min(values) / 1000:.2f} / {statistics.median(values) / 1000:.2f} s"


def _last_response(r: dict[str, Any]) -> float:
    return max(a["end"] for a in r["api"].values())


def _plot_response(r: dict[str, Any]) -> float:
    """When the last of the requests the plots are drawn from answered."""
    return max(a["end"] for p, a in r["api"].items() if p in PLOT_PATHS)


def to_markdown(res: Result, command: str) -> str:
    load = " / ".join(f"{x:.1f}" for x in os.getloadavg())
    load_start = " / ".join(f"{x:.1f}" for x in res.load_start)
    rows = [f"| {label} | {_bm([r['fcp'] for r in runs])} | {_bm([r['first'] for r in runs])} | "
            f"{_bm([r['tables'] for r in runs])} | {_bm([r['plots'] for r in runs])} | "
            f"{_bm([_last_response(r) for r in runs])} |"
            for label, runs in (("service just started, cold cache (first visit)", res.fresh),
                                ("cold cache (first visit)", res.cold), ("warm cache (reload)", res.warm))]
    together = {p: [r["api"][p]["ms"] for r in res.warm if p in r["api"]] for p in res.warm[0]["api"]}
    fetched_kb = sum(a.get("bytes", 0) for a in res.cold[0]["api"].values()) / 1e3
    first = res.cold[0]["fetched"]
    total = first["page and assets"] + first["API answers"]
    within = "met" if total <= TARGET_BYTES else "**not met**"
    drawing = [r["plots"] - _plot_response(r) for r in res.warm]
    plots = {"first visit": min(r["first"] for r in res.cold),
             "service just started": min(r["first"] for r in res.fresh)}
    plot_verdicts = "; ".join(f"{k} {v / 1000:.2f} s, {'met' if v < PLOT_TARGET_S * 1000 else '**not met**'}"
                              for k, v in plots.items())
    best = {"first paint": min(r["fcp"] for r in res.cold), "interactive plots drawn (warm cache)":
            min(r["plots"] for r in res.warm), "interactive plots drawn (service just started)":
            min(r["plots"] for r in res.fresh), "episode drill-down": min(res.drill)}
    verdicts = "; ".join(f"{k} {v / 1000:.2f} s, {'met' if v < TARGET_S * 1000 else '**not met**'}"
                         for k, v in best.items())
    built = f", written in {res.build_s:.1f} s" if res.build_s else ""
    api = lambda times: ", ".join(f"`{p}` {_bm(v)}" for p, v in sorted(times.items()))  # noqa: E731
    return f"""## Dashboard: {res.episodes:,} episodes

`{command}` ({datetime.now(timezone.utc):%Y-%m-%d %H:%M UTC}; trajstore commit {git_commit(REPO)}; {cpu_model()},
{os.cpu_count()} logical cores; load average {load_start} at the start and {load} at the end, the browser and the
service sharing the cores; each time is given as best / median of {len(res.cold)} repeats). Store:
{res.episodes:,} complete episodes, {res.steps:,} steps (4 synthetic runs x 8 policy versions, value and log_prob
extras{built}). Headless Debian Chromium (software WebGL) driven by Playwright; the service under uvicorn in the
benchmark's process. Times run from navigation start and are read from the page's own Paint Timing entries and
`performance.mark`s.

| page load | first contentful paint | first plot: learning curves on screen | runs and episodes tables with data \
| interactive learning curves and histograms drawn (Plotly.js) | last API response |
|---|---|---|---|---|---|
{chr(10).join(rows)}

| episode drill-down: click to reward, return-to-go, extras and observation plots drawn | best / median |
|---|---|
| episodes from the table (rows 1, 6 and 11 of the newest) | {_bm(res.drill)} |
| the longest episode ({res.longest_steps:,} steps) | {_bm(res.drill_longest)} |

Where the time goes: the API requests of one load made alone, one after the other: {api(res.api_alone)};
made together by the page (warm load): {api(together)}. The first of them to
arrive makes the `episodes` rows of the committed version, added up from its files' summaries (their episodes'
fragments, kept beside the table; see docs/architecture.md), and the learning curves the plots and the runs table
bin and summarise; the others wait for those, then read them, as do later requests until the next commit (so the
requests made alone, after the page loads, find them ready). The first row is the first visit to a service just
started (a new service for each repeat): nothing of the store read yet but the summaries on disk. The plots are
drawn as soon as their requests (binned curves, histograms, runs) have answered, not after the episodes table.
On the first load the page asks for the binned curves and the runs table first and draws the learning curves on a
canvas (api/dashboard/sketch.js: each series' mean and band) as soon as they answer; only then does it ask for the
histograms, statistics, per-agent curves and episodes table, and compile and run Plotly.js (about half a second of
this machine's main thread), which draws the interactive plots in the sketch's place: a service just started
answers the first plot's requests alone, not six at once on cores it shares with its warm-up and the browser.
The first visit fetches {total / 1e3:,.0f} kB in all, headers included (goal: at most {TARGET_BYTES / 1e6:g} MB,
{within}): the page and its assets {first["page and assets"] / 1e3:,.0f} kB, of it Plotly.js \
{first.get("plotly", 0) / 1e3:,.0f} kB (its basic bundle, gzipped; the assets are named by their content hash and \
kept by the browser, so a reload fetches none of them), and the API's JSON answers \
{first["API answers"] / 1e3:,.0f} kB ({fetched_kb:,.0f} kB of
bodies): the curves and histograms come binned (`/curves/binned`, `/curves/histogram`) and the runs table's
statistics summarised (`/runs?last=100`), so this does not grow with the number of episodes. After the last of
the plots' responses the page takes {_bm(drawing)} to draw the binned curves and both histograms.

Against the 2 s goal (best runs): {verdicts}. Against the {PLOT_TARGET_S:g} s goal for the first plot
(issue 31: the learning curves on screen; best runs): {plot_verdicts}.
"""


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--episodes", type=int, default=FULL_EPISODES, help="episodes in the store (default: %(default)s)")
    p.add_argument("--repeats", type=int, default=3, help="fresh browser contexts (default: %(default)s)")
    p.add_argument("--store", type=Path, default=None, help="where to write the store (reused if it exists)")
    output_options(p, f"{FULL_EPISODES:,} episodes or more", check=False)
    p.add_argument("--workdir", type=Path, default=None, help="where to put the temporary store")
    return p


def main(argv: list[str] | None = None) -> int:
    args = _parser().parse_args(argv)
    if not Path(CHROMIUM).is_file():
        print(f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` installs it", file=sys.stderr)
        return 2
    out = out_path(args.out, args.episodes >= FULL_EPISODES, REPO)
    with tempfile.TemporaryDirectory(prefix="trajstore-bench-dashboard-", dir=args.workdir) as work:
        res = run(args.episodes, repeats=args.repeats, store_path=args.store, work=Path(work))
    command = "python benchmarks/bench_dashboard.py" + "".join(f" {a}" for a in (argv or sys.argv[1:]))
    body = to_markdown(res, command)
    publish(out, SECTION, body)
    return 0


if __name__ == "__main__":
    sys.exit(main())
