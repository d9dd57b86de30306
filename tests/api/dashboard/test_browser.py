"""The dashboard in headless Chromium: it loads cleanly, shows every complete episode, drills into one
episode, and follows new rollouts without a reload. Screenshots land in ``test-artifacts/dashboard/``."""

from __future__ import annotations

import contextlib
import math
from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.compute
import pytest

import trajstore
from tests.api.dashboard.helpers import ARTIFACTS, Dashboard
from tests.api.dashboard.synthetic import write_learning_runs
from tests.api.helpers import ID_A, ID_B, LENGTHS, serve, write_adjacent_ids
from trajstore.api.app import create_app
from trajstore.api.settings import ServiceSettings
from trajstore.rollout import gym_rollout
from trajstore.store import plumbing

pytestmark = [pytest.mark.browser, pytest.mark.server]  # the tiers: tests/tiers.py


def complete_per_series(store: trajstore.Store) -> dict[str, int]:
    rows = store.sql("SELECT run_id || ' · ' || env_id AS key, count(*) AS n FROM episodes WHERE complete "
                     "GROUP BY ALL").to_pylist()
    return {r["key"]: r["n"] for r in rows}


def test_page_loads_with_no_console_errors(dashboard: Dashboard, demo_store: trajstore.Store) -> None:
    dashboard.open("/")  # redirects to /dashboard
    assert dashboard.page.url == dashboard.url + "/dashboard"
    runs = dashboard.page.locator("#runs tbody tr")
    assert runs.count() == len(complete_per_series(demo_store)) == 4
    assert dashboard.page.locator("#episodes tbody tr").count() == 25
    assert dashboard.page.evaluate("() => typeof Plotly") == "object"
    assert dashboard.page.locator("#curves canvas.sketch").count() == 0  # Plotly's plot took the sketch's place
    assert dashboard.page.evaluate("() => performance.getEntriesByName('trajstore-first-plot').length") == 1
    dashboard.screenshot("overview")
    assert dashboard.problems == []


def test_the_learning_curves_are_sketched_before_plotly_is_loaded(context: Any, demo_live: Any,
                                                                  demo_store: trajstore.Store) -> None:
    """With Plotly.js held back, the binned learning curves are still drawn: every series' mean in its colour, as
    many points as the service's bins."""
    page = context.new_page()
    page.route("**/plotly.min.js*", lambda route: None)  # never answered: Plotly.js stays out of the page
    try:
        page.goto(demo_live.url + "/dashboard")
        page.wait_for_function("() => performance.getEntriesByName('trajstore-first-plot').length === 1")
        sketch = page.evaluate("() => trajstoreDashboard.sketch")
        width = page.evaluate("() => document.getElementById('curves').clientWidth")
        binned = plumbing(demo_store).binned_curves(bins=max(50, min(2000, width)))
        series = binned.group_by(["run_id", "env_id"]).aggregate([("bin", "count")])
        assert sketch == {"series": series.num_rows, "points": binned.num_rows}
        assert page.evaluate("() => typeof Plotly") == "undefined"
        colours = page.evaluate("""() => {
          const c = document.querySelector('#curves canvas.sketch'), d = c.getContext('2d')
            .getImageData(0, 0, c.width, c.height).data, seen = {};
          for (let i = 0; i < d.length; i += 4) {
            const hex = '#' + [d[i], d[i + 1], d[i + 2]].map((v) => v.toString(16).padStart(2, '0')).join('');
            if (d[i + 3] === 255) seen[hex] = (seen[hex] || 0) + 1;
          }
          const want = {};
          for (const s of trajstoreDashboard.binned.series) {
            const colour = seriesColor(seriesKey(s));
            want[colour] = seen[colour] || 0;
          }
          return want;
        }""")
        assert len(colours) == series.num_rows and all(n > 20 for n in colours.values()), colours
        page.locator("#curves").screenshot(path=str(ARTIFACTS / "curves-sketch.png"))
    finally:
        page.close()


def test_curves_have_one_point_per_complete_episode(dashboard: Dashboard, demo_store: trajstore.Store) -> None:
    dashboard.open()
    expected = complete_per_series(demo_store)
    assert dashboard.episode_points() == expected
    assert dashboard.state("points") == sum(expected.values())
    assert sum(expected.values()) < demo_store.sql("SELECT count(*) AS n FROM episodes")["n"][0].as_py()
    assert f"{sum(expected.values()):,} complete episodes" in dashboard.page.locator("#status").inner_text()
    for hist in ("hist-return", "hist-length"):  # binned by the service: the counts add up to the episodes
        assert {t["name"]: sum(t["y"]) for t in dashboard.traces(hist)} == expected
    assert dashboard.problems == []


