"""Resume states given by a caller: what is not a state is an InputError naming ``resume`` with a bounded
message, however large or deeply nested (the JSON decoder's RecursionError included); loaders over a version
with no steps."""

from __future__ import annotations

import json

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.errors import InputError
from trajstore.loaders.order import epoch_order, parse_state, resume_position

STATE = {"kind": "sequences", "digest": "d" * 32, "epoch": 0, "position": 3}


def deep(levels: int) -> list:
    value: list = []
    for _ in range(levels):
        value = [value]
    return value


def position(state: object) -> int:
    return resume_position(state, kind="sequences", digest_="d" * 32, epoch=0, total=10)  # type: ignore[arg-type]


def test_a_state_round_trips_through_its_json() -> None:
    assert position(parse_state(json.dumps(STATE))) == 3
    assert position({**STATE, "position": np.int64(4)}) == 4


@pytest.mark.parametrize("text", ["[" * 100_000, "[" * 5000 + "]" * 5000, "{" * 3000, "nope", "[]", "7",
                                  "1" * 5000, ""])
def test_text_that_is_not_a_state_is_refused(text: str) -> None:
    with pytest.raises(InputError, match="resume: expected the JSON of an iterator's state_dict") as info:
        parse_state(text)
    assert len(str(info.value)) < 300


@pytest.mark.parametrize("state,message", [
    ({"position": 3}, "resume: expected the dict"),
    (deep(50_000), "resume: expected the dict"),
    ({**STATE, "kind": deep(50_000)}, "resume: kind and digest must be strings"),
    ({**STATE, "digest": {"a": deep(50_000)}}, "resume: kind and digest must be strings"),
    ({**STATE, "epoch": np.zeros(3)}, "resume: kind and digest must be strings and epoch an integer"),
    ({**STATE, "epoch": 10**5000}, "resume: a state of epoch"),
    ({**STATE, "kind": "x" * 100_000}, r"resume: a state of store\.x+\.\.\.x+\(\.\.\.\), not of store\.sequences"),
    ({**STATE, "position": 11}, r"resume: position must be in \[0, 10\]"),
    ({**STATE, "position": deep(50_000)}, r"resume: position must be in \[0, 10\], got \[+\.\.\.\]+$"),
    ({**STATE, "position": True}, r"resume: position must be in \[0, 10\]"),
])
def test_a_bad_state_is_named_with_a_bounded_message(state: object, message: str) -> None:
    with pytest.raises(InputError, match=message) as info:
        position(state)
    assert len(str(info.value)) < 400


def test_loaders_over_a_version_without_steps_refuse_or_yield_nothing(store: trajstore.Store) -> None:
    with store.writer(run_id="a", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(0), 4, 2))
    empty = trajstore.open(store.uri, version=0)  # the store's creation: no file, no column
    assert list(empty.sequences(2)) == []
    with pytest.raises(InputError, match="gamma: 'return_to_go' is computed from the steps' reward, which these "
                                         "steps do not have"):
        empty.sequences(2, gamma=0.0)
    with pytest.raises(InputError, match="columns: n-step transitions need"):
        empty.transitions(1, gamma=0.5)


# --- orders computed as they are reached ---------------------------------------------------------------------

@pytest.mark.parametrize("n", [0, 1, 2, 3, 4, 5, 17, 64, 1000, 65_537, 300_001])
def test_the_shuffle_is_a_permutation_of_every_size(n: int) -> None:
    order = epoch_order(n, shuffle=True, seed=7, epoch=2, rank=0, world_size=1)
    got = order.take(0, n)
    assert len(order) == n and sorted(got.tolist()) == list(range(n))
    pieces = np.concatenate([order.take(i, i + 1000) for i in range(0, n, 1000)] or [np.zeros(0, np.int64)])
    np.testing.assert_array_equal(pieces, got)  # the same entries, whatever the pieces asked for


def test_the_shuffle_depends_on_seed_and_epoch_only() -> None:
    def order(seed: int, epoch: int) -> list[int]:
        return epoch_order(10_000, shuffle=True, seed=seed, epoch=epoch, rank=0, world_size=1).take(0, 10_000).tolist()

    assert order(1, 0) == order(1, 0)
    assert order(1, 0) != order(1, 1) and order(1, 0) != order(2, 0)
    assert sum(a == b for a, b in zip(order(1, 0), order(1, 1))) < 20  # ~1 expected in common by chance


