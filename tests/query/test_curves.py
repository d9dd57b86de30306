"""Learning curves (``Store.curves``): each series' complete episodes in the order they ended, and the env steps
of all its writers at each one, against a plain walk over the stored episodes."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.helpers import engine_of, make_batch, write_huge_returns
from trajstore.errors import RunNotFoundError
from trajstore.store import plumbing
from trajstore.write.episode_ids import COUNTER_BITS

SPENT = 1 << (COUNTER_BITS - 1)


def walk_order(e: dict[str, Any]) -> tuple[Any, ...]:
    return e["ended_at"], e["env_steps"] is None, e["env_steps"] or 0, e["episode_id"]


def reference_totals(episodes: list[dict[str, Any]]) -> dict[int, int]:
    """Plain walk of every episode of each (run, env) in wall-time order: each adds its writer's steps since its
    writer's previous episode; within a worker_id a drop in the count, or an id token first seen after a token
    whose counters stayed low, is a new writer counted from 0; an episode without env_steps adds its length."""
    totals: dict[int, int] = {}
    series: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for e in episodes:
        series.setdefault((e["run_id"], e["env_id"]), []).append(e)
    for eps in series.values():
        total, workers = 0, {}
        for e in sorted(eps, key=walk_order):
            w = workers.setdefault(e["worker_id"], {"prev": None, "prev_max": None, "max": {}})
            token, counter = e["episode_id"] >> COUNTER_BITS, e["episode_id"] & ((1 << COUNTER_BITS) - 1)
            first = token not in w["max"]
            w["max"][token] = max(w["max"].get(token, -1), counter)
            steps, prev = e["env_steps"], w["prev"]
            if steps is None:
                total += e["episode_length"]
            elif prev is None or steps < prev or (first and w["prev_max"] < SPENT):
                total += steps
            else:
                total += steps - prev
            w["prev"], w["prev_max"] = steps, w["max"][token]
            totals[e["episode_id"]] = total
    return totals


def assert_matches_reference(store: trajstore.Store) -> list[dict[str, Any]]:
    curve = store.curves().to_pylist()
    expected = reference_totals(store.episodes().to_pylist())
    assert [e["total_env_steps"] for e in curve] == [expected[e["episode_id"]] for e in curve]
    assert all(e["complete"] for e in curve)
    assert len(curve) == store.episodes(complete=True).num_rows
    keys = [(e["run_id"], e["env_id"], *walk_order(e)) for e in curve]
    assert keys == sorted(keys)
    return curve


def write(store: trajstore.Store, rng: np.random.Generator, *, calls: int, T: int = 8, B: int = 3,
          run_id: str = "r", p_terminated: float = 0.2, **options: Any) -> None:
    with store.writer(run_id=run_id, env_id="e", **options) as w:
        for _ in range(calls):
            w.add_batch(make_batch(rng, T, B, p_terminated=p_terminated, p_truncated=0))


def one_end_per_writer(store: trajstore.Store, writers: int, *, T: int = 5, B: int = 3) -> None:
    """``writers`` writers one after the other with one worker_id, two calls each; only env 0's episode ends,
    at the last time index: every writer has one complete episode, all at env_steps 2·T·B."""
    rng = np.random.default_rng(0)
    for _ in range(writers):
        with store.writer(run_id="loop", env_id="e", worker_id="host:1") as w:
            for call in range(2):
                batch = make_batch(rng, T, B, p_terminated=0, p_truncated=0)
                batch["terminated"][T - 1, 0] = call == 1
                w.add_batch(batch)


def test_one_writer_curve_is_its_env_steps(store: trajstore.Store) -> None:
    write(store, np.random.default_rng(1), calls=6)
    curve = assert_matches_reference(store)
    assert len(curve) > 10
    assert [e["total_env_steps"] for e in curve] == [e["env_steps"] for e in curve]


def test_writers_of_one_worker_one_after_another_add_up(store: trajstore.Store) -> None:
    # each writer's only end is at the count the writer before it ended at: no drop, a new id token
    one_end_per_writer(store, 3)
    curve = assert_matches_reference(store)
    assert [e["env_steps"] for e in curve] == [30, 30, 30]
    assert [e["total_env_steps"] for e in curve] == [30, 60, 90]


def test_writers_at_once_and_one_after_another(store: trajstore.Store) -> None:
    rng = np.random.default_rng(2)
    for _ in range(3):  # a training loop: a writer per iteration, the default worker_id
        write(store, rng, calls=2)
    a = store.writer(run_id="r", env_id="e", worker_id="a")
    b = store.writer(run_id="r", env_id="e", worker_id="b")
    with a, b:  # two workers interleaved
        for _ in range(4):
            a.add_batch(make_batch(rng, 8, 3, p_terminated=0.2, p_truncated=0))
            b.add_batch(make_batch(rng, 6, 2, p_terminated=0.2, p_truncated=0))
    write(store, rng, calls=3, run_id="other", worker_id="a")  # another series: counted on its own
    curve = assert_matches_reference(store)
    totals = {run: [e["total_env_steps"] for e in curve if e["run_id"] == run] for run in ("r", "other")}
    assert totals["r"] == sorted(totals["r"])
    assert totals["r"][-1] <= 3 * 2 * 8 * 3 + 4 * 8 * 3 + 4 * 6 * 2  # at most every step written to the run
    assert totals["other"][-1] <= 3 * 8 * 3


def test_a_writer_that_runs_out_of_id_counters_stays_one_writer(store: trajstore.Store) -> None:
    rng = np.random.default_rng(3)
    with store.writer(run_id="r", env_id="e") as w:
        w._ids._next = (1 << COUNTER_BITS) - 5  # as after 2**24 - 5 episodes: the next ids take a new token
        for _ in range(5):
            w.add_batch(make_batch(rng, 10, 4, p_terminated=0.3, p_truncated=0))
    curve = assert_matches_reference(store)
    assert len({e["episode_id"] >> COUNTER_BITS for e in curve}) == 2
    assert [e["total_env_steps"] for e in curve] == [e["env_steps"] for e in curve]


def test_a_writer_after_a_spent_token_is_told_by_its_count_dropping(store: trajstore.Store) -> None:
    rng = np.random.default_rng(6)
    for end in (5, 2):  # the first writer's ids all of a spent token; the second's first end is earlier
        with store.writer(run_id="r", env_id="e", worker_id="host:1") as w:
            if end == 5:
                w._ids._next = (1 << COUNTER_BITS) - 2
            batch = make_batch(rng, 6, 2, p_terminated=0, p_truncated=0)
            batch["terminated"][end] = True
            w.add_batch(batch)
    curve = assert_matches_reference(store)
    assert [e["env_steps"] for e in curve] == [12, 12, 6, 6]
    assert [e["total_env_steps"] for e in curve] == [12, 12, 18, 18]


def ingested_rows(lengths: list[int], first_id: int) -> pa.Table:
    """Rows as a sender without env_steps (or a file written before it was recorded) stores them."""
    ids = np.repeat(np.arange(first_id, first_id + len(lengths)), lengths)
    steps = np.concatenate([np.arange(n) for n in lengths])
    ends = np.concatenate([np.arange(n) == n - 1 for n in lengths])
    return pa.table({"episode_id": pa.array(ids, pa.int64()), "step": pa.array(steps, pa.int32()),
                     "obs": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(len(ids) * 3, np.float32)), 3),
                     "action": pa.array(np.zeros(len(ids), np.int64)),
                     "reward": pa.array(np.ones(len(ids), np.float32)),
                     "next_obs": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(len(ids) * 3, np.float32)), 3),
                     "terminated": pa.array(ends), "truncated": pa.array(np.zeros(len(ids), bool))})


def test_episodes_without_env_steps_add_their_length(store: trajstore.Store) -> None:
    plumbing(store).ingest(ingested_rows([4, 7, 2], first_id=1), run_id="old", env_id="e")
    assert store.sql("SELECT count(*) AS n FROM steps WHERE env_steps IS NULL")["n"].to_pylist() == [13]
    assert store.episodes()["env_steps"].to_pylist() == [None, None, None]
    assert store.episodes().schema.field("env_steps").type == pa.int64()
    write(store, np.random.default_rng(4), calls=2, run_id="old")
    assert store.sql("SELECT count(*) AS n FROM steps WHERE env_steps IS NULL")["n"].to_pylist() == [13]
    curve = assert_matches_reference(store)
    assert [e["total_env_steps"] for e in curve[:3]] == [4, 11, 13]


def test_filters_choose_episodes_not_positions(store: trajstore.Store) -> None:
    rng = np.random.default_rng(5)
    for _ in range(2):
        write(store, rng, calls=4)
    every = {e["episode_id"]: e["total_env_steps"] for e in store.curves().to_pylist()}
    long = store.curves(where="episode_length >= 4").to_pylist()
    assert 0 < len(long) < len(every)
    assert all(e["episode_length"] >= 4 and e["total_env_steps"] == every[e["episode_id"]] for e in long)
    discounted = store.curves(gamma=0.9)
    assert discounted["total_env_steps"].to_pylist() == list(every.values())
    assert "discounted_return" in discounted.column_names
    with pytest.raises(RunNotFoundError, match="run_id: no run 'absent'"):
        store.curves(run_id="absent")


def test_curves_of_an_empty_store(store: trajstore.Store) -> None:
    assert store.curves().num_rows == 0
    assert "total_env_steps" in store.curves().column_names


@pytest.mark.parametrize("writers", [1, 4])
def test_the_last_total_counts_every_writer(store: trajstore.Store, writers: int) -> None:
    one_end_per_writer(store, writers)
    assert store.curves()["total_env_steps"].to_pylist()[-1] == writers * 2 * 5 * 3


# --- binned curves and histograms (Store.binned_curves, Store.histogram) --------------------------------------


@pytest.fixture(scope="module")
def learning_store(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    from tests.api.dashboard.synthetic import write_learning_runs

    store = trajstore.open(tmp_path_factory.mktemp("binned"), create=True)
    write_learning_runs(store, episodes=1500, runs=3, num_envs=8, versions=5)
    return store


def test_a_page_walks_the_episodes_once(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """What the dashboard's first page asks (binned curves, the latest statistics, a histogram, curves per agent)
    walks a version's episodes once: a selection given as None is the selection not given (fast tier)."""
    from tests.api.dashboard.synthetic import write_learning_runs
    from trajstore.query import curves

    store = trajstore.open(tmp_path / "s", create=True)
    write_learning_runs(store, episodes=200, runs=2, num_envs=4, versions=2)
    walks = []
    real = curves.curves
    monkeypatch.setattr(curves, "curves", lambda engine, **kw: walks.append(kw) or real(engine, **kw))
    served = plumbing(store)
    served.binned_curves(x="env_steps", y="episode_return", bins=50, gamma=None, run_id=None, env_id=None,
                         metric=None)
    served.latest_stats(10, gamma=None)
    served.histogram(y="episode_return", bins=10, gamma=None, run_id=None, env_id=None, metric=None, density=True)
    served.binned_curves(by="agent_id")
    assert len(walks) == 1, walks
    assert served.binned_curves(bins=1)["count"].to_numpy().sum() == store.curves().num_rows > 0