def test_gamma_switches_curves_to_discounted_return(dashboard: Dashboard, demo_store: trajstore.Store) -> None:
    dashboard.open()
    loads = dashboard.state("loads")
    dashboard.page.fill("#gamma", "0.9")
    dashboard.page.dispatch_event("#gamma", "change")
    dashboard.page.wait_for_function(f"() => trajstoreDashboard.loads > {loads} && trajstoreDashboard.gamma === 0.9")
    ids_y = dashboard.page.evaluate("() => Object.fromEntries(document.getElementById('curves').data"
                                    ".filter((t) => t.meta && t.meta.kind === 'episodes')"
                                    ".flatMap((t) => Array.from(t.customdata).map((id, i) => [id, t.y[i]])))")
    expected = {str(r["episode_id"]): r["discounted_return"]
                for r in demo_store.returns(gamma=0.9).to_pylist() if r["complete"]}
    assert ids_y.keys() == expected.keys()
    assert all(math.isclose(ids_y[k], v, rel_tol=1e-9, abs_tol=1e-9) for k, v in expected.items())
    assert "discounted return (γ=0.9)" in dashboard.page.locator("#curves").inner_text()
    assert dashboard.problems == []


def test_clicking_an_episode_opens_its_step_plots(dashboard: Dashboard, demo_store: trajstore.Store) -> None:
    dashboard.open()
    episodes = {r["episode_id"]: r for r in demo_store.episodes().to_pylist()}
    rows = dashboard.page.locator("#episodes tbody tr")
    row = rows.filter(has=dashboard.page.locator("td:nth-child(2)", has_text="ppo-seed")).nth(2)
    episode_id = row.get_attribute("data-episode-id")
    assert int(episode_id) in episodes  # the 63-bit id survived JSON parsing exactly
    row.click()
    dashboard.page.wait_for_function(f"() => trajstoreDashboard.episode && trajstoreDashboard.episode.id === "
                                     f"'{episode_id}' && trajstoreDashboard.timings.episode_ms > 0")
    n = episodes[int(episode_id)]["episode_length"]
    reward, rtg = dashboard.traces("ep-reward")
    assert len(reward["x"]) == len(rtg["x"]) == n
    assert reward["x"] == list(range(n))
    expected = demo_store.returns(gamma=0.99, per="step", episode_id=int(episode_id))
    assert rtg["y"] == pytest.approx(expected["return_to_go"].to_pylist())
    assert {t["name"] for t in dashboard.traces("ep-extras")} == {"action", "value", "log_prob"}
    assert all(len(t["x"]) == n for t in dashboard.traces("ep-extras"))
    obs = dashboard.traces("ep-obs")
    assert [t["name"] for t in obs] == [f"obs[{d}]" for d in range(4)] and all(len(t["x"]) == n for t in obs)
    assert episode_id in dashboard.page.locator("#episode-title").inner_text()
    dashboard.screenshot("episode", "#episode")
    assert dashboard.problems == []


def test_clicking_a_curve_point_opens_that_episode(dashboard: Dashboard, demo_store: trajstore.Store) -> None:
    dashboard.open()
    episode_id = dashboard.page.evaluate(
        "() => { const gd = document.getElementById('curves');"
        " const t = gd.data.find((d) => d.meta && d.meta.kind === 'episodes' && d.meta.key.startsWith('acrobot'));"
        " gd.emit('plotly_click', {points: [{data: t, customdata: t.customdata[0]}]}); return t.customdata[0]; }")
    dashboard.page.wait_for_function(f"() => trajstoreDashboard.episode && trajstoreDashboard.episode.id === "
                                     f"'{episode_id}'")
    n = demo_store.episodes(where=f"episode_id = {int(episode_id)}")["episode_length"][0].as_py()
    assert len(dashboard.traces("ep-reward")[0]["x"]) == n
    assert len(dashboard.traces("ep-obs")) == 6  # Acrobot's observation has 6 dimensions
    assert "no numeric extras" in dashboard.page.locator("#ep-extras").inner_text() or \
        [t["name"] for t in dashboard.traces("ep-extras")] == ["action"]
    assert dashboard.problems == []


