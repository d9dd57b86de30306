"""Routes of the dashboard: its pages (``/dashboard``, and ``/dashboard/experiment``: groups of runs compared
with rliable's statistics over the ``/compare`` routes), their assets, ``/curves`` (every complete episode, as
columns) and ``/curves/binned`` / ``/curves/histogram`` (the same binned on the server: a payload of the number of
bins). The curves read the latest version, or with ``?version=N`` the store as it was at version N.

The assets (``common.js``, what both pages share, ``dashboard.js``, ``experiment.js``, ``dashboard.css`` and
Plotly.js: the ``plotly.js-basic-dist-min`` bundle of npm, vendored in ``vendor/`` by ``make vendor-plotly``:
scatter and bar traces, a quarter of the full bundle) are gzipped once and named by their content's hash in the pages
(``?v=<hash>``), so a browser fetches each one compressed and once, then keeps it (``immutable``); the pages
themselves are revalidated with their ETag.
"""

from __future__ import annotations

import gzip
import hashlib
import logging
import threading
from dataclasses import dataclass, replace
from functools import lru_cache
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
from fastapi import APIRouter, Depends, HTTPException, Query, Request
from fastapi.responses import RedirectResponse, Response
from pydantic import BaseModel, Field

from trajstore.api.arrow import ARROW_CONTENT, table_response, wants_arrow
from trajstore.api.budgets import grouped_budget
from trajstore.api.deps import ReadStoreDep
from trajstore.api.ints import SafeInt
from trajstore.api.params import ByDep, FilterDep, WhereDep
from trajstore.query.condition import Condition
from trajstore.query.filters import EpisodeFilter
from trajstore.store import Store, plumbing

log = logging.getLogger(__name__)
router = APIRouter()
HERE = Path(__file__).resolve().parent
LAST_N, HIST_BINS = 100, 60  # what the page asks first (dashboard.js): each run's latest episodes, histogram bins
ASSETS = {"dashboard.js": ("dashboard.js", "text/javascript"), "dashboard.css": ("dashboard.css", "text/css"),
          "experiment.js": ("experiment.js", "text/javascript"), "common.js": ("common.js", "text/javascript"),
          "sketch.js": ("sketch.js", "text/javascript"),
          "plotly.min.js": ("vendor/plotly-basic.min.js", "text/javascript")}
PAGES = ("page.html", "experiment.html")
FOREVER = "public, max-age=31536000, immutable"  # an asset named by its content's hash never changes
REVALIDATE = "no-cache"  # kept, but asked again each time (answered 304 while its ETag holds)


@dataclass(frozen=True)
class Asset:
    """A file of the dashboard, as sent: its bytes, gzipped bytes, media type and content hash."""

    body: bytes
    gzipped: bytes
    media_type: str
    digest: str


def _asset(body: bytes, media_type: str) -> Asset:
    return Asset(body, gzip.compress(body, compresslevel=9, mtime=0), media_type,
                 hashlib.sha256(body).hexdigest()[:16])


def warm(store: Store) -> threading.Thread:
    """Read what the dashboard's first page asks of ``store``'s latest version (its episodes rows, learning curves,
    runs and their latest episodes, histograms, statistics per series, curves per agent), as its requests ask it
    (the engine keeps each once per version; the binned curves' bins follow the page's width, so their walk of the
    episodes is what is kept), on
    a background thread started now: a first visit to a service just started finds them ready, or waits for the
    computation under way (never does it twice). A store that cannot be read is left to the requests to report."""
    def read() -> None:
        try:
            served = plumbing(store)
            served.latest_stats(LAST_N, gamma=None)
            store.runs()
            for y in ("episode_return", "episode_length"):
                served.histogram(y=y, bins=HIST_BINS, gamma=None, run_id=None, env_id=None, metric=None, density=True)
            store.stats(by=["run_id", "env_id"])
            served.binned_curves(by="agent_id")
        except Exception as exc:  # noqa: BLE001 - the requests will say what is wrong
            log.debug("the dashboard's first page was not read ahead: %s", exc)

    # not a daemon: a process that ends while it reads waits for it (a daemon thread inside DuckDB when the
    # interpreter shuts down can crash the process). Said outright: a thread started from a daemon thread (a test
    # client's event loop runs in one) is a daemon unless told
    thread = threading.Thread(target=read, name="trajstore-dashboard-warm", daemon=False)
    thread.start()
    return thread


