"""Following a store (``Store.follow``) while writers commit: every step once, in commit order, resumable."""

from __future__ import annotations

import shutil
import threading
from typing import Any

import pyarrow.parquet as pq
import pytest

import trajstore
from tests import delta_protocol
from tests.helpers import step_keys, steps_table, write_commits
from trajstore.errors import UnsupportedTableError
from trajstore.query.follow import new_commits


def test_follow_under_a_concurrent_writer_delivers_every_step_once_in_commit_order(store: trajstore.Store) -> None:
    write_commits(store, 1, run_id="before")  # seen already: following starts after it
    start = store.version
    writer = threading.Thread(target=write_commits, args=(store, 30))
    writer.start()
    got = []
    for commit in store.follow(["episode_id", "step", "reward"], since=start, poll=0.05, timeout=3.0):
        got.append(commit)
        if not writer.is_alive() and commit.version == store.version:
            break
    writer.join()
    versions = [c.version for c in got]
    assert versions == sorted(set(versions)) and versions[0] > start
    delivered = [k for c in got for k in step_keys(c.rows)]
    stored = step_keys(store.scan(["episode_id", "step"], run_id="live").read_all())
    assert len(delivered) == len(set(delivered)) == len(stored) == 30 * 6 * 8
    assert set(delivered) == set(stored)
    assert all(c.runs == ["live"] and c.rows.column_names == ["episode_id", "step", "reward"] for c in got)


def test_follow_resumes_after_a_version(store: trajstore.Store) -> None:
    write_commits(store, 6)
    every = list(store.follow(since=-1, timeout=0))
    assert [c.version for c in every] == list(range(2, store.version + 1))  # after the columns' commit
    middle = every[2].version
    rest = list(store.follow(since=middle, timeout=0))
    assert [c.version for c in rest] == [c.version for c in every[3:]]
    assert [step_keys(c.rows) for c in rest] == [step_keys(c.rows) for c in every[3:]]
    assert list(store.follow(timeout=0)) == []  # from now on: nothing new yet


def test_follow_selects_runs_and_passes_over_other_commits(store: trajstore.Store) -> None:
    write_commits(store, 2, run_id="a")
    write_commits(store, 3, run_id="b", seed=1)
    b = list(store.follow(["run_id", "step"], run_id="b", since=-1, timeout=0))
    assert len(b) == 3 and {r for c in b for r in c.rows["run_id"].to_pylist()} == {"b"}


def test_follow_episodes_yields_each_completed_episode_once(store: trajstore.Store) -> None:
    write_commits(store, 8)
    got = [r for c in store.follow(since=-1, episodes=True, timeout=0) for r in c.rows.to_pylist()]
    want = store.episodes(complete=True).to_pylist()
    assert sorted(r["episode_id"] for r in got) == sorted(r["episode_id"] for r in want)
    by_id = {r["episode_id"]: r for r in want}
    assert all(r["episode_return"] == pytest.approx(by_id[r["episode_id"]]["episode_return"]) for r in got)


def test_a_commit_adding_rows_marked_deleted_is_refused_not_followed(store: trajstore.Store) -> None:
    """Another engine's commit adds a file with a deletion vector that marks all its rows deleted, and a later one
    removes it (the latest version reads): following past that commit refuses it, naming the feature and the version,
    rather than deliver rows no version holds."""
    write_commits(store, 1)
    start, table = store.version, steps_table(store).path
    rel, add = next(iter(delta_protocol.live_adds(table).items()))
    copy = rel.replace(".parquet", "-copy.parquet")
    shutil.copyfile(table / rel, table / copy)
    rows = list(range(pq.read_metadata(table / copy).num_rows))
    marked = {**add, "path": copy, "deletionVector": delta_protocol.inline_deletion_vector(rows)}
    added = delta_protocol.commit(table, [{"add": marked}], "WRITE")
    gone = {"path": copy, "dataChange": True, "deletionTimestamp": 1, "deletionVector": marked["deletionVector"],
            "partitionValues": add["partitionValues"], "size": add["size"]}
    delta_protocol.commit(table, [{"remove": gone}], "DELETE")
    assert len(store.maintain.files()) == 1  # the latest version reads
    with pytest.raises(UnsupportedTableError, match=f"at version {added}: .*reader feature deletionVectors"):
        list(store.follow(since=start, timeout=0))


def test_waiting_backs_off_instead_of_polling_hard(store: trajstore.Store) -> None:
    write_commits(store, 1)
    waits: list[float] = []
    now = [0.0]

    def sleep(s: float) -> None:
        waits.append(s)
        now[0] += s

    assert len(list(new_commits(steps_table(store), since=-1, poll=1.0, timeout=10.0, sleep=sleep,
                                clock=lambda: now[0]))) == store.version + 1
    assert waits[:7] == pytest.approx([0.02, 0.04, 0.08, 0.16, 0.32, 0.64, 1.0])
    assert len(waits) < 20 and sum(waits) == pytest.approx(10.0)


@pytest.mark.parametrize(("kwargs", "message"), [({"since": -2}, "since: must be a store version >= -1"),
                                                 ({"poll": 0}, "poll: must be a positive number"),
                                                 ({"timeout": -1}, "timeout: must be a number of seconds")])
def test_follow_refuses_bad_arguments(store: trajstore.Store, kwargs: dict[str, Any], message: str) -> None:
    with pytest.raises(trajstore.InputError, match=message):
        next(store.follow(**kwargs))
