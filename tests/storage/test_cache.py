"""The one rule every cache of a store's data files follows (storage/cache.py): an entry is read only for the file it
names as it is, is written whole or not at all, goes with its file, and prune removes what a killed writer left and
what the table no longer has; a bounded cache drops the entries written longest ago first."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

from tests.helpers import make_batch
from trajstore.storage.arrays import StepArrays
from trajstore.storage.cache import TEMPORARY, FileCopies, FileId, StoreCache
from trajstore.storage.summaries import Footer, Summaries, Summary

PARQUET = "run_id=a/env_id=E/part-1.parquet"


def summary() -> Summary:
    return Summary(Footer(pa.schema([("reward", pa.float32())])), pa.table({"episode_id": [1, 2], "rows": [3, 4]}))


def stored_rows(steps: int = 8) -> pa.Table:
    """Rows as a writer stores them: one env, episode ids and steps, float observations and rewards."""
    batch = make_batch(np.random.default_rng(0), steps, 1)
    return pa.table({"episode_id": pa.array([7] * steps, pa.int64()), "step": pa.array(range(steps), pa.int32()),
                     "obs": pa.array(list(batch["obs"][:, 0]), pa.list_(pa.float32(), 3)),
                     "reward": pa.array(batch["reward"][:, 0], pa.float32())})


def test_each_kind_writes_reads_and_removes_an_entry_of_one_file(tmp_path: Path) -> None:
    f = FileId(PARQUET, 1234, 99)
    copies, summaries, arrays = FileCopies(tmp_path / "files"), Summaries(tmp_path / "summaries"), \
        StepArrays(tmp_path / "arrays")
    assert copies.write(FileId(PARQUET, 5), b"PAR1 five")  # a copy's identity is its bytes' size
    assert summaries.write(f.rel, f.size, f.modified_ns, summary())
    assert arrays.write(f, stored_rows())
    assert Path(copies.read(FileId(PARQUET, 9)) or "").read_bytes() == b"PAR1 five"
    assert summaries.read(f.rel, f.size, f.modified_ns).fragments.num_rows == 2  # type: ignore[union-attr]
    found = arrays.read(f)
    assert found is not None and found.rows == 8 and found.fragments.tolist() == [[7, 0, 0, 8]]
    assert Path(copies.path_of(PARQUET)).relative_to(tmp_path / "files").as_posix() == PARQUET  # the table's path
    for cache in (copies, summaries, arrays):
        cache.remove(PARQUET)
        cache.remove(PARQUET)  # gone already is fine
    assert copies.read(FileId(PARQUET, 9)) is None and summaries.read(f.rel, f.size, f.modified_ns) is None
    assert arrays.read(f) is None and not (tmp_path / "files" / "run_id=a").exists()  # empty partitions go too


@pytest.mark.parametrize("other", [FileId(PARQUET, 1235, 99), FileId(PARQUET, 1234, 100),
                                   FileId("run_id=a/env_id=E/part-2.parquet", 1234, 99)],
                         ids=["size", "modified", "path"])
def test_an_entry_is_never_read_for_a_file_of_another_size_time_or_path(tmp_path: Path, other: FileId) -> None:
    f = FileId(PARQUET, 1234, 99)
    summaries, arrays, copies = Summaries(tmp_path / "s"), StepArrays(tmp_path / "a"), FileCopies(tmp_path / "f")
    summaries.write(f.rel, f.size, f.modified_ns, summary())
    arrays.write(f, stored_rows())
    copies.write(f, b"x" * f.size)
    assert summaries.read(other.rel, other.size, other.modified_ns) is None
    assert arrays.read(other) is None
    if other.rel == f.rel and other.size != f.size:
        assert copies.read(other) is None
    for cache in (summaries, arrays):  # a file of another path: its own entry, of the other path, is not this one
        os.replace(cache.path_of(f.rel), cache.path_of(other.rel))
    assert summaries.read(other.rel, other.size, other.modified_ns) is None and arrays.read(other) is None


KILLED_WRITER = """
import sys, time
from trajstore.storage.cache import FileCopies, FileId
copies = FileCopies(sys.argv[1])
with copies.writing(sys.argv[2]) as partial, open(partial, "wb") as out:
    out.write(b"PAR1 half a file")
    out.flush()
    print("writing", flush=True)
    time.sleep(60)  # killed here
"""


def test_a_killed_write_leaves_a_temporary_nothing_reads_and_prune_removes(tmp_path: Path) -> None:
    folder = tmp_path / "files"
    writer = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(folder), PARQUET], stdout=subprocess.PIPE,
                              env={**os.environ, "PYTHONPATH": os.pathsep.join(sys.path)})
    try:
        assert writer.stdout is not None and writer.stdout.readline() == b"writing\n"
    finally:
        writer.kill()
        writer.wait()
    copies = FileCopies(folder)
    left = [p.name for p in folder.iterdir()]
    assert len(left) == 1 and left[0].startswith(TEMPORARY)
    assert copies.read(FileId(PARQUET, len(b"PAR1 half a file"))) is None  # nothing is in place
    assert copies.prune(lambda rel: True) == [] and len(list(folder.iterdir())) == 1  # it may be a live writer's
    assert copies.prune(lambda rel: True, now=time.time() + 3601) == [] and not list(folder.iterdir())


def test_prune_removes_the_entries_of_files_no_longer_in_the_table(tmp_path: Path) -> None:
    kept, gone = FileId(PARQUET, 10), FileId("run_id=b/env_id=E/part-9.parquet", 10)
    summaries, arrays, copies = Summaries(tmp_path / "s"), StepArrays(tmp_path / "a"), FileCopies(tmp_path / "f")
    for f in (kept, gone):
        summaries.write(f.rel, f.size, f.modified_ns, summary())
        arrays.write(f, stored_rows())
        copies.write(f, b"0123456789")
    (tmp_path / "s" / "0123.arrow").write_bytes(b"?")  # unreadable: removed once old, like a temporary
    for cache in (summaries, arrays, copies):
        assert cache.prune(lambda rel: rel == kept.rel) == [gone.rel]
    assert summaries.read(kept.rel, kept.size, 0) is not None and summaries.read(gone.rel, gone.size, 0) is None
    assert arrays.read(kept) is not None and arrays.read(gone) is None
    assert copies.read(kept) is not None and copies.read(gone) is None
    assert (tmp_path / "s" / "0123.arrow").exists()
    summaries.prune(lambda rel: True, now=time.time() + 3601)
    assert not (tmp_path / "s" / "0123.arrow").exists()


def test_a_bounded_cache_drops_the_entries_written_longest_ago(tmp_path: Path) -> None:
    bound = StoreCache(tmp_path, max_bytes=2500)
    copies = bound.add(FileCopies(tmp_path / "files"))
    assert isinstance(copies, FileCopies)
    ids = [FileId(f"run_id=a/env_id=E/part-{i}.parquet", 1000) for i in range(4)]
    for i, f in enumerate(ids):
        copies.write(f, b"x" * 1000)
        os.utime(copies.path_of(f.rel), (1000 + i, 1000 + i))  # written in this order
    assert bound.bound() == 2000
    assert [copies.read(f) is not None for f in ids] == [False, False, True, True]
    assert bound.bound() == 0