@lru_cache(maxsize=None)
def asset(name: str) -> Asset:
    """The asset ``name`` (read and compressed once per process)."""
    if name not in ASSETS:
        raise HTTPException(status_code=404, detail=f"no dashboard asset {name!r}")
    path, media_type = ASSETS[name]
    if not (HERE / path).is_file():
        raise HTTPException(status_code=500, detail=f"the dashboard's {path} is missing from this installation: "
                                                    "reinstall trajstore")
    return _asset((HERE / path).read_bytes(), media_type)


@lru_cache(maxsize=None)
def page(name: str = "page.html") -> Asset:
    """The page ``name`` (one of :data:`PAGES`), each asset's URL carrying its hash."""
    if name not in PAGES:
        raise ValueError(f"no dashboard page {name!r}")
    text = (HERE / name).read_text()
    for item in ASSETS:
        text = text.replace(f"{{{{{item}}}}}", f"/dashboard/assets/{item}?v={asset(item).digest}")
    return _asset(text.encode(), "text/html; charset=utf-8")


def _send(request: Request, found: Asset, cache: str) -> Response:
    """``found``, gzipped when the client takes it, or 304 when the client holds this version (its ETag)."""
    etag = f'"{found.digest}"'
    headers = {"ETag": etag, "Cache-Control": cache, "Vary": "Accept-Encoding"}
    if etag in request.headers.get("if-none-match", ""):
        return Response(status_code=304, headers=headers)
    if "gzip" in request.headers.get("accept-encoding", ""):
        return Response(found.gzipped, media_type=found.media_type, headers={**headers, "Content-Encoding": "gzip"})
    return Response(found.body, media_type=found.media_type, headers=headers)


@router.get("/", include_in_schema=False)
def root() -> RedirectResponse:
    return RedirectResponse("/dashboard")


@router.get("/dashboard", response_class=Response, tags=["dashboard"],
            responses={200: {"content": {"text/html": {}}}},
            summary="The dashboard: runs, learning curves, distributions, episodes and one episode's steps, live")
def dashboard(request: Request) -> Response:
    return _send(request, page("page.html"), REVALIDATE)


@router.get("/dashboard/experiment", response_class=Response, tags=["dashboard"],
            responses={200: {"content": {"text/html": {}}}},
            summary="The experiment view: groups of runs (by a config key) compared per task with rliable's IQM and "
                    "intervals, learning curves across seeds, performance profiles, probability of improvement")
def experiment(request: Request) -> Response:
    return _send(request, page("experiment.html"), REVALIDATE)


@router.get("/dashboard/assets/{name}", include_in_schema=False)
def dashboard_asset(request: Request, name: str, v: str | None = None) -> Response:
    found = asset(name)
    return _send(request, found, FOREVER if v == found.digest else REVALIDATE)


class CurveSeries(BaseModel):
    """The complete episodes of one (run, env) in the order they ended, one list per column."""

    run_id: str
    env_id: str
    episode_id: list[str] = Field(description="decimal strings: 63-bit ids do not fit a JavaScript number")
    env_steps: list[int] = Field(description="env steps of all the series' writers when the episode ended (each "
                                             "writer's count over all its envs, summed over its writers)")
    wall_time: list[float | None] = Field(description="when the episode's last step was written (its time index's "
                                                      "share of its batch), Unix seconds")
    episode_return: list[float]
    episode_length: list[int]
    terminated: list[bool]
    policy_version: list[SafeInt | None] = Field(description="lineage at the episode's first step (null if not "
                                                             "stored); a decimal string beyond ±(2**53 - 1)")
    discounted_return: list[float] | None = Field(None, description="only when gamma is given")
    metric: list[float | None] | None = Field(None, description="only when metric is given: its value per episode "
                                                                "(null where the episode has none)")


class Curves(BaseModel):
    gamma: float | None
    series: list[CurveSeries]


def curves_payload(store: Store, *, filter: EpisodeFilter | None = None, where: Condition | None = None,  # noqa: A002
                   gamma: float | None = None, metric: str | None = None) -> Curves:
    """Complete episodes of each (run, env), sorted by run and env, then in the order they ended."""
    eps = store.curves(filter=filter, where=where, gamma=gamma, metric=metric)
    keys = pc.binary_join_element_wise(eps["run_id"], eps["env_id"], "\x00").to_numpy(zero_copy_only=False)
    starts = np.flatnonzero(np.r_[True, keys[1:] != keys[:-1]]) if len(keys) else np.array([], int)
    bounds = zip(starts.tolist(), [*starts[1:].tolist(), len(keys)])
    return Curves(gamma=gamma, series=[_series(eps.slice(a, b - a)) for a, b in bounds])