def reference_x(curve: dict[str, list[Any]], axis: str) -> np.ndarray:
    """Where each episode lies along ``axis``, from the plain columns of Store.curves (already tested above)."""
    if axis == "env_steps":
        return np.array(curve["total_env_steps"], float)
    if axis == "policy_version":
        return np.array([np.nan if v is None else v for v in curve["policy_version"]], float)
    if axis == "wall_time":
        return np.array([t.timestamp() for t in curve["ended_at"]])
    index, seen = [], {}
    for run, env in zip(curve["run_id"], curve["env_id"]):
        index.append(seen.setdefault((run, env), 0))
        seen[(run, env)] += 1
    return np.array(index, float)


def reference_bins(store: trajstore.Store, x: str, y: str, bins: int, gamma: float | None) -> list[dict[str, Any]]:
    """Per series and non-empty bin, from a plain loop over the episodes: numpy's edges and counts, numpy's
    mean and 'linear' percentiles (DuckDB's quantile_cont)."""
    curve = store.curves(gamma=gamma).to_pydict()
    xs, ys = reference_x(curve, x), np.array(curve[y], float)
    edges = np.histogram_bin_edges(xs[np.isfinite(xs)], bins)
    rows = []
    for key in sorted(set(zip(curve["run_id"], curve["env_id"]))):
        mine = np.array([(r, e) == key for r, e in zip(curve["run_id"], curve["env_id"])])
        counts = np.histogram(xs[mine & np.isfinite(xs)], edges)[0]
        for i in range(bins):
            last = i == bins - 1
            inside = mine & (xs >= edges[i]) & ((xs <= edges[i + 1]) if last else (xs < edges[i + 1]))
            assert inside.sum() == counts[i]
            if counts[i]:
                v = ys[inside]
                p10, p50, p90 = np.percentile(v, [10, 50, 90], method="linear")
                rows.append({"run_id": key[0], "env_id": key[1], "bin": i, "lo": edges[i], "hi": edges[i + 1],
                             "count": int(counts[i]), "mean": v.mean(), "p10": p10, "p50": p50, "p90": p90})
    return rows


