"""Loader layouts kept between calls: the next epoch over the same selection reuses the column files; a new
commit, another selection or other columns build anew; an evicted layout is removed once nobody uses it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.query.layout import Layout, LayoutCache
from trajstore.settings import Settings


def write(store: trajstore.Store, run: str, seed: int) -> None:
    with store.writer(run_id=run, env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(seed), 30, 4, p_terminated=0.1))


def epoch(store: trajstore.Store, **kwargs: object) -> list[dict[str, np.ndarray]]:
    return list(store.sequences(4, columns=["obs", "reward"], pad=True, batch_size=16, shuffle=True, **kwargs))


def folders(store: trajstore.Store) -> list[Path]:
    return [Path(layout.folder.name) for layout in store._layouts._entries.values() if layout.folder]


def test_the_next_epoch_reuses_the_layout_and_gives_what_a_fresh_one_gives(store: trajstore.Store,
                                                                            tmp_path: Path) -> None:
    write(store, "a", 0)
    first = epoch(store, epoch=0)
    kept = folders(store)
    assert len(kept) == 1 and kept[0].exists()  # the iteration ended; its files stay for the next epoch
    second = epoch(store, epoch=1)
    assert folders(store) == kept
    fresh = trajstore.Store(store.location, settings=Settings(loader_layouts=0))
    for got, want in ((first, epoch(fresh, epoch=0)), (second, epoch(fresh, epoch=1))):
        assert len(got) == len(want)
        for a, b in zip(got, want):
            for k in b:
                np.testing.assert_array_equal(a[k], b[k])
    assert len(fresh._layouts) == 0


def test_a_commit_other_columns_or_gamma_build_anew_and_the_old_files_go(store: trajstore.Store) -> None:
    write(store, "a", 0)
    epoch(store)
    (old,) = folders(store)
    write(store, "b", 1)  # a new version: its windows include run b
    assert sum(len(b["episode_id"]) for b in epoch(store)) > 0
    (new,) = folders(store)
    assert new != old and not old.exists()
    list(store.sequences(4, columns=["obs", "return_to_go"], gamma=0.9, pad=True))
    (rtg,) = folders(store)
    assert rtg != new and not new.exists()
    a = list(store.sequences(4, columns=["return_to_go"], gamma=0.5, pad=True, batch_size=10_000))[0]
    b = list(trajstore.Store(store.location, settings=Settings(loader_layouts=0)).sequences(
        4, columns=["return_to_go"], gamma=0.5, pad=True, batch_size=10_000))[0]
    np.testing.assert_array_equal(a["return_to_go"], b["return_to_go"])  # gamma is part of what is kept


def test_an_evicted_layout_stays_while_an_iterator_reads_it(store: trajstore.Store) -> None:
    write(store, "a", 0)
    running = store.sequences(4, columns=["obs"], pad=True, batch_size=2)
    next(running)
    (held,) = folders(store)
    list(store.sequences(4, columns=["reward"], pad=True))  # evicts the first layout
    assert held.exists() and held not in folders(store)
    rest = list(running)  # still gathers from its files
    assert rest and not held.exists()  # gone once its last reader finished


def test_the_cache_builds_once_per_key_and_closes_on_release() -> None:
    built: list[Layout] = []

    def make() -> Layout:
        layout = Layout(np.zeros(1, np.int64), np.ones(1, np.int64), np.zeros(1, np.int64))
        layout.new_column("x", np.dtype(np.float32), ())
        built.append(layout)
        return layout

    cache = LayoutCache(1)
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
    uncached, release = LayoutCache(0).get("k", make)
    release()
    assert uncached.folder is None


@pytest.mark.parametrize("loader", ["sequences", "transitions"])
def test_both_loaders_keep_and_share_nothing_wrong(store: trajstore.Store, loader: str) -> None:
    write(store, "a", 0)
    call = (lambda s: s.sequences(3, columns=["obs"], batch_size=64)) if loader == "sequences" else \
        (lambda s: s.transitions(2, gamma=0.9, columns=["obs"], batch_size=64))
    twice = [list(call(store)) for _ in range(2)]
    once = list(call(trajstore.Store(store.location, settings=Settings(loader_layouts=0))))
    for got in twice:
        for a, b in zip(got, once, strict=True):
            for k in b:
                np.testing.assert_array_equal(a[k], b[k])
