"""Other engines read a store through its Delta log: deltalake's pyarrow dataset and polars."""

from __future__ import annotations

import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.compute
import pytest
from deltalake import DeltaTable

import trajstore
from tests.helpers import make_batch


@pytest.fixture
def mixed(store: trajstore.Store) -> trajstore.Store:
    rng = np.random.default_rng(0)
    with store.writer(run_id="a", env_id="Small-v0", flush_bytes=1, policy_version=1) as w:
        for _ in range(3):
            w.add_batch(make_batch(rng, 20, 4, obs_dim=3))
    with store.writer(run_id="b", env_id="Wide-v0") as w:  # another observation shape, no lineage
        w.add_batch(make_batch(rng, 15, 2, obs_dim=6))
    return store


def episode_returns(store: trajstore.Store) -> dict[int, float]:
    eps = store.episodes()
    return dict(zip(eps["episode_id"].to_pylist(), eps["episode_return"].to_pylist()))


def test_deltalake_dataset_reads_every_committed_step(mixed: trajstore.Store) -> None:
    table = DeltaTable(str(mixed.root / "steps")).to_pyarrow_dataset().to_table()
    ours = mixed.sql("SELECT episode_id, step, reward, obs FROM steps ORDER BY episode_id, step")
    # Wide-v0's 6-float observations are a type of their own: a column named so, beside Small-v0's obs
    wide = [n for n in table.column_names if n.startswith("obs__")]
    theirs = table.select(["episode_id", "step", "reward", "obs", *wide]).sort_by([("episode_id", "ascending"),
                                                                                  ("step", "ascending")])
    assert theirs.num_rows == ours.num_rows == sum(f.rows for f in mixed.maintain.files())
    assert theirs["reward"].to_pylist() == ours["reward"].to_pylist()
    obs = pa.compute.coalesce(theirs["obs"], *[theirs[n] for n in wide])
    assert obs.to_pylist() == ours["obs"].to_pylist()
    assert set(table["run_id"].to_pylist()) == {"a", "b"}


def test_polars_scan_delta_gives_the_same_episode_returns(mixed: trajstore.Store) -> None:
    # polars' native Delta reader refuses the fixed-size observation columns (the Delta schema records them
    # as lists); through pyarrow it reads the same files
    frame = pl.scan_delta(str(mixed.root / "steps"), use_pyarrow=True)
    returns = frame.group_by("episode_id").agg(pl.col("reward").cast(pl.Float64).sum()).collect()
    got = dict(zip(returns["episode_id"].to_list(), returns["reward"].to_list()))
    expected = episode_returns(mixed)
    assert got.keys() == expected.keys()
    assert [got[k] for k in sorted(got)] == pytest.approx([expected[k] for k in sorted(expected)], rel=1e-9)


def test_info_key_columns_with_nulls_mean_the_same_to_other_engines_and_survive_their_compaction(
        store: trajstore.Store) -> None:
    from tests.integrations.test_info_keys import SuccessEnv
    from trajstore.integrations import RecordToStore

    for i in range(3):
        with RecordToStore(SuccessEnv(), store, run_id=f"r{i}", env_id="Success-v0", chunk=8,
                           info_keys=["cost", "is_success"]) as env:
            env.reset(seed=i)
            for _ in range(50):
                if any(env.step(0)[2:4]):
                    env.reset()
    query = "SELECT episode_id, step, cost, is_success FROM steps ORDER BY episode_id, step"
    want = store.sql(query).to_pylist()
    assert 0 < sum(r["is_success"] is not None for r in want) < len(want)  # null where a step's info lacked it
    path = str(store.root / "steps")
    frame = pl.scan_delta(path, use_pyarrow=True).select(["episode_id", "step", "cost", "is_success"])
    assert frame.sort(["episode_id", "step"]).collect().to_dicts() == want
    DeltaTable(path).optimize.compact()
    assert trajstore.open(store.root).sql(query).to_pylist() == want