@pytest.mark.parametrize(("x", "y", "bins", "gamma"), [
    ("env_steps", "episode_return", 50, None), ("episode_index", "episode_length", 7, None),
    ("wall_time", "discounted_return", 33, 0.95), ("policy_version", "episode_return", 5, None),
    ("env_steps", "episode_return", 1, None), ("episode_index", "episode_return", 2000, None)])
def test_binned_curves_match_numpy(learning_store: trajstore.Store, x: str, y: str, bins: int,
                                   gamma: float | None) -> None:
    got = plumbing(learning_store).binned_curves(x=x, y=y, bins=bins, gamma=gamma).to_pylist()
    want = reference_bins(learning_store, x, y, bins, gamma)
    assert [(r["run_id"], r["bin"], r["count"]) for r in got] == [(r["run_id"], r["bin"], r["count"]) for r in want]
    for g, w in zip(got, want):
        assert g["lo"] == w["lo"] and g["hi"] == w["hi"]
        np.testing.assert_allclose([g[k] for k in ("mean", "p10", "p50", "p90")],
                                   [w[k] for k in ("mean", "p10", "p50", "p90")], rtol=1e-9, atol=1e-9)
    assert sum(r["count"] for r in got) == learning_store.curves().num_rows


def test_binned_curves_select_runs_and_keep_their_size(learning_store: trajstore.Store) -> None:
    one = plumbing(learning_store).binned_curves(run_id="ppo-seed1", bins=40)
    assert set(one["run_id"].to_pylist()) == {"ppo-seed1"}
    assert one.num_rows <= 40
    both = plumbing(learning_store).binned_curves(run_id=["ppo-seed0", "ppo-seed2"], bins=40)
    assert set(both["run_id"].to_pylist()) == {"ppo-seed0", "ppo-seed2"}
    with pytest.raises(RunNotFoundError, match="run_id: no run 'absent'"):
        plumbing(learning_store).binned_curves(run_id="absent")


