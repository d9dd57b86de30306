"""store.compare, probability_of_improvement and performance_profile (issue 31): scores of runs on tasks as a
researcher defines them, and rliable's statistics over them — checked against the real rliable package on the same
score matrices (point estimates equal, interval ends within Monte-Carlo tolerance)."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from trajstore.errors import InputError, RemoteError

rliable = pytest.importorskip("rliable")
from rliable import library as rly  # noqa: E402
from rliable import metrics  # noqa: E402

pytestmark = pytest.mark.filterwarnings("ignore:random_state is deprecated:FutureWarning")  # arch, under rliable
ALGOS, RUNS, TASKS = ("ppo", "dqn"), 5, ("Walk-v0", "Run-v0", "Jump-v0")
REPS = 4000


def episodes(returns: list[float], lengths: list[int]) -> dict[str, Any]:
    """One env's episodes back to back, each ``lengths[i]`` steps whose rewards sum to ``returns[i]`` (on the last
    step), the last one ending at the batch's end; ``is_success`` 1 on the last step of an episode above 0."""
    T = sum(lengths)
    reward = np.zeros((T, 1), np.float32)
    terminated = np.zeros((T, 1), bool)
    success = np.zeros((T, 1), np.float32)
    end = np.cumsum(lengths) - 1
    reward[end, 0] = returns
    terminated[end, 0] = True
    success[end, 0] = np.asarray(returns) > 0
    obs = np.zeros((T + 1, 1, 2), np.float32)
    return {"obs": obs[:-1], "next_obs": obs[1:], "action": np.zeros((T, 1), np.int64), "reward": reward,
            "terminated": terminated, "truncated": np.zeros((T, 1), bool), "extras": {"is_success": success}}


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> tuple[trajstore.Store, dict[str, np.ndarray]]:
    """Two algorithms × 5 seeds × 3 tasks; each run's last 3 episodes average to its score (an earlier, very
    different episode is left out by last=3). Returns the store and each algorithm's (runs, tasks) matrix."""
    store = trajstore.open(tmp_path_factory.mktemp("compare") / "store", create=True)
    rng = np.random.default_rng(0)
    truth = {}
    for a, algo in enumerate(ALGOS):
        matrix = np.round(rng.normal(10 + 4 * a, 5, (RUNS, len(TASKS))) * 4) / 4  # exact in float32 rewards
        truth[algo] = matrix
        for seed in range(RUNS):
            for t, task in enumerate(TASKS):
                score = matrix[seed, t]
                spread = [score - 1.5, score, score + 1.5]
                with store.writer(run_id=f"{algo}-{seed}-{t}", env_id=task, config={"algo": algo, "seed": seed}) as w:
                    w.add_batch(episodes([1000.0, *spread], [2, 3, 4, 5]))
    return store, truth


def rliable_statistics(matrix: np.ndarray) -> np.ndarray:
    return np.array([metrics.aggregate_iqm(matrix), metrics.aggregate_median(matrix),
                     metrics.aggregate_mean(matrix)])


def close_enough(ours: float, theirs: float, scale: float, grain: float = 0.0) -> bool:
    """Interval ends of two independent bootstraps of REPS replications agree to a few percent of the spread (or
    to one step of a statistic that takes steps of ``grain``)."""
    return abs(ours - theirs) <= max(0.06 * scale, grain + 1e-12)


def test_compare_equals_rliable_on_the_same_matrices(study: tuple[trajstore.Store, dict[str, np.ndarray]]) -> None:
    store, truth = study
    got = store.compare("config.algo", last=3, reps=REPS, statistics=("iqm", "median", "mean"))
    assert set(got.column_names) == {"config.algo", "statistic", "value", "ci_low", "ci_high", "n_runs", "n_tasks"}
    # the matrix columns are the tasks in sorted order; rliable's statistics do not depend on their order
    points, intervals = rly.get_interval_estimates(truth, rliable_statistics, reps=REPS,
                                                   random_state=np.random.RandomState(1))
    for algo in ALGOS:
        rows = [r for r in got.to_pylist() if r["config.algo"] == algo]
        assert [r["statistic"] for r in rows] == ["iqm", "median", "mean"]
        assert all(r["n_runs"] == RUNS * len(TASKS) and r["n_tasks"] == len(TASKS) for r in rows)
        scale = float(np.ptp(truth[algo]))
        for i, row in enumerate(rows):
            assert row["value"] == pytest.approx(points[algo][i], rel=1e-9, abs=1e-9), row["statistic"]
            assert close_enough(row["ci_low"], intervals[algo][0][i], scale), (row, intervals[algo][:, i])
            assert close_enough(row["ci_high"], intervals[algo][1][i], scale), (row, intervals[algo][:, i])
            assert row["ci_low"] <= row["value"] <= row["ci_high"]


