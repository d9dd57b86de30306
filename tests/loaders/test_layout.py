"""Loader layouts: the next epoch reuses the layout a store keeps open; another commit, other columns or another
gamma make another; an iterator maps its files once and holds no per-window or per-step arrays; the in-memory
cache shares a layout between iterators and closes a temporary one when the last is done."""

from __future__ import annotations

import tempfile
import tracemalloc
from pathlib import Path
from typing import Callable

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.loaders.layout import Layout, OpenLayouts
from trajstore.settings import Settings

pytestmark = pytest.mark.usefixtures("built_layouts")


def write(store: trajstore.Store, run: str, seed: int, T: int = 30, B: int = 4) -> None:
    with store.writer(run_id=run, env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(seed), T, B, p_terminated=0.1))


def epoch(store: trajstore.Store, **kwargs: object) -> list[dict[str, np.ndarray]]:
    return list(store.sequences(4, columns=["obs", "reward"], pad=True, batch_size=16, shuffle=True, **kwargs))


def private(store: trajstore.Store) -> trajstore.Store:
    """The same store, building every layout anew in a temporary folder: the reference a kept layout must match."""
    return trajstore.Store(store.uri, settings=Settings(loader_layouts=0, store_layouts=False, loader_arrays=False))


def same(got: list[dict[str, np.ndarray]], want: list[dict[str, np.ndarray]]) -> None:
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert list(a) == list(b)
        for k in b:
            np.testing.assert_array_equal(a[k], b[k], err_msg=k)


def manifests(store: trajstore.Store) -> list[str]:
    return sorted(p.name for p in (store.root / "layouts").glob("*.json"))


def test_the_next_epoch_reuses_the_layout_and_gives_what_a_fresh_one_gives(store: trajstore.Store,
                                                                          built: Callable[[], int]) -> None:
    write(store, "a", 0)
    first = epoch(store, epoch=0)
    assert built() == 1 and len(manifests(store)) == 1
    second = epoch(store, epoch=1)
    assert built() == 1  # kept open: nothing found or built again
    fresh = private(store)
    same(first, epoch(fresh, epoch=0))
    same(second, epoch(fresh, epoch=1))
    assert built() == 3 and len(manifests(store)) == 1  # the private store kept nothing, saved nothing


def test_a_commit_other_columns_or_gamma_make_another_layout(store: trajstore.Store,
                                                             built: Callable[[], int]) -> None:
    write(store, "a", 0)
    epoch(store)
    assert built() == 1 and len(manifests(store)) == 1
    write(store, "b", 1)  # a new version: its windows include run b
    assert sum(len(b["episode_id"]) for b in epoch(store)) > 0
    assert built() == 2 and len(manifests(store)) == 1  # the same selection's older layout went
    list(store.sequences(4, columns=["obs", "return_to_go"], gamma=0.9, pad=True))
    a = list(store.sequences(4, columns=["return_to_go"], gamma=0.5, pad=True, batch_size=10_000))
    assert built() == 4 and len(manifests(store)) == 3
    b = list(private(store).sequences(4, columns=["return_to_go"], gamma=0.5, pad=True, batch_size=10_000))
    same(a, b)  # gamma is part of what is kept
    assert built() == 5  # the private store's, for itself alone
    epoch(store, run_id="a")
    assert built() == 6 and len(manifests(store)) == 4
    write(store, "b", 2)  # a commit to another run: run a's files, hence its layout, stay
    again = trajstore.open(store.uri)
    reference = epoch(private(store), run_id="a")
    assert built() == 7
    same(epoch(again, run_id="a"), reference)
    assert built() == 7  # another Store object found run a's layout kept in the store