def test_episodes_table_sorts_filters_and_pages(dashboard: Dashboard, demo_store: trajstore.Store) -> None:
    dashboard.open()
    page = dashboard.page

    def after(action: Any) -> None:
        loads = dashboard.state("table.loads")
        action()
        page.wait_for_function(f"() => trajstoreDashboard.table.loads > {loads}")

    def column(i: int) -> list[str]:
        return page.locator(f"#episodes tbody tr td:nth-child({i})").all_inner_texts()

    after(lambda: page.click("#episodes th[data-sort=episode_return]"))
    best = demo_store.sql("SELECT max(episode_return) AS m FROM episodes")["m"][0].as_py()
    assert float(column(4)[0].replace(",", "")) == pytest.approx(best, abs=1e-3)
    returns = [float(x.replace(",", "")) for x in column(4)]
    assert returns == sorted(returns, reverse=True)

    after(lambda: page.select_option("#f-run", "ppo-seed1"))
    total = demo_store.sql("SELECT count(*) AS n FROM episodes WHERE run_id = 'ppo-seed1'")["n"][0].as_py()
    assert set(column(2)) == {"ppo-seed1"}
    assert f"{total:,} episodes" in page.locator("#page").inner_text()

    first_page = column(1)
    after(lambda: page.click("#next"))
    assert "page 2 of" in page.locator("#page").inner_text() and set(column(1)).isdisjoint(first_page)

    after(lambda: page.select_option("#f-end", "unfinished"))
    after(lambda: page.select_option("#f-run", ""))
    unfinished = demo_store.sql("SELECT count(*) AS n FROM episodes WHERE NOT complete")["n"][0].as_py()
    assert unfinished > 0 and len(column(1)) == unfinished
    assert page.locator("#page").inner_text().startswith("page 1 of 1")
    assert dashboard.problems == []


def test_hiding_a_series_removes_it_from_the_plots(dashboard: Dashboard) -> None:
    dashboard.open()
    key = "acrobot-random · Acrobot-v1"
    assert key in dashboard.episode_points()
    dashboard.page.locator(f'#runs tr[data-series="{key}"] input[type=checkbox]').uncheck()
    dashboard.page.wait_for_function("(key) => !document.getElementById('curves').data"
                                     ".some((t) => t.meta && t.meta.key === key)", arg=key)
    assert len(dashboard.episode_points()) == 3
    assert key not in {t["name"] for t in dashboard.traces("hist-return")}
    dashboard.screenshot("learning-runs", full_page=False)
    assert dashboard.problems == []


def test_histograms_show_densities_and_bin_lengths_on_whole_numbers(dashboard: Dashboard,
                                                                     demo_store: trajstore.Store) -> None:
    dashboard.open()

    def widths(hist: str, name: str) -> list[float]:
        return dashboard.page.evaluate(f"(i) => Array.from(document.getElementById('{hist}').data"
                                       f".find((t) => t.name === i).width)", name)

    for trace in dashboard.traces("hist-length"):  # whole-number lengths: bins from k - 0.5, whole numbers wide
        for x, w in zip(trace["x"], widths("hist-length", trace["name"])):
            assert w == int(w) >= 1 and (x - w / 2) % 1 == 0.5
    dashboard.page.locator("#density").check()
    dashboard.page.wait_for_function("() => document.getElementById('hist-length').layout.yaxis.title.text"
                                     " === 'density'")
    assert "density=1" in dashboard.page.url
    want = plumbing(demo_store).histogram(y="episode_length", bins=60, density=True)
    for hist in ("hist-return", "hist-length"):
        for trace in dashboard.traces(hist):  # each run's bars integrate to 1
            assert sum(y * w for y, w in zip(trace["y"], widths(hist, trace["name"]))) == pytest.approx(1.0)
    acrobot = [t for t in dashboard.traces("hist-length") if t["name"] == "acrobot-random · Acrobot-v1"][0]
    rows = want.filter(pa.compute.equal(want["run_id"], "acrobot-random")).to_pydict()
    assert acrobot["y"] == pytest.approx(rows["density"])
    assert dashboard.problems == []
    dashboard.page.reload()  # ends the page's event stream (a request the browser aborts)
    dashboard.wait_ready()
    assert dashboard.page.locator("#density").is_checked()
    assert [p for p in dashboard.problems if not p.endswith("/events net::ERR_ABORTED")] == []


def test_episodes_one_apart_above_two_to_the_53_open_as_themselves(context: Any, tmp_path: Path) -> None:
    """Two episode ids one apart above 2**62 are one JavaScript number; the page keeps the service's decimal
    strings, so each row opens its own episode (its own steps and rewards), never its neighbour's."""
    write_adjacent_ids(tmp_path / "store")
    assert float(ID_A) == float(ID_B)
    with contextlib.contextmanager(serve)(create_app(ServiceSettings(store=str(tmp_path / "store")))) as live:
        dash = Dashboard(context.new_page(), live.url)
        dash.open()
        rows = dash.page.locator("#episodes tbody tr")
        assert sorted(rows.evaluate_all("(trs) => trs.map((tr) => tr.dataset.episodeId)")) == [str(ID_A), str(ID_B)]
        assert sorted(dash.page.locator("#episodes tbody tr td:first-child").all_inner_texts()) == \
            [str(ID_A), str(ID_B)]
        for episode_id in (ID_A, ID_B):
            dash.page.locator(f'#episodes tbody tr[data-episode-id="{episode_id}"]').click()
            dash.page.wait_for_function("(id) => trajstoreDashboard.episode && trajstoreDashboard.episode.id === id",
                                        arg=str(episode_id))
            reward = dash.traces("ep-reward")[0]
            assert reward["x"] == list(range(LENGTHS[episode_id]))
            assert set(reward["y"]) == {1.0 if episode_id == ID_A else 2.0}
            assert str(episode_id) in dash.page.locator("#episode-title").inner_text()
            selected = dash.page.locator("#episodes tbody tr.selected")
            assert selected.count() == 1 and selected.get_attribute("data-episode-id") == str(episode_id)
        assert dash.problems == []
        dash.page.close()


