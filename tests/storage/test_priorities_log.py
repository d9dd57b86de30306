"""The priorities table on its own: other engines read it as its columns say (each described in its field comment),
commits racing from many threads all land as versions of their own with their number in their rows, merged files
keep each item's latest row, and a deleted episode's rows go from every replay."""

from __future__ import annotations

import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

from trajstore.errors import InputError
from trajstore.storage import priorities_log as pl
from trajstore.storage.location import locate


def rows(episode: list[int], step: list[int], priority: list[float]) -> pa.Table:
    n = len(episode)
    return pa.table({"episode_id": pa.array(episode, pa.int64()), "step": pa.array(step, pa.int32()),
                     "agent_id": pa.nulls(n, pa.string()), "priority": pa.array(priority, pa.float64()),
                     "time": pa.array(np.full(n, time.time_ns() // 1000), pa.int64()).cast(pa.timestamp("us", "UTC"))})


@pytest.fixture
def table(tmp_path: Path) -> pl.PrioritiesLog:
    return pl.PrioritiesLog(locate(tmp_path).child(pl.FOLDER))


def latest(log: pl.PrioritiesLog, name: str) -> dict[tuple[int, int], tuple[float, int]]:
    got = pl.latest_rows(log.rows(name).files).to_pylist()
    return {(r["episode_id"], r["step"]): (r["priority"], r["version"]) for r in got}


def test_another_engine_reads_what_the_columns_say(table: pl.PrioritiesLog) -> None:
    table.append("dqn", rows([7, 7, 8], [0, 1, 0], [0.5, 1.5, 2.0]))
    version = table.append("dqn", rows([7], [1], [9.0]))
    found = DeltaTable(table.uri)
    schema = found.schema().to_arrow()
    assert [f.name for f in schema] == [f.name for f in pl.SCHEMA]
    assert all(json_comment(found, f.name) for f in pl.SCHEMA)
    assert found.metadata().partition_columns == ["replay"] and "highest version" in found.metadata().description
    every = pa.table(found.to_pyarrow_table()).to_pylist()
    assert sorted((r["episode_id"], r["step"], r["priority"], r["version"]) for r in every) == \
        [(7, 0, 0.5, version - 1), (7, 1, 1.5, version - 1), (7, 1, 9.0, version), (8, 0, 2.0, version - 1)]
    assert latest(table, "dqn") == {(7, 0): (0.5, version - 1), (7, 1): (9.0, version), (8, 0): (2.0, version - 1)}


def json_comment(table: DeltaTable, name: str) -> str:
    field = next(f for f in table.schema().fields if f.name == name)
    return str(field.metadata.get("comment", ""))


def test_racing_commits_all_land_each_with_its_own_version(tmp_path: Path) -> None:
    tables = [pl.PrioritiesLog(locate(tmp_path).child(pl.FOLDER)) for _ in range(4)]  # as four processes would
    tables[0].append("r", rows([0], [0], [0.0]))
    landed: list[tuple[int, int, int]] = []
    errors: list[BaseException] = []

    def learner(i: int) -> None:
        try:
            for k in range(8):
                landed.append((tables[i].append("r", rows([i + 1, 0], [k, 0], [float(k), 100.0 * i + k])), i, k))
        except BaseException as exc:  # noqa: BLE001 - reported below
            errors.append(exc)

    threads = [threading.Thread(target=learner, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors
    versions = [v for v, _, _ in landed]
    assert len(set(versions)) == 32
    got = latest(tables[0], "r")
    assert all(got[(i + 1, k)] == (float(k), v) for v, i, k in landed)  # each row carries its commit's version
    last, i, k = max(landed)
    assert got[(0, 0)] == (100.0 * i + k, last)  # the item all of them gave: the latest commit's value


def test_merged_files_keep_each_items_latest_row(table: pl.PrioritiesLog) -> None:
    for k in range(pl.COMPACT_FILES + 3):
        table.append("m", rows([1, 2], [0, k], [float(k), float(k)]))
    table.append("other", rows([1], [0], [5.0]))
    files = table.rows("m").files
    assert len(files) < 8
    got = latest(table, "m")
    assert got[(1, 0)][0] == float(pl.COMPACT_FILES + 2) and len(got) == pl.COMPACT_FILES + 4
    assert latest(table, "other") == {(1, 0): (5.0, got[(1, 0)][1] + 1)}


def test_a_deleted_episodes_rows_go_from_every_replay(table: pl.PrioritiesLog) -> None:
    table.append("a", rows([1, 1, 2], [0, 1, 0], [1.0, 2.0, 3.0]))
    table.append("b", rows([1, 3], [5, 0], [4.0, 5.0]))
    assert table.delete_episodes(np.array([1])) == 3
    assert set(latest(table, "a")) == {(2, 0)} and set(latest(table, "b")) == {(3, 0)}
    assert table.delete_episodes(np.array([99])) == 0
    assert len(table.unneeded(0)) == 2  # the two files rewritten away, for a vacuum


@pytest.mark.parametrize("name", ["", "a b", "../x", "x" * 129, "é", None, 3])
def test_a_replays_name_is_a_plain_word(table: pl.PrioritiesLog, name: object) -> None:
    with pytest.raises(InputError, match="^priorities: a replay's name"):
        table.append(name, rows([1], [0], [1.0]))  # type: ignore[arg-type]
