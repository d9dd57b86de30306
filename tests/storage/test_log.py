"""The log (storage/log.py): a commit made against one version lands right after it, or not at all, and records its
app transaction; a listing of the log that misses a version while another writer makes it is read again, not taken
for damage, while a version missing for good is reported as damage."""

from __future__ import annotations

import os
import threading
from contextlib import AbstractContextManager, contextmanager
from pathlib import Path
from typing import Iterator

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch, steps_table
from tests.storage.helpers import rows
from trajstore.store import check


def test_a_commit_after_a_version_fails_once_another_commit_took_the_next(store: trajstore.Store) -> None:
    table = steps_table(store)
    table.append(rows(episode_id=1), run_id="r", env_id="E")
    written = table.write(rows(episode_id=2), run_id="r", env_id="E")
    read = table.log.ensure(written.schema)  # what a check would have looked at
    table.append(rows(episode_id=3), run_id="r", env_id="E")  # lands first
    assert table.log.commit_after(read, written) is False
    assert sorted(f.min_episode_id for f in table.files()) == [1, 3]  # nothing of the late commit
    assert table.log.commit_after(table.log.ensure(written.schema), written) is True
    assert sorted(f.min_episode_id for f in table.files()) == [1, 2, 3]
    assert store.sql("SELECT count(*) AS n FROM steps")["n"].to_pylist() == [12]


def test_a_commit_after_records_its_app_transaction(store: trajstore.Store) -> None:
    written = steps_table(store).write(rows(), run_id="r", env_id="E")
    assert steps_table(store).log.commit_after(steps_table(store).log.ensure(written.schema), written,
                                        app=("trajstore-ingest:k", 2**62 + 3))
    assert steps_table(store).log.read().app_version("trajstore-ingest:k") == 2**62 + 3


# --- a listing that misses a version another writer was making ------------------------------------------------------
# A directory listing need not show an entry created while it runs, so with many writers deltalake can list versions
# 4,993 and 4,995 but not 4,994 ("Expected contiguous commit files, but found gap"). The tests make that gap for
# real: a version's entry is moved out of the log, and put back while trajstore reads again.


def _entry(store: trajstore.Store, version: int) -> Path:
    return steps_table(store).path / "_delta_log" / f"{version:020d}.json"


@contextmanager
def _out_of_log(store: trajstore.Store, path: Path, *, back_after: float | None) -> Iterator[None]:
    """The log's file ``path`` out of the log; put back (never over another) after ``back_after`` seconds, or on
    leaving when None."""
    aside = steps_table(store).path / f"aside{path.suffix}"
    path.rename(aside)
    timer = threading.Timer(back_after or 0.0, os.link, (aside, path))
    if back_after is not None:
        timer.start()
    try:
        yield
    finally:
        if back_after is None:
            os.link(aside, path)
        else:
            timer.join()
        aside.unlink()


def _missing(store: trajstore.Store, version: int, *, back_after: float | None) -> AbstractContextManager[None]:
    """Version ``version``'s log entry out of the log (:func:`_out_of_log`)."""
    return _out_of_log(store, _entry(store, version), back_after=back_after)


def _episodes(store: trajstore.Store) -> list[int]:
    return store.sql("SELECT episode_id FROM steps ORDER BY episode_id, step")["episode_id"].to_pylist()


def test_a_reader_and_a_writer_whose_listing_misses_a_version_read_again(store: trajstore.Store) -> None:
    for e in range(1, 5):
        steps_table(store).append(rows(episode_id=e), run_id="r", env_id="E")
    with _missing(store, 2, back_after=0.3):
        assert _episodes(store) == [e for e in range(1, 5) for _ in range(4)]
    with _missing(store, 2, back_after=0.3):
        steps_table(store).append(rows(episode_id=5), run_id="r", env_id="E")
    assert _episodes(store) == [e for e in range(1, 6) for _ in range(4)]
    assert check(store).ok


def test_a_commit_that_meets_a_gap_after_losing_the_race_is_retried_not_failed(store: trajstore.Store) -> None:
    """deltalake lists the log inside the commit call once another commit took the version; the gap it meets there
    is a lost race too (nothing landed), so the caller reads again and commits on the latest version."""
    log = steps_table(store).log
    steps_table(store).append(rows(episode_id=1), run_id="r", env_id="E")
    written = steps_table(store).write(rows(episode_id=9), run_id="r", env_id="E")
    read = log.ensure(written.schema)
    for e in range(2, 5):  # versions after the one the commit was planned on
        steps_table(store).append(rows(episode_id=e), run_id="r", env_id="E")
    with _missing(store, read.number + 2, back_after=0.3):
        assert log.commit_after(read, written) is False
    assert log.commit_after(log.ensure(written.schema), written) is True
    assert _episodes(store) == [e for e in (1, 2, 3, 4, 9) for _ in range(4)]


def test_a_swap_whose_rebase_meets_a_gap_is_sent_again_and_lands_once(store: trajstore.Store) -> None:
    """A compaction or delete commits over the versions since it read (deltalake rebases it); the gap its rebase
    meets is sent again, not reported as a failed change."""
    log = steps_table(store).log
    steps_table(store).append(rows(episode_id=1), run_id="r", env_id="E")
    read = log.read()
    assert read is not None
    for e in range(2, 5):
        steps_table(store).append(rows(episode_id=e), run_id="r", env_id="E")
    written = steps_table(store).write(rows(episode_id=9), run_id="r", env_id="E")
    with _missing(store, read.number + 2, back_after=0.3):
        version = log.swap(read, [], [written], metadata={"operation": "rewrite"})
    assert version == read.number + 4
    assert _episodes(store) == [e for e in (1, 2, 3, 4, 9) for _ in range(4)]


