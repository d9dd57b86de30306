"""Discounted returns and per-step return-to-go against a plain float64 reference loop."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch, reference_return
from trajstore import discounted_sum
from trajstore.errors import InputError

GAMMAS = [0.0, 0.5, 0.9, 0.99, 0.999, 1.0]
LENGTHS = [1, 2, 100, 10_000, 100_000]
CHUNK = 10_000
RTOL = 1e-5


def reference_return_to_go(rewards: np.ndarray, gamma: float) -> np.ndarray:
    out = np.empty(len(rewards))
    g = 0.0
    for t in range(len(rewards) - 1, -1, -1):
        g = float(rewards[t]) + gamma * g
        out[t] = g
    return out


def max_rel_err(got: np.ndarray, ref: np.ndarray) -> float:
    return float(np.max(np.abs(np.asarray(got) - ref) / np.abs(ref)))


def _episode_batch(rewards: np.ndarray, last: bool) -> dict[str, Any]:
    T = len(rewards)
    terminated = np.zeros((T, 1), bool)
    terminated[-1, 0] = last
    return {"obs": np.zeros((T, 1, 1), np.float32), "action": np.zeros((T, 1), np.int64),
            "reward": rewards[:, None], "next_obs": np.zeros((T, 1, 1), np.float32),
            "terminated": terminated, "truncated": np.zeros((T, 1), bool)}


@pytest.fixture(scope="module")
def long_store(tmp_path_factory: pytest.TempPathFactory) -> tuple[trajstore.Store, dict[int, np.ndarray]]:
    """One env, episodes of 1, 2, 100, 10k and 100k steps, written in (T, 1) chunks of at most 10k steps."""
    rng = np.random.default_rng(0)
    store = trajstore.open(tmp_path_factory.mktemp("returns") / "store", create=True)
    episodes = {n: rng.uniform(0.1, 1.0, n).astype(np.float32) for n in LENGTHS}
    with store.writer(run_id="r", env_id="e") as w:
        for n, rewards in episodes.items():
            for start in range(0, n, CHUNK):
                w.add_batch(_episode_batch(rewards[start:start + CHUNK], last=start + CHUNK >= n))
    return store, episodes


def test_long_episode_is_stored_whole(long_store: tuple[trajstore.Store, dict[int, np.ndarray]]) -> None:
    store, episodes = long_store
    eps = store.episodes(complete=True).to_pylist()
    assert sorted(e["episode_length"] for e in eps) == LENGTHS
    assert all(e["first_step"] == 0 and e["last_step"] == e["episode_length"] - 1 for e in eps)


@pytest.mark.parametrize("gamma", GAMMAS)
def test_discounted_return_per_episode(long_store: tuple[trajstore.Store, dict[int, np.ndarray]],
                                       gamma: float) -> None:
    store, episodes = long_store
    got = {r["episode_length"]: r for r in store.returns(gamma=gamma).to_pylist()}
    assert sorted(got) == LENGTHS
    for n, rewards in episodes.items():
        ref = reference_return(rewards, gamma)
        assert abs(got[n]["discounted_return"] - ref) <= RTOL * abs(ref), (n, got[n]["discounted_return"], ref)
        assert got[n]["episode_return"] == pytest.approx(float(rewards.astype(np.float64).sum()), rel=1e-9)
        assert got[n]["complete"] is True


@pytest.mark.parametrize("gamma", GAMMAS)
def test_return_to_go_per_step(long_store: tuple[trajstore.Store, dict[int, np.ndarray]], gamma: float) -> None:
    store, episodes = long_store
    table = store.returns(gamma=gamma, per="step")
    assert table.column_names == ["run_id", "env_id", "episode_id", "step", "reward", "return_to_go"]
    assert table.num_rows == sum(LENGTHS)
    ids = table["episode_id"].to_numpy()
    steps = table["step"].to_numpy()
    g = table["return_to_go"].to_numpy()
    bounds = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1], True])
    by_length = {}
    for a, b in zip(bounds[:-1], bounds[1:]):
        np.testing.assert_array_equal(steps[a:b], np.arange(b - a))  # sorted by (episode, step)
        by_length[b - a] = g[a:b]
    assert sorted(by_length) == LENGTHS
    for n, rewards in episodes.items():
        assert max_rel_err(by_length[n], reference_return_to_go(rewards, gamma)) <= RTOL, n


@pytest.mark.parametrize("gamma", [0.0, 0.9, 0.99, 1.0])
def test_return_to_go_of_episodes_split_over_files_and_envs(store: trajstore.Store, gamma: float) -> None:
    rng = np.random.default_rng(1)
    T, B = 50, 3
    rewards = rng.uniform(0.5, 2.0, (T, B)).astype(np.float32)
    terminated = rng.random((T, B)) < 0.1
    with store.writer(run_id="r", env_id="e", flush_bytes=1) as w:  # a commit per chunk
        for start in range(0, T, 7):
            sl = slice(start, start + 7)
            batch = _episode_batch(rewards[sl, 0], last=False)
            batch = {k: np.repeat(v, B, axis=1) for k, v in batch.items()}
            batch["reward"], batch["terminated"] = rewards[sl], terminated[sl]
            w.add_batch(batch)
    assert len(store.maintain.files()) > 1
    table = store.returns(gamma=gamma, per="step")
    got = {(i, s): g for i, s, g in zip(table["episode_id"].to_pylist(), table["step"].to_pylist(),
                                         table["return_to_go"].to_pylist())}
    eps = store.sql("SELECT episode_id, env_index, min(step) AS s FROM steps GROUP BY ALL").to_pylist()
    assert len(got) == T * B
    rows = store.sql("SELECT episode_id, step, reward FROM steps ORDER BY episode_id, step").to_pylist()
    per_episode: dict[int, list[float]] = {}
    for r in rows:
        per_episode.setdefault(r["episode_id"], []).append(r["reward"])
    assert len(per_episode) == len(eps)
    for eid, rs in per_episode.items():
        ref = reference_return_to_go(np.array(rs), gamma)
        assert max_rel_err(np.array([got[(eid, s)] for s in range(len(rs))]), ref) <= RTOL
    # as many episodes as the done mask gives: one per done, plus one still running per env not ending at T-1
    assert len(eps) == sum(int(terminated[:, b].sum()) + (0 if terminated[-1, b] else 1) for b in range(B))


def test_a_limit_gives_the_first_rows_of_the_whole_answer(store: trajstore.Store) -> None:
    rng = np.random.default_rng(7)
    with store.writer(run_id="r", env_id="e", flush_bytes=1) as w:
        for _ in range(4):
            w.add_batch(make_batch(rng, 30, 3, p_terminated=0.15, p_truncated=0.05))
    whole = store.returns(gamma=0.9, per="step")
    lengths = store.sql("SELECT episode_length FROM episodes ORDER BY episode_id")["episode_length"].to_numpy()
    ends = np.cumsum(lengths)
    for limit in [0, 1, int(ends[0]), int(ends[0]) + 1, int(ends[3]) - 1, whole.num_rows, whole.num_rows + 5]:
        assert store.returns(gamma=0.9, per="step", limit=limit).equals(whole.slice(0, limit)), limit
    where = "reward > 0"  # a condition on steps: the cut counts only the steps it keeps
    kept = store.returns(gamma=0.9, per="step", where=where)
    assert store.returns(gamma=0.9, per="step", where=where, limit=50).equals(kept.slice(0, 50))
    per_episode = store.returns(gamma=0.9)
    assert store.returns(gamma=0.9, limit=3).equals(per_episode.slice(0, 3))
    with pytest.raises(InputError, match="limit"):
        store.returns(gamma=0.9, limit=-1)


def test_discounted_return_with_mixed_sign_rewards(store: trajstore.Store) -> None:
    rng = np.random.default_rng(2)
    rewards = rng.standard_normal(5_000).astype(np.float32)
    with store.writer(run_id="r", env_id="e") as w:
        w.add_batch(_episode_batch(rewards, last=True))
    for gamma in GAMMAS:
        got = store.returns(gamma=gamma)["discounted_return"].to_pylist()
        scale = sum(abs(float(r)) * gamma ** t for t, r in enumerate(rewards))
        assert abs(got[0] - reference_return(rewards, gamma)) <= RTOL * scale


def test_returns_filters_and_incomplete_episodes(store: trajstore.Store) -> None:
    with store.writer(run_id="a", env_id="e") as w:
        w.add_batch(_episode_batch(np.array([1, 2, 3], np.float32), last=True))
        w.add_batch(_episode_batch(np.array([4, 5], np.float32), last=False))  # still running
    with store.writer(run_id="b", env_id="e") as w:
        w.add_batch(_episode_batch(np.array([10], np.float32), last=True))
    got = store.returns(gamma=0.5, run_id="a").to_pylist()
    assert sorted((r["discounted_return"], r["complete"]) for r in got) == [(1 + 1 + 0.75, True), (4 + 2.5, False)]
    only_b = store.returns(gamma=0.5, per="step", run_id="b")
    assert only_b["return_to_go"].to_pylist() == [10.0]
    first = min(got, key=lambda r: r["episode_id"])["episode_id"]
    steps = store.returns(gamma=0.5, per="step", episode_id=first)
    assert steps["return_to_go"].to_pylist() == [2.75, 3.5, 3.0]
    assert store.returns(gamma=0.5, where="episode_length > 2").num_rows == 1


@pytest.mark.parametrize("n", [0, 1, 2, 100, 10_000, 100_000])
def test_discounted_sum(n: int) -> None:
    rewards = np.random.default_rng(n).uniform(0.1, 1.0, n)
    for gamma in GAMMAS:
        ref = reference_return(rewards, gamma)
        got = discounted_sum(rewards, gamma)
        assert isinstance(got, float)
        assert abs(got - ref) <= RTOL * abs(ref) if n else got == 0.0
    assert discounted_sum([1.0, 1.0, 1.0], 0.5) == 1.75


@pytest.mark.parametrize("gamma", [-0.1, 1.5, 2, float("nan"), float("inf")])
def test_gamma_outside_unit_interval_is_refused(store: trajstore.Store, gamma: float) -> None:
    match = r"gamma must be in \[0, 1\], got "
    with pytest.raises(InputError, match=match):
        store.returns(gamma=gamma)
    with pytest.raises(InputError, match=match):
        store.returns(gamma=gamma, per="step")
    with pytest.raises(InputError, match=match):
        store.stats(gamma=gamma)
    with pytest.raises(InputError, match=match):
        store.episodes(gamma=gamma)
    with pytest.raises(InputError, match=match):
        discounted_sum([1.0], gamma)


def test_gamma_not_a_number_and_bad_per_are_refused(store: trajstore.Store) -> None:
    with pytest.raises(InputError, match=r"gamma must be a number in \[0, 1\], got 'high'"):
        store.returns(gamma="high")  # type: ignore[arg-type]
    with pytest.raises(InputError, match=r"per: must be 'episode' or 'step', got 'env'"):
        store.returns(gamma=0.9, per="env")  # type: ignore[arg-type]
