"""The learning curves' sketch (``api/dashboard/sketch.js``) in headless Chromium: its axis ticks end for any data —
equal ends, an axis a few float steps wide at 1e17, denormals, negative and huge ranges — and a store whose returns
are ~1e17 apart by 16 gets its curve drawn.

The tick function is a global of the page (sketch.js is a classic script); it is run in a Web Worker that loads the
same sketch.js, so a tick loop that never ends is reported as such instead of hanging the page and the test."""

from __future__ import annotations

import math
from typing import Any, Iterator

import numpy as np
import pytest

import trajstore
from tests.api.dashboard.helpers import Dashboard
from tests.api.helpers import Live, serve
from tests.helpers import HUGE, write_huge_returns
from trajstore.api.app import create_app
from trajstore.api.settings import ServiceSettings
from trajstore.store import plumbing

pytestmark = [pytest.mark.browser, pytest.mark.server]  # the tiers: tests/tiers.py

ENDS_WITHIN_MS = 5000

# The ticks of each [lo, hi] computed in a worker running the page's sketch.js; "did not end" past the deadline.
TICKS_IN_A_WORKER = """async ([ranges, deadline]) => {
  const src = document.querySelector('script[src*="sketch.js"]').src;
  const code = `importScripts(${JSON.stringify(src)});
    onmessage = (e) => postMessage(e.data.map(([lo, hi]) => sketchTicks(lo, hi)));`;
  const worker = new Worker(URL.createObjectURL(new Blob([code], { type: "text/javascript" })));
  try {
    return await new Promise((resolve, reject) => {
      worker.onmessage = (e) => resolve(e.data);
      worker.onerror = (e) => reject(new Error(e.message));
      setTimeout(() => resolve("did not end"), deadline);
      worker.postMessage(ranges);
    });
  } finally {
    worker.terminate();
  }
}"""


