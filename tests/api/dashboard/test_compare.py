"""The dashboard's run comparison in headless Chromium: binned curves overlaid with a legend, the selection,
axis and γ kept in the URL (a reload restores them), per-run stats side by side."""

from __future__ import annotations

from typing import Any

import pytest

import trajstore
from tests.api.dashboard.helpers import Dashboard
from trajstore.store import plumbing

pytestmark = [pytest.mark.browser, pytest.mark.server]  # the tiers: tests/tiers.py


def mean_traces(dashboard: Dashboard) -> dict[str, dict[str, Any]]:
    return {t["meta"]["key"]: t for t in dashboard.traces("curves") if t["meta"] and t["meta"]["kind"] == "mean"}


def test_binned_curves_are_overlaid_with_a_band_and_a_legend(dashboard: Dashboard,
                                                             demo_store: trajstore.Store) -> None:
    dashboard.open()
    means = mean_traces(dashboard)
    assert len(means) == 4 and all(t["name"] == key for key, t in means.items())  # the legend names the series
    bins = dashboard.state("binned")
    want = plumbing(demo_store).binned_curves(bins=bins["bins"])
    for s in bins["series"]:
        key = f"{s['run_id']} · {s['env_id']}"
        rows = [r for r in want.to_pylist() if r["run_id"] == s["run_id"]]
        assert means[key]["y"] == pytest.approx([r["mean"] for r in rows])
    bands = [t for t in dashboard.traces("curves") if t["meta"] and t["meta"]["kind"] == "binned"]
    assert len(bands) == 2 * 4
    assert dashboard.page.locator(".legend .traces").count() >= 4
    assert dashboard.problems == []


def test_selection_axis_and_gamma_survive_a_reload(dashboard: Dashboard) -> None:
    dashboard.open()
    page = dashboard.page
    loads = dashboard.state("loads")
    page.locator('#runs tr[data-series="ppo-seed1 · Synthetic-v0"] input[type=checkbox]').uncheck()
    page.locator('#runs tr[data-series="acrobot-random · Acrobot-v1"] input[type=checkbox]').uncheck()
    page.select_option("#xaxis", "episode_index")
    page.fill("#gamma", "0.95")
    page.dispatch_event("#gamma", "change")
    page.wait_for_function(f"() => trajstoreDashboard.loads > {loads} && !trajstoreDashboard.refreshing && "
                           "trajstoreDashboard.gamma === 0.95 && trajstoreDashboard.binned.x === 'episode_index'")
    url = page.url
    assert "x=episode_index" in url and "gamma=0.95" in url and "run=ppo-seed0" in url and "run=ppo-seed1" not in url
    page.reload()
    dashboard.wait_ready()
    # leaving a page aborts its open event stream: that is the reload, not a problem
    dashboard.problems = [p for p in dashboard.problems if not p.endswith("/events net::ERR_ABORTED")]
    assert page.url == url
    assert page.input_value("#xaxis") == "episode_index" and page.input_value("#gamma") == "0.95"
    assert set(mean_traces(dashboard)) == {"ppo-seed0 · Synthetic-v0", "ppo-seed2 · Synthetic-v0"}
    head = page.locator("#compare thead th, #compare thead td").all_inner_texts()
    assert head[1:] == ["ppo-seed0 · Synthetic-v0", "ppo-seed2 · Synthetic-v0"]
    assert "discounted return mean (γ=0.95)" in page.locator("#compare").inner_text()
    dashboard.screenshot("compare", full_page=False)
    assert dashboard.problems == []


def test_compare_table_holds_each_runs_stats(dashboard: Dashboard, demo_store: trajstore.Store) -> None:
    dashboard.open()
    cols = dashboard.page.evaluate("() => Array.from(document.querySelectorAll('#compare tbody tr'))"
                                   ".map((tr) => Array.from(tr.children).map((td) => td.textContent))")
    stats = demo_store.stats(by=["run_id", "env_id"]).to_pylist()
    episodes = [int(v.replace(",", "")) for v in cols[0][1:]]
    assert cols[0][0] == "episodes" and sorted(episodes) == sorted(s["n_traj"] for s in stats)
    assert cols[1][0] == "return mean"
    assert sorted(float(v.replace(",", "")) for v in cols[1][1:]) == pytest.approx(
        sorted(s["return_mean"] for s in stats), abs=1e-3)
