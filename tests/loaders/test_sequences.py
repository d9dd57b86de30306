"""Store.sequences: every window exactly as a plain python loop over the episodes cuts it (pad and mask,
stride, return_to_go), the order of an epoch (shuffle, shards, weighted draws), resume, and bad input."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch, reference_return
from trajstore.errors import InputError

pytestmark = pytest.mark.usefixtures("both_layouts")


@pytest.fixture
def filled(store: trajstore.Store) -> trajstore.Store:
    rng = np.random.default_rng(7)
    with store.writer(run_id="a", env_id="E") as w:
        for _ in range(3):  # episodes cross batches and files
            w.add_batch(make_batch(rng, 40, 5, p_terminated=0.06, p_truncated=0.03))
            w.flush()
    with store.writer(run_id="b", env_id="E") as w:
        w.add_batch(make_batch(rng, 30, 3))
    return store


def episodes(store: trajstore.Store, run_id: str | None = None) -> dict[int, dict[str, np.ndarray]]:
    """Every stored episode's steps in order, by a plain SQL read."""
    cond = f"WHERE run_id = '{run_id}'" if run_id else ""
    rows = store.sql(f"SELECT episode_id, obs, action, reward, terminated, truncated FROM steps {cond} "
                     "ORDER BY episode_id, step").to_pylist()
    out: dict[int, dict[str, list[Any]]] = {}
    for r in rows:
        ep = out.setdefault(r.pop("episode_id"), {})
        for k, v in r.items():
            ep.setdefault(k, []).append(v)
    return {e: {k: np.asarray(v) for k, v in cols.items()} for e, cols in out.items()}


def reference_windows(eps: dict[int, dict[str, np.ndarray]], length: int, stride: int, pad: bool,
                      gamma: float | None = None) -> list[dict[str, Any]]:
    out = []
    for e in sorted(eps):
        cols = dict(eps[e])
        n = len(cols["reward"])
        if gamma is not None:
            cols["return_to_go"] = np.array([reference_return(cols["reward"][t:], gamma) for t in range(n)])
        start = 0
        while start < n and (pad or start + length <= n):
            w: dict[str, Any] = {"episode_id": e, "start": start, "mask": [start + i < n for i in range(length)]}
            for k, v in cols.items():
                piece = list(v[start:start + length])
                zero = np.zeros_like(v[0])
                w[k] = np.asarray(piece + [zero] * (length - len(piece)))
            out.append(w)
            start += stride
    return out


def rows(batches: Any) -> list[dict[str, Any]]:
    """Windows of every batch, one dict each."""
    out = []
    for b in batches:
        for i in range(len(b["episode_id"])):
            out.append({k: v[i] for k, v in b.items()})
    return out


def key(w: dict[str, Any]) -> tuple[int, int]:
    return int(w["episode_id"]), int(w["start"])


@pytest.mark.parametrize("length,stride,pad", [(4, None, False), (4, None, True), (5, 2, True), (3, 1, False),
                                               (1, None, False), (60, None, True)])
def test_every_window_as_the_reference(filled: trajstore.Store, length: int, stride: int | None,
                                       pad: bool) -> None:
    ref = reference_windows(episodes(filled), length, stride or length, pad, gamma=0.9)
    got = rows(filled.sequences(length, stride=stride, pad=pad, gamma=0.9, batch_size=7))
    assert [key(w) for w in got] == [key(w) for w in ref]
    assert len(got) > 0
    for g, r in zip(got, ref):
        for name in ("obs", "action", "reward", "terminated", "truncated", "mask"):
            np.testing.assert_array_equal(g[name], r[name], err_msg=name)
        np.testing.assert_allclose(g["return_to_go"], r["return_to_go"], rtol=1e-12, atol=1e-12)
        assert g["obs"].shape == (length, 3)


def test_batches_have_the_shapes_and_types_asked(filled: trajstore.Store) -> None:
    batch = next(iter(filled.sequences(8, columns=["obs", "reward"], batch_size=5, pad=True)))
    assert list(batch) == ["obs", "reward", "mask", "episode_id", "start"]
    assert batch["obs"].shape == (5, 8, 3) and batch["obs"].dtype == np.float32
    assert batch["mask"].shape == (5, 8) and batch["mask"].dtype == bool
    assert batch["episode_id"].shape == (5,) and batch["start"].shape == (5,)


