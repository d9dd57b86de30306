"""Compaction: fewer files, the same steps and types, safe next to writers, other compactions and readers."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trajstore
from tests import delta_protocol
from tests.helpers import make_batch, steps_table
from trajstore.errors import UnsupportedTableError
from trajstore.storage.table import StepsTable
from trajstore.store import check, compact, remove_orphans


def many_files(store: trajstore.Store, seed: int = 0) -> None:
    """Two partitions of many small commits, and a third env whose extra column the others lack."""
    rng = np.random.default_rng(seed)
    for run in ("a", "b"):
        with store.writer(run_id=run, env_id="Small-v0", flush_bytes=1, policy_version=2) as w:
            for _ in range(8):
                w.add_batch(make_batch(rng, 12, 3))
    with store.writer(run_id="a", env_id="Wide-v0") as w:
        w.add_batch(make_batch(rng, 10, 2, obs_dim=6, extras={"value": rng.random((10, 2)).astype(np.float32)}))


def everything(store: trajstore.Store) -> pa.Table:
    return store.sql("SELECT * FROM steps ORDER BY episode_id, step")


def test_partitions_become_one_file_each_with_the_same_steps(store: trajstore.Store,
                                                            capsys: pytest.CaptureFixture[str]) -> None:
    from trajstore import cli

    many_files(store)
    before = everything(store)
    columns = store.sql("SELECT * FROM steps LIMIT 0").column_names
    episodes = store.episodes(order_by="episode_id").select(["episode_id", "episode_length", "episode_return",
                                                              "complete", "policy_version"])
    assert len(store.maintain.files()) == 17
    assert cli.main(["compact", "--store", str(store.root), "--no-progress"]) == 0
    assert "compacted 2 partition(s): 16 files into 2" in capsys.readouterr().out
    files = store.maintain.files()
    assert sorted((f.run_id, f.env_id) for f in files) == [("a", "Small-v0"), ("a", "Wide-v0"), ("b", "Small-v0")]
    assert everything(store).equals(before)
    assert store.sql("SELECT * FROM steps LIMIT 0").column_names == columns  # the view's order stays
    assert store.episodes(order_by="episode_id").select(episodes.column_names).equals(episodes)
    assert check(store).ok
    for f in files:  # the writer's types and no partition columns inside the files
        schema = pq.read_schema(f.path)
        obs = [n for n in schema.names if n.startswith("obs")][0]
        assert pa.types.is_fixed_size_list(schema.field(obs).type) and "run_id" not in schema.names
    assert "value" in steps_table(store).log.read().schema.names  # the table keeps every column
    assert compact(store, progress=False).partitions == 0  # nothing left to gain
    rng = np.random.default_rng(9)
    with store.writer(run_id="a", env_id="Small-v0") as w:  # the compacted env still takes writes
        w.add_batch(make_batch(rng, 5, 3))
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == before.num_rows + 15


def test_only_the_chosen_partitions_and_target_sizes(store: trajstore.Store) -> None:
    many_files(store)
    report = compact(store, run_id="b", progress=False)
    assert (report.partitions, report.files_before, report.files_after) == (1, 8, 1)
    assert len([f for f in store.maintain.files() if f.run_id == "a"]) == 9
    sizes = [f.size for f in store.maintain.files() if f.run_id == "a" and f.env_id == "Small-v0"]
    report = compact(store, env_id="Small-v0", target_bytes=3 * max(sizes), progress=False)
    assert report.partitions == 1 and report.files_before == 8 and 2 <= report.files_after <= 4
    with pytest.raises(trajstore.InputError, match="target_bytes"):
        compact(store, target_bytes=0)


def test_a_table_with_rows_deleted_through_a_deletion_vector_is_never_compacted(store: trajstore.Store) -> None:
    """Another engine deleted an episode through a deletion vector: compacting would rewrite its rows into a new file
    without one and bring them back. It is refused, naming the feature, and nothing is committed: the episode stays
    deleted for every engine that applies deletion vectors."""
    many_files(store)
    gone = store.episodes(run_id="b").sort_by("episode_id")["episode_id"][0].as_py()
    deleted = delta_protocol.delete_episode(steps_table(store).path, gone)
    kept = delta_protocol.deltalake_episodes(steps_table(store).path)
    with pytest.raises(UnsupportedTableError, match=f"at version {deleted}: .*reader feature deletionVectors"):
        compact(store, progress=False)
    assert store.version == deleted
    assert delta_protocol.deltalake_episodes(steps_table(store).path) == kept and gone not in kept


def test_an_append_during_compaction_is_kept(store: trajstore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    many_files(store)
    real_write = StepsTable.write
    appended = {"rows": 0}

    def write_then_append(self: StepsTable, data: pa.Table, **kwargs: Any) -> Any:
        out = real_write(self, data, **kwargs)
        if not appended["rows"]:  # a writer commits to the same partition while compaction runs
            appended["rows"] = 1
            with store.writer(run_id=kwargs["run_id"], env_id=kwargs["env_id"], upkeep=None) as w:  # no merging
                w.add_batch(make_batch(np.random.default_rng(5), 7, 3))
        return out

    before = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
    monkeypatch.setattr(StepsTable, "write", write_then_append)
    report = compact(store, run_id="a", env_id="Small-v0", progress=False)
    assert report.partitions == 1
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == before + 21
    assert check(store).ok


def test_two_compactions_at_once_store_every_step_once(store: trajstore.Store,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    many_files(store)
    before = everything(store)
    real_write = StepsTable.write
    inner: dict[str, Any] = {}

    def write_during_another(self: StepsTable, data: pa.Table, **kwargs: Any) -> Any:
        out = real_write(self, data, **kwargs)
        if "report" not in inner:  # another compaction of the same partition finishes first
            inner["report"] = None
            monkeypatch.setattr(StepsTable, "write", real_write)
            inner["report"] = compact(store, run_id="a", env_id="Small-v0", progress=False)
        return out

    monkeypatch.setattr(StepsTable, "write", write_during_another)
    outer = compact(store, run_id="a", env_id="Small-v0", progress=False)
    assert inner["report"].partitions == 1
    assert outer.partitions == 0 and len(outer.skipped) == 1 and "was not committed" in outer.skipped[0]
    assert everything(store).equals(before)  # nothing lost, nothing twice
    partition = Path(store.maintain.files()[0].path).parents[1]
    on_disk = {str(p) for p in partition.rglob("*.parquet")}
    committed = {f.path for f in store.maintain.files()}
    assert len(on_disk - committed) == 8  # the 8 replaced files only: the failed compaction's file is gone


def test_removed_files_are_kept_for_readers_until_removed_long_enough_ago(store: trajstore.Store) -> None:
    many_files(store)
    old = [f.path for f in store.maintain.files() if f.run_id == "b"]
    long_ago = time.time() - 7200
    for path in old:  # written long ago: only the time of their removal counts
        os.utime(path, (long_ago, long_ago))
    reader = store.scan(["episode_id", "reward"], run_id="b", batch_size=10)  # listed before the compaction
    compact(store, run_id="b", progress=False)
    assert remove_orphans(store, older_than_s=3600) == []
    assert sum(b.num_rows for b in reader) == 8 * 12 * 3  # the reader still finds its files
    assert sorted(remove_orphans(store, older_than_s=0)) == sorted(old)
    assert check(store).ok and check(store).orphans == []
