"""Segmentation: the vectorised cut against plain reference loops, alone and end to end through the store."""

from __future__ import annotations

import itertools
import tempfile
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import trajstore
from tests.helpers import RefEpisode, make_batch, reference_episodes, slice_batch
from trajstore.errors import InputError
from trajstore.write.segment import Cursors, segment, segment_reference


def counter() -> Any:
    """An allocator handing out 0, 1, 2, … so two segmentations can be compared id for id."""
    it = itertools.count()
    return lambda n: np.array([next(it) for _ in range(n)], np.int64)


@st.composite
def streams(draw: Any, max_t: int = 30, max_b: int = 4) -> dict[str, Any]:
    """A (T, B) stream: terminated, truncated and valid masks drawn separately, and cut points into batches."""
    T = draw(st.integers(1, max_t))
    B = draw(st.integers(1, max_b))
    masks = {name: draw(hnp.arrays(bool, (T, B), elements=st.booleans() if name != "valid" else
                                   st.sampled_from([True, True, True, False])))
             for name in ("terminated", "truncated", "valid")}
    # sparse dones most of the time, so that many episodes span batches
    for name in ("terminated", "truncated"):
        if draw(st.booleans()):
            masks[name] &= draw(hnp.arrays(bool, (T, B), elements=st.sampled_from([False] * 5 + [True])))
    cuts = sorted(draw(st.lists(st.integers(0, T), max_size=6)))
    masks["bounds"] = [0, *cuts, T]
    return masks


def batches(bounds: list[int]) -> list[tuple[int, int]]:
    return list(zip(bounds[:-1], bounds[1:]))


def episodes_from_segments(pieces: list[tuple[int, int, Any]], B: int) -> dict[int, list[dict[str, list[int]]]]:
    """Per env, the episodes a sequence of ``segment`` results describes: global t and step of every row."""
    by_id: dict[int, dict[str, Any]] = {}
    for start, T, seg in pieces:
        env, t = seg.rows // T, seg.rows % T + start
        for e, tt, i, s in zip(env, t, seg.episode_id, seg.step):
            ep = by_id.setdefault(int(i), {"env": int(e), "t": [], "step": []})
            assert ep["env"] == e, "one episode id on two envs"
            ep["t"].append(int(tt))
            ep["step"].append(int(s))
    out: dict[int, list[dict[str, list[int]]]] = {b: [] for b in range(B)}
    for ep in sorted(by_id.values(), key=lambda ep: ep["t"][0]):
        out[ep["env"]].append(ep)
    return out


def assert_same_episodes(got: dict[int, list[dict[str, list[int]]]], ref: list[RefEpisode]) -> None:
    for b, episodes in got.items():
        expected = [r for r in ref if r.env == b]
        assert [ep["t"] for ep in episodes] == [r.t for r in expected], f"env {b}"
        for ep in episodes:
            assert ep["step"] == list(range(len(ep["t"]))), f"env {b}: steps not contiguous from 0"


# --- segment() against segment_reference() -------------------------------------------------------------

@settings(max_examples=300, deadline=None)
@given(streams())
def test_segment_matches_reference_batch_by_batch(s: dict[str, Any]) -> None:
    valid, done = s["valid"], s["terminated"] | s["truncated"]
    fast, ref = Cursors.empty(valid.shape[1]), Cursors.empty(valid.shape[1])
    alloc_fast, alloc_ref = counter(), counter()
    for a, b in batches(s["bounds"]):
        got = segment(valid[a:b], done[a:b], fast, alloc_fast)
        want = segment_reference(valid[a:b], done[a:b], ref, alloc_ref)
        np.testing.assert_array_equal(got.rows, want.rows)
        np.testing.assert_array_equal(got.episode_id, want.episode_id)
        np.testing.assert_array_equal(got.step, want.step)
        assert (got.new_episodes, got.completed) == (want.new_episodes, want.completed)
        for name in ("episode_id", "next_step", "state"):
            np.testing.assert_array_equal(getattr(got.cursors, name), getattr(want.cursors, name), err_msg=name)
        fast, ref = got.cursors, want.cursors


@settings(max_examples=200, deadline=None)
@given(streams())
def test_segment_over_batches_equals_whole_stream_reference(s: dict[str, Any]) -> None:
    valid, term, trunc = s["valid"], s["terminated"], s["truncated"]
    B = valid.shape[1]
    cursors, alloc, pieces = Cursors.empty(B), counter(), []
    for a, b in batches(s["bounds"]):
        seg = segment(valid[a:b], (term | trunc)[a:b], cursors, alloc)
        pieces.append((a, b - a, seg))
        cursors = seg.cursors
    ref = reference_episodes(np.zeros(valid.shape), term, trunc, valid)
    assert_same_episodes(episodes_from_segments(pieces, B), ref)