def test_normalized_scores_and_the_optimality_gap(study: tuple[trajstore.Store, dict[str, np.ndarray]]) -> None:
    store, truth = study
    bounds = {task: (0.0, 20.0 + 5 * t) for t, task in enumerate(TASKS)}
    got = store.compare("config.algo", last=3, normalize=bounds, reps=REPS, statistics=["optimality_gap", "iqm"])
    for algo in ALGOS:
        scaled = np.stack([(truth[algo][:, t] - 0.0) / (20.0 + 5 * t) for t in range(len(TASKS))], axis=1)
        points, intervals = rly.get_interval_estimates(
            {algo: scaled}, lambda m: np.array([metrics.aggregate_optimality_gap(m), metrics.aggregate_iqm(m)]),
            reps=REPS, random_state=np.random.RandomState(2))
        rows = [r for r in got.to_pylist() if r["config.algo"] == algo]
        for i, row in enumerate(rows):
            assert row["value"] == pytest.approx(points[algo][i], rel=1e-9, abs=1e-12)
            assert close_enough(row["ci_low"], intervals[algo][0][i], float(np.ptp(scaled)))
            assert close_enough(row["ci_high"], intervals[algo][1][i], float(np.ptp(scaled)))
    raw = store.compare("config.algo", last=3, statistics=["optimality_gap"], reps=10)
    assert raw["value"].to_pylist() == [None, None]  # a gap to 1.0 only means something for normalized scores


@pytest.mark.slow
def test_probability_of_improvement_and_performance_profiles_equal_rliable(
        study: tuple[trajstore.Store, dict[str, np.ndarray]]) -> None:
    store, truth = study
    got = store.probability_of_improvement("dqn", "ppo", by="config.algo", last=3, reps=REPS)
    points, intervals = rly.get_interval_estimates({"dqn,ppo": (truth["dqn"], truth["ppo"])},
                                                   metrics.probability_of_improvement, reps=REPS,
                                                   random_state=np.random.RandomState(3))
    assert got["value"] == pytest.approx(points["dqn,ppo"], rel=1e-12)
    assert close_enough(got["ci_low"], intervals["dqn,ppo"][0], 1.0)
    assert close_enough(got["ci_high"], intervals["dqn,ppo"][1], 1.0)
    assert got["n_tasks"] == len(TASKS)
    taus = np.linspace(0, 25, 11)
    profile = store.performance_profile("config.algo", thresholds=taus, last=3, reps=REPS)
    values, cis = rly.create_performance_profile(truth, taus, reps=REPS)
    for algo in ALGOS:
        rows = [r for r in profile.to_pylist() if r["config.algo"] == algo]
        assert [r["threshold"] for r in rows] == pytest.approx(list(taus))
        assert [r["value"] for r in rows] == pytest.approx(list(values[algo]), abs=1e-12)
        for j, row in enumerate(rows):
            grain = 1 / (RUNS * len(TASKS))  # a fraction of the 15 scores
            assert close_enough(row["ci_low"], cis[algo][0][j], 0.0, grain), (row, cis[algo][:, j])
            assert close_enough(row["ci_high"], cis[algo][1][j], 0.0, grain), (row, cis[algo][:, j])


