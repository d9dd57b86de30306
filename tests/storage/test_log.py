"""The log's conditional commit (storage/log.py): a commit made against one version lands right after it, or not at
all, and records its app transaction."""

from __future__ import annotations

import trajstore
from tests.storage.helpers import rows


def test_a_commit_after_a_version_fails_once_another_commit_took_the_next(store: trajstore.Store) -> None:
    table = store.table
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
    written = store.table.write(rows(), run_id="r", env_id="E")
    assert store.table.log.commit_after(store.table.log.ensure(written.schema), written,
                                        app=("trajstore-ingest:k", 2**62 + 3))
    assert store.table.log.read().app_version("trajstore-ingest:k") == 2**62 + 3
