"""The dashboard in a 1,280 px window, with unfinished episodes, and without live updates (``?live=0``).

The store holds what a stopped rollout leaves: complete CartPole episodes and, written last, the unfinished fragments
of the envs still running (MountainCarContinuous' 999-step episodes never end within the rollout), under a long run
id. Screenshots land in ``test-artifacts/dashboard/``."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path
from typing import Any, Iterator

import pytest

import trajstore
from tests.api.dashboard.helpers import ARTIFACTS, CHROMIUM, Dashboard
from tests.api.helpers import Live, serve
from trajstore.api.app import create_app
from trajstore.api.settings import ServiceSettings
from trajstore.rollout import gym_rollout

pytestmark = [pytest.mark.browser, pytest.mark.server]  # the tiers: tests/tiers.py

LONG_RUN = "ppo-lstm-continuous-control-sweep-lr3e-4-seed-0000000042"
WIDTH = 1280

# Count the EventSources the page opens, from before its scripts run.
COUNT_STREAMS = """(() => {
  const Real = window.EventSource;
  window.openedStreams = [];
  window.EventSource = class extends Real {
    constructor(url, init) { super(url, init); window.openedStreams.push(String(url)); }
  };
})();"""


@pytest.fixture(scope="module")
def fragments(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    store = trajstore.open(tmp_path_factory.mktemp("fragments") / "store", create=True)
    gym_rollout(store, "CartPole-v1", run_id="cartpole", num_envs=4, steps=600, seed=0, progress=False)
    gym_rollout(store, "MountainCarContinuous-v0", run_id=LONG_RUN, num_envs=3, steps=300, seed=1,
                progress=False)
    return store


@pytest.fixture(scope="module")
def fragments_live(fragments: trajstore.Store) -> Iterator[Live]:
    yield from serve(create_app(ServiceSettings(store=str(fragments.root))))


@pytest.fixture
def narrow(browser: Any, fragments_live: Live) -> Iterator[Dashboard]:
    """The dashboard in a 1,280 px wide window, every EventSource it opens counted."""
    ctx = browser.new_context(viewport={"width": WIDTH, "height": 900}, locale="en-GB", timezone_id="UTC")
    ctx.set_default_timeout(60_000)
    ctx.add_init_script(COUNT_STREAMS)
    yield Dashboard(ctx.new_page(), fragments_live.url)
    ctx.close()


def test_the_runs_table_fits_1280_px(narrow: Dashboard, fragments: trajstore.Store) -> None:
    narrow.open("/dashboard?gamma=0.99")  # the longest header: the discounted return's
    page = narrow.page
    assert page.locator("#runs tbody tr").count() == 2
    assert "discounted return (γ=0.99)" in page.locator("#runs-return").inner_text()
    show_every_episode(page, fragments)  # the long run's rows too
    for table in ("runs", "episodes"):
        assert_fits(page, table)
    cells = page.locator(f'#runs tr[data-series="{LONG_RUN} · MountainCarContinuous-v0"] td').all_inner_texts()
    assert cells[1].replace("\n", "") == LONG_RUN  # the long run id wraps, whole
    narrow.screenshot("runs-1280", "#runs-section")
    assert narrow.problems == []


def show_every_episode(page: Any, store: trajstore.Store) -> None:
    """The episodes table's largest page (100 rows), which holds every episode of the store."""
    n = store.episodes().num_rows
    assert 25 < n <= 100
    page.select_option("#f-size", "100")
    page.wait_for_function("(n) => document.querySelectorAll('#episodes tbody tr').length === n", arg=n)


def assert_fits(page: Any, table: str) -> None:
    """The table ``table`` is whole inside the window: its last column fully visible, nothing scrolled away."""
    box = page.evaluate("""(id) => {
      const table = document.getElementById(id), frame = table.parentElement;
      const right = (el) => el.getBoundingClientRect().right;
      return { window: document.documentElement.clientWidth, page: document.documentElement.scrollWidth,
               frame: frame.clientWidth, table: table.scrollWidth,
               section: right(table.closest('section')),
               last: Array.from(table.querySelectorAll('tr')).map((tr) => right(tr.lastElementChild)) }; }""", table)
    assert box["window"] == WIDTH and box["page"] <= WIDTH, (table, box)  # nothing beyond the window
    assert box["table"] <= box["frame"], (table, box)  # the table fits its frame: nothing scrolled out of sight
    assert max(box["last"]) <= box["section"] <= WIDTH, (table, box)  # every row's last cell in the section


