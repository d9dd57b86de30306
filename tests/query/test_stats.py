"""Episode statistics and the episodes listing against numpy over a reference segmentation of the same data."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import trajstore
from tests.helpers import RefEpisode, make_batch, reference_episodes, reference_return, slice_batch
from trajstore.errors import InputError
from trajstore.store import plumbing

STAT_KEYS = ["n_traj", "return_min", "return_mean", "return_std", "return_max",
             "len_min", "len_mean", "len_std", "len_max"]
DISCOUNTED_KEYS = ["discounted_return_min", "discounted_return_mean", "discounted_return_std",
                   "discounted_return_max"]
RUNS = {"a": ("CartPole-v1", 1), "b": ("CartPole-v1", 2), "c": ("Pendulum-v1", 3)}
T, B = 60, 4


@pytest.fixture(scope="module")
def written(tmp_path_factory: pytest.TempPathFactory) -> tuple[trajstore.Store, dict[str, list[RefEpisode]]]:
    """Three runs of random episodes, written in 5 batches with a flush in between, and their reference episodes."""
    store = trajstore.open(tmp_path_factory.mktemp("stats") / "store", create=True)
    ref: dict[str, list[RefEpisode]] = {}
    for run, (env, seed) in RUNS.items():
        rng = np.random.default_rng(seed)
        valid = rng.random((T, B)) < 0.9
        batch = make_batch(rng, T, B, p_terminated=0.08, p_truncated=0.03, valid=valid)
        with store.writer(run_id=run, env_id=env, seed=seed) as w:
            for start in range(0, T, 12):
                w.add_batch(slice_batch(batch, start, start + 12))
                if start == 24:
                    w.flush()
        ref[run] = reference_episodes(batch["reward"], batch["terminated"], batch["truncated"], valid)
    return store, ref


def numpy_stats(episodes: list[RefEpisode], gamma: float | None = None) -> dict[str, float]:
    """imitation's rollout_stats, re-stated: numpy over per-episode returns and lengths (std population)."""
    metrics = {"return": np.array([np.sum(np.array(e.rewards, np.float64)) for e in episodes]),
               "len": np.array([len(e.t) for e in episodes], np.float64)}
    if gamma is not None:
        metrics["discounted_return"] = np.array([reference_return(e.rewards, gamma) for e in episodes])
    out: dict[str, float] = {"n_traj": len(episodes)}
    for key, values in metrics.items():
        out.update({f"{key}_min": values.min(), f"{key}_mean": values.mean(), f"{key}_std": np.std(values),
                    f"{key}_max": values.max()})
    return out


def assert_stats(row: dict[str, Any], expected: dict[str, float]) -> None:
    assert row["n_traj"] == expected["n_traj"]
    for key, value in expected.items():
        assert row[key] == pytest.approx(value, rel=1e-9, abs=1e-9), key


def every(ref: dict[str, list[RefEpisode]], *, complete: bool | None = True) -> list[RefEpisode]:
    return [e for eps in ref.values() for e in eps if complete is None or e.complete == complete]


def test_stats_keys_and_values(written: tuple[trajstore.Store, dict[str, list[RefEpisode]]]) -> None:
    store, ref = written
    table = store.stats()
    assert table.column_names == STAT_KEYS
    assert table.num_rows == 1
    assert 10 < table["n_traj"][0].as_py() < len(every(ref, complete=None))  # the data has both kinds
    assert_stats(table.to_pylist()[0], numpy_stats(every(ref)))


@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
def test_stats_with_gamma(written: tuple[trajstore.Store, dict[str, list[RefEpisode]]], gamma: float) -> None:
    store, ref = written
    table = store.stats(gamma=gamma)
    assert table.column_names == STAT_KEYS + DISCOUNTED_KEYS
    assert_stats(table.to_pylist()[0], numpy_stats(every(ref), gamma))


