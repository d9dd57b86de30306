"""Snapshot: its ``steps`` read through registered pyarrow datasets are the rows and types of DuckDB's own
``read_parquet`` of the same committed files, so that the sandbox's connection, which can open no file, sees the
same views."""

from __future__ import annotations

import pyarrow as pa
import pytest

import trajstore
from tests.helpers import write_mixed_store
from trajstore.errors import QueryError
from trajstore.query.snapshot import Snapshot


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    """Two runs, two envs with different observation shapes, lineage and extras in some files only."""
    return write_mixed_store(tmp_path_factory.mktemp("snapshot") / "store", seed=1, commits=2)


def both(store: trajstore.Store, query: str) -> tuple[pa.Table, pa.Table]:
    files = store.maintain.files()
    with Snapshot(files) as parquet, Snapshot(files, registered=True) as dataset:
        return parquet.arrow(query), dataset.arrow(query)


@pytest.mark.parametrize("query", [
    "SELECT * FROM steps ORDER BY run_id, env_id, episode_id, step",
    "SELECT * FROM episodes ORDER BY episode_id",
    "SELECT env_id, count(*) AS n, sum(reward) AS r, max(len(obs)) AS d FROM steps GROUP BY ALL ORDER BY ALL",
])
def test_the_dataset_source_gives_the_views_of_read_parquet(mixed: trajstore.Store, query: str) -> None:
    parquet, dataset = both(mixed, query)
    assert dataset.schema == parquet.schema
    assert dataset.equals(parquet) and dataset.num_rows > 0


def test_an_empty_store_has_the_same_typed_views(store: trajstore.Store) -> None:
    parquet, dataset = both(store, "SELECT * FROM steps")
    assert dataset.schema == parquet.schema and dataset.num_rows == 0


def test_the_dataset_source_reads_no_file_through_duckdb(mixed: trajstore.Store) -> None:
    files = mixed.maintain.files()
    with Snapshot(files, registered=True) as snap:
        snap.con.execute("SET enable_external_access = false")
        assert snap.arrow("SELECT count(*) AS n FROM steps")["n"][0].as_py() == sum(f.rows for f in files)
    with Snapshot(files) as snap:  # the default source needs the files' paths
        snap.con.execute("SET enable_external_access = false")
        with pytest.raises(QueryError, match="disabled by configuration"):
            snap.arrow("SELECT count(*) AS n FROM steps")