def dense_counts(got: pa.Table, run: str, bins: int) -> np.ndarray:
    rows = got.filter(pa.compute.equal(got["run_id"], run)).to_pydict()
    dense = np.zeros(bins, int)
    dense[rows["bin"]] = rows["count"]
    return dense


def test_histogram_of_real_values_matches_numpy(learning_store: trajstore.Store) -> None:
    curve = learning_store.curves(gamma=0.9).to_pydict()
    ys = np.array(curve["discounted_return"], float)
    assert not np.all(ys == np.round(ys))
    edges = np.histogram_bin_edges(ys, 25)
    got = plumbing(learning_store).histogram(y="discounted_return", gamma=0.9, bins=25)
    for run in sorted(set(curve["run_id"])):
        mine = np.array(curve["run_id"]) == run
        np.testing.assert_array_equal(dense_counts(got, run, 25), np.histogram(ys[mine], edges)[0])
    np.testing.assert_allclose(got["lo"].to_numpy(), edges[:-1][got["bin"].to_numpy()])


@pytest.mark.parametrize("bins", [25, 1000])
def test_whole_numbers_are_binned_on_whole_numbers(learning_store: trajstore.Store, bins: int) -> None:
    curve = learning_store.curves().to_pydict()
    ys = np.array(curve["episode_length"], float)
    got = plumbing(learning_store).histogram(y="episode_length", bins=bins)
    lo, hi = got["lo"].to_numpy(), got["hi"].to_numpy()
    width = hi[0] - lo[0]
    assert np.all(hi - lo == width) and width == int(width) >= 1  # every bin as many whole numbers wide
    assert np.all(lo - np.floor(lo) == 0.5)  # edges halfway between whole numbers
    edges = lo.min() + width * np.arange(int(got["bin"].to_numpy().max()) + 2)
    assert len(edges) - 1 <= bins and edges[0] < ys.min() and edges[-1] > ys.max()
    assert width == (1 if bins == 1000 else np.ceil((ys.max() - ys.min() + 1) / bins))
    for run in sorted(set(curve["run_id"])):
        mine = np.array(curve["run_id"]) == run
        want = np.histogram(ys[mine], edges)[0]
        np.testing.assert_array_equal(dense_counts(got, run, len(edges) - 1), want)


