"""The sum and min trees of a prioritized replay against plain numpy: draws fall where a cumulative sum puts them,
sums and minimums are those of the leaves after any changes, and a million draws follow the weights (chi-square)."""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats

from trajstore.loaders import sumtree
from trajstore.loaders.assemble import Loading
from trajstore.loaders.sumtree import FANOUT, PriorityTree, grown_room, level_sizes


@pytest.fixture(autouse=True, params=["kernels", "numpy"])
def way(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """Every test twice: by the compiled kernels, and by numpy (what a process does while they load)."""
    if request.param == "numpy":
        def unavailable() -> None:
            raise RuntimeError("no kernels in this test")

        kernels = Loading(unavailable, "replay kernels (none in this test)")
        kernels.usable()
        monkeypatch.setattr(sumtree, "KERNELS", kernels)
    else:
        assert sumtree.KERNELS.usable()
    return str(request.param)


def reference_draw(weights: np.ndarray, masses: np.ndarray) -> np.ndarray:
    """The slot each mass falls on: the first whose running sum passes it (numpy's cumulative sum)."""
    return np.searchsorted(np.cumsum(weights), masses, side="right")


@pytest.mark.parametrize("room", [1, 2, FANOUT - 1, FANOUT, FANOUT + 1, FANOUT**2 + 3, 100_000])
def test_draws_fall_where_a_cumulative_sum_puts_them(room: int) -> None:
    rng = np.random.default_rng(room)
    weights = rng.random(room) * (rng.random(room) < 0.7)  # some empty slots
    weights[0] = max(weights[0], 0.1)
    tree = PriorityTree(room)
    tree.fill(0, weights)
    masses = rng.random(20_000) * weights.sum()
    got, want = tree.draw(masses), reference_draw(weights, masses)
    edges = np.cumsum(weights)
    near = np.abs(masses[:, None] - edges[None, :]).min(axis=1) < 1e-9 * weights.sum() if room <= 5000 else \
        np.zeros(len(masses), bool)
    assert np.array_equal(got[~near], want[~near])
    assert (weights[got] > 0).all()  # an empty slot is never drawn
    assert tree.total == pytest.approx(weights.sum(), rel=1e-12)
    assert tree.minimum == weights[weights > 0].min()


def test_changes_keep_every_level_exact() -> None:
    rng = np.random.default_rng(1)
    room = 5 * FANOUT**2 + 7
    tree, weights = PriorityTree(room), np.zeros(room)
    for _ in range(200):
        slots = rng.integers(0, room, 300)
        values = rng.random(300) * (rng.random(300) < 0.9)
        tree.set(slots, values)
        for s, v in zip(slots, values):  # one after the other: the last of a slot given twice wins
            weights[s] = v
    assert np.array_equal(tree.leaves(np.arange(room)), weights)
    # every inner node is the sum (and minimum) of its children, so the root is the leaves' own
    assert tree.total == pytest.approx(weights.sum(), rel=1e-12)
    assert tree.minimum == weights[weights > 0].min()
    offsets, sizes = tree.offsets, tree.sizes
    for level in range(1, len(sizes)):
        below = tree.sums[offsets[level - 1]:offsets[level - 1] + sizes[level - 1]]
        padded = np.zeros(sizes[level] * FANOUT)
        padded[:len(below)] = below
        np.testing.assert_allclose(tree.sums[offsets[level]:offsets[level] + sizes[level]],
                                   padded.reshape(-1, FANOUT).sum(axis=1), rtol=1e-12)


def test_a_million_draws_follow_the_weights() -> None:
    rng = np.random.default_rng(2)
    room = 1000
    weights = rng.random(room) ** 3 + 1e-3
    tree = PriorityTree(room)
    tree.fill(0, weights)
    tree.set(rng.integers(0, room, 100), rng.random(100) * 5)  # after changes
    weights = tree.leaves(np.arange(room))
    counts = np.bincount(tree.draw(rng.random(1_000_000) * tree.total), minlength=room)
    assert stats.chisquare(counts, weights / weights.sum() * counts.sum()).pvalue > 1e-3


def test_grown_and_cleared_trees_keep_their_weights() -> None:
    tree = PriorityTree(10)
    tree.fill(0, np.arange(1.0, 11.0))
    bigger = tree.grown(grown_room(11, 10))
    assert bigger.room >= 11 and bigger.total == 55.0 and bigger.minimum == 1.0
    bigger.clear(0, 5)
    assert bigger.total == 40.0 and bigger.minimum == 6.0
    assert level_sizes(1) == [1, 1] and level_sizes(FANOUT + 1) == [FANOUT + 1, 2, 1]
    empty = PriorityTree(4)
    assert empty.total == 0.0 and empty.minimum == np.inf
    assert (empty.draw(np.zeros(3)) == -1).all()


def test_one_weight_for_a_span_is_the_same_tree_as_that_weight_per_slot() -> None:
    """A bulk load of one weight (a new replay's items, a follow's new ones) sets the nodes wholly inside the span at
    once: the same sums and least weights as loading the weights one per slot, at any span and room."""
    rng = np.random.default_rng(0)
    for _ in range(200):
        room = int(rng.integers(1, 5000))
        base = rng.random(room) * (rng.random(room) < 0.7)  # some slots empty
        start = int(rng.integers(0, room))
        count = int(rng.integers(1, room - start + 1))
        weight = float(rng.choice([0.0, 0.37, 2.0]))
        one, each = PriorityTree(room), PriorityTree(room)
        for tree in (one, each):
            tree.fill(0, base)
        one.fill(start, weight, count)
        each.fill(start, np.full(count, weight))
        np.testing.assert_allclose(one.sums, each.sums, rtol=1e-12, atol=1e-12)
        np.testing.assert_allclose(one.mins, each.mins, rtol=1e-12, atol=1e-12)
        assert one.total == pytest.approx(base[:start].sum() + weight * count + base[start + count:].sum())
