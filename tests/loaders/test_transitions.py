"""Store.transitions: every n-step transition exactly as a plain python loop computes it (reward sums, next_obs,
terminated vs truncated ends, discount), shuffled, sharded, resumed, and bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.errors import InputError

pytestmark = pytest.mark.usefixtures("both_layouts")


@pytest.fixture
def filled(store: trajstore.Store) -> trajstore.Store:
    rng = np.random.default_rng(11)
    with store.writer(run_id="a", env_id="E") as w:
        for _ in range(2):
            w.add_batch(make_batch(rng, 40, 4, p_terminated=0.08, p_truncated=0.05))
            w.flush()  # the last steps of some episodes stay unfinished
    return store


def reference(store: trajstore.Store, n: int, gamma: float) -> list[dict[str, Any]]:
    rows = store.sql("SELECT episode_id, step, obs, action, reward, next_obs, terminated FROM steps "
                     "ORDER BY episode_id, step").to_pylist()
    by_episode: dict[int, list[dict[str, Any]]] = {}
    for r in rows:
        by_episode.setdefault(r["episode_id"], []).append(r)
    out = []
    for e in sorted(by_episode):
        steps = by_episode[e]
        for t in range(len(steps)):
            m = min(n, len(steps) - t)
            reward = sum(gamma ** k * steps[t + k]["reward"] for k in range(m))
            terminated = any(steps[t + k]["terminated"] for k in range(m))
            out.append({"episode_id": e, "step": t, "obs": steps[t]["obs"], "action": steps[t]["action"],
                        "reward": reward, "next_obs": steps[t + m - 1]["next_obs"], "terminated": terminated,
                        "discount": 0.0 if terminated else gamma ** m})
    return out


def rows(batches: Any) -> list[dict[str, Any]]:
    return [{k: v[i] for k, v in b.items()} for b in batches for i in range(len(b["step"]))]


@pytest.mark.parametrize("n,gamma", [(1, 0.99), (3, 0.9), (5, 1.0), (4, 0.0)])
def test_every_transition_as_the_reference(filled: trajstore.Store, n: int, gamma: float) -> None:
    ref = reference(filled, n, gamma)
    got = rows(filled.transitions(n, gamma=gamma, batch_size=13))
    assert len(got) == len(ref) == filled.sql("SELECT count(*) AS c FROM steps")["c"][0].as_py()
    assert any(r["terminated"] for r in ref) and not all(r["terminated"] for r in ref)
    for g, r in zip(got, ref):
        assert (int(g["episode_id"]), int(g["step"])) == (r["episode_id"], r["step"])
        np.testing.assert_array_equal(g["obs"], r["obs"])
        np.testing.assert_array_equal(g["next_obs"], r["next_obs"])
        assert g["action"] == r["action"] and bool(g["terminated"]) == r["terminated"]
        assert g["reward"] == pytest.approx(r["reward"], rel=1e-6, abs=1e-6)
        assert g["discount"] == pytest.approx(r["discount"], rel=1e-6, abs=1e-12)


def test_a_truncated_end_bootstraps_and_a_terminated_one_does_not(store: trajstore.Store) -> None:
    batch = {"obs": np.zeros((3, 2, 1), np.float32), "action": np.zeros((3, 2), np.int64),
             "reward": np.ones((3, 2), np.float32), "next_obs": np.arange(6, dtype=np.float32).reshape(3, 2, 1),
             "terminated": np.array([[0, 0], [0, 0], [1, 0]], bool),
             "truncated": np.array([[0, 0], [0, 0], [0, 1]], bool)}
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch(batch)
    got = rows(store.transitions(2, gamma=0.5))
    last = {int(g["episode_id"]): g for g in got if g["step"] == 2}
    (term, trunc) = sorted(last.values(), key=lambda g: not g["terminated"])
    assert term["terminated"] and term["discount"] == 0.0 and term["reward"] == 1.0
    assert not trunc["terminated"] and trunc["discount"] == 0.5 and trunc["reward"] == 1.0
    first = [g for g in got if g["step"] == 0]
    assert all(g["reward"] == 1.5 and g["discount"] == 0.25 for g in first)


def test_shuffle_shards_and_resume(filled: trajstore.Store) -> None:
    plain = [(int(g["episode_id"]), int(g["step"])) for g in rows(filled.transitions(2, gamma=0.9))]
    shards = [[(int(g["episode_id"]), int(g["step"])) for g in
               rows(filled.transitions(2, gamma=0.9, shuffle=True, seed=4, rank=r, world_size=3, batch_size=10))]
              for r in range(3)]
    assert sorted(k for s in shards for k in s) == sorted(plain)
    assert max(map(len, shards)) - min(map(len, shards)) <= 1
    it = filled.transitions(2, gamma=0.9, shuffle=True, seed=4, batch_size=10)
    head = [next(it) for _ in range(2)]
    rest = list(filled.transitions(2, gamma=0.9, shuffle=True, seed=4, batch_size=10, resume=it.state_dict()))
    full = list(filled.transitions(2, gamma=0.9, shuffle=True, seed=4, batch_size=10))
    np.testing.assert_array_equal(np.concatenate([b["obs"] for b in head + rest]),
                                  np.concatenate([b["obs"] for b in full]))
    with pytest.raises(InputError, match="resume: the state was made with other arguments"):
        filled.transitions(3, gamma=0.9, shuffle=True, seed=4, resume=it.state_dict())


def test_columns_at_t_and_weighted_draws(filled: trajstore.Store) -> None:
    batch = next(filled.transitions(2, gamma=0.9, columns=["obs", "truncated"], batch_size=4))
    assert list(batch) == ["obs", "truncated", "reward", "next_obs", "terminated", "discount", "episode_id", "step"]
    drawn = rows(filled.transitions(1, gamma=0.9, weight_by="action", num_samples=200, batch_size=64))
    assert len(drawn) == 200 and all(g["action"] > 0 for g in drawn)


@pytest.mark.parametrize("kwargs,match", [
    ({"n": 0, "gamma": 0.9}, "n: must be an integer >= 1, got 0"),
    ({"n": 2, "gamma": 2.0}, r"gamma must be in \[0, 1\], got 2.0"),
    ({"n": 2, "gamma": 0.9, "rank": 1}, r"rank: must be in \[0, world_size\)"),
    ({"n": 2, "gamma": 0.9, "columns": ["obz"]}, r"columns: unknown column\(s\) \['obz'\]"),
    ({"n": 2, "gamma": 0.9, "columns": ["return_to_go"]}, "columns: 'return_to_go' is a column of"),
])
def test_bad_input_names_the_argument(filled: trajstore.Store, kwargs: dict[str, Any], match: str) -> None:
    kwargs = dict(kwargs)  # the parameter is shared by each layout's run of the test
    n = kwargs.pop("n")
    with pytest.raises(InputError, match=match):
        filled.transitions(n, **kwargs)