def test_run_and_where_select_episodes(filled: trajstore.Store) -> None:
    got = rows(filled.sequences(2, run_id="b", pad=True))
    assert {key(w)[0] for w in got} == set(episodes(filled, "b"))
    long = filled.sql("SELECT episode_id FROM episodes WHERE episode_length >= 10")["episode_id"].to_pylist()
    got = rows(filled.sequences(2, where="episode_length >= 10"))
    assert {key(w)[0] for w in got} == set(long)


def test_shuffle_covers_each_window_once_and_differs_by_epoch(filled: trajstore.Store) -> None:
    plain = [key(w) for w in rows(filled.sequences(3, pad=True, batch_size=16))]
    orders = []
    for epoch in (0, 1):
        got = [key(w) for w in rows(filled.sequences(3, pad=True, batch_size=16, shuffle=True, seed=5,
                                                     epoch=epoch))]
        assert sorted(got) == sorted(plain) and len(set(got)) == len(got)
        orders.append(got)
    assert orders[0] != orders[1] and orders[0] != plain
    again = [key(w) for w in rows(filled.sequences(3, pad=True, batch_size=9, shuffle=True, seed=5, epoch=0))]
    assert again == orders[0]  # the same (seed, epoch): the same order, whatever the batch size


@pytest.mark.parametrize("world_size", [2, 3])
def test_shards_are_disjoint_covering_and_balanced(filled: trajstore.Store, world_size: int) -> None:
    batch_size = 8
    everything = sorted(key(w) for w in rows(filled.sequences(4, pad=True)))
    shards = [[key(w) for w in rows(filled.sequences(4, pad=True, shuffle=True, seed=1, rank=r,
                                                     world_size=world_size, batch_size=batch_size))]
              for r in range(world_size)]
    assert sorted(k for s in shards for k in s) == everything
    sizes = [len(s) for s in shards]
    assert max(sizes) - min(sizes) <= 1
    batches = [len(filled.sequences(4, pad=True, rank=r, world_size=world_size, batch_size=batch_size))
               for r in range(world_size)]
    assert max(batches) - min(batches) <= 1


def test_resume_mid_epoch_continues_exactly(filled: trajstore.Store) -> None:
    args = dict(pad=True, batch_size=6, shuffle=True, seed=3, epoch=2, columns=["obs", "reward"])
    full = rows(filled.sequences(4, **args))
    it = filled.sequences(4, **args)
    first = [next(it) for _ in range(3)]
    state = it.state_dict()
    it.close()
    assert state["position"] == 18 and state["epoch"] == 2
    rest = rows(filled.sequences(4, resume=state, **args))
    assert [key(w) for w in rows(first) + rest] == [key(w) for w in full]
    np.testing.assert_array_equal(np.stack([w["obs"] for w in rest]), np.stack([w["obs"] for w in full[18:]]))
    with pytest.raises(InputError, match="resume: the state was made with other arguments"):
        filled.sequences(4, resume=state, **{**args, "seed": 4})
    with pytest.raises(InputError, match="resume: a state of epoch 2, but epoch=3"):
        filled.sequences(4, resume=state, **{**args, "epoch": 3})
    with pytest.raises(InputError, match="resume: a state of store.sequences"):
        filled.transitions(1, gamma=0.9, resume=state)
    with pytest.raises(InputError, match="resume: expected the dict"):
        filled.sequences(4, resume={"position": 3}, **args)


def test_resume_refuses_a_state_made_over_other_data(filled: trajstore.Store) -> None:
    it = filled.sequences(4)
    next(it)
    state = it.state_dict()
    with filled.writer(run_id="c", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(1), 10, 2))
    with pytest.raises(InputError, match="resume: .*other data"):
        filled.sequences(4, resume=state)