@settings(max_examples=200, deadline=None)
@given(streams())
def test_next_step_autoreset_drops_the_reset_step(s: dict[str, Any]) -> None:
    valid, term, trunc = s["valid"], s["terminated"], s["truncated"]
    B = valid.shape[1]
    cursors, alloc, pieces = Cursors.empty(B), counter(), []
    for a, b in batches(s["bounds"]):
        seg = segment(valid[a:b], (term | trunc)[a:b], cursors, alloc, autoreset="next-step")
        pieces.append((a, b - a, seg))
        cursors = seg.cursors
    ref = reference_episodes(np.zeros(valid.shape), term, trunc, valid, autoreset="next-step")
    assert_same_episodes(episodes_from_segments(pieces, B), ref)


def test_next_step_reset_step_alone_in_its_batch_is_dropped_once() -> None:
    # one env stepped one step at a time (add_step): done at t=1, reset step at t=2, new episode from t=3
    done = [False, True, False, False, True, False, False]
    cursors, alloc, pieces = Cursors.empty(1), counter(), []
    for t, d in enumerate(done):
        seg = segment(np.ones((1, 1), bool), np.array([[d]]), cursors, alloc, autoreset="next-step")
        pieces.append((t, 1, seg))
        cursors = seg.cursors
    got = episodes_from_segments(pieces, 1)[0]
    assert [ep["t"] for ep in got] == [[0, 1], [3, 4], [6]]


# --- end to end: writer → committed files → SQL ------------------------------------------------------------

def stored_episodes(store: trajstore.Store) -> dict[int, list[dict[str, Any]]]:
    """Per env index, the stored episodes in time order (by the ``t`` extra written with each step)."""
    rows = store.sql("SELECT env_index, episode_id, step, t, reward, terminated, truncated FROM steps "
                     "ORDER BY env_index, t").to_pylist()
    by_id: dict[int, dict[str, Any]] = {}
    for r in rows:
        ep = by_id.setdefault(r["episode_id"], {"env": r["env_index"], "t": [], "step": [], "rewards": [],
                                                "terminated": [], "truncated": []})
        assert ep["env"] == r["env_index"], "one episode id on two envs"
        for k in ("t", "step", "terminated", "truncated"):
            ep[k].append(r[k])
        ep["rewards"].append(r["reward"])
    out: dict[int, list[dict[str, Any]]] = {}
    for eid, ep in sorted(by_id.items(), key=lambda kv: kv[1]["t"][0]):
        ep["episode_id"] = eid
        out.setdefault(ep["env"], []).append(ep)
    return out


def write_stream(root: Path, s: dict[str, Any], *, autoreset: str) -> trajstore.Store:
    T, B = s["valid"].shape
    batch = make_batch(np.random.default_rng(T * 7 + B), T, B, obs_dim=2, valid=s["valid"],
                       extras={"t": np.repeat(np.arange(T)[:, None], B, axis=1)})
    batch["terminated"], batch["truncated"] = s["terminated"], s["truncated"]
    store = trajstore.open(root, create=True)
    with store.writer(run_id="r", env_id="e", autoreset=autoreset) as w:
        for a, b in batches(s["bounds"]):
            w.add_batch(slice_batch(batch, a, b))
    s["reward"] = batch["reward"]
    return store


@pytest.mark.slow
@pytest.mark.parametrize("autoreset", ["same-step", "next-step"])
@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(s=streams())
def test_writer_stores_the_reference_episodes(autoreset: str, s: dict[str, Any]) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = write_stream(Path(tmp) / "store", s, autoreset=autoreset)
        ref = reference_episodes(s["reward"], s["terminated"], s["truncated"], s["valid"], autoreset=autoreset)
        got = stored_episodes(store)
        assert sum(len(v) for v in got.values()) == len(ref)
        assert len({ep["episode_id"] for eps in got.values() for ep in eps}) == len(ref)
        for b in range(s["valid"].shape[1]):
            expected = [r for r in ref if r.env == b]
            episodes = got.get(b, [])
            assert [ep["t"] for ep in episodes] == [r.t for r in expected], f"env {b}"
            for ep, r in zip(episodes, expected):
                assert ep["step"] == list(range(len(r.t)))
                assert ep["rewards"] == r.rewards
                assert (ep["terminated"], ep["truncated"]) == (r.terminated, r.truncated)
        view = {e["episode_id"]: e for e in store.episodes().to_pylist()}
        for eps in got.values():
            for ep in eps:
                row = view[ep["episode_id"]]
                assert row["episode_length"] == len(ep["t"])
                assert row["terminated"] == ep["terminated"][-1]
                assert row["truncated"] == ep["truncated"][-1]
                assert row["complete"] == (ep["terminated"][-1] or ep["truncated"][-1])


