"""Schema evolution through the writer: an extra that first appears in a later run is a nullable column for the
earlier rows everywhere (stats, sql, scan, on a version opened later); an extra whose dtype changes is refused."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow.compute as pc
import pytest

import trajstore
from tests.helpers import make_batch, steps_table
from trajstore.errors import SchemaMismatchError
from trajstore.settings import Settings
from trajstore.storage.table import file_schema, read_footer


def test_a_new_extra_is_null_for_earlier_rows(store: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    with store.writer(run_id="old", env_id="E") as w:
        w.add_batch(make_batch(rng, 10, 2))
    with store.writer(run_id="new", env_id="E") as w:
        w.add_batch(make_batch(rng, 10, 2, extras={"value": rng.random((10, 2)).astype(np.float32)}))
    rows = store.sql("SELECT run_id, count(value) AS n, count(*) AS total FROM steps GROUP BY run_id ORDER BY run_id")
    assert rows.to_pylist() == [{"run_id": "new", "n": 20, "total": 20}, {"run_id": "old", "n": 0, "total": 20}]
    scanned = store.scan(["value"], run_id="old").read_all()
    assert scanned["value"].null_count == scanned.num_rows == 20
    assert store.stats(by="run_id")["n_traj"].to_pylist() == store.stats(by="run_id")["n_traj"].to_pylist()
    assert store.stats(where="run_id = 'old'")["n_traj"][0].as_py() > 0


def test_an_extra_whose_dtype_changes_is_refused(store: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    with store.writer(run_id="a", env_id="E") as w:
        w.add_batch(make_batch(rng, 4, 2, extras={"value": rng.random((4, 2)).astype(np.float32)}))
    with pytest.raises(SchemaMismatchError, match=r"value: expected shape \(\) float32 .*, got shape \(\) <U1"):
        with store.writer(run_id="b", env_id="E") as w:
            w.add_batch(make_batch(rng, 4, 2, extras={"value": np.array([["x"] * 2] * 4)}))
    with pytest.raises(SchemaMismatchError, match=r"value: expected shape \(\) float32 .*, got shape \(2,\) float32"):
        with store.writer(run_id="b", env_id="E") as w:
            w.add_batch(make_batch(rng, 4, 2, extras={"value": np.zeros((4, 2, 2), np.float32)}))
    assert pc.sum(store.sql("SELECT count(*) AS n FROM steps WHERE run_id = 'b'")["n"]).as_py() == 0


def test_files_with_equal_schemas_share_one_copy(tmp_path: Path) -> None:
    """A table keeps one schema per distinct footer, not one per file: a service keeps the schema of every file its
    store gets, thousands a day. What each file is read as stays what its own footer says."""
    store = trajstore.open(tmp_path / "store", create=True, settings=Settings(compact_small_files=0))
    rng = np.random.default_rng(0)
    for env, dim in (("A", 3), ("B", 5)):
        with store.writer(run_id="r", env_id=env, flush_bytes=1) as w:
            for _ in range(4):
                w.add_batch(make_batch(rng, 4, 2, obs_dim=dim))
    files = store.maintain.files()
    table = steps_table(store)
    schemas = table.schemas(files)
    assert len(files) == 8 and len({id(s) for s in schemas}) == 2  # one per env's schema
    for f, s in zip(files, schemas):  # each as its own footer alone says
        assert s == file_schema(f, read_footer(f)) and s.format == file_schema(f, read_footer(f)).format
        assert s.logical.field("obs").type.list_size == (3 if f.env_id == "A" else 5)
    again = steps_table(store)  # another table, reading the same files in two calls
    assert [id(s) for s in again.schemas(files[:3]) + again.schemas(files[3:])] == \
           [id(s) for s in again.schemas(files)]
    assert len({id(s) for s in again.schemas(files)}) == 2
