"""Vacuum: files no retained version needs are deleted, and then a plain Parquet reader of the folder counts what
the log counts; versions within the horizon still read; a dry run and a killed vacuum delete nothing needed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Callable

import numpy as np
import pyarrow.dataset as ds
import pytest
from deltalake import DeltaTable

import trajstore
from tests import seaweed
from tests.helpers import make_batch
from tests.storage.helpers import fill_two_runs
from trajstore.errors import InputError, StoreDamagedError, VersionNotFoundError
from trajstore.operations.vacuum import parse_duration
from trajstore.store import check, plumbing


def fill(store: trajstore.Store) -> None:
    fill_two_runs(store, seed=0, batches=5, steps=8, envs=2)


def folder_rows(store: trajstore.Store) -> int:
    """What a reader that globs the folder (not the log) counts."""
    return ds.dataset(Path(store.root) / "steps", format="parquet", partitioning="hive").count_rows()


def logged_rows(store: trajstore.Store) -> int:
    return store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()


def test_after_delete_compact_and_vacuum_the_folder_holds_what_the_log_lists(store: trajstore.Store) -> None:
    fill(store)
    store.maintain.delete(run_id="a")
    trajstore.compact(store, progress=False)
    assert folder_rows(store) > logged_rows(store)  # the removed files are still there for old versions
    old = store.version - 2
    kept = store.maintain.vacuum(older_than="1h")  # removed just now: every version of the last hour needs them
    assert kept.files == [] and trajstore.open(store.uri, version=old).stats()["n_traj"][0].as_py() > 0
    dry = store.maintain.vacuum(older_than=0, dry_run=True)
    assert dry.files and all(os.path.exists(f) for f in dry.files) and folder_rows(store) > logged_rows(store)
    report = store.maintain.vacuum(older_than=0)
    assert sorted(report.files) == sorted(dry.files) and report.bytes > 0
    assert folder_rows(store) == logged_rows(store)
    assert check(store).ok and not check(store).orphans
    with pytest.raises(VersionNotFoundError, match=rf"version: version {old} can no longer be read: `trajstore "
                                                   r"vacuum` deleted \d+ of its files \(first: .*\), which versions up "
                                                   rf"to {old + 2} \(compact, .*\) had removed from the store; the "
                                                   rf"store is not damaged: the latest version, {old + 2}, does not "
                                                   r"need them"):
        trajstore.open(store.uri, version=old)
    assert trajstore.open(store.uri, version=store.version).stats()["n_traj"][0].as_py() > 0


def test_vacuum_removes_the_runs_tables_merged_files(store: trajstore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """Each description change adds a file to the ``runs`` table and a compaction merges them every so often: a vacuum
    removes the merged-away files (past the grace, here none), and every description reads as before."""
    from trajstore.operations import vacuum as vacuum_op
    from trajstore.storage import runs_log
    monkeypatch.setattr(runs_log, "COMPACT_FILES", 4)
    monkeypatch.setattr(vacuum_op, "UNCOMMITTED_GRACE_S", 0.0)
    fill(store)
    for k in range(9):
        store.set_run("a", config={"k": k}, notes="n" * k)
    runs = Path(store.root) / "runs"
    on_disk = lambda: sorted(p.name for p in runs.glob("*.parquet"))  # noqa: E731
    listed = lambda: sorted(Path(p).name for p in DeltaTable(str(runs)).file_uris())  # noqa: E731
    assert len(on_disk()) > len(listed())  # the merged-away files are still there for older versions
    before = trajstore.open(store.uri).run_info("a")
    report = store.maintain.vacuum(older_than=0)
    assert on_disk() == listed() and any("/runs/" in f for f in report.files)
    assert trajstore.open(store.uri).run_info("a") == before and before["config"] == {"k": 8}


def test_uncommitted_files_get_a_grace_period(store: trajstore.Store) -> None:
    fill(store)
    stray = Path(store.root) / "steps" / "run_id=a" / "env_id=E" / "part-stray.parquet"
    stray.write_bytes(b"half a file")
    assert store.maintain.vacuum(older_than=0).files == []  # a writer may be about to commit it
    old = time.time() - 2 * 3600
    os.utime(stray, (old, old))
    assert store.maintain.vacuum(older_than="1h").files == [str(stray)]


def test_durations() -> None:
    assert parse_duration("7d") == 7 * 86400 and parse_duration("12h") == 43200 and parse_duration(90) == 90.0
    with pytest.raises(InputError, match="older_than: expected a duration such as 7d, 12h, 30m"):
        parse_duration("a week")
    with pytest.raises(InputError, match="older_than: must be a duration >= 0s"):
        parse_duration(-1)


KILLED = """
import sys, trajstore
store = trajstore.open(sys.argv[1])
print("ready", flush=True)
store.maintain.vacuum(older_than=0)
"""


def test_a_killed_vacuum_leaves_a_readable_store(store: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    with store.writer(run_id="a", env_id="E", flush_bytes=1) as w:
        for _ in range(60):
            w.add_batch(make_batch(rng, 4, 2))
    trajstore.compact(store, progress=False)
    rows = logged_rows(store)
    proc = subprocess.Popen([sys.executable, "-c", KILLED, str(store.root)], stdout=subprocess.PIPE, text=True,
                            cwd=Path(__file__).parents[2])
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    time.sleep(0.3)
    proc.kill()
    proc.wait()
    assert check(store).ok and logged_rows(store) == rows
    store.maintain.vacuum(older_than=0)
    assert folder_rows(store) == rows


def reads(store: trajstore.Store, episode: int = 0) -> dict[str, Callable[[], object]]:
    """Every kind of read a store answers from its files (``episode``: the one whose steps are read, from the
    files that hold it alone)."""
    return {
        "stats": store.stats, "episodes": store.episodes, "runs": store.runs, "curves": store.curves,
        "binned_curves": plumbing(store).binned_curves, "histogram": plumbing(store).histogram,
        "returns": lambda: store.returns(gamma=0.9, per="step"),
        "sql": lambda: store.sql("SELECT count(*) FROM steps"),
        "sandboxed_sql": lambda: plumbing(store).sandboxed_sql("SELECT sum(reward) FROM steps"),
        "scan": lambda: store.scan().read_all(),
        "scan_where": lambda: store.scan(where="episode_length > 0").read_all(),
        "iter_batches": lambda: list(store.iter_batches(batch_size=7)),
        "steps_page": lambda: plumbing(store).steps_page(limit=5),
        "episode_steps": lambda: store.episode_steps(episode),
        "schema": lambda: store.schema(env_id="E"),
        "sequences": lambda: list(store.sequences(3, batch_size=4)),
        "transitions": lambda: list(store.transitions(2, gamma=0.9, batch_size=4)),
    }


def test_every_read_of_a_vacuumed_version_is_version_not_found_never_damage(store: trajstore.Store) -> None:
    fill(store)
    old = store.version
    pinned = trajstore.open(store.uri, version=old)
    assert pinned.stats()["n_traj"][0].as_py() > 0  # read (and its caches filled) before the vacuum
    episode = store.episodes(run_id="a", limit=1)["episode_id"][0].as_py()  # (pinned: no episodes cached)
    store.maintain.delete(run_id="a")
    trajstore.compact(store, progress=False)
    assert store.maintain.vacuum(older_than=0).files and check(store).ok
    for read in reads(pinned, episode).values():
        with pytest.raises(VersionNotFoundError, match=rf"version: version {old} can no longer be read: `trajstore "
                                                       rf"vacuum` deleted its file .*, which version ({old + 1} "
                                                       rf"\(delete|{old + 2} \(compact), .*\) had removed from the "
                                                       r"store; the store is not damaged"):
            read()
    for read in reads(store).values():  # the latest version reads
        read()


def test_the_rows_of_a_commit_whose_files_were_vacuumed_are_version_not_found(store: trajstore.Store) -> None:
    fill(store)
    first = store.history()["version"][2].as_py()  # the first append (after create and the columns' commit)
    assert plumbing(store).commit_rows(first).rows.num_rows > 0
    trajstore.compact(store, progress=False)
    store.maintain.vacuum(older_than=0)
    with pytest.raises(VersionNotFoundError, match=rf"version: version {first} can no longer be read: .*, which "
                                                   r"version \d+ \(compact, "):
        plumbing(store).commit_rows(first)
    with pytest.raises(VersionNotFoundError, match=rf"version: version {first} can no longer be read"):
        next(store.follow(since=first - 1, timeout=0.1))


def test_a_reader_of_the_latest_version_whose_files_a_vacuum_removes_meanwhile(store: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    with store.writer(run_id="a", env_id="E", flush_bytes=1) as w:
        for _ in range(40):
            w.add_batch(make_batch(rng, 4, 2))
    began = store.version
    snap = store.snapshot()  # holds the file list of the version it began at
    trajstore.compact(store, progress=False)
    store.maintain.vacuum(older_than=0)
    gone = r"version: the version this read began at can no longer be read: `trajstore vacuum` deleted its file " \
           rf".* while the read used it, which version {began + 1} \(compact, .*\) had removed from the store; the " \
           rf"store is not damaged: read again \(the latest version is {began + 1}\)"
    with pytest.raises(VersionNotFoundError, match=gone):
        snap.arrow("SELECT count(*) AS n FROM steps")
    assert store.stats()["n_traj"][0].as_py() > 0  # read again: the new version


def test_a_missing_file_the_latest_version_lists_is_still_damage(store: trajstore.Store) -> None:
    fill(store)
    old = store.version
    pinned = trajstore.open(store.uri, version=old)
    os.remove(store.maintain.files()[0].path)  # listed by the latest version (and by the pinned one)
    for s in (store, pinned):
        for name, read in reads(s).items():
            if name == "schema" or name == "episode_steps":
                continue  # may not read that file
            with pytest.raises(StoreDamagedError, match="is missing; the store is damaged"):
                read()
    assert not check(store).ok


@pytest.mark.s3
def test_a_vacuumed_version_on_s3_is_version_not_found(s3: seaweed.SeaweedFS) -> None:
    store = trajstore.open(f"s3://{s3.bucket()}/vac", create=True, storage_options=s3.storage_options)
    fill(store)
    old = store.version
    pinned = trajstore.open(store.uri, storage_options=s3.storage_options, version=old)
    assert pinned.stats()["n_traj"][0].as_py() > 0
    episode = store.episodes(run_id="a", limit=1)["episode_id"][0].as_py()  # (pinned: no episodes cached)
    store.maintain.delete(run_id="a")
    store.maintain.vacuum(older_than=0)
    for name, read in reads(pinned, episode).items():
        if name == "schema":
            continue  # reads the newest file, of run b, still there
        with pytest.raises(VersionNotFoundError, match=rf"version: version {old} can no longer be read: `trajstore "
                                                       rf"vacuum` deleted its file s3://.*, which version {old + 1} "
                                                       r"\(delete, "):
            read()
    with pytest.raises(VersionNotFoundError, match=rf"version {old} can no longer be read"):
        trajstore.open(store.uri, storage_options=s3.storage_options, version=old)
    assert store.stats()["n_traj"][0].as_py() > 0 and check(store).ok
