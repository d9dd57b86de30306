"""The dashboard's experiment view (``/dashboard/experiment``) in headless Chromium: groups of runs by a config key,
each group's IQM per task and over all tasks with its interval, learning curves across seeds, the performance
profile and the probability of improvement — every number checked against the Store's methods on the same store
with the same arguments (the bootstrap is seeded: the service and the method give the same numbers). The choices
survive a reload; a metric that does not exist says so in the status without breaking the page."""

from __future__ import annotations

import re
from typing import Any, Iterator

import numpy as np
import pytest

import trajstore
from tests.api.dashboard.helpers import Dashboard
from tests.api.helpers import Live, serve, settings_for
from trajstore.api.app import create_app

pytestmark = [pytest.mark.browser, pytest.mark.server,
              pytest.mark.filterwarnings("ignore:random_state is deprecated:FutureWarning")]
ALGOS, SEEDS, TASKS = ("ppo", "dqn"), (0, 1, 2), ("Walk-v0", "Run-v0")
EPISODES = 8
PAGE = "/dashboard/experiment"
INTERVAL = re.compile(r"^(-?\d+(?:\.(\d+))?) \[(-?\d+(?:\.\d+)?), (-?\d+(?:\.\d+)?)\]$")


def episodes(returns: list[float], lengths: list[int]) -> dict[str, Any]:
    """One env's episodes back to back, each ``lengths[i]`` steps whose rewards sum to ``returns[i]`` (on the last
    step), the last one ending at the batch's end."""
    T = sum(lengths)
    reward = np.zeros((T, 1), np.float32)
    terminated = np.zeros((T, 1), bool)
    end = np.cumsum(lengths) - 1
    reward[end, 0] = returns
    terminated[end, 0] = True
    obs = np.zeros((T + 1, 1, 2), np.float32)
    return {"obs": obs[:-1], "next_obs": obs[1:], "action": np.zeros((T, 1), np.int64), "reward": reward,
            "terminated": terminated, "truncated": np.zeros((T, 1), bool)}


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    """2 algorithms × 3 seeds × 2 tasks, one run each, of 8 episodes of growing length (so that they spread along
    env_steps) whose returns rise with the episode, from a level of the run's own; dqn's rise faster. Returns are
    multiples of 0.25 (exact in the float32 rewards)."""
    found = trajstore.open(tmp_path_factory.mktemp("experiment") / "store", create=True)
    rng = np.random.default_rng(7)
    for a, algo in enumerate(ALGOS):
        for seed in SEEDS:
            for t, task in enumerate(TASKS):
                level = 5 + 3 * t + rng.normal(0, 2.5)
                rise = np.arange(EPISODES) * (1.0 + 0.4 * a)
                returns = np.round((level + rise + rng.normal(0, 1.5, EPISODES)) * 4) / 4
                lengths = (10 + 5 * np.arange(EPISODES) + rng.integers(0, 4, EPISODES)).tolist()
                with found.writer(run_id=f"{algo}-{seed}-{task}", env_id=task,
                                  config={"algo": algo, "seed": seed}) as w:
                    w.add_batch(episodes(returns.tolist(), lengths))
    return found


@pytest.fixture(scope="module")
def live(store: trajstore.Store) -> Iterator[Live]:
    yield from serve(create_app(settings_for(store.root)))


class Experiment(Dashboard):
    """The experiment view: its state is ``window.trajstoreExperiment``."""

    STATE = "trajstoreExperiment"

    def open(self, path: str = PAGE) -> None:
        super().open(path)

    def after(self, action: Any) -> None:
        """Do ``action`` (a change of a control) and wait until the page has recomputed."""
        loads = self.state("loads")
        action()
        self.page.wait_for_function(f"() => trajstoreExperiment.loads > {loads} && !trajstoreExperiment.busy")

    def change(self, selector: str, value: str) -> None:
        def act() -> None:
            if self.page.locator(selector).evaluate("(e) => e.tagName") == "SELECT":
                self.page.select_option(selector, value)
            else:
                self.page.fill(selector, value)
                self.page.dispatch_event(selector, "change")
        self.after(act)

    def header(self) -> list[str]:
        return self.page.locator("#iqm thead th").all_inner_texts()

    def table(self) -> dict[str, dict[str, str]]:
        """Cell texts: group -> task (or "all tasks", "runs") -> text."""
        rows = self.page.evaluate("() => Array.from(document.querySelectorAll('#iqm tbody tr'))"
                                  ".map((tr) => Array.from(tr.children).map((td) => td.textContent))")
        head = self.header()
        return {row[0]: dict(zip(head[1:], row[1:])) for row in rows}

    def lines(self, plot: str) -> dict[str, dict[str, Any]]:
        return {t["name"]: t for t in self.traces(plot) if t["meta"] and t["meta"]["kind"] == "line"}

    def bands(self, plot: str) -> dict[str, list[dict[str, Any]]]:
        out: dict[str, list[dict[str, Any]]] = {}
        for t in self.traces(plot):
            if t["meta"] and t["meta"]["kind"] == "band":
                out.setdefault(t["meta"]["group"], []).append(t)
        return out


