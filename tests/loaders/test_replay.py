"""Store.replay: prioritized replay (Schaul et al.; TorchRL's definitions) over steps, windows and n-step transitions.

Every sampled item is the item the matching loader gives (store.sequences, store.transitions, the steps as SQL reads
them); probabilities and weights are the definitions computed in numpy over every item; a million draws follow them
(chi-square) before and after updates, after new commits arrive and while a capacity evicts; updates that are not
priorities are refused by name, changing nothing."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from scipy import stats

import trajstore
from tests.helpers import make_batch
from trajstore.errors import EmptyReplayError, InputError, ReplayClosedError
from trajstore.loaders import replay_items, sumtree
from trajstore.loaders.assemble import Loading
from trajstore.loaders.replay import Replay

DRAWS = 1 << 20  # draws per chi-square test (at least 10^6)


def write(store: trajstore.Store, seed: int, *, T: int = 40, B: int = 4, run_id: str = "a") -> None:
    rng = np.random.default_rng(seed)
    with store.writer(run_id=run_id, env_id="E") as w:
        w.add_batch(make_batch(rng, T, B, obs_dim=4, p_terminated=0.06, p_truncated=0.03))


@pytest.fixture(params=["kernels", "numpy"])
def ways(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test twice: by the compiled kernels, and by numpy, as a process makes its first items and batches while
    numba loads them."""
    if request.param == "numpy":
        def unavailable() -> None:
            raise RuntimeError("no kernels in this test")

        for module in (sumtree, replay_items):
            kernels = Loading(unavailable, "none in this test")
            kernels.usable()
            monkeypatch.setattr(module, "KERNELS", kernels)
    return str(request.param)


@pytest.fixture
def filled(store: trajstore.Store) -> trajstore.Store:
    write(store, 0)
    return store


