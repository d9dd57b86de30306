"""Vacuum: files no retained version needs are deleted, and then a plain Parquet reader of the folder counts what
the log counts; versions within the horizon still read; a dry run and a killed vacuum delete nothing needed."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow.dataset as ds
import pytest

import trajstore
from tests.storage.helpers import fill_two_runs
from tests.helpers import make_batch
from trajstore.errors import InputError, VersionNotFoundError
from trajstore.storage.check import check
from trajstore.storage.vacuum import parse_duration


def fill(store: trajstore.Store) -> None:
    fill_two_runs(store, seed=0, batches=5, steps=8, envs=2)


def folder_rows(store: trajstore.Store) -> int:
    """What a reader that globs the folder (not the log) counts."""
    return ds.dataset(Path(store.root) / "steps", format="parquet", partitioning="hive").count_rows()


def logged_rows(store: trajstore.Store) -> int:
    return store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()


def test_after_delete_compact_and_vacuum_the_folder_holds_what_the_log_lists(store: trajstore.Store) -> None:
    fill(store)
    store.delete(run_id="a")
    trajstore.compact(store, progress=False)
    assert folder_rows(store) > logged_rows(store)  # the removed files are still there for old versions
    old = store.version - 2
    kept = store.vacuum(older_than="1h")  # removed just now: every version of the last hour needs them
    assert kept.files == [] and trajstore.open(store.uri, version=old).stats()["n_traj"][0].as_py() > 0
    dry = store.vacuum(older_than=0, dry_run=True)
    assert dry.files and all(os.path.exists(f) for f in dry.files) and folder_rows(store) > logged_rows(store)
    report = store.vacuum(older_than=0)
    assert sorted(report.files) == sorted(dry.files) and report.bytes > 0
    assert folder_rows(store) == logged_rows(store)
    assert check(store).ok and not check(store).orphans
    with pytest.raises(VersionNotFoundError, match=rf"version: version {old} can no longer be read: \d+ of its "
                                                   r"files were removed \(by `trajstore vacuum`"):
        trajstore.open(store.uri, version=old)
    assert trajstore.open(store.uri, version=store.version).stats()["n_traj"][0].as_py() > 0


def test_uncommitted_files_get_a_grace_period(store: trajstore.Store) -> None:
    fill(store)
    stray = Path(store.root) / "steps" / "run_id=a" / "env_id=E" / "part-stray.parquet"
    stray.write_bytes(b"half a file")
    assert store.vacuum(older_than=0).files == []  # a writer may be about to commit it
    old = time.time() - 2 * 3600
    os.utime(stray, (old, old))
    assert store.vacuum(older_than="1h").files == [str(stray)]


def test_durations() -> None:
    assert parse_duration("7d") == 7 * 86400 and parse_duration("12h") == 43200 and parse_duration(90) == 90.0
    with pytest.raises(InputError, match="older_than: expected a duration like 7d"):
        parse_duration("a week")
    with pytest.raises(InputError, match="older_than: must not be negative"):
        parse_duration(-1)


KILLED = """
import sys, trajstore
store = trajstore.open(sys.argv[1])
print("ready", flush=True)
store.vacuum(older_than=0)
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
    store.vacuum(older_than=0)
    assert folder_rows(store) == rows