def test_stats_by_run(written: tuple[trajstore.Store, dict[str, list[RefEpisode]]]) -> None:
    store, ref = written
    table = store.stats(by=["run_id"], gamma=0.99)
    assert table.column_names == ["run_id"] + STAT_KEYS + DISCOUNTED_KEYS
    rows = table.to_pylist()
    assert [r["run_id"] for r in rows] == ["a", "b", "c"]
    for r in rows:
        assert_stats(r, numpy_stats([e for e in ref[r["run_id"]] if e.complete], 0.99))
    by_env = store.stats(by="env_id").to_pylist()
    assert [(r["env_id"], r["n_traj"]) for r in by_env] == [
        ("CartPole-v1", len([e for run in "ab" for e in ref[run] if e.complete])),
        ("Pendulum-v1", len([e for e in ref["c"] if e.complete]))]
    two = store.stats(by=["env_id", "run_id"])
    assert [(r["env_id"], r["run_id"]) for r in two.to_pylist()] == [
        ("CartPole-v1", "a"), ("CartPole-v1", "b"), ("Pendulum-v1", "c")]


def test_stats_filters(written: tuple[trajstore.Store, dict[str, list[RefEpisode]]]) -> None:
    store, ref = written
    assert_stats(store.stats(run_id="b").to_pylist()[0], numpy_stats([e for e in ref["b"] if e.complete]))
    assert_stats(store.stats(run_id=["a", "c"]).to_pylist()[0],
                 numpy_stats([e for run in "ac" for e in ref[run] if e.complete]))
    assert_stats(store.stats(env_id="Pendulum-v1").to_pylist()[0],
                 numpy_stats([e for e in ref["c"] if e.complete]))
    assert_stats(store.stats(where="episode_length >= 5").to_pylist()[0],
                 numpy_stats([e for e in every(ref) if len(e.t) >= 5]))
    assert_stats(store.stats(where="seed = 2").to_pylist()[0], numpy_stats([e for e in ref["b"] if e.complete]))
    assert_stats(store.stats(where="truncated").to_pylist()[0],
                 numpy_stats([e for e in every(ref) if e.truncated[-1]]))


def test_incomplete_episodes_only_when_asked(written: tuple[trajstore.Store, dict[str, list[RefEpisode]]]) -> None:
    store, ref = written
    assert any(not e.complete for e in every(ref, complete=None))
    assert_stats(store.stats(include_incomplete=True).to_pylist()[0], numpy_stats(every(ref, complete=None)))
    assert_stats(store.stats(include_incomplete=True, where="NOT complete").to_pylist()[0],
                 numpy_stats(every(ref, complete=False)))


def test_unknown_by_column_is_refused(written: tuple[trajstore.Store, dict[str, list[RefEpisode]]]) -> None:
    store, _ = written
    with pytest.raises(InputError, match=r"by: unknown column\(s\) \['nope'\] of episodes"):
        store.stats(by=["run_id", "nope"])


def test_stats_of_an_empty_store(store: trajstore.Store) -> None:
    row = store.stats(gamma=0.9).to_pylist()[0]
    assert row["n_traj"] == 0
    assert all(row[k] is None for k in STAT_KEYS + DISCOUNTED_KEYS if k != "n_traj"), row  # no 0.0 beside nulls
    assert store.stats(by="run_id").num_rows == 0


def test_single_episode_has_zero_std(store: trajstore.Store) -> None:
    batch = make_batch(np.random.default_rng(5), 3, 1, p_terminated=0, p_truncated=0)
    batch["terminated"][-1] = True
    with store.writer(run_id="r", env_id="e") as w:
        w.add_batch(batch)
    row = store.stats().to_pylist()[0]
    assert (row["n_traj"], row["return_std"], row["len_std"], row["len_mean"]) == (1, 0.0, 0.0, 3.0)


# --- the episodes listing ----------------------------------------------------------------------------------

def test_episodes_top_returns(written: tuple[trajstore.Store, dict[str, list[RefEpisode]]]) -> None:
    store, ref = written
    table = store.episodes(complete=True, order_by="-episode_return", limit=5)
    expected = sorted((float(np.sum(np.array(e.rewards, np.float64))) for e in every(ref)), reverse=True)[:5]
    assert table["episode_return"].to_pylist() == pytest.approx(expected, rel=1e-9)
    assert table["complete"].to_pylist() == [True] * 5
    page = store.episodes(complete=True, order_by="-episode_return", limit=3, offset=2)
    assert page["episode_id"].to_pylist() == table["episode_id"].to_pylist()[2:5]