def _series(t: pa.Table) -> CurveSeries:
    seconds = pc.divide(t["ended_at"].cast(pa.int64()).cast(pa.float64()), 1e6)
    return CurveSeries(
        run_id=t["run_id"][0].as_py(), env_id=t["env_id"][0].as_py(),
        episode_id=t["episode_id"].cast(pa.string()).to_pylist(),
        env_steps=t["total_env_steps"].to_pylist(),
        wall_time=seconds.to_pylist(),
        episode_return=t["episode_return"].to_pylist(),
        episode_length=t["episode_length"].to_pylist(),
        terminated=t["terminated"].to_pylist(),
        policy_version=t["policy_version"].to_pylist() if "policy_version" in t.column_names else [None] * len(t),
        discounted_return=t["discounted_return"].to_pylist() if "discounted_return" in t.column_names else None,
        metric=t["metric"].to_pylist() if "metric" in t.column_names else None,
    )


MetricQuery = Annotated[str | None, Query(max_length=200, description=(
    "instead of y: any metric, a column of episodes or agg(column) of a step column with agg one of last, first, "
    "sum, mean, min, max (last(is_success)); episodes without a value are left out"))]


@router.get("/curves", tags=["dashboard"], response_model=Curves | list[dict[str, Any]],
            summary="Learning curves: the complete episodes of each (run, env) in the order they ended, as columns "
                    "(as Arrow: Store.curves' table); with by=, each group of runs' curve across seeds per env_steps "
                    "bin, its IQM or mean with a bootstrap band (as Store.curves(by=…) and /curves/groups)",
            responses={200: {"content": ARROW_CONTENT}}, dependencies=[Depends(grouped_budget)])
def curves(request: Request, store: ReadStoreDep, flt: FilterDep, by: ByDep, where: WhereDep,
           gamma: Annotated[float | None, Query(ge=0, le=1, description="adds discounted_return (not with "
                                                                        "by)")] = None,
           metric: MetricQuery = None,
           task: Annotated[str | None, Query(max_length=200, description="with by: the column of episodes that names "
                                                                         "a task (env_id)")] = None,
           bins: Annotated[int | None, Query(ge=1, le=10_000, description="with by: env_steps bins (50)")] = None,
           aggregate: Annotated[Literal["iqm", "mean"] | None, Query(description="with by: iqm or mean")] = None,
           ci: Annotated[float | None, Query(gt=0, lt=1, description="with by: the band's confidence (0.95)")] = None,
           reps: Annotated[int | None, Query(ge=1, le=100_000, description="with by: bootstrap replications "
                                                                           "(1000)")] = None,
           seed: Annotated[int | None, Query(ge=0, description="with by: the bootstrap's seed (0)")] = None,
           mode: Annotated[Literal["train", "eval"] | None, Query(description="with by: eval episodes only")] = None,
           ) -> Any:
    if by and seed is not None:  # with by=, seed= is the bootstrap's, not the lineage filter the filter read it as
        flt = replace(flt, lineage={k: v for k, v in flt.lineage.items() if k != "seed"})
    chosen = None if flt.is_empty() else flt
    across = {"task": task, "bins": bins, "aggregate": aggregate, "ci": ci, "reps": reps, "seed": seed, "mode": mode}
    if by or wants_arrow(request) or any(v is not None for v in across.values()):
        table = store.curves(by=by or None, filter=chosen, where=where, gamma=gamma, metric=metric, **across)
        return table_response(request, table)
    return curves_payload(store, filter=chosen, where=where, gamma=gamma, metric=metric)


class BinnedSeries(BaseModel):
    """One (run, env)'s non-empty bins (with by=: one agent's, or one group of agents'), one list per column."""

    run_id: str
    env_id: str
    agent: str | None = Field(None, description="with by=: the series' agent_id, or agent_group")
    bin: list[int]
    lo: list[float] = Field(description="left edge of each bin (x)")
    hi: list[float] = Field(description="right edge of each bin (x; the last bin includes it)")
    count: list[int]
    mean: list[float] | None = None
    p10: list[float] | None = None
    p50: list[float] | None = None
    p90: list[float] | None = None
    density: list[float] | None = Field(None, description="histograms with density=true: count / (the series' "
                                                         "episodes × bin width)")


