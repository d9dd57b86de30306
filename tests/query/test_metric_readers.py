"""``metric=`` on stats, curves, binned curves and histograms (issue 31): an ``episodes`` column or ``agg(column)``
of a step column, over episodes recorded with ``info_keys`` — checked against the infos the env itself returned."""

from __future__ import annotations

from collections import defaultdict
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.integrations.test_info_keys import SuccessEnv
from trajstore.errors import InputError
from trajstore.integrations import RecordToStore
from trajstore.store import plumbing

RUNS = {"a": (0, 400), "b": (1, 150)}  # run -> (seed, steps)


@pytest.fixture(scope="module")
def recorded(tmp_path_factory: pytest.TempPathFactory) -> tuple[trajstore.Store, dict[str, list[dict[str, Any]]]]:
    """Two runs of SuccessEnv recorded with info_keys, and per run its complete episodes as the env reported them
    (success of the last step, sum and mean of the costs, length)."""
    store = trajstore.open(tmp_path_factory.mktemp("metrics") / "store", create=True)
    truth = {}
    for run, (seed, steps) in RUNS.items():
        before = set(SuccessEnv.infos)
        with RecordToStore(SuccessEnv(), store, run_id=run, env_id="Success-v0", chunk=16,
                           info_keys=["cost", "is_success"]) as env:
            env.reset(seed=seed)
            for _ in range(steps):
                if any(env.step(0)[2:4]):
                    env.reset()
        episodes = defaultdict(dict)
        for (uid, t), info in SuccessEnv.infos.items():
            if (uid, t) not in before:
                episodes[uid][t] = info
        truth[run] = [{"success": float(steps_[len(steps_) - 1]["is_success"]),
                       "cost_sum": sum(i["cost"] for i in steps_.values()),
                       "cost_mean": float(np.mean([i["cost"] for i in steps_.values()])), "length": len(steps_)}
                      for steps_ in episodes.values() if "is_success" in steps_[len(steps_) - 1]]
    return store, truth


def test_stats_take_a_metric(recorded: tuple[trajstore.Store, dict[str, list[dict[str, Any]]]]) -> None:
    store, truth = recorded
    for metric, key in (("last(is_success)", "success"), ("sum(cost)", "cost_sum"), ("mean(cost)", "cost_mean"),
                        ("episode_length", "length")):
        rows = store.stats(by="run_id", metric=metric).to_pylist()
        assert [r["run_id"] for r in rows] == sorted(RUNS)
        for row in rows:
            want = np.array([e[key] for e in truth[row["run_id"]]])
            assert row["metric_n"] == row["n_traj"] == len(want)
            assert row["metric_mean"] == pytest.approx(want.mean())
            assert row["metric_std"] == pytest.approx(want.std())
            assert (row["metric_min"], row["metric_max"]) == pytest.approx((want.min(), want.max()))
    plain = store.stats(by="run_id")
    assert "metric_mean" not in plain.column_names
    assert store.stats(by="run_id", metric="episode_length")["metric_mean"].equals(plain["len_mean"])


def test_curves_binned_curves_and_histograms_take_a_metric(
        recorded: tuple[trajstore.Store, dict[str, list[dict[str, Any]]]]) -> None:
    store, truth = recorded
    curve = store.curves(metric="sum(cost)")
    for run in RUNS:
        mine = curve.filter(pa.compute.equal(curve["run_id"], run))["metric"].to_pylist()
        assert sorted(mine) == pytest.approx(sorted(e["cost_sum"] for e in truth[run]))
    binned = plumbing(store).binned_curves(metric="last(is_success)", bins=5)
    for run in RUNS:
        rows = binned.filter(pa.compute.equal(binned["run_id"], run)).to_pydict()
        assert sum(rows["count"]) == len(truth[run])
        assert sum(c * m for c, m in zip(rows["count"], rows["mean"])) == \
            pytest.approx(sum(e["success"] for e in truth[run]))
    everything = np.array([e["cost_sum"] for run in RUNS for e in truth[run]])
    edges = np.histogram_bin_edges(everything, 7)
    hist = plumbing(store).histogram(metric="sum(cost)", bins=7)
    for run in RUNS:
        rows = hist.filter(pa.compute.equal(hist["run_id"], run)).to_pydict()
        dense = np.zeros(7, int)
        dense[rows["bin"]] = rows["count"]
        np.testing.assert_array_equal(dense, np.histogram([e["cost_sum"] for e in truth[run]], edges)[0])
    success = plumbing(store).histogram(metric="last(is_success)", bins=60, density=True).to_pydict()
    assert sorted(set(success["lo"])) == [-0.5, 0.5]  # 0 and 1, each in a bin of its own


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"metric": "median(cost)"}, "metric: unknown aggregate 'median'"),
    ({"metric": "last(nope)"}, "metric: 'nope' in 'last\\(nope\\)' is not a column of steps"),
    ({"metric": "sum(cost)", "y": "episode_length"}, "metric: give y or metric, not both"),
])
def test_a_wrong_metric_is_named(recorded: tuple[trajstore.Store, dict[str, list[dict[str, Any]]]],
                                 kwargs: dict[str, Any], message: str) -> None:
    store, _ = recorded
    with pytest.raises(InputError, match=message):
        plumbing(store).histogram(**kwargs)
    if "y" not in kwargs:
        with pytest.raises(InputError, match=message):
            store.stats(**kwargs)


@pytest.mark.server
def test_the_service_and_the_client_take_a_metric(
        recorded: tuple[trajstore.Store, dict[str, list[dict[str, Any]]]]) -> None:
    import httpx

    from tests.api.helpers import serve, settings_for
    from trajstore.api.app import create_app
    from trajstore.remote.client import Client

    store, _ = recorded
    want = store.stats(by="run_id", metric="last(is_success)")
    for live in serve(create_app(settings_for(store.root))):
        with Client(live.url) as client:
            got = client.stats(by="run_id", metric="last(is_success)")
            assert got.select(["run_id", "metric_n", "metric_mean"]).equals(
                want.select(["run_id", "metric_n", "metric_mean"]))
        hist = httpx.get(f"{live.url}/curves/histogram", params={"metric": "sum(cost)", "bins": 7,
                                                                 "density": "true"}).json()
        assert hist["metric"] == "sum(cost)"
        for series in hist["series"]:
            widths = np.subtract(series["hi"], series["lo"])
            assert np.sum(np.multiply(series["density"], widths)) == pytest.approx(1.0)
        binned = httpx.get(f"{live.url}/curves/binned", params={"metric": "last(is_success)", "bins": 5}).json()
        assert {s["run_id"] for s in binned["series"]} == set(RUNS)
        curves = httpx.get(f"{live.url}/curves", params={"metric": "sum(cost)"}).json()
        want_curves = store.curves(metric="sum(cost)")
        for series in curves["series"]:
            mine = want_curves.filter(pa.compute.equal(want_curves["run_id"], series["run_id"]))
            assert series["metric"] == pytest.approx(mine["metric"].to_pylist())
        bad = httpx.get(f"{live.url}/stats", params={"metric": "median(cost)"})
        assert bad.status_code == 422 and "metric: unknown aggregate" in bad.text
