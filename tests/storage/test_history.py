"""Versions: history() names every commit with its rows and runs; open(version=/as_of=) reads a store exactly as
it was, read-only."""

from __future__ import annotations

import time
from datetime import datetime, timedelta, timezone

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch, steps_table
from trajstore.errors import InputError, ReadOnlyError, VersionNotFoundError
from trajstore.store import plumbing


def write(store: trajstore.Store, run: str, seed: int) -> None:
    with store.writer(run_id=run, env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(seed), 10, 2))


def test_history_lists_each_commit(store: trajstore.Store) -> None:
    write(store, "a", 0)
    write(store, "b", 1)
    store.maintain.delete(run_id="a")
    h = store.history()
    assert h["version"].to_pylist() == list(range(store.version + 1))
    # the first writer reserves its columns in the log in a commit of their own, before its first file
    assert h["operation"].to_pylist() == ["create", "add_columns", "append", "append", "delete"]
    assert h["rows_added"].to_pylist() == [0, 0, 20, 20, 0]
    assert h["rows_removed"].to_pylist() == [0, 0, 0, 0, 20]
    assert h["run_ids"].to_pylist() == [[], [], ["a"], ["b"], ["a"]]
    assert h["timestamp"].to_pylist() == sorted(h["timestamp"].to_pylist())
    assert store.history(limit=1)["version"].to_pylist() == [4]


def test_a_store_opened_at_a_version_reads_as_it_was(store: trajstore.Store) -> None:
    write(store, "a", 0)
    stats, episodes, steps = store.stats(), store.episodes(), store.sql("SELECT * FROM steps ORDER BY episode_id, step")
    windows = [b["obs"] for b in store.sequences(3, columns=["obs"], pad=True, batch_size=64)]
    version, when = store.version, datetime.now(timezone.utc)
    time.sleep(0.05)
    write(store, "b", 1)
    store.maintain.delete(run_id="a")
    for old in (trajstore.open(store.uri, version=version), trajstore.open(store.uri, as_of=when)):
        assert old.read_only and old.version == version
        assert old.stats().to_pylist() == [pytest.approx(r) for r in stats.to_pylist()]
        assert old.episodes().equals(episodes)
        assert old.sql("SELECT * FROM steps ORDER BY episode_id, step").equals(steps)
        assert old.scan().read_all().num_rows == steps.num_rows and plumbing(old).run_ids() == ["a"]
        assert old.returns(gamma=0.9).num_rows == episodes.num_rows
        assert len(old.history()) == version + 1
        old_windows = [b["obs"] for b in old.sequences(3, columns=["obs"], pad=True, batch_size=64)]
        assert len(old_windows) == len(windows) and all(np.array_equal(a, b) for a, b in zip(old_windows, windows))
    assert plumbing(store).run_ids() == ["b"] and not store.read_only


def test_a_pinned_store_refuses_every_change(store: trajstore.Store) -> None:
    write(store, "a", 0)
    old = store.at(version=1)
    for change in (lambda: old.writer(run_id="a", env_id="E"), lambda: old.maintain.delete(run_id="a"),
                   lambda: old.maintain.vacuum(older_than=0), lambda: old.maintain.add_column("x", "reward"),
                   lambda: trajstore.compact(old), lambda: plumbing(old).ingest(store.sql("SELECT * FROM steps"),
                                                                       run_id="a", env_id="E")):
        with pytest.raises(ReadOnlyError, match="read-only at version 1"):
            change()
    with pytest.raises(PermissionError):
        old.maintain.delete(run_id="a")
    with pytest.raises(InputError, match=r"follow: this store is opened at version 1, which never changes; follow "
                                         r"the store itself from that version: "
                                         r"trajstore.open\(uri\).follow\(since=1\)"):
        next(old.follow(timeout=0.1))


def test_bad_versions_are_named(store: trajstore.Store) -> None:
    write(store, "a", 0)
    with pytest.raises(InputError, match=r"version: must be a version of this store, 0..2, got 7"):
        trajstore.open(store.uri, version=7)
    with pytest.raises(InputError, match="give one of them, not both"):
        trajstore.open(store.uri, version=0, as_of=datetime.now())
    with pytest.raises(InputError, match="as_of: .* is before the store's first readable version"):
        trajstore.open(store.uri, as_of=datetime.now(timezone.utc) - timedelta(days=1))


def test_a_version_whose_log_entries_were_cleaned_up_is_not_found(store: trajstore.Store) -> None:
    write(store, "a", 0)
    write(store, "b", 1)
    steps_table(store).log.checkpoint_if_due(0)  # the latest version reads from the checkpoint alone
    for version in (0, 1, 2):  # create, the columns' commit, a's append
        (store.root / "steps" / "_delta_log" / f"{version:020d}.json").unlink()
    with pytest.raises(VersionNotFoundError, match=r"version: version 2 can no longer be read \(its log entries were "
                                                   r"cleaned up\)"):
        trajstore.open(store.uri, version=2)
    assert trajstore.open(store.uri, version=3).stats()["n_traj"][0].as_py() == store.stats()["n_traj"][0].as_py()