def test_weighted_draws_follow_the_episode_weights(filled: trajstore.Store) -> None:
    draws = rows(filled.sequences(2, weight_by="episode_length", num_samples=4000, seed=2, batch_size=500))
    assert len(draws) == 4000
    windows = rows(filled.sequences(2))
    table = filled.sql("SELECT episode_id, episode_length FROM episodes").to_pydict()
    lengths = dict(zip(table["episode_id"], table["episode_length"]))
    weights = np.array([lengths[key(w)[0]] for w in windows], float)
    expected = weights / weights.sum()
    index = {key(w): i for i, w in enumerate(windows)}
    counts = np.bincount([index[key(w)] for w in draws], minlength=len(windows)) / len(draws)
    assert np.abs(counts - expected).sum() < 0.25  # total variation of 4000 draws
    again = rows(filled.sequences(2, weight_by="episode_length", num_samples=4000, seed=2, batch_size=500))
    assert [key(w) for w in again] == [key(w) for w in draws]
    # a step column weighs each window by its first step: zero weight is never drawn
    drawn = rows(filled.sequences(2, weight_by="action", num_samples=300, batch_size=50))
    assert len(drawn) == 300 and all(w["action"][0] > 0 for w in drawn)
    assert {int(w["action"][0]) for w in drawn} == {1, 2, 3}


def test_formats(filled: trajstore.Store) -> None:
    ref = next(iter(filled.sequences(4, pad=True, batch_size=5)))
    arrow = next(iter(filled.sequences(4, pad=True, batch_size=5, format="arrow")))
    from trajstore.loaders.loader import from_arrow

    for k, v in from_arrow(arrow).items():
        np.testing.assert_array_equal(v, ref[k])
    pytest.importorskip("jax")
    it = filled.sequences(4, pad=True, batch_size=5, format="jax")
    batches = list(it)
    assert len(batches) == len(filled.sequences(4, pad=True, batch_size=5))
    np.testing.assert_array_equal(np.asarray(batches[0]["obs"]), ref["obs"])


def test_jax_batches_are_on_the_device_and_the_next_one_is_made_while_this_one_trains(
        filled: trajstore.Store) -> None:
    jax = pytest.importorskip("jax")
    with filled.sequences(4, pad=True, batch_size=5, format="jax") as it:
        first = next(it)
        assert isinstance(first["obs"], jax.Array)
        ahead = it._ahead  # the second batch, submitted to the prefetch thread before the first was handed out
        assert ahead is not None
        ahead.result(timeout=30)  # made while the caller held the first batch and had not asked for more
        assert next(it) is ahead.result()


@pytest.mark.parametrize("kwargs,match", [
    ({"length": 0}, "length: must be an integer >= 1, got 0"),
    ({"length": 4, "stride": 0}, "stride: must be an integer >= 1, got 0"),
    ({"length": 4, "gamma": 1.5}, r"gamma must be in \[0, 1\], got 1.5"),
    ({"length": 4, "gamma": -0.1}, r"gamma must be in \[0, 1\]"),
    ({"length": 4, "rank": 2, "world_size": 2}, r"rank: must be in \[0, world_size\)"),
    ({"length": 4, "world_size": 0}, "world_size: must be a positive number"),
    ({"length": 4, "columns": ["obs", "nope"]}, r"columns: unknown column\(s\) \['nope'\]"),
    ({"length": 4, "columns": ["return_to_go"]}, "gamma: 'return_to_go' needs a discount"),
    ({"length": 4, "batch_size": 0}, "batch_size: must be an integer >= 1"),
    ({"length": 4, "format": "pandas"}, "format: must be one of"),
    ({"length": 4, "weight_by": "nope"}, "weight_by"),
    ({"length": 4, "num_samples": 5}, "num_samples: draws with replacement need weight_by"),
    ({"length": 4, "where": "no_such_column > 1"}, "where:"),
])
def test_bad_input_names_the_argument(filled: trajstore.Store, kwargs: dict[str, Any], match: str) -> None:
    kwargs = dict(kwargs)  # the parameter is shared by each layout's run of the test
    length = kwargs.pop("length")
    with pytest.raises(InputError, match=match):
        filled.sequences(length, **kwargs)


@pytest.mark.parametrize("selection", [{"where": "episode_length > 10000"}, {"where": "run_id = 'nobody'"},
                                       {"mode": "eval"}, {"min_return": 1e17}])
def test_an_empty_selection_gives_no_batches(filled: trajstore.Store, selection: dict[str, Any]) -> None:
    """Filters that keep no episode give no windows and no transitions, padded or not (an empty layout once
    failed to build its spans: a 500 over REST)."""
    for it in (filled.sequences(4, **selection), filled.sequences(4, pad=True, **selection),
               filled.transitions(n=3, gamma=0.9, **selection)):
        assert len(it) == 0 and list(it) == []


