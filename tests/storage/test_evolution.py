"""Schema evolution through the writer: an extra that first appears in a later run is a nullable column for the
earlier rows everywhere (stats, sql, scan, on a version opened later); an extra whose dtype changes is refused."""

from __future__ import annotations

import numpy as np
import pyarrow.compute as pc
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.errors import SchemaMismatchError


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