def test_unfinished_episodes_are_marked_and_complete_ones_come_first(narrow: Dashboard,
                                                                     fragments: trajstore.Store) -> None:
    narrow.open()
    page = narrow.page
    show_every_episode(page, fragments)
    rows = page.evaluate("""() => Array.from(document.querySelectorAll('#episodes tbody tr')).map((tr) => ({
      id: tr.dataset.episodeId, unfinished: tr.classList.contains('unfinished'),
      badge: tr.querySelector('.badge') ? tr.querySelector('.badge').textContent : null,
      ended: tr.lastElementChild.textContent }))""")
    episodes = {str(r["episode_id"]): r for r in fragments.episodes().to_pylist()}
    latest = max(r["ended_at"] for r in episodes.values())
    assert any(not r["complete"] and r["ended_at"] == latest for r in episodes.values())  # a fragment ended last
    shown = [episodes[r["id"]] for r in rows]
    complete = [e["complete"] for e in shown]
    assert complete == sorted(complete, reverse=True) and True in complete  # complete first, on the first page
    finished = [e for e in shown if e["complete"]]
    assert [e["ended_at"] for e in finished] == sorted((e["ended_at"] for e in finished), reverse=True)
    for row, episode in zip(rows, shown):  # every unfinished row marked, no complete one
        assert row["unfinished"] == (not episode["complete"])
        assert row["badge"] == (None if episode["complete"] else "unfinished")
    assert [r["unfinished"] for r in rows].count(True) == sum(not e["complete"] for e in episodes.values()) == 6
    page.click("#episodes th[data-sort=episode_return]")  # another column: complete episodes still first
    page.wait_for_function("() => document.querySelector('#episodes th.sorted-desc') !== null")
    page.wait_for_function("() => document.querySelector('#episodes tbody tr') && trajstoreDashboard.table.sort"
                           " === '-episode_return'")
    narrow.wait_ready()
    narrow.screenshot("episodes-unfinished", "#episodes")
    assert narrow.problems == []


def test_live_zero_opens_no_event_stream(narrow: Dashboard, fragments: trajstore.Store) -> None:
    narrow.open("/dashboard?live=0")
    page = narrow.page
    assert page.evaluate("() => window.openedStreams") == []
    assert not page.locator("#live").is_checked()
    assert not any("/events" in e for e in page.evaluate(
        "() => performance.getEntriesByType('resource').map((e) => e.name)"))
    page.wait_for_timeout(2500)  # past the poll interval: nothing is polled either
    assert page.evaluate("() => performance.getEntriesByType('resource').filter((e) => e.name.includes('/ready'))"
                         ".length") == 1  # the first load's
    page.locator("#live").check()  # turned on: one stream, and the URL forgets live=0
    page.wait_for_function("() => window.openedStreams.length === 1")
    assert "live=0" not in page.url
    page.locator("#live").uncheck()
    page.wait_for_function("() => trajstoreDashboard.source === null")
    assert "live=0" in page.url
    assert [p for p in narrow.problems if not p.endswith("/events net::ERR_ABORTED")] == []  # closed by the page


def test_the_default_page_opens_one_event_stream(narrow: Dashboard) -> None:
    narrow.open()
    assert narrow.page.evaluate("() => window.openedStreams") == ["/events"]
    assert narrow.page.locator("#live").is_checked()


def test_a_headless_screenshot_with_a_virtual_time_budget_finishes(fragments_live: Live, tmp_path: Path) -> None:
    """What the issue ran: Chromium's own --screenshot with --virtual-time-budget, which waits for the page to
    settle; with ?live=0 it finishes and the picture shows the page."""
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}")
    out = tmp_path / "shot.png"
    proc = subprocess.run([str(CHROMIUM), "--headless", "--no-sandbox", "--disable-gpu", "--hide-scrollbars",
                           "--disable-background-networking", "--disable-component-update",
                           f"--user-data-dir={tmp_path / 'profile'}", f"--window-size={WIDTH},2000",
                           "--virtual-time-budget=20000", f"--screenshot={out}",
                           f"{fragments_live.url}/dashboard?live=0"],
                          capture_output=True, text=True, timeout=180, env={**os.environ, "HOME": str(tmp_path)})
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert out.is_file() and out.stat().st_size > 50_000  # the page drawn, not a blank window
    ARTIFACTS.mkdir(parents=True, exist_ok=True)
    shutil.copy(out, ARTIFACTS / "virtual-time-live0.png")
