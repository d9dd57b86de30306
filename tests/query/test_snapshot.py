"""Snapshot: its ``steps`` read through a registered pyarrow dataset (given the view's schema) are the rows and
types of DuckDB's own ``read_parquet`` of the same committed files, so that the sandbox's connection, which can
open no file, sees the same views."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.errors import QueryError
from trajstore.query.snapshot import Snapshot


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    """Two runs, two envs with different observation shapes, lineage and extras in some files only."""
    store = trajstore.open(tmp_path_factory.mktemp("snapshot") / "store", create=True)
    rng = np.random.default_rng(1)
    with store.writer(run_id="a", env_id="Small-v0", policy_version=3, mode="train") as w:
        for _ in range(2):
            w.add_batch(make_batch(rng, 40, 4, obs_dim=3))
            w.flush()
    with store.writer(run_id="a", env_id="Wide-v0", worker_id="w-2") as w:
        w.add_batch(make_batch(rng, 30, 3, obs_dim=8, extras={"value": rng.random((30, 3)).astype(np.float32)}))
    with store.writer(run_id="b", env_id="Small-v0", seed=np.arange(5)) as w:
        w.add_batch(make_batch(rng, 25, 5, obs_dim=3))
    return store


def both(store: trajstore.Store, query: str) -> tuple[pa.Table, pa.Table]:
    files = store.files()
    with Snapshot(files) as parquet, Snapshot(files, schema=store._steps_schema(files)) as dataset:
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
    files = mixed.files()
    with Snapshot(files, schema=mixed._steps_schema(files)) as snap:
        snap.con.execute("SET enable_external_access = false")
        assert snap.arrow("SELECT count(*) AS n FROM steps")["n"][0].as_py() == sum(f.rows for f in files)
    with Snapshot(files) as snap:  # the default source needs the files' paths
        snap.con.execute("SET enable_external_access = false")
        with pytest.raises(QueryError, match="disabled by configuration"):
            snap.arrow("SELECT count(*) AS n FROM steps")