def test_an_evicted_temporary_layout_stays_while_an_iterator_reads_it(store: trajstore.Store, tmp_path: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    write(store, "a", 0)
    monkeypatch.setattr(tempfile, "tempdir", str(tmp_path / "temporary"))  # where this process's layouts go
    (tmp_path / "temporary").mkdir()
    fresh = trajstore.Store(store.uri, settings=Settings(loader_layouts=1, store_layouts=False, loader_arrays=False))
    running = fresh.sequences(4, columns=["obs"], pad=True, batch_size=2)
    next(running)
    (held,) = list((tmp_path / "temporary").iterdir())  # the layout the iterator reads
    list(fresh.sequences(4, columns=["reward"], pad=True))  # evicts the first layout
    assert held is not None and held.exists()
    rest = list(running)  # still gathers from its files
    assert rest and not held.exists()  # gone once its last reader finished


def test_the_cache_builds_once_per_key_and_closes_on_release() -> None:
    built: list[Layout] = []

    def make() -> Layout:
        layout = Layout(np.zeros(1, np.int64), np.ones(1, np.int64), np.zeros(1, np.int64))
        layout.new_column("x", np.dtype(np.float32), ())
        built.append(layout)
        return layout

    cache = OpenLayouts(1)
    a, release_a = cache.get("k", make)
    b, release_b = cache.get("k", make)
    assert a is b and len(built) == 1
    c, release_c = cache.get("other", make)
    assert a.folder is not None  # evicted but in use twice
    release_a()
    release_a()  # a second release of the same handle changes nothing
    assert a.folder is not None
    release_b()
    assert a.folder is None and c.folder is not None
    release_c()
    assert c.folder is not None  # kept for the next caller
    cache.clear()
    assert c.folder is None
    uncached, release = OpenLayouts(0).get("k", make)
    release()
    assert uncached.folder is None


@pytest.mark.parametrize("loader", ["sequences", "transitions"])
def test_both_loaders_keep_and_share_nothing_wrong(store: trajstore.Store, loader: str,
                                                   built: Callable[[], int]) -> None:
    write(store, "a", 0)
    call = (lambda s: s.sequences(3, columns=["obs"], batch_size=64)) if loader == "sequences" else \
        (lambda s: s.transitions(2, gamma=0.9, columns=["obs"], batch_size=64))
    twice = [list(call(store)) for _ in range(2)]
    assert built() == 1  # kept open for the second
    once = list(call(private(store)))
    for got in twice:
        same(got, once)
    same(list(call(trajstore.open(store.uri))), once)  # another Store object finds the saved layout
    assert built() == 2  # the private store's own, and no other


def test_an_iterator_maps_its_files_once(store: trajstore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    write(store, "a", 0, T=200)
    list(store.sequences(4, batch_size=8, columns=["obs", "action", "reward"]))  # built (maps batch by batch)
    opened = []
    real = np.memmap.__new__

    def counted(cls: type, *args: object, **kwargs: object) -> np.memmap:
        opened.append(args)
        return real(cls, *args, **kwargs)

    monkeypatch.setattr(np.memmap, "__new__", counted)
    it = store.sequences(4, batch_size=8, columns=["obs", "action", "reward"])
    batches = list(it)
    assert len(batches) >= 10 and len(opened) == 3  # one map per column for the whole iteration


def test_stride_one_windows_hold_memory_per_episode_not_per_window(store: trajstore.Store) -> None:
    """300,000 windows: a per-window int64 array alone would be 2.4 MB; the iterator holds far less."""
    with store.writer(run_id="a", env_id="E") as w:
        rng = np.random.default_rng(0)
        for _ in range(3):
            w.add_batch(make_batch(rng, 1000, 100, obs_dim=1, p_terminated=0.002, p_truncated=0.0))
    list(store.sequences(8, stride=1, columns=["reward"], batch_size=4096, shuffle=True))  # built
    next(store.transitions(1, gamma=0.5, columns=["reward"], batch_size=2))  # built, and both kernels compiled
    for kind in ("sequences", "transitions"):
        tracemalloc.start()
        try:
            if kind == "sequences":
                it = store.sequences(8, stride=1, columns=["reward"], batch_size=256, shuffle=True, epoch=1)
            else:
                it = store.transitions(3, gamma=0.9, columns=["reward"], batch_size=256, shuffle=True, epoch=1)
            next(it)
            next(it)
            held, peak = tracemalloc.get_traced_memory()
        finally:
            tracemalloc.stop()
        assert it.items > 250_000, kind
        assert held < 600_000 and peak < 2_400_000, (kind, held, peak)  # less than one int64 per window
        it.close()


def test_a_saved_layout_of_no_episodes_loads_and_maps() -> None:
    """A selection that keeps no episode is laid out, saved, loaded back (a later process, or the cache) and
    read: its offsets are as many as its episodes, none (once one more: a 500 over REST)."""
    empty = np.zeros(0, np.int64)
    layout = Layout(empty, empty.copy(), empty.copy())
    layout.new_column("x", np.dtype(np.float32), (2,))
    layout.save()
    loaded = Layout.load(layout.folder, layout.describe())
    assert len(loaded.offset) == len(loaded.length) == 0 and loaded.steps == 0
    view = loaded.mapped()
    try:
        assert view.spans.episodes.shape == (0, 3)
    finally:
        view.close()
        layout.close()