class Binned(BaseModel):
    x: str
    y: str
    bins: int
    gamma: float | None
    version: int = Field(description="the store version the bins were computed at")
    metric: str = Field(description="what was summarised: episode_return, episode_length, discounted_return or "
                                    "the metric asked for (with by=: each agent's own return or length)")
    by: str | None = Field(None, description="agent_id or agent_group: one series per agent (or group) of the "
                                             "multi-agent episodes")
    series: list[BinnedSeries]


def binned_payload(table: pa.Table, *, x: str, y: str, bins: int, gamma: float | None, version: int,
                   by: str | None = None) -> Binned:
    names = ["run_id", "env_id", *([by] if by else [])]
    keys = list(zip(*(table[n].to_pylist() for n in names))) if table.num_rows else []
    starts = [i for i, k in enumerate(keys) if i == 0 or k != keys[i - 1]]
    series = []
    for a, b in zip(starts, [*starts[1:], len(keys)]):
        part = table.slice(a, b - a).to_pydict()
        series.append(BinnedSeries(**{k: v for k, v in part.items() if k not in names}, run_id=keys[a][0],
                                   env_id=keys[a][1], agent=keys[a][2] if by else None))
    return Binned(x=x, y=y, bins=bins, gamma=gamma, version=version, metric=_metric(y, gamma), by=by,
                  series=series)


Axis = Literal["env_steps", "wall_time", "policy_version", "episode_index"]
Metric = Literal["episode_return", "episode_length"]
RunsQuery = Annotated[list[str], Query(description="runs to include (all by default)")]
EnvsQuery = Annotated[list[str], Query(description="envs to include (all by default)")]
GammaQuery = Annotated[float | None, Query(ge=0, le=1, description="with y=episode_return: the discounted return "
                                                                    "for this discount instead")]


def _metric(y: str, gamma: float | None) -> str:
    """The episodes column ``y`` names: the return is the discounted one when ``gamma`` is given."""
    return "discounted_return" if y == "episode_return" and gamma is not None else y


@router.get("/curves/binned", tags=["dashboard"], summary="Learning curves in bins along x: per (run, env) and bin, "
                                                          "the count, mean and 10/50/90 percentiles of y (with "
                                                          "by=agent_id or agent_group: per agent)")
def curves_binned(store: ReadStoreDep, run_id: RunsQuery = [], env_id: EnvsQuery = [],  # noqa: B006
                  x: Annotated[Axis, Query(description="the x axis")] = "env_steps",
                  y: Annotated[Metric, Query(description="the value summarised in each bin")] = "episode_return",
                  bins: Annotated[int, Query(ge=1, le=10_000, description="number of bins (about the plot's "
                                                                          "width in pixels)")] = 800,
                  gamma: GammaQuery = None, metric: MetricQuery = None,
                  by: Annotated[Literal["agent_id", "agent_group"] | None, Query(description=(
                      "one series per agent (or group of agents: the id before its last _) of the multi-agent "
                      "episodes, of each agent's own return or length (no gamma, no metric); single-agent "
                      "episodes have none"))] = None) -> Binned:
    version = store.version
    table = plumbing(store).binned_curves(x=x, y=_metric(y, gamma), bins=bins, gamma=gamma, run_id=run_id or None,
                                env_id=env_id or None, metric=metric, by=by)
    return binned_payload(table, x=x, y=metric or y, bins=bins, gamma=gamma, version=version, by=by)


@router.get("/curves/histogram", tags=["dashboard"], summary="Distribution of y per (run, env) in bins shared by "
                                                             "all the series")
def curves_histogram(store: ReadStoreDep, run_id: RunsQuery = [], env_id: EnvsQuery = [],  # noqa: B006
                     y: Annotated[Metric, Query(description="the value counted")] = "episode_return",
                     bins: Annotated[int, Query(ge=1, le=10_000, description="number of bins")] = 60,
                     gamma: GammaQuery = None, metric: MetricQuery = None,
                     density: Annotated[bool, Query(description="also each bin's density (count over the series' "
                                                                "episodes and the bin's width)")] = False) -> Binned:
    version = store.version
    table = plumbing(store).histogram(y=_metric(y, gamma), bins=bins, gamma=gamma, run_id=run_id or None,
                            env_id=env_id or None, metric=metric, density=density)
    return binned_payload(table, x=metric or y, y=metric or y, bins=bins, gamma=gamma, version=version)
