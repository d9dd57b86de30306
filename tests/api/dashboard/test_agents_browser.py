"""The dashboard over multi-agent runs, in headless Chromium: learning curves per agent (or group of agents) beside
the runs' own, and an agent selector in the episode view showing one agent's steps, rewards and return-to-go.
The store holds a real mpe2 simple_spread run (three agents; ``local_ratio=0.5`` gives each agent a reward of its
own) and a single-agent CartPole run, which looks as it always did."""

from __future__ import annotations

from typing import Any, Iterator

import pytest

import trajstore
from tests.api.dashboard.helpers import Dashboard
from tests.api.helpers import Live, serve
from trajstore.api.app import create_app
from trajstore.api.settings import ServiceSettings

mpe2 = pytest.importorskip("mpe2")

from mpe2 import simple_spread_v3  # noqa: E402

from trajstore.rollout import gym_rollout, parallel_rollout  # noqa: E402
from trajstore.store import plumbing  # noqa: E402

pytestmark = [pytest.mark.browser, pytest.mark.server]  # the tiers: tests/tiers.py

SPREAD = "spread · simple_spread_v3"
AGENTS = ["agent_0", "agent_1", "agent_2"]


@pytest.fixture(scope="module")
def team(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    store = trajstore.open(tmp_path_factory.mktemp("agents") / "store", create=True)
    parallel_rollout(store, lambda: simple_spread_v3.parallel_env(max_cycles=25, local_ratio=0.5), run_id="spread",
                     episodes=30, seed=0, progress=False)
    gym_rollout(store, "CartPole-v1", run_id="solo", num_envs=2, episodes=20, seed=0, progress=False)
    return store


@pytest.fixture(scope="module")
def team_live(team: trajstore.Store) -> Iterator[Live]:
    yield from serve(create_app(ServiceSettings(store=str(team.root))))


@pytest.fixture
def page(context: Any, team_live: Live) -> Iterator[Dashboard]:
    dash = Dashboard(context.new_page(), team_live.url)
    yield dash
    dash.page.close()


def agent_traces(dash: Dashboard) -> dict[str, dict[str, Any]]:
    return {t["meta"]["key"]: t for t in dash.traces("agent-curves") if t["meta"] and t["meta"]["kind"] == "agent"}


def test_learning_curves_per_agent_and_per_group(page: Dashboard, team: trajstore.Store) -> None:
    page.open()
    assert page.page.locator("#agents-section").is_visible()
    bins = page.state("agentCurves.bins")
    want = plumbing(team).binned_curves(by="agent_id", bins=bins).to_pylist()
    traces = agent_traces(page)
    assert sorted(traces) == [f"{SPREAD} · {a}" for a in AGENTS]  # the single-agent run has no agent curve
    for agent in AGENTS:
        mine = [r for r in want if r["agent_id"] == agent]
        assert traces[f"{SPREAD} · {agent}"]["y"] == pytest.approx([r["mean"] for r in mine])
    assert traces[f"{SPREAD} · agent_0"]["y"] != traces[f"{SPREAD} · agent_1"]["y"]  # each agent its own reward
    assert "agent return" in page.page.locator("#agent-curves").inner_text()
    page.screenshot("agents", "#agents-section")

    loads = page.state("loads")
    page.page.select_option("#agent-by", "agent_group")
    page.page.wait_for_function("() => Object.keys(trajstoreDashboard.agentCurves.series).length === 1 && "
                                "trajstoreDashboard.agentCurves.by === 'agent_group'")
    page.page.wait_for_function("() => document.getElementById('agent-curves').data.some((t) => t.meta && "
                                "t.meta.agent === 'agent')")
    group = plumbing(team).binned_curves(by="agent_group", bins=bins).to_pylist()
    assert agent_traces(page)[f"{SPREAD} · agent"]["y"] == pytest.approx([r["mean"] for r in group])
    assert "agents=group" in page.page.url and page.state("loads") == loads  # redrawn, not reloaded
    assert page.problems == []


def test_the_episode_view_shows_one_agent_at_a_time(page: Dashboard, team: trajstore.Store) -> None:
    page.open()
    differ = team.sql("SELECT episode_id FROM agent_episodes WHERE run_id = 'spread' AND complete GROUP BY "
                      "episode_id HAVING count(DISTINCT agent_return) > 1 ORDER BY episode_id LIMIT 1")
    episode = team.episodes(episode_id=differ["episode_id"][0].as_py()).to_pylist()[0]  # agents' rewards differ
    episode_id = str(episode["episode_id"])
    page.page.evaluate("(id) => showEpisode(id)", episode_id)
    page.page.wait_for_function("(id) => trajstoreDashboard.episode && trajstoreDashboard.episode.id === id",
                                arg=episode_id)
    assert page.page.locator("#ep-agent-label").is_visible()
    assert page.page.locator("#ep-agent option").all_inner_texts() == AGENTS
    returns = team.returns(gamma=0.99, per="step", episode_id=episode["episode_id"])
    seen = {}
    for agent in AGENTS:
        if agent != AGENTS[0]:
            page.page.select_option("#ep-agent", agent)
            page.page.wait_for_function("(a) => trajstoreDashboard.episode.agent === a", arg=agent)
        rows = team.episode_steps(episode["episode_id"], ["step", "reward"], agent_id=agent)
        reward, rtg = page.traces("ep-reward")
        assert reward["x"] == rows["step"].to_pylist() == list(range(episode["episode_length"]))
        assert reward["y"] == pytest.approx(rows["reward"].to_pylist())
        mine = returns.filter(returns["agent_id"].to_numpy(zero_copy_only=False) == agent)
        assert rtg["y"] == pytest.approx(mine["return_to_go"].to_pylist())
        assert len(page.traces("ep-obs")) == 18  # simple_spread: each agent sees 18 floats
        assert f"agent {agent} (of 3)" in page.page.locator("#episode-title").inner_text()
        seen[agent] = reward["y"]
    assert len({tuple(y) for y in seen.values()}) > 1
    page.screenshot("episode-agent", "#episode")
    assert page.problems == []


def test_a_single_agent_episode_has_no_agent_selector(page: Dashboard, team: trajstore.Store) -> None:
    page.open()
    episode = team.episodes(run_id="solo", complete=True, limit=1).to_pylist()[0]
    page.page.evaluate("(id) => showEpisode(id)", str(episode["episode_id"]))
    page.page.wait_for_function("(id) => trajstoreDashboard.episode && trajstoreDashboard.episode.id === id",
                                arg=str(episode["episode_id"]))
    assert not page.page.locator("#ep-agent-label").is_visible()
    assert len(page.traces("ep-reward")[0]["x"]) == episode["episode_length"]
    assert "agent" not in page.page.locator("#episode-title").inner_text()
    assert page.problems == []


def test_single_agent_stores_look_as_before(dashboard: Dashboard) -> None:
    dashboard.open()
    assert dashboard.state("agentCurves.series") == []
    assert not dashboard.page.locator("#agents-section").is_visible()
    assert dashboard.problems == []