def test_episode_spanning_batches_keeps_one_id_and_contiguous_steps(store: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    with store.writer(run_id="r", env_id="e") as w:
        for k in range(3):
            batch = make_batch(rng, 4, 2, p_terminated=0, p_truncated=0)
            batch["truncated"][3, 1] = k == 2  # env 1's episode is cut by a time limit in the third batch
            w.add_batch(batch)
    eps = store.episodes(order_by="env_index").to_pylist()
    assert [(e["env_index"], e["episode_length"], e["truncated"], e["terminated"], e["complete"]) for e in eps] \
        == [(0, 12, False, False, False), (1, 12, True, False, True)]
    for e in eps:
        steps = store.sql(f"SELECT step FROM steps WHERE episode_id = {e['episode_id']} ORDER BY step")
        assert steps.column("step").to_pylist() == list(range(12))


def test_rollout_cut_is_not_a_truncation(store: trajstore.Store) -> None:
    rng = np.random.default_rng(1)
    with store.writer(run_id="r", env_id="e") as w:
        w.add_batch(make_batch(rng, 5, 3, p_terminated=0, p_truncated=0))
    assert store.sql("SELECT count(*) AS n FROM steps WHERE truncated").column("n").to_pylist() == [0]
    assert store.episodes(complete=True).num_rows == 0
    assert store.episodes(complete=False).num_rows == 3


def test_add_step_with_next_step_autoreset_matches_reference(store: trajstore.Store) -> None:
    rng = np.random.default_rng(2)
    T, B = 40, 3
    batch = make_batch(rng, T, B, p_terminated=0.15, p_truncated=0.05,
                       extras={"t": np.repeat(np.arange(T)[:, None], B, axis=1)})
    with store.writer(run_id="r", env_id="e", autoreset="next-step") as w:
        for t in range(T):
            step = {k: v[t] for k, v in batch.items() if k != "extras"}
            w.add_step(**step, extras={"t": batch["extras"]["t"][t]})
    ref = reference_episodes(batch["reward"], batch["terminated"], batch["truncated"], autoreset="next-step")
    got = stored_episodes(store)
    for b in range(B):
        assert [ep["t"] for ep in got[b]] == [r.t for r in ref if r.env == b]


# --- autoreset="off": a step after an end needs writer.reset() ------------------------------------------

def _off_batch(rng: np.random.Generator, T: int, done_at: tuple[int, int] | None) -> dict[str, Any]:
    batch = make_batch(rng, T, 2, p_terminated=0, p_truncated=0)
    if done_at is not None:
        batch["terminated"][done_at] = True
    return batch


def test_off_refuses_a_step_after_an_end_in_the_same_batch(store: trajstore.Store) -> None:
    rng = np.random.default_rng(3)
    with store.writer(run_id="r", env_id="e", autoreset="off") as w:
        w.add_batch(_off_batch(rng, 2, None))
        w.flush()
        before = store.sql("SELECT * EXCLUDE (wall_time) FROM steps ORDER BY episode_id, step")
        with pytest.raises(InputError, match=r"env 1, t=2: a step for an env whose episode already ended"):
            w.add_batch(_off_batch(rng, 4, (1, 1)))  # env 1 ends at t=1 and steps again at t=2
        masked = _off_batch(rng, 4, (1, 1))
        masked["valid"] = np.ones((4, 2), bool)
        masked["valid"][2:, 1] = False  # the same, with the steps after the end masked out: accepted
        w.add_batch(masked)
    kept = store.sql("SELECT * EXCLUDE (wall_time) FROM steps WHERE step < 2 ORDER BY episode_id, step")
    assert kept.equals(before)  # the refused call wrote nothing; what was committed is unchanged
    assert store.sql("SELECT count(*) AS n FROM steps").column("n").to_pylist() == [before.num_rows + 6]
    assert store.episodes(complete=True).column("episode_length").to_pylist() == [4]


def test_off_refuses_a_step_after_an_end_in_an_earlier_batch_until_reset(store: trajstore.Store) -> None:
    rng = np.random.default_rng(4)
    with store.writer(run_id="r", env_id="e", autoreset="off") as w:
        w.add_batch(_off_batch(rng, 3, (2, 0)))  # env 0 ends at the last step of the batch
        with pytest.raises(InputError, match=r"env 0, t=0: .*call writer\.reset"):
            w.add_batch(_off_batch(rng, 3, None))
        w.reset([0])
        w.add_batch(_off_batch(rng, 3, None))
    eps = store.episodes(order_by="env_index").to_pylist()
    assert [(e["env_index"], e["episode_length"], e["complete"]) for e in eps] == \
        [(0, 3, True), (0, 3, False), (1, 6, False)]


def test_autoreset_mode_is_checked() -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store = trajstore.open(Path(tmp) / "s", create=True)
        with pytest.raises(InputError, match=r"autoreset must be one of"):
            store.writer(run_id="r", env_id="e", autoreset="sometimes")