def test_a_metric_over_step_columns_and_the_last_episodes(study: tuple[trajstore.Store, dict[str, np.ndarray]]) -> None:
    store, truth = study
    success = store.compare("config.algo", metric="last(is_success)", last=3, statistics=["mean"], reps=10)
    for algo in ALGOS:
        spreads = truth[algo][..., None] + np.array([-1.5, 0.0, 1.5])  # each run's last three returns
        want = (spreads > 0).mean()
        value = [r["value"] for r in success.to_pylist() if r["config.algo"] == algo][0]
        assert value == pytest.approx(want)
    whole = store.compare("config.algo", last=100, statistics=["mean"], reps=10)  # the 1000-return episode too
    for algo in ALGOS:
        value = [r["value"] for r in whole.to_pylist() if r["config.algo"] == algo][0]
        assert value == pytest.approx((truth[algo].mean() * 3 + 1000) / 4)
    length = store.compare("config.algo", metric="episode_length", last=1, statistics=["mean"], reps=10)
    assert length["value"].to_pylist() == [5.0, 5.0]


@pytest.mark.parametrize(("kwargs", "message"), [
    (dict(by="config.algo", metric="median(reward)"), r"metric: unknown aggregate 'median'"),
    (dict(by="config.algo", metric="last(nope)"), r"metric: 'nope' in 'last\(nope\)' is not a column of steps"),
    (dict(by="config.algo", metric="nope"), r"metric: 'nope' is not a column of episodes"),
    (dict(by="config.algo", statistics=["best"]), r"statistics: unknown \['best'\]"),
    (dict(by="config.algo", ci=1.5), r"ci: expected a confidence level"),
    (dict(by="config.algo", last=0), r"last: expected a positive number"),
    (dict(by="config.algo", normalize={"Walk-v0": (0, 1)}), r"normalize: no \(low, high\) for task\(s\) 'Jump-v0'"),
    (dict(by="config.algo", mode="test"), r"mode: expected one of"),
    (dict(by="config.algo", where="run_id NOT IN ('dqn-0-2', 'dqn-1-2', 'dqn-2-2', 'dqn-3-2', 'dqn-4-2')"),
     r"config.algo='dqn' on 'Jump-v0'"),
])
def test_bad_requests_name_what_is_wrong(study: tuple[trajstore.Store, dict[str, np.ndarray]],
                                          kwargs: dict[str, Any], message: str) -> None:
    store, _ = study
    with pytest.raises(InputError, match=message):
        store.compare(reps=10, **kwargs)
    with pytest.raises(InputError, match=r"no group 'sac'"):
        store.probability_of_improvement("sac", "ppo", by="config.algo", reps=10)


@pytest.mark.server
def test_the_service_and_the_client_give_the_same_comparison(
        study: tuple[trajstore.Store, dict[str, np.ndarray]]) -> None:
    from tests.api.helpers import serve, settings_for
    from trajstore.api.app import create_app
    from trajstore.remote.client import Client

    store, _ = study
    want = store.compare("config.algo", last=3, reps=500, seed=4)
    bounds = {task: (0.0, 30.0) for task in TASKS}
    for live in serve(create_app(settings_for(store.root))):
        with Client(live.url) as client:
            assert client.compare("config.algo", last=3, reps=500, seed=4).equals(want)
            normalized = client.compare("config.algo", last=3, reps=500, normalize=bounds, statistics=["mean"])
            assert normalized.equals(store.compare("config.algo", last=3, reps=500, normalize=bounds,
                                                   statistics=["mean"]))
            assert client.probability_of_improvement("dqn", "ppo", by="config.algo", last=3, reps=300) == \
                store.probability_of_improvement("dqn", "ppo", by="config.algo", last=3, reps=300)
            assert client.performance_profile("config.algo", thresholds=[5, 10], last=3, reps=300).equals(
                store.performance_profile("config.algo", thresholds=[5, 10], last=3, reps=300))
            assert client.curves(by="config.algo", bins=4, reps=200, aggregate="mean").equals(
                store.curves(by="config.algo", bins=4, reps=200, aggregate="mean"))
            assert client.scores("config.algo", last=3).equals(store.scores("config.algo", last=3))
            with pytest.raises(RemoteError, match="422 .*metric: unknown aggregate"):
                client.compare("config.algo", metric="median(reward)")


