"""The steps table's conditional commit: a commit made against one version lands right after it, or not at all."""

from __future__ import annotations

import trajstore
from tests.storage.helpers import rows


def test_a_commit_after_a_version_fails_once_another_commit_took_the_next(store: trajstore.Store) -> None:
    table = store.table
    table.append(rows(episode_id=1), run_id="r", env_id="E")
    written = table.write(rows(episode_id=2), run_id="r", env_id="E")
    table.sync(written)
    read = table.latest(written.schema)  # what a check would have looked at
    table.append(rows(episode_id=3), run_id="r", env_id="E")  # lands first
    assert table.commit_after(read, written) is False
    assert sorted(f.min_episode_id for f in table.files()) == [1, 3]  # nothing of the late commit
    assert table.commit_after(table.latest(written.schema), written) is True
    assert sorted(f.min_episode_id for f in table.files()) == [1, 2, 3]
    assert store.sql("SELECT count(*) AS n FROM steps")["n"].to_pylist() == [12]


def test_a_commit_after_records_its_app_transaction(store: trajstore.Store) -> None:
    from deltalake.transaction import Transaction

    written = store.table.write(rows(), run_id="r", env_id="E")
    store.table.sync(written)
    assert store.table.commit_after(store.table.latest(written.schema), written,
                                    transaction=Transaction("trajstore-ingest:k", 2**62 + 3))
    assert store.table.latest().transaction_version("trajstore-ingest:k") == 2**62 + 3