def draws(replay: Replay, total: int = DRAWS, batch: int = 1 << 13) -> np.ndarray:
    """How often each handle came up in ``total`` draws."""
    counts = np.zeros(0, np.int64)
    for _ in range(total // batch):
        got = np.bincount(replay.sample(batch)["index"])
        counts = np.pad(counts, (0, max(0, len(got) - len(counts))))
        counts[:len(got)] += got
    return counts


def reference(priority: np.ndarray, alpha: float, beta: float, eps: float) -> tuple[np.ndarray, np.ndarray]:
    """P(i) = p_i^a / sum p^a with p = priority + eps; w_i = (N P(i))^-b / max_j (N P(j))^-b (NaN: no item)."""
    live = ~np.isnan(priority)
    p = np.where(live, priority + eps, 0.0) ** alpha * live
    prob = p / p.sum()
    n = live.sum()
    w = np.where(live, (n * np.where(live, prob, 1.0)) ** -beta, 0.0)
    return prob, w / w[live].max()


def chi_square(counts: np.ndarray, prob: np.ndarray) -> float:
    live = prob > 0
    counts = np.pad(counts, (0, max(0, len(prob) - len(counts))))
    assert counts[~live].sum() == 0, "an item that is not there was drawn"
    return float(stats.chisquare(counts[live], prob[live] * counts.sum()).pvalue)


@pytest.mark.usefixtures("both_layouts")
def test_steps_are_the_stored_steps(filled: trajstore.Store) -> None:
    rows = {(r["episode_id"], r["step"]): r for r in filled.sql(
        "SELECT episode_id, step, obs, action, reward, next_obs, terminated, truncated FROM steps").to_pylist()}
    with filled.replay(priorities=None) as replay:
        assert len(replay) == len(rows)
        batch = replay.sample(500)
    assert set(batch) >= {"obs", "action", "reward", "next_obs", "terminated", "truncated", "index", "episode_id",
                          "start", "probability", "weight"}
    for i in range(500):
        want = rows[(int(batch["episode_id"][i]), int(batch["start"][i]))]
        np.testing.assert_array_equal(batch["obs"][i], want["obs"])
        np.testing.assert_array_equal(batch["next_obs"][i], want["next_obs"])
        assert (batch["action"][i], batch["reward"][i], batch["terminated"][i]) == \
            (want["action"], np.float32(want["reward"]), want["terminated"])


@pytest.mark.usefixtures("both_layouts")
@pytest.mark.parametrize("pad", [False, True])
def test_windows_are_the_loaders_windows(filled: trajstore.Store, pad: bool) -> None:
    loader = {}
    for b in filled.sequences(6, stride=2, pad=pad, gamma=0.9, columns=["obs", "reward", "return_to_go"]):
        for i in range(len(b["start"])):
            loader[(int(b["episode_id"][i]), int(b["start"][i]))] = {k: v[i] for k, v in b.items()}
    with filled.replay(["obs", "reward", "return_to_go"], length=6, stride=2, pad=pad, gamma=0.9,
                       priorities=None) as replay:
        assert len(replay) == len(loader)
        batch = replay.sample(300)
    for i in range(300):
        want = loader[(int(batch["episode_id"][i]), int(batch["start"][i]))]
        for name in ("obs", "reward", "return_to_go", "mask"):
            np.testing.assert_array_equal(batch[name][i], want[name])


@pytest.mark.usefixtures("both_layouts")
def test_transitions_are_the_loaders_transitions(filled: trajstore.Store) -> None:
    loader = {}
    for b in filled.transitions(3, gamma=0.9):
        for i in range(len(b["step"])):
            loader[(int(b["episode_id"][i]), int(b["step"][i]))] = {k: v[i] for k, v in b.items()}
    with filled.replay(n=3, gamma=0.9, priorities=None) as replay:
        assert len(replay) == len(loader)
        batch = replay.sample(300)
    assert np.array_equal(batch["start"], batch["step"])
    for i in range(300):
        want = loader[(int(batch["episode_id"][i]), int(batch["start"][i]))]
        for name in ("obs", "action", "reward", "next_obs", "terminated", "discount"):
            np.testing.assert_array_equal(batch[name][i], want[name])


@pytest.mark.usefixtures("ways")
def test_probabilities_and_weights_are_the_definitions(filled: trajstore.Store) -> None:
    alpha, beta, eps = 0.7, 0.5, 1e-3
    with filled.replay(n=2, gamma=0.99, alpha=alpha, beta=beta, eps=eps, priorities=None, seed=3) as replay:
        n = len(replay)
        priority = np.full(n, 1.0)  # never given: the largest given so far, 1.0 before any
        batch = replay.sample(64)
        prob, weight = reference(priority, alpha, beta, eps)
        np.testing.assert_allclose(batch["probability"], prob[batch["index"]], rtol=1e-12)
        np.testing.assert_allclose(batch["weight"], weight[batch["index"]], rtol=1e-6)
        rng = np.random.default_rng(0)
        for _ in range(20):
            index = rng.integers(0, n, 50)
            given = rng.exponential(1.0, 50) * (rng.random(50) < 0.9)  # some zeros
            replay.update(index, given)
            for i, g in zip(index, given):  # a handle given twice keeps its last
                priority[i] = g
        batch = replay.sample(4096)
        prob, weight = reference(priority, alpha, beta, eps)
        np.testing.assert_allclose(batch["probability"], prob[batch["index"]], rtol=1e-9)
        np.testing.assert_allclose(batch["weight"], weight[batch["index"]], rtol=1e-6)
        assert chi_square(draws(replay), prob) > 1e-3


def test_a_million_draws_follow_the_priorities_before_and_after_updates(filled: trajstore.Store) -> None:
    with filled.replay(priorities=None, seed=1) as replay:
        n = len(replay)
        assert chi_square(draws(replay), np.full(n, 1.0 / n)) > 1e-3  # before any: all alike
        rng = np.random.default_rng(1)
        priority = rng.pareto(1.5, n)
        replay.update(np.arange(n), priority)
        prob, _ = reference(priority, 0.6, 0.4, 1e-6)
        assert chi_square(draws(replay), prob) > 1e-3


def test_alpha_zero_is_uniform(filled: trajstore.Store) -> None:
    with filled.replay(alpha=0.0, priorities=None) as replay:
        replay.update(np.arange(10), np.arange(10.0) * 100)
        batch = replay.sample(100)
        assert np.all(batch["probability"] == 1.0 / len(replay)) and np.all(batch["weight"] == 1.0)


def test_new_items_take_the_largest_priority_given_so_far(store: trajstore.Store) -> None:
    write(store, 0, T=10, B=2)
    with store.replay(priorities=None, follow=True, poll=0.0, alpha=1.0, eps=1e-9) as replay:
        n = len(replay)
        replay.update(np.arange(n), np.full(n, 0.25))
        replay.update([0], [7.0])
        replay.update([0], [0.5])  # 7.0 stays the largest given
        write(store, 1, T=10, B=2)
        batch = replay.sample(1000)
        added = batch["index"] >= n
        assert added.any() and len(replay) == 2 * n
        p = np.where(added, 7.0, np.where(batch["index"] == 0, 0.5, 0.25)) + 1e-9
        total = (n - 1) * (0.25 + 1e-9) + (0.5 + 1e-9) + n * (7.0 + 1e-9)
        np.testing.assert_allclose(batch["probability"], p / total, rtol=1e-9)


@pytest.mark.usefixtures("ways")
def test_new_commits_bring_new_items_and_the_draws_follow(store: trajstore.Store) -> None:
    write(store, 0, T=30, B=3)
    with store.replay(n=3, gamma=0.9, follow=True, poll=0.0, priorities=None, seed=2) as replay:
        before = len(replay)
        rng = np.random.default_rng(2)
        replay.update(np.arange(before), rng.exponential(1.0, before))
        given = replay._tree.leaves(np.arange(before)).copy()
        write(store, 1, T=30, B=3)
        assert len(replay) == before + 90
        weights = np.concatenate([given, replay._tree.leaves(np.arange(before, before + 90))])
        # the new items have the largest priority given so far
        np.testing.assert_allclose(weights[before:], weights[:before].max())
        assert chi_square(draws(replay), weights / weights.sum()) > 1e-3
        steps = {(r["episode_id"], r["step"]) for r in store.sql("SELECT episode_id, step FROM steps").to_pylist()}
        batch = replay.sample(2000)
        assert {(int(e), int(s)) for e, s in zip(batch["episode_id"], batch["start"])} <= steps


def test_a_running_episode_grows_in_place(store: trajstore.Store) -> None:
    """An n-step transition near the end of an episode still running is drawn with the steps there are: the same
    handle, more steps once they are committed."""
    batch = {"obs": np.arange(6, dtype=np.float32).reshape(6, 1, 1), "action": np.zeros((6, 1), np.int64),
             "reward": np.ones((6, 1), np.float32), "next_obs": np.arange(1, 7, dtype=np.float32).reshape(6, 1, 1),
             "terminated": np.zeros((6, 1), bool), "truncated": np.zeros((6, 1), bool)}
    with store.writer(run_id="live", env_id="E") as w:
        w.add_batch({k: v[:3] for k, v in batch.items()})
        w.flush()
        with store.replay(n=3, gamma=0.5, follow=True, poll=0.0, alpha=0.0, priorities=None) as replay:
            assert len(replay) == 3
            replay.update([2], [1.0])
            last = [b for b in (replay.sample(64) for _ in range(4)) if (b["start"] == 2).any()][0]
            assert last["reward"][last["start"] == 2][0] == 1.0  # one step so far
            w.add_batch({k: v[3:] for k, v in batch.items()})
            w.flush()
            assert len(replay) == 6
            found = [b for b in (replay.sample(64) for _ in range(8)) if (b["start"] == 2).any()][0]
            at = found["start"] == 2
            assert found["index"][at][0] == 2 and found["reward"][at][0] == 1.75  # 1 + 0.5 + 0.25


@pytest.mark.usefixtures("ways")
def test_capacity_keeps_the_newest_items(store: trajstore.Store) -> None:
    write(store, 0, T=20, B=2)
    first = {(r["episode_id"], r["step"]) for r in store.sql("SELECT episode_id, step FROM steps").to_pylist()}
    with store.replay(capacity=60, follow=True, poll=0.0, priorities=None, seed=4) as replay:
        assert len(replay) == 40
        replay.update(np.arange(40), np.arange(1.0, 41.0))
        write(store, 1, T=20, B=2)  # 40 more: the 20 oldest go
        assert len(replay) == 60
        batch = replay.sample(5000)
        assert batch["index"].min() >= 20
        kept_first = {(int(e), int(s)) for e, s, i in zip(batch["episode_id"], batch["start"], batch["index"])
                      if i < 40}
        assert kept_first <= first
        # the updates of items gone change nothing; the others are kept
        replay.update(np.arange(0, 20), np.full(20, 1e6))
        weights = replay._tree.leaves(np.arange(60))
        prob = weights / weights.sum()
        slots = np.arange(80) % 60
        by_handle = prob[slots[20:]]
        counts = draws(replay)[20:]
        assert chi_square(counts, by_handle) > 1e-3


def test_capacity_first_in_first_out_by_last_write(store: trajstore.Store) -> None:
    write(store, 0, T=10, B=2, run_id="old")
    write(store, 1, T=10, B=2, run_id="new")
    newest = {r["episode_id"] for r in store.sql("SELECT episode_id FROM steps WHERE run_id = 'new'").to_pylist()}
    with store.replay(capacity=20, priorities=None) as replay:
        batch = replay.sample(2000)
    assert {int(e) for e in batch["episode_id"]} == newest


def test_bad_updates_are_refused_by_name_and_change_nothing(filled: trajstore.Store) -> None:
    with filled.replay(priorities=None) as replay:
        n = len(replay)
        before = replay._tree.leaves(np.arange(n)).copy()
        for index, priority, field in [([0, 1], [1.0, np.nan], "priority"), ([0, 1], [1.0, -0.5], "priority"),
                                       ([0], [np.inf], "priority"), ([0, 1], [1.0], "priority"),
                                       ([0, n], [1.0, 1.0], "index"), ([-1], [1.0], "index"),
                                       ([[0, 1]], [1.0, 2.0], "index"), (["a"], [1.0], "index"),
                                       ([0.5], [1.0], "index"), ([0], ["high"], "priority"),
                                       ([0, 1], [[1.0, 2.0]], "priority")]:
            with pytest.raises(InputError, match=f"^{field}:"):
                replay.update(index, priority)
        assert np.array_equal(replay._tree.leaves(np.arange(n)), before) and replay.pending == 0
        replay.update([0, 1], 2.0)  # one priority for all
        assert replay._tree.leaves(np.array([0, 1])).tolist() == [(2.0 + 1e-6) ** 0.6] * 2


@pytest.mark.parametrize("kwargs,field", [({"length": 4, "n": 2, "gamma": 0.9}, "n"), ({"n": 2}, "gamma"),
                                          ({"gamma": 0.9}, "gamma"), ({"stride": 2}, "stride"),
                                          ({"alpha": -1.0}, "alpha"), ({"beta": float("nan")}, "beta"),
                                          ({"eps": 0.0}, "eps"), ({"capacity": 0}, "capacity"),
                                          ({"priorities": "a b"}, "priorities"), ({"seed": -1}, "seed"),
                                          ({"length": 0}, "length"), ({"commit_interval": "0s"}, "commit_interval"),
                                          ({"commit_updates": 0}, "commit_updates"),
                                          ({"columns": ["nope"]}, "columns")])
def test_bad_arguments_are_refused_by_name(filled: trajstore.Store, kwargs: dict[str, Any], field: str) -> None:
    with pytest.raises(InputError, match=f"^{field}"):
        filled.replay(**kwargs).close()


def test_an_empty_or_closed_replay_says_so(store: trajstore.Store) -> None:
    write(store, 0, T=3, B=1)
    with pytest.raises(InputError, match="^length: 50 steps is longer"):
        store.replay(length=50)
    with store.replay(priorities=None, where="episode_length > 100") as empty:
        assert len(empty) == 0
        with pytest.raises(EmptyReplayError, match="no items"):
            empty.sample(1)
    closed = store.replay(priorities=None)
    closed.close()
    closed.close()
    with pytest.raises(ReplayClosedError):
        closed.sample(1)


def test_multi_agent_items_are_each_agents_own(tmp_path: Any) -> None:
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    from trajstore.rollout import parallel_rollout

    store = trajstore.open(tmp_path / "store", create=True)
    parallel_rollout(store, lambda: simple_spread_v3.parallel_env(max_cycles=8), run_id="spread", episodes=2,
                     steps=2 * 3 * 8, seed=1, progress=False)
    agents = ["agent_0", "agent_2"]
    loader = {}
    for b in store.transitions(2, gamma=0.9, agent_id=agents):
        for i in range(len(b["step"])):
            loader[(int(b["episode_id"][i]), str(b["agent_id"][i]), int(b["step"][i]))] = b["obs"][i]
    with store.replay(n=2, gamma=0.9, agent_id=agents, priorities="agents") as replay:
        assert len(replay) == len(loader)
        batch = replay.sample(200)
        for e, a, s, obs in zip(batch["episode_id"], batch["agent_id"], batch["start"], batch["obs"]):
            np.testing.assert_array_equal(obs, loader[(int(e), str(a), int(s))])
        given = np.unique(batch["index"])[:5]
        replay.update(given, np.arange(5.0) + 10)
        replay.commit()
    rows = store.sql("SELECT agent_id, priority FROM priorities WHERE replay = 'agents' ORDER BY priority").to_pylist()
    assert {r["agent_id"] for r in rows} <= set(agents) and [r["priority"] for r in rows] == [10, 11, 12, 13, 14]
    with store.replay(n=2, gamma=0.9, agent_id=agents, priorities="agents", alpha=1.0, eps=1e-9) as again:
        # the stored ones kept, the others the largest stored (14)
        total = sum(r["priority"] + 1e-9 for r in rows) + (len(again) - 5) * (14.0 + 1e-9)
        probabilities = set(np.round(again.sample(4000)["probability"] * total, 6).tolist())
        assert probabilities <= {10.0, 11.0, 12.0, 13.0, 14.0}