def test_a_rollout_written_during_the_test_appears_without_reload(context: Any, tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "store", create=True)
    write_learning_runs(store, episodes=60, runs=1, num_envs=4, versions=2)
    with contextlib.contextmanager(serve)(create_app(ServiceSettings(store=str(store.root)))) as live:
        page = context.new_page()
        dash = Dashboard(page, live.url)
        dash.open()
        page.evaluate("() => { window.notReloaded = true; }")
        for n, run in enumerate(["late-run", "later-run"], start=1):
            gym_rollout(store, "CartPole-v1", run_id=run, num_envs=4, episodes=10 * n, seed=n, progress=False)
            expected = complete_per_series(store)
            page.wait_for_function("(n) => trajstoreDashboard.points === n", arg=sum(expected.values()),
                                   timeout=30_000)
            assert dash.episode_points() == expected
            assert page.locator(f'#runs tr[data-series="{run} · CartPole-v1"]').count() == 1
        assert page.evaluate("() => window.notReloaded") is True
        assert dash.state("loads") >= 3 and dash.state("events") >= 2  # redrawn on pushed commits, not polls
        dash.screenshot("live")
        assert dash.problems == []
        page.close()


RUN_CELLS = "() => Array.from(document.querySelectorAll('#runs tbody tr')).map((tr) => [tr.dataset.series, " \
            "Array.from(tr.cells).slice(7).map((td) => td.textContent)])"
FETCHED = """() => {
  const nav = performance.getEntriesByType("navigation")[0];
  const all = [nav, ...performance.getEntriesByType("resource")];
  return all.map((e) => ({ url: e.name, bytes: e.transferSize, body: e.encodedBodySize }));
}"""


def _cells(row: dict[str, Any], gamma: float | None) -> list[str]:
    """The runs table's return and length cells of one series, as the page formats them (en-US, 2 digits)."""
    p = "return" if gamma is None else "discounted_return"
    fmt = lambda x, d=2: f"{round(x, d):,.{d}f}".rstrip("0").rstrip(".")  # noqa: E731 - toLocaleString's form
    return [f"{fmt(row[p + '_mean'])} ± {fmt(row[p + '_std'])}", fmt(row[p + "_min"]), fmt(row[p + "_max"]),
            fmt(row["len_mean"], 1)]


def test_runs_table_and_first_load_at_a_size_past_the_per_episode_points(context: Any, tmp_path: Path) -> None:
    """Past 20,000 complete episodes (the page draws one marker per episode up to 5,000, bins only beyond) the
    runs table's statistics still show (computed by the service), and the first load fetches at most 2 MB in all,
    as it would at a million episodes."""
    store = trajstore.open(tmp_path / "store", create=True)
    write_learning_runs(store, episodes=22_000, runs=2, num_envs=64, versions=4)
    assert store.stats()["n_traj"][0].as_py() > 20_000
    with contextlib.contextmanager(serve)(create_app(ServiceSettings(store=str(store.root)))) as live:
        page = context.browser.new_context(viewport={"width": 1400, "height": 1000}, locale="en-GB").new_page()
        dash = Dashboard(page, live.url)
        dash.open()
        assert dash.episode_points() == {}  # bins only at this size
        fetched = page.evaluate(FETCHED)  # everything of the first load: the page, its assets, the API's answers
        assert not any("/curves?" in f["url"] or f["url"].endswith("/curves") for f in fetched)
        total = sum(f["bytes"] for f in fetched)
        assert 0 < total <= 2_000_000, fetched
        plotly = next(f for f in fetched if "/plotly.min.js" in f["url"])
        assert plotly["body"] < 500_000  # fetched compressed
        for gamma in (None, 0.9):
            if gamma is not None:
                loads = dash.state("loads")
                page.fill("#gamma", str(gamma))
                page.dispatch_event("#gamma", "change")
                page.wait_for_function(f"() => trajstoreDashboard.loads > {loads}")
            want = {f"{r['run_id']} · {r['env_id']}": _cells(r, gamma)
                    for r in plumbing(store).latest_stats(100, gamma=gamma).to_pylist()}
            assert dict(page.evaluate(RUN_CELLS)) == want
        assert dash.problems == []
        page.context.close()