def test_a_version_that_stays_missing_is_damage_and_a_writer_keeps_its_rows(store: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    with store.writer(run_id="r", env_id="E", upkeep=None) as w:
        for _ in range(3):
            w.add_batch(make_batch(rng, 8, 2))
            w.flush()
        stored = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
        w.add_batch(make_batch(rng, 8, 2))
        with _missing(store, 1, back_after=None):
            for read in (steps_table(store).files, w.flush):  # a reader, and the writer's commit (which keeps its rows)
                with pytest.raises(trajstore.errors.StoreDamagedError, match="lists versions 0 and 2 but not those"):
                    read()
        w.flush()  # the entry is back: the rows kept are committed, once
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == stored + 16
    assert store.sql("SELECT count(*) AS n FROM (SELECT DISTINCT episode_id, step FROM steps)")["n"][0].as_py() \
        == stored + 16
    assert check(store).ok


def test_a_first_writer_on_a_new_store_waits_no_back_off(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Making the runs table and the steps table, then giving them their columns, is progress, not a lost race: the
    next step reads the log at once (a back-off, 2 ms and up, is only for a race lost to another writer)."""
    waited: list[int] = []
    monkeypatch.setattr("trajstore.retry.backoff", lambda attempt: waited.append(attempt) or 0.0)
    store = trajstore.open(tmp_path / "store", create=True)
    with store.writer(run_id="r", env_id="E", config={"lr": 0.1}) as w:
        w.add_batch(make_batch(np.random.default_rng(0), T=4, B=2))
    assert store.sql("SELECT count(*) AS n FROM steps")["n"].to_pylist() == [8]
    assert waited == []


# --- a checkpoint gone while it is read ------------------------------------------------------------------------------
# A clean-up after a checkpoint removes the older checkpoint and the entries behind it once they are older than the
# log's retention (issue 49), while a reader that listed the log before the new checkpoint may be reading them:
# deltalake then finds a checkpoint it listed, or the one `_last_checkpoint` names, not there. The tests make that
# for real: the checkpoint's file is moved out of the log, and put back while trajstore reads again.


def _checkpoint_missing(store: trajstore.Store, *, back_after: float | None) -> AbstractContextManager[None]:
    """The log's one checkpoint out of the log (:func:`_out_of_log`)."""
    (checkpoint,) = (steps_table(store).path / "_delta_log").glob("*.checkpoint.parquet")
    return _out_of_log(store, checkpoint, back_after=back_after)


def test_a_reader_and_a_writer_that_meet_a_checkpoint_gone_read_again(store: trajstore.Store) -> None:
    for e in range(1, 5):
        steps_table(store).append(rows(episode_id=e), run_id="r", env_id="E")
    assert steps_table(store).log.checkpoint_if_due(interval=1) is not None
    with _checkpoint_missing(store, back_after=0.3):
        assert _episodes(store) == [e for e in range(1, 5) for _ in range(4)]
    with _checkpoint_missing(store, back_after=0.3):
        steps_table(store).append(rows(episode_id=5), run_id="r", env_id="E")
    assert _episodes(store) == [e for e in range(1, 6) for _ in range(4)]
    with _checkpoint_missing(store, back_after=None):  # missing for good: an error naming the log, not a wait
        with pytest.raises(trajstore.errors.StoreDamagedError, match="commit log of .* cannot be read"):
            steps_table(store).log.latest_number()
    assert check(store).ok


def test_the_kept_file_list_follows_every_commit_and_a_table_made_again(tmp_path: Path) -> None:
    """A table keeps the latest version's file list while the log's newest entry stays the same: another writer's
    commit, a delete and a table made again in the same folder (its versions numbered as before) are each seen
    at once, as a fresh read of the log sees them."""
    import shutil

    path = tmp_path / "store"
    store = trajstore.open(path, create=True)

    def append(target: trajstore.Store, run_id: str, seed: int) -> None:
        with target.writer(run_id=run_id, env_id="E") as w:
            w.add_batch(make_batch(np.random.default_rng(seed), 8, 2))

    def fresh() -> set[str]:  # a table of its own, nothing kept: the log read now
        return {f.path for f in steps_table(trajstore.open(path)).files()}

    append(store, "a", 0)
    table = steps_table(store)
    first = {f.path for f in table.files()}
    assert {f.path for f in table.files()} == first == fresh() and len(first) == 1
    append(trajstore.open(path), "b", 1)  # another Store: another writer
    assert {f.path for f in table.files()} == fresh() and len(fresh()) == 2
    trajstore.open(path).maintain.delete(run_id="b")  # a commit that removes a file
    assert {f.path for f in table.files()} == fresh() == first
    version = trajstore.open(path).version
    shutil.rmtree(path)
    again = trajstore.open(path, create=True)
    for i in range(version + 1):  # as many versions as before
        append(again, "c", 10 + i)
        if again.version == version:
            break
    assert again.version == version
    assert {f.path for f in table.files()} == fresh() and {f.run_id for f in table.files()} == {"c"}