@pytest.fixture
def experiment(context: Any, live: Live) -> Iterator[Experiment]:
    page = context.new_page()
    yield Experiment(page, live.url)
    page.close()


def shown(text: str, value: float, low: float, high: float) -> bool:
    """Whether "12.3 [10.1, 14.0]" shows ``value [low, high]`` to its decimals."""
    found = INTERVAL.match(text)
    assert found, text
    digits = len(found.group(2) or "")
    tol = 0.5 * 10.0 ** -digits * (1 + 1e-9) + 1e-12
    numbers = [float(found.group(1)), float(found.group(3)), float(found.group(4))]
    return all(abs(a - b) <= tol for a, b in zip(numbers, [value, low, high]))


def by_group(table: Any, by: str) -> dict[str, dict[str, Any]]:
    return {str(r[by]): r for r in table.to_pylist()}


def assert_table(experiment: Experiment, store: trajstore.Store, by: str, **args: Any) -> None:
    """Each cell shows the store's IQM of that group on that task (and over all tasks), with its interval."""
    table = experiment.table()
    overall = by_group(store.compare(by, statistics=["iqm"], **args), by)
    assert set(table) == set(overall)
    for task in sorted(TASKS):
        want = by_group(store.compare(by, statistics=["iqm"], where=f"env_id = '{task}'", **args), by)
        for group, row in want.items():
            assert shown(table[group][task], row["value"], row["ci_low"], row["ci_high"]), (group, task, row)
    for group, row in overall.items():
        assert shown(table[group]["all tasks"], row["value"], row["ci_low"], row["ci_high"]), (group, row)
        assert table[group]["runs"] == str(row["n_runs"])
    exact = experiment.state("table")  # the numbers behind the text, unrounded
    assert [r["value"] for r in exact["all"]["rows"]] == pytest.approx(
        [overall[str(r[by])]["value"] for r in exact["all"]["rows"]], rel=1e-12)


def test_groups_by_the_config_key_that_differs_with_each_groups_iqm_per_task(
        experiment: Experiment, store: trajstore.Store) -> None:
    experiment.open()
    page = experiment.page
    options = page.locator("#by option").evaluate_all("(os) => os.map((o) => o.value)")
    assert options == ["config.algo", "config.seed"] and page.input_value("#by") == "config.algo"
    assert page.input_value("#metric") == "episode_return" and page.input_value("#last") == "100"
    assert experiment.header() == ["config.algo", "Run-v0", "Walk-v0", "all tasks", "runs"]
    assert list(experiment.table()) == ["dqn", "ppo"]
    assert_table(experiment, store, "config.algo")
    assert all(experiment.table()[g]["runs"] == "6" for g in ALGOS)  # 3 seeds × 2 tasks
    assert page.locator("#to-dashboard").get_attribute("href") == "/dashboard"
    assert "by=config.algo" in page.url and "metric=episode_return" in page.url and "last=100" in page.url
    experiment.screenshot("experiment")
    assert experiment.problems == []


def test_curves_across_seeds_and_the_performance_profile_equal_the_stores(
        experiment: Experiment, store: trajstore.Store) -> None:
    experiment.open()
    curves = store.curves(by="config.algo").to_pylist()
    plots = experiment.page.locator("#curves-by-task .plot").evaluate_all(
        "(ds) => ds.map((d) => [d.id, d.dataset.task])")
    assert [task for _, task in plots] == sorted(TASKS)
    for plot, task in plots:
        lines, bands = experiment.lines(plot), experiment.bands(plot)
        assert set(lines) == set(bands) == set(ALGOS)  # a line and a band per group, the legend naming it
        for algo, line in lines.items():
            want = [r for r in curves if r["task"] == task and r["config.algo"] == algo]
            assert len(want) >= 5  # several bins along env_steps
            assert line["y"] == pytest.approx([r["value"] for r in want], rel=1e-12)
            assert line["x"] == pytest.approx([(r["lo"] + r["hi"]) / 2 for r in want], rel=1e-12)
            upper, lower = bands[algo]
            assert upper["y"] == pytest.approx([r["ci_high"] for r in want], rel=1e-12)
            assert lower["y"] == pytest.approx([r["ci_low"] for r in want], rel=1e-12)
    assert experiment.page.locator("#curves-by-task .legend .traces").count() == 2 * len(TASKS)

    scores = store.scores("config.algo")["score"].to_numpy()
    thresholds = experiment.state("thresholds")
    assert thresholds == pytest.approx(np.linspace(scores.min(), scores.max(), 25).tolist(), rel=1e-12)
    profile = store.performance_profile("config.algo", thresholds=thresholds).to_pylist()
    lines, bands = experiment.lines("profile"), experiment.bands("profile")
    assert set(lines) == set(bands) == set(ALGOS)
    for algo, line in lines.items():
        want = [r for r in profile if r["config.algo"] == algo]
        assert line["x"] == thresholds
        assert line["y"] == pytest.approx([r["value"] for r in want], rel=1e-12)
        assert bands[algo][0]["y"] == pytest.approx([r["ci_high"] for r in want], rel=1e-12)
        assert bands[algo][1]["y"] == pytest.approx([r["ci_low"] for r in want], rel=1e-12)
    assert experiment.problems == []