def test_the_shuffle_looks_like_numpys_permutation() -> None:
    """Simple statistics of a uniform random permutation: no trend, consecutive entries n/3 apart on average,
    about one fixed point, and the order of a few items not predictable from their neighbours."""
    n = 200_003
    got = epoch_order(n, shuffle=True, seed=0, epoch=0, rank=0, world_size=1).take(0, n).astype(np.float64)
    ref = np.random.default_rng(0).permutation(n).astype(np.float64)
    position = np.arange(n)
    for perm in (got, ref):
        assert abs(np.corrcoef(position, perm)[0, 1]) < 0.01
        assert abs(np.abs(np.diff(perm)).mean() / (n / 3) - 1) < 0.01
        assert (perm == position).sum() < 10
        assert abs(np.corrcoef(perm[:-1], perm[1:])[0, 1]) < 0.01  # consecutive entries unrelated
    low = got < n / 2  # the first half of the items spread evenly over the order
    assert abs(low[: n // 2].mean() - 0.5) < 0.01


@pytest.mark.parametrize("world_size", [1, 3])
def test_shards_of_a_shuffle_are_disjoint_and_cover_it(world_size: int) -> None:
    n = 50_001
    whole = epoch_order(n, shuffle=True, seed=4, epoch=1, rank=0, world_size=1).take(0, n)
    shards = [epoch_order(n, shuffle=True, seed=4, epoch=1, rank=r, world_size=world_size) for r in range(world_size)]
    for r, shard in enumerate(shards):
        np.testing.assert_array_equal(shard.take(0, len(shard)), whole[r::world_size])


def reference_draws(weights: np.ndarray, points: np.ndarray) -> np.ndarray:
    """The item whose stretch of the weights laid end to end holds each point, by a plain loop."""
    out = []
    for p in points:
        total = 0.0
        for i, w in enumerate(weights):
            if w > 0 and total <= p < total + w:
                out.append(i)
                break
            total += w
        else:
            out.append(int(np.flatnonzero(weights > 0)[-1]))
    return np.array(out)


def test_group_and_step_weights_locate_points_as_a_plain_loop(monkeypatch: pytest.MonkeyPatch) -> None:
    from trajstore.loaders import order as order_module
    from trajstore.loaders.order import GroupWeights, StepWeights

    rng = np.random.default_rng(3)
    count = rng.integers(0, 5, 40)
    group_weight = rng.uniform(0, 2, 40) * (rng.random(40) > 0.2)
    first = np.cumsum(count) - count
    per_item = np.repeat(group_weight, count)
    points = rng.uniform(0, per_item.sum(), 500)
    expected = reference_draws(per_item, points)
    np.testing.assert_array_equal(GroupWeights(group_weight, first, count).locate(points), expected)
    for limit in (10**6, 7):  # in memory, and in a temporary file
        monkeypatch.setattr(order_module, "IN_MEMORY_WEIGHTS", limit)
        steps = StepWeights((per_item[i:i + 9] for i in range(0, len(per_item), 9)), len(per_item))
        assert steps.total == pytest.approx(per_item.sum())
        np.testing.assert_array_equal(steps.locate(points), expected)


def test_weighted_draws_follow_the_weights_in_blocks_whatever_the_shard() -> None:
    weights = np.array([0.0, 1.0, 3.0, 0.0, 6.0])
    n = 60_000
    draws = epoch_order(5, shuffle=False, seed=1, epoch=0, rank=0, world_size=1, weights=weights, num_samples=n)
    got = draws.take(0, n)
    assert len(got) == n and set(got.tolist()) == {1, 2, 4}
    assert np.abs(np.bincount(got, minlength=5) / n - weights / weights.sum()).max() < 0.01
    shard = epoch_order(5, shuffle=False, seed=1, epoch=0, rank=1, world_size=2, weights=weights, num_samples=n)
    np.testing.assert_array_equal(shard.take(0, len(shard)), got[1::2])
    with pytest.raises(InputError, match="weight_by: weights must be finite and >= 0"):
        epoch_order(2, shuffle=False, seed=0, epoch=0, rank=0, world_size=1, weights=np.array([1.0, -1.0]))
    with pytest.raises(InputError, match="weight_by: every weight is 0"):
        epoch_order(2, shuffle=False, seed=0, epoch=0, rank=0, world_size=1, weights=np.zeros(2))
