"""The registry's look-ups by key (:mod:`trajstore.loaders.replay_items`): the kernels against the numpy path and a
plain loop over the runs, on random registries."""

from __future__ import annotations

import numpy as np
import pytest

from trajstore.loaders import replay_items
from trajstore.loaders.assemble import Loading
from trajstore.loaders.replay_items import Keys, Registry


def registry(rng: np.random.Generator, capacity: int | None, stride: int, agents: int) -> Registry:
    """A registry grown over a few looks: trajectories that grow, appear, and leave (some come back, from 0)."""
    reg = Registry(capacity, stride)
    pairs = [(int(e), int(a)) for e in rng.choice(1000, 12, replace=False) for a in range(agents)]
    counts = {p: 0 for p in pairs}
    for _ in range(5):
        here = sorted(p for p in pairs if rng.random() < 0.8)
        for p in here:
            counts[p] = counts[p] + int(rng.integers(0, 6)) if counts[p] else int(rng.integers(1, 8))
        for p in set(pairs) - set(here):
            counts[p] = 0  # left the selection: it counts from 0 if it comes back
        trajectories = Keys(np.array([p[0] for p in here], np.int64), np.array([p[1] for p in here], np.int32),
                            np.zeros(len(here), np.int32))
        runs, _ = reg.new_runs(trajectories, np.array([counts[p] for p in here], np.int64),
                               rng.permutation(len(here)))
        reg.add(runs)
    return reg


def queries(rng: np.random.Generator, reg: Registry, n: int) -> Keys:
    """Keys of items held and taken, of items past a run's end, of other trajectories, steps off the stride."""
    episode = np.concatenate([reg.runs.episode, rng.choice(1000, 3)]).astype(np.int64)
    pick = rng.integers(0, len(episode), n)
    agent = np.where(rng.random(n) < 0.9, np.concatenate([reg.runs.agent, np.zeros(3, np.int32)])[pick],
                     rng.integers(-1, 3, n)).astype(np.int32)
    start = rng.integers(-2, 12, n) * reg.stride + np.where(rng.random(n) < 0.2, rng.integers(1, 3, n), 0)
    return Keys(episode[pick], agent, start.astype(np.int32))


def plain_handles(reg: Registry, keys: Keys) -> np.ndarray:
    """By the definition, key by key: the last run of the key's trajectory (in index, then handle order) starting at
    or before it, if that run reaches it and the item is still held."""
    out = np.full(len(keys), -1, np.int64)
    r = reg.runs
    for i in range(len(keys)):
        start = int(keys.start[i])
        if start % reg.stride:
            continue
        index = start // reg.stride
        mine = [j for j in range(len(r)) if r.episode[j] == keys.episode[i] and r.agent[j] == keys.agent[i]
                and r.index[j] <= index]
        if not mine:
            continue
        j = max(mine, key=lambda j: (r.index[j], r.handle[j]))
        handle = int(r.handle[j] + index - r.index[j])
        if index < r.index[j] + r.count[j] and handle >= reg.total - reg.held():
            out[i] = handle
    return out


@pytest.fixture
def no_kernels(monkeypatch: pytest.MonkeyPatch) -> None:
    def unavailable() -> None:
        raise RuntimeError("no kernels in this test")

    kernels = Loading(unavailable, "none in this test")
    kernels.usable()
    monkeypatch.setattr(replay_items, "KERNELS", kernels)


CASES = [(None, 1, 1), (None, 3, 1), (None, 2, 3), (7, 1, 1), (10, 2, 2), (40, 1, 3)]  # capacity, stride, agents


@pytest.mark.parametrize(("capacity", "stride", "agents"), CASES)
def test_handles_of_by_the_kernel_numpy_and_the_definition(capacity: int | None, stride: int, agents: int) -> None:
    assert replay_items.KERNELS.usable()
    found = np.zeros(2, np.int64)  # keys held, keys not
    for seed in range(20):
        rng = np.random.default_rng(seed)
        reg = registry(rng, capacity, stride, agents)
        keys = queries(rng, reg, 400)
        want = plain_handles(reg, keys)
        found += (want >= 0).sum(), (want < 0).sum()
        np.testing.assert_array_equal(reg.handles_of(keys), want)
        np.testing.assert_array_equal(reg.handles_of_numpy(keys), want)
        ordered = keys.take(np.lexsort((keys.start, keys.agent, keys.episode)))  # (the kernel's guess of a run)
        np.testing.assert_array_equal(reg.handles_of(ordered), plain_handles(reg, ordered))
    assert found.min() > 100


@pytest.mark.parametrize(("capacity", "stride", "agents"), CASES)
@pytest.mark.parametrize("ways", ["kernels", "numpy"])
def test_scatter_puts_each_held_items_last_value_in_its_place(capacity: int | None, stride: int, agents: int,
                                                              ways: str, request: pytest.FixtureRequest) -> None:
    if ways == "numpy":
        request.getfixturevalue("no_kernels")
    for seed in range(20):
        rng = np.random.default_rng(seed)
        reg = registry(rng, capacity, stride, agents)
        keys = queries(rng, reg, 400)  # (repeated keys among them: the later value wins)
        values = rng.random(len(keys))
        first = int(rng.integers(0, reg.total))
        out = np.full(int(rng.integers(1, reg.total - first + 3)), np.nan)
        want = out.copy()
        for handle, value in zip(plain_handles(reg, keys), values):
            if first <= handle < first + len(want):
                want[handle - first] = value
        reg.scatter(keys, values, first, out)
        np.testing.assert_array_equal(out, want)


def test_no_runs_or_no_keys_hold_nothing() -> None:
    reg = Registry(None, 1)
    keys = Keys(np.arange(3, dtype=np.int64), np.zeros(3, np.int32), np.zeros(3, np.int32))
    assert (reg.handles_of(keys) == -1).all() and len(reg.handles_of(Keys.empty())) == 0
    out = np.full(2, np.nan)
    reg.scatter(keys, np.ones(3), 0, out)
    assert np.isnan(out).all()