def improvement_text(experiment: Experiment, x: str, y: str) -> str:
    experiment.page.wait_for_function(f"() => document.getElementById('improvement').textContent"
                                      f".startsWith('P({x} > {y}) = ')")
    return experiment.page.locator("#improvement").inner_text()


def assert_improvement(text: str, want: dict[str, Any]) -> None:
    found = re.fullmatch(r"P\((\w+) > (\w+)\) = (\d\.\d\d) \[(\d\.\d\d), (\d\.\d\d)\]", text)
    assert found, text
    assert (found.group(1), found.group(2)) == (want["x"], want["y"])
    got = [float(found.group(i)) for i in (3, 4, 5)]
    assert got == pytest.approx([want["value"], want["ci_low"], want["ci_high"]], abs=0.005 + 1e-9), (text, want)


def test_probability_of_improvement_of_the_groups_chosen(experiment: Experiment, store: trajstore.Store) -> None:
    experiment.open()
    page = experiment.page
    assert page.locator("#x option").all_inner_texts() == ["dqn", "ppo"]
    assert (page.input_value("#x"), page.input_value("#y")) == ("dqn", "ppo")  # the first two groups
    page.select_option("#x", "ppo")
    page.select_option("#y", "dqn")
    assert_improvement(improvement_text(experiment, "ppo", "dqn"),
                       store.probability_of_improvement("ppo", "dqn", by="config.algo"))
    page.select_option("#x", "dqn")
    page.select_option("#y", "ppo")
    want = store.probability_of_improvement("dqn", "ppo", by="config.algo")
    assert_improvement(improvement_text(experiment, "dqn", "ppo"), want)
    page.wait_for_function("() => trajstoreExperiment.improvement && trajstoreExperiment.improvement.x === 'dqn'")
    got = experiment.state("improvement")
    assert [got[k] for k in ("value", "ci_low", "ci_high")] == pytest.approx(
        [want[k] for k in ("value", "ci_low", "ci_high")], rel=1e-12)
    assert want["value"] > 0.5  # dqn's returns rise faster
    assert "x=dqn" in page.url and "y=ppo" in page.url
    assert experiment.problems == []


def test_last_recomputes_and_the_choices_survive_a_reload(experiment: Experiment, store: trajstore.Store) -> None:
    experiment.open()
    page = experiment.page
    before = experiment.table()
    experiment.change("#last", "3")
    assert experiment.table() != before
    assert_table(experiment, store, "config.algo", last=3)

    experiment.change("#by", "config.seed")
    experiment.change("#metric", "episode_length")
    assert experiment.header()[0] == "config.seed" and list(experiment.table()) == ["0", "1", "2"]
    assert_table(experiment, store, "config.seed", metric="episode_length", last=3)
    url = page.url
    assert "by=config.seed" in url and "metric=episode_length" in url and "last=3" in url
    page.reload()
    experiment.wait_ready()
    assert page.url == url
    assert (page.input_value("#by"), page.input_value("#metric"), page.input_value("#last")) == \
        ("config.seed", "episode_length", "3")
    assert_table(experiment, store, "config.seed", metric="episode_length", last=3)
    assert (page.input_value("#x"), page.input_value("#y")) == ("0", "1")
    assert experiment.problems == []


def test_a_metric_that_does_not_exist_is_an_error_in_the_status(experiment: Experiment) -> None:
    experiment.open()
    page = experiment.page
    experiment.change("#metric", "median(reward)")
    errors = experiment.state("errors")
    assert len(errors) == 3 and all(": 422 metric: unknown aggregate 'median'" in e for e in errors), errors
    status = page.locator("#status")  # said once, as the service said it
    assert status.inner_text().startswith("metric: unknown aggregate 'median' in 'median(reward)'; expected one of")
    assert " · " not in status.inner_text() and "error" in (status.get_attribute("class") or "")
    assert page.locator("#iqm tbody td.empty").inner_text().startswith("no group has a score")
    assert "no learning curves" in page.locator("#curves-by-task").inner_text()
    assert "no performance profile" in page.locator("#profile").inner_text()
    # what the refusals left behind: the 422s and the page's own report of them, nothing else
    expected = re.compile(r"^(HTTP 422: .*median|console error: (trajstore experiment: .*median|Failed to load "
                          r"resource: the server responded with a status of 422))")
    assert [p for p in experiment.problems if not expected.match(p)] == []
    assert not [p for p in experiment.problems if p.startswith("page error")]
    experiment.change("#metric", "episode_return")  # and it recovers
    assert "error" not in (status.get_attribute("class") or "")
    assert list(experiment.table()) == ["dqn", "ppo"]