def test_histogram_densities_compare_runs_of_different_sizes(learning_store: trajstore.Store) -> None:
    small = "run_id <> 'ppo-seed0' OR episode_id % 10 = 0"  # one run with a tenth of the others' episodes
    curve = learning_store.curves(where=small).to_pydict()
    got = plumbing(learning_store).histogram(y="episode_length", bins=30, density=True, where=small)
    lo, hi = got["lo"].to_numpy(), got["hi"].to_numpy()
    edges = lo.min() + (hi[0] - lo[0]) * np.arange(int(got["bin"].to_numpy().max()) + 2)
    ys = np.array(curve["episode_length"], float)
    sizes = [int(np.sum(np.array(curve["run_id"]) == run)) for run in sorted(set(curve["run_id"]))]
    assert min(sizes) * 5 < max(sizes)
    for run in sorted(set(curve["run_id"])):
        mine = np.array(curve["run_id"]) == run
        want, _ = np.histogram(ys[mine], edges, density=True)
        rows = got.filter(pa.compute.equal(got["run_id"], run))
        at = np.searchsorted(edges, rows["lo"].to_numpy())
        np.testing.assert_allclose(rows["density"].to_numpy(), want[at])
        assert np.sum(rows["density"].to_numpy() * (rows["hi"].to_numpy() - rows["lo"].to_numpy())) == \
            pytest.approx(1.0)


@pytest.mark.parametrize("bins", [1, 4, 60])
def test_histogram_of_returns_a_few_float_steps_apart(tmp_path: Path, bins: int) -> None:
    """Returns of ~1e17 that differ by 16 (the next double) are binned into as many bins as the floats between
    them hold, each of some width, with the counts and densities numpy gives for those edges."""
    store = write_huge_returns(tmp_path / "store")
    got = plumbing(store).histogram(bins=bins, density=True)
    lo, hi = got["lo"].to_numpy(), got["hi"].to_numpy()
    assert np.all(hi > lo) and 1 <= got.num_rows <= bins
    returns = np.array(store.curves()["episode_return"].to_pylist())
    edges = np.unique(np.concatenate([lo, hi]))
    want_counts, _ = np.histogram(returns, edges)
    want_density, _ = np.histogram(returns, edges, density=True)
    at = np.searchsorted(edges, lo)
    assert got["count"].to_pylist() == want_counts[at].tolist() and sum(want_counts) == len(returns) == 40
    np.testing.assert_allclose(got["density"].to_numpy(), want_density[at])