@pytest.mark.server
def test_rest_curves_take_by_as_python_does(study: tuple[trajstore.Store, dict[str, np.ndarray]]) -> None:
    """``GET /curves?by=config.algo`` groups runs as ``store.curves(by=…)`` does (the same rows as
    ``/curves/groups``), as Arrow or JSON rows, under the budget of the routes that compute per request; without
    ``by`` it answers each run's episodes, as before."""
    import httpx

    from tests.api.helpers import serve, settings_for
    from trajstore.api.app import create_app
    from trajstore.remote.wire import ARROW_STREAM

    store, _ = study
    want = store.curves(by="config.algo", bins=4, reps=200, seed=1)
    assert want.num_rows > 0 and "config.algo" in want.column_names
    query = {"by": "config.algo", "bins": 4, "reps": 200, "seed": 1}
    for live in serve(create_app(settings_for(store.root, compute_max_concurrent=1))):
        arrow = httpx.get(f"{live.url}/curves", params=query, headers={"Accept": ARROW_STREAM})
        assert arrow.status_code == 200, arrow.text
        assert pa.ipc.open_stream(arrow.content).read_all().equals(want)
        groups = httpx.get(f"{live.url}/curves/groups", params=query, headers={"Accept": ARROW_STREAM})
        assert pa.ipc.open_stream(groups.content).read_all().equals(want)
        rows = httpx.get(f"{live.url}/curves", params=query).json()
        assert [r["bin"] for r in rows] == want["bin"].to_pylist()
        assert [r["value"] for r in rows] == pytest.approx(want["value"].to_pylist())
        run = store.runs()["run_id"][0].as_py()
        per_run = httpx.get(f"{live.url}/curves", params={"run_id": run}).json()  # the dashboard's, as before
        assert [s["run_id"] for s in per_run["series"]] == [run]
        refused = httpx.get(f"{live.url}/curves", params={"by": "config.algo", "gamma": 0.9})
        assert refused.status_code == 422 and "gamma: not with by=" in refused.json()["detail"]


def test_trajstore_compare_prints_the_comparison(study: tuple[trajstore.Store, dict[str, np.ndarray]],
                                                 capsys: pytest.CaptureFixture[str]) -> None:
    from trajstore.cli import main

    store, _ = study
    want = store.compare("config.algo", last=3, reps=500, seed=4)
    bounds = {task: (0.0, 30.0) for task in TASKS}
    assert main(["compare", "--store", str(store.root), "--by", "config.algo", "--last", "3", "--reps", "500",
                 "--seed", "4", "--format", "csv"]) == 0
    rows = capsys.readouterr().out.splitlines()
    assert rows[0] == "config.algo,statistic,value,ci_low,ci_high,n_runs,n_tasks"
    assert float(rows[1].split(",")[2]) == pytest.approx(want["value"][0].as_py())
    assert main(["compare", "--store", str(store.root), "--by", "config.algo", "--last", "3",
                 "--normalize", "Walk-v0=0:30", "--normalize", "Run-v0=0:30", "--normalize", "Jump-v0=0:30"]) == 0
    table = capsys.readouterr().out
    iqm = store.compare("config.algo", last=3, normalize=bounds, statistics=["iqm"])
    assert f"{iqm['value'][0].as_py():.4g} [{iqm['ci_low'][0].as_py():.4g}, " in table
    assert main(["compare", "--store", str(store.root), "--by", "config.algo", "--normalize", "Walk-v0"]) != 0
    assert "--normalize: expected TASK=LOW:HIGH, got 'Walk-v0'" in capsys.readouterr().err


def test_scores_are_each_runs_mean_of_its_last_episodes(study: tuple[trajstore.Store, dict[str, np.ndarray]]) -> None:
    store, truth = study
    got = store.scores("config.algo", last=3).to_pylist()
    assert len(got) == len(ALGOS) * RUNS * len(TASKS)
    for row in got:
        algo, seed, t = row["run_id"].split("-")
        assert row["config.algo"] == algo and row["task"] == TASKS[int(t)]
        assert row["score"] == pytest.approx(truth[algo][int(seed), int(t)])
    bounds = {task: (0.0, 30.0) for task in TASKS}
    normalized = store.scores("config.algo", last=3, normalize=bounds)["score"].to_numpy()
    np.testing.assert_allclose(normalized, np.array([r["score"] for r in got]) / 30.0)