def test_a_window_longer_than_every_episode_is_refused_naming_the_longest(filled: trajstore.Store) -> None:
    longest = filled.episodes(order_by="-episode_length", limit=1).to_pylist()[0]
    n, episode_id = longest["episode_length"], longest["episode_id"]
    with pytest.raises(InputError, match=rf"length: 1000 steps is longer than every selected episode; the "
                                         rf"longest, episode_id {episode_id}, has {n} steps: .*pad=True"):
        filled.sequences(1000)
    assert sum(int(b["mask"][:, 0].sum()) for b in filled.sequences(n)) >= 1  # the longest one fits
    padded = list(filled.sequences(1000, pad=True, batch_size=10_000))
    assert sum(len(b["start"]) for b in padded) == filled.episodes().num_rows  # one padded window per episode


@pytest.mark.s3
def test_an_s3_store_gives_the_windows_of_a_directory(s3: Any, tmp_path: Any) -> None:
    """The same writes on a directory and on SeaweedFS: the same windows and transitions, order included."""
    local = trajstore.open(tmp_path / "local", create=True)
    remote = trajstore.open(f"s3://{s3.bucket()}/loaders", create=True, storage_options=s3.storage_options)
    for store in (local, remote):
        rng = np.random.default_rng(5)
        with store.writer(run_id="a", env_id="E") as w:
            w.add_batch(make_batch(rng, 40, 3))
            w.flush()
            w.add_batch(make_batch(rng, 40, 3))

    def positions(store: trajstore.Store) -> dict[int, int]:  # episode ids differ: compare by rank of the id
        ids = sorted(store.sql("SELECT episode_id FROM episodes")["episode_id"].to_pylist())
        return {e: i for i, e in enumerate(ids)}

    batches = {}
    for name, store in (("local", local), ("s3", remote)):
        rank = positions(store)
        windows = rows(store.sequences(5, pad=True, gamma=0.9, shuffle=True, seed=2, batch_size=8))
        batches[name] = [(rank[int(w["episode_id"])], int(w["start"]), w["obs"].tobytes(), w["mask"].tobytes(),
                          np.round(w["return_to_go"], 9).tobytes()) for w in windows]
        steps = rows(store.transitions(3, gamma=0.9, batch_size=16))
        batches[name + "-transitions"] = [(rank[int(t["episode_id"])], int(t["step"]), float(t["reward"]),
                                           float(t["discount"])) for t in steps]
    assert batches["local"] == batches["s3"] and len(batches["local"]) > 0
    assert batches["local-transitions"] == batches["s3-transitions"]


def test_environments_of_other_shapes_are_refused_until_one_is_selected(tmp_path: Any) -> None:
    from tests.helpers import write_mixed_store

    store = write_mixed_store(tmp_path / "mixed", seed=0, commits=2)
    with pytest.raises(InputError, match=r"columns: 'obs' is stored in types that cannot be one array by the selected "
                                         r"environments \(Small-v0: float32\[3\]; Wide-v0: float32\[8\]\); select one "
                                         r"with env_id="):
        store.sequences(4)
    wide = next(store.sequences(4, where="env_id = 'Wide-v0'", columns=["obs", "value"]))
    assert wide["obs"].shape[1:] == (4, 8) and wide["value"].shape[1:] == (4,)
    with pytest.raises(InputError, match="columns: 'value' is missing"):
        store.sequences(4, columns=["value"])


def test_torch_format_without_torch_names_format(filled: trajstore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "torch", None)  # what `import torch` meets where PyTorch is not installed
    with pytest.raises(InputError, match=r"format: 'torch' needs PyTorch: pip install "
                                         r"'trajstore\[torch\]'"):
        filled.sequences(4, format="torch")


def test_return_to_go_is_exact_when_computed_in_many_pieces(filled: trajstore.Store,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    from trajstore.loaders import layout as layout

    monkeypatch.setattr(layout, "CHUNK_STEPS", 7)  # groups of whole episodes of about 7 steps each
    ref = reference_windows(episodes(filled), 3, 1, True, gamma=0.97)
    got = rows(filled.sequences(3, stride=1, pad=True, gamma=0.97, columns=["return_to_go"]))
    assert [key(w) for w in got] == [key(w) for w in ref]
    np.testing.assert_allclose(np.stack([w["return_to_go"] for w in got]),
                               np.stack([w["return_to_go"] for w in ref]), rtol=1e-12, atol=1e-12)