def test_a_bin_of_no_width_has_no_density() -> None:
    """A bin whose edges are one float (no width) gets a null density, not inf or nan (which JSON cannot carry);
    the other bins' are their count over the series' count and their width."""
    from trajstore.query.curves import with_density
    table = pa.table({"run_id": ["r"] * 3, "env_id": ["e"] * 3, "bin": [0, 1, 2], "lo": [0.0, 1.0, 1.0],
                      "hi": [1.0, 1.0, 3.0], "count": [2, 1, 1]})
    assert with_density(table)["density"].to_pylist() == [0.5, None, 0.125]


def test_binned_curves_of_an_empty_store(store: trajstore.Store) -> None:
    assert plumbing(store).binned_curves().num_rows == 0
    assert plumbing(store).histogram().num_rows == 0


@pytest.mark.parametrize(("kwargs", "message"), [
    ({"x": "steps"}, "x: must be one of env_steps, wall_time"), ({"y": "reward"}, "y: must be one of"),
    ({"bins": 0}, r"bins: must be a whole number in \[1, 100000\], got 0"),
    ({"y": "discounted_return"}, "discounted_return needs gamma")])
def test_binned_curves_refuse_bad_arguments(store: trajstore.Store, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(trajstore.InputError, match=message):
        plumbing(store).binned_curves(**kwargs)


def test_latest_stats_are_those_of_each_series_last_episodes(learning_store: trajstore.Store) -> None:
    """Against a plain reference: every complete episode, sorted per series in the order they ended."""
    episodes = learning_store.returns(gamma=0.9).to_pylist()
    discounted = {e["episode_id"]: e["discounted_return"] for e in episodes}
    rows = sorted((e for e in learning_store.episodes(complete=True).to_pylist()),
                  key=lambda e: (e["run_id"], e["env_id"], e["ended_at"], e["env_steps"], e["episode_id"]))
    for last in (1, 7, 100, 10**6):
        got = plumbing(learning_store).latest_stats(last, gamma=0.9).to_pylist()
        series = sorted({(e["run_id"], e["env_id"]) for e in rows})
        assert [(g["run_id"], g["env_id"]) for g in got] == series
        for g in got:
            mine = [e for e in rows if (e["run_id"], e["env_id"]) == (g["run_id"], g["env_id"])][-last:]
            for prefix, values in (("return", [e["episode_return"] for e in mine]),
                                   ("len", [e["episode_length"] for e in mine]),
                                   ("discounted_return", [discounted[e["episode_id"]] for e in mine])):
                assert g["n_traj"] == len(values)
                want = {"mean": np.mean(values), "std": np.std(values), "min": min(values), "max": max(values)}
                assert {k: g[f"{prefix}_{k}"] for k in want} == pytest.approx(want, rel=1e-9), (prefix, last)
    assert "discounted_return_mean" not in plumbing(learning_store).latest_stats(5).column_names
    with pytest.raises(trajstore.InputError, match="last: must be a whole number of episodes >= 1, got 0"):
        plumbing(learning_store).latest_stats(0)


def test_every_episode_sorted_without_sql_is_the_sql_walk(store: trajstore.Store) -> None:
    """The curves of every episode sort the kept episodes rows by numpy (text in byte order, null env_steps last):
    the rows and types of the SQL walk (taken when episodes are chosen)."""
    plumbing(store).ingest(ingested_rows([4, 7, 2], first_id=1), run_id="old", env_id="e")  # no env_steps
    rng = np.random.default_rng(7)
    for run in ("b", "a b", "Z", "é"):
        write(store, rng, calls=3, run_id=run)
    write(store, rng, calls=2, run_id="old")
    with engine_of(store).query_snapshot(episodes="fill") as snap:
        assert snap.materialized is not None  # the rows the fast path sorts
    fast, by_sql = store.curves(), store.curves(where="true")
    assert fast.num_rows > 20 and fast.schema == by_sql.schema
    assert fast.to_pylist() == by_sql.to_pylist()
