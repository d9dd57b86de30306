"""Stores written before encoding 2 stay readable as they were written: ``tests/data/encoding1-*`` were made by
trajstore before this change (``tests/data/make_encoding1.py``, run with that version): uint8 frames stored as
int64, float64 observations as float32, next_obs in full, no format in the files' footers. New writers append
encoding-2 files to the same environments in the types those environments have."""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.helpers import make_batch, slice_batch, steps_table
from trajstore.schema import to_numpy
from trajstore.store import check, compact

DATA = Path(__file__).resolve().parents[1] / "data"


@pytest.fixture
def old(tmp_path: Path) -> trajstore.Store:
    shutil.copytree(DATA / "encoding1-store", tmp_path / "store")
    return trajstore.open(tmp_path / "store")


@pytest.fixture
def written() -> dict[str, np.ndarray]:
    return dict(np.load(DATA / "encoding1-written.npz"))


def rows_of(store: trajstore.Store, env_id: str, columns: list[str]) -> pa.Table:
    got = store.scan(["env_index", "step", "episode_id", *columns], env_id=env_id).read_all()
    return got.sort_by([("env_index", "ascending"), ("episode_id", "ascending"), ("step", "ascending")])


def time_index(table: pa.Table) -> np.ndarray:
    """Each row's time index in the one call that wrote it (12 steps per env, episodes one after another)."""
    env, eid = table["env_index"].to_numpy(), table["episode_id"].to_numpy()
    out = np.zeros(len(env), np.int64)
    for b in np.unique(env):
        rows = np.flatnonzero(env == b)
        out[rows] = np.arange(len(rows))
    assert len(np.unique(eid)) >= 2
    return out


def test_an_old_store_reads_as_it_was_written(old: trajstore.Store, written: dict[str, np.ndarray]) -> None:
    assert check(old).ok
    for env, shape in (("Pixels-v0", (3, 4)), ("Small-v0", (2, 5))):
        got = rows_of(old, env, ["obs", "next_obs"])
        t, b = time_index(got), got["env_index"].to_numpy()
        obs = to_numpy(got["obs"])
        assert obs.dtype == np.int64 and obs.shape[1:] == shape  # the types the old writer stored
        np.testing.assert_array_equal(obs, written[env][t, b])
        np.testing.assert_array_equal(to_numpy(got["next_obs"]), written[env][t + 1, b])
        sql = old.sql("SELECT obs FROM steps ORDER BY env_index, episode_id, step", env_id=env)
        np.testing.assert_array_equal(np.array(sql["obs"].to_pylist()), written[env][t, b])
    assert old.stats(include_incomplete=True)["n_traj"][0].as_py() == 8


def test_an_old_dict_store_reads_as_it_was_written(tmp_path: Path, written: dict[str, np.ndarray]) -> None:
    shutil.copytree(DATA / "encoding1-dict", tmp_path / "store")
    store = trajstore.open(tmp_path / "store")
    got = rows_of(store, "Dict-v0", ["obs", "next_obs"])
    t, b = time_index(got), got["env_index"].to_numpy()
    obs, nxt = to_numpy(got["obs"]), to_numpy(got["next_obs"])
    assert obs["pos"].dtype == np.float32  # float64 values, stored as float32 then
    np.testing.assert_array_equal(obs["pos"], written["Dict-pos"][t, b].astype(np.float32))
    np.testing.assert_array_equal(nxt["mode"], written["Dict-mode"][t + 1, b])


def test_new_writes_append_to_old_environments_in_their_types(old: trajstore.Store) -> None:
    rng = np.random.default_rng(3)
    batch = make_batch(rng, 10, 2, extras={"t": np.repeat(np.arange(10)[:, None], 2, axis=1)})
    frames = rng.integers(0, 256, (11, 2, 3, 4), dtype=np.uint8)
    batch["obs"], batch["next_obs"] = frames[:-1], frames[1:]
    with old.writer(run_id="old", env_id="Pixels-v0") as w:  # the old partition: 1 old file, then 2 new ones
        w.add_batch(slice_batch(batch, 0, 4))
        w.flush()
        w.add_batch(slice_batch(batch, 4, 10))
    assert old.schema("Pixels-v0").field("obs").type == pa.list_(pa.list_(pa.int64(), 4), 3)  # the env's type
    # its frames are now stored as bytes, under names that say so, beside the old columns (external readers see
    # both; trajstore's readers one obs)
    names = [f.name for f in steps_table(old).log.read().schema]
    assert {"obs", "next_obs", "obs_bytes", "next_obs_sparse_bytes"} <= set(names)
    assert old.scan(["obs"], env_id="Pixels-v0").read_all().num_rows == 24 + 20
    got = old.scan(["run_id", "env_index", "t", "obs"], env_id="Pixels-v0").read_all()
    got = got.filter(got["t"].is_valid())  # the new rows
    np.testing.assert_array_equal(to_numpy(got["obs"]), frames[:-1][got["t"].to_numpy(), got["env_index"].to_numpy()])
    before = old.sql("SELECT run_id, episode_id, step, obs, next_obs FROM steps ORDER BY ALL")
    report = compact(old, progress=False)  # files are joined with their own kind only: 3 files into 2
    assert (report.files_before, report.files_after) == (3, 2)
    assert old.sql("SELECT run_id, episode_id, step, obs, next_obs FROM steps ORDER BY ALL").equals(before)
    assert check(old).ok
    batches = list(old.sequences(3, columns=["obs"], where="env_id = 'Pixels-v0'"))
    assert batches and batches[0]["obs"].dtype == np.int64 and batches[0]["obs"].shape[1:] == (3, 3, 4)