@pytest.fixture(scope="module")
def huge_store(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    return write_huge_returns(tmp_path_factory.mktemp("sketch") / "store")


@pytest.fixture(scope="module")
def huge_live(huge_store: trajstore.Store) -> Iterator[Live]:
    yield from serve(create_app(ServiceSettings(store=str(huge_store.root))))


@pytest.fixture
def tick_page(context: Any, huge_live: Live) -> Iterator[Any]:
    """A page of the service holding sketch.js alone, as the dashboard loads it (a classic script)."""
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.goto(huge_live.url + "/health")
    page.add_script_tag(url=huge_live.url + "/dashboard/assets/sketch.js")
    try:
        yield page
    finally:
        page.close()


@pytest.fixture
def sketch_page(context: Any, huge_live: Live) -> Iterator[Any]:
    """The dashboard over the store of huge returns, Plotly.js held back (the sketch stays on screen)."""
    page = context.new_page()
    page.set_default_timeout(20_000)
    page.route("**/plotly.min.js*", lambda route: None)  # never answered
    page.goto(huge_live.url + "/dashboard", wait_until="domcontentloaded")
    try:
        yield page
    finally:
        page.close()


def test_returns_a_few_float_steps_apart_at_1e17_are_sketched(sketch_page: Any, huge_store: trajstore.Store) -> None:
    returns = sorted({r["episode_return"] for r in huge_store.episodes().to_pylist()})
    assert returns == [HUGE, HUGE + 16] and HUGE + 5 == HUGE  # the axis the old tick loop never left
    sketch_page.wait_for_function("() => performance.getEntriesByName('trajstore-first-plot').length === 1")
    width = sketch_page.evaluate("() => document.getElementById('curves').clientWidth")
    binned = plumbing(huge_store).binned_curves(bins=max(50, min(2000, width)))
    assert sketch_page.evaluate("() => trajstoreDashboard.sketch") == {"series": 1, "points": binned.num_rows}
    drawn = sketch_page.evaluate("""() => {
      const c = document.querySelector('#curves canvas.sketch'), d = c.getContext('2d')
        .getImageData(0, 0, c.width, c.height).data, colour = seriesColor(seriesKey(trajstoreDashboard.binned
        .series[0])).match(/\\w\\w/g).map((h) => parseInt(h, 16));
      let n = 0;
      for (let i = 0; i < d.length; i += 4) n += d[i] === colour[0] && d[i + 1] === colour[1] && d[i + 2] === colour[2];
      return n;
    }""")
    assert drawn > 100  # the curve's pixels, in its colour


def test_the_whole_dashboard_loads_over_returns_at_1e17(context: Any, huge_live: Live) -> None:
    page = context.new_page()
    try:
        dashboard = Dashboard(page, huge_live.url)
        dashboard.open()
        assert dashboard.page.locator("#curves canvas.sketch").count() == 0  # Plotly's plot took the sketch's place
        assert dashboard.episode_points() == {"huge · Huge-v0": 40}
        assert dashboard.problems == []
    finally:
        page.close()


AWKWARD = [
    (1.0, 1.0), (0.0, 0.0), (-3.5, -3.5),  # equal ends
    (HUGE, HUGE + 16), (HUGE - 16, HUGE + 32), (-HUGE - 16, -HUGE), (1e300, 1e300 * (1 + 4e-16)),  # float steps
    (0.0, 5e-324), (5e-324, 1e-323), (-1e-310, 1e-310), (1e-310, 2e-310),  # denormals
    (-10.0, -2.0), (-1e6, -999_990.0), (-0.3, 0.7),  # negative
    (-1.7e308, 1.7e308), (0.0, 1.7e308),  # a span that overflows
    (1_700_000_000.0, 1_700_003_600.0), (0.0, 1.0), (0.1, 0.3), (3.0, 3.0 + 1e-12),
]


def test_ticks_end_for_any_range(tick_page: Any) -> None:
    assert tick_page.evaluate("() => sketchTicks(0, 10)") == [0, 2, 4, 6, 8, 10]  # a global of the page
    found = tick_page.evaluate(TICKS_IN_A_WORKER, [AWKWARD, ENDS_WITHIN_MS])
    assert found != "did not end"
    for (lo, hi), ticks in zip(AWKWARD, found):
        assert 1 <= len(ticks) <= 50 and all(math.isfinite(v) for v in ticks), (lo, hi, ticks)
        assert ticks == sorted(set(ticks)), (lo, hi, ticks)  # each tick further on than the last
        if lo == hi:
            assert ticks == [lo]
            continue
        step = max(abs(lo), abs(hi)) * 2.3e-16 + (hi - lo) / 4  # within the range, give or take a tick's step
        assert lo - step <= ticks[0] and ticks[-1] <= hi + step, (lo, hi, ticks)


def test_ticks_of_ordinary_ranges_are_round_and_cover_them(tick_page: Any) -> None:
    """On ranges the float grid does not limit, the ticks are the multiples in [lo, hi] of the smallest of 1, 2, 5
    times a power of ten that is at least a fifth of the range (a plain reference)."""
    ranges = [(0.0, 1.0), (-10.0, -2.0), (-0.3, 0.7), (0.0, 437.0), (1_700_000_000.0, 1_700_003_600.0),
              (-1e6, -999_990.0), (12.5, 13.0)]
    found = tick_page.evaluate(TICKS_IN_A_WORKER, [ranges, ENDS_WITHIN_MS])
    for (lo, hi), ticks in zip(ranges, found):
        raw = (hi - lo) / 5
        step = min(m * 10 ** math.floor(math.log10(raw)) for m in (1, 2, 5, 10)
                   if m * 10 ** math.floor(math.log10(raw)) >= raw)
        expected = [k * step for k in range(math.ceil(lo / step - 1e-9), math.floor(hi / step + 1e-9) + 1)]
        assert len(ticks) == len(expected) and np.allclose(ticks, expected, rtol=1e-12, atol=step * 1e-9), \
            (lo, hi, ticks, expected)