def test_episodes_columns_and_completeness(written: tuple[trajstore.Store, dict[str, list[RefEpisode]]]) -> None:
    store, ref = written
    everything = store.episodes()
    for name in ("run_id", "env_id", "episode_id", "episode_length", "episode_return", "terminated", "truncated",
                 "complete", "first_step", "last_step", "started_at", "ended_at", "env_index", "worker_id", "seed"):
        assert name in everything.column_names, name
    assert everything.num_rows == len(every(ref, complete=None))
    assert store.episodes(complete=False).num_rows == len(every(ref, complete=False))
    lengths = sorted(store.episodes(complete=True, run_id="a")["episode_length"].to_pylist())
    assert lengths == sorted(len(e.t) for e in ref["a"] if e.complete)
    ordered = store.episodes(order_by="episode_length")["episode_length"].to_pylist()
    assert ordered == sorted(ordered)
    with_gamma = store.episodes(gamma=0.5, run_id="c", complete=True)
    assert sorted(with_gamma["discounted_return"].to_pylist()) == pytest.approx(
        sorted(reference_return(e.rewards, 0.5) for e in ref["c"] if e.complete), rel=1e-9)


def test_episodes_unknown_order_by_is_refused(written: tuple[trajstore.Store, dict[str, list[RefEpisode]]]) -> None:
    store, _ = written
    with pytest.raises(InputError, match=r"order_by: unknown column\(s\) \['nope'\]"):
        store.episodes(order_by="-nope")
    with pytest.raises(InputError, match=r"order_by: unknown column\(s\) \['nope'\]"):
        store.episodes(order_by="-complete,nope")
    with pytest.raises(InputError, match="order_by: an empty column name"):
        store.episodes(order_by="-complete,")


def test_episodes_by_several_keys(written: tuple[trajstore.Store, dict[str, list[RefEpisode]]]) -> None:
    """Complete episodes first, then the latest to end, ties by episode_id: as Python sorts the same rows."""
    store, _ = written
    rows = store.episodes().to_pylist()
    assert {r["complete"] for r in rows} == {True, False}
    want = sorted(rows, key=lambda r: (not r["complete"], -r["episode_length"], r["episode_id"]))
    got = store.episodes(order_by="-complete, -episode_length")
    assert got["episode_id"].to_pylist() == [r["episode_id"] for r in want]
    page, total = plumbing(store).episode_page(order_by="-complete,-episode_length", limit=5, offset=3)
    assert page["episode_id"].to_pylist() == [r["episode_id"] for r in want[3:8]] and total == len(rows)


def test_episode_queries_follow_every_commit_and_agree_with_the_view(store: trajstore.Store) -> None:
    """The episodes view is materialized once per committed version and reused: answers must be those
    of the view itself, and a new commit must show at once."""
    rng = np.random.default_rng(11)

    def view_stats() -> dict[str, Any]:  # straight from the view, through a connection of its own
        return store.sql("SELECT count(*) FILTER (WHERE complete) AS n, sum(episode_length) AS steps, "
                         "avg(episode_return) FILTER (WHERE complete) AS mean FROM episodes").to_pylist()[0]

    for round_ in range(3):
        with store.writer(run_id=f"r{round_}", env_id="e") as w:
            w.add_batch(make_batch(rng, 30, 4))
        expected = view_stats()
        fresh = store.stats().to_pylist()[0]  # nothing materialized yet for this version: aggregated directly
        page = store.episodes(order_by="episode_id")  # materializes this version
        assert page.equals(store.sql("SELECT * FROM episodes ORDER BY episode_id"))
        cached = store.stats().to_pylist()[0]
        assert fresh["n_traj"] == cached["n_traj"] == expected["n"]
        assert cached["return_mean"] == pytest.approx(fresh["return_mean"], rel=1e-12)
        assert cached["return_mean"] == pytest.approx(expected["mean"], rel=1e-12)
        runs = store.runs().to_pylist()
        assert [r["run_id"] for r in runs] == [f"r{i}" for i in range(round_ + 1)]
        assert sum(r["steps"] for r in runs) == expected["steps"] == 30 * 4 * (round_ + 1)
