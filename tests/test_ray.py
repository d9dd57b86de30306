"""trajstore.ray (the ray extra; skipped without it): committed steps and episodes as Ray Datasets, typed as the
store types them, from a directory and from S3; rollout workers as Ray tasks, each writing its share."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trajstore
from tests import seaweed
from tests.helpers import make_batch

pytestmark = pytest.mark.ray  # the tiers: tests/tiers.py

ray = pytest.importorskip("ray")
tray = pytest.importorskip("trajstore.ray")


@pytest.fixture(scope="module", autouse=True)
def local_ray() -> Iterator[None]:
    ray.init(num_cpus=2, include_dashboard=False, log_to_driver=False, configure_logging=False)
    ray.data.DataContext.get_current().enable_progress_bars = False
    try:
        yield
    finally:
        ray.shutdown()


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    """Runs and envs named like numbers (a guessing reader would make them ints), several files."""
    store = trajstore.open(tmp_path_factory.mktemp("ray") / "store", create=True)
    rng = np.random.default_rng(0)
    for run in ("007", "b"):
        with store.writer(run_id=run, env_id="42", flush_bytes=1) as w:
            for _ in range(3):
                w.add_batch(make_batch(rng, 30, 4))
    stray = Path(store.maintain.files()[0].path).with_name("part-stray.parquet")  # on disk, in no commit
    pq.write_table(pq.read_table(store.maintain.files()[0].path), stray)
    return store


def rows(table: pa.Table) -> list[tuple[Any, ...]]:
    return sorted(tuple(str(v) for v in r.values()) for r in table.to_pylist())


def test_read_steps_reads_the_committed_rows_with_the_stores_types(filled: trajstore.Store) -> None:
    ds = tray.read_steps(str(filled.root), columns=["run_id", "env_id", "episode_id", "step", "obs", "reward"])
    got = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    want = filled.scan(["run_id", "env_id", "episode_id", "step", "obs", "reward"]).read_all()
    assert got.schema == want.schema and got.schema.field("run_id").type == pa.string()
    assert got.num_rows == want.num_rows == 2 * 3 * 30 * 4 and rows(got) == rows(want)


def test_read_steps_filters_and_read_episodes(filled: trajstore.Store) -> None:
    ds = tray.read_steps(str(filled.root), columns=["run_id", "episode_id"], run_id="007", where="complete")
    want = filled.scan(["run_id", "episode_id"], run_id="007", where="complete").read_all()
    assert ds.count() == want.num_rows and rows(pa.concat_tables(ray.get(ds.to_arrow_refs()))) == rows(want)
    episodes = pa.concat_tables(ray.get(tray.read_episodes(str(filled.root), run_id="b").to_arrow_refs()))
    assert rows(episodes) == rows(filled.episodes(run_id="b"))


@pytest.mark.s3
def test_read_steps_from_s3(s3: seaweed.SeaweedFS) -> None:
    uri = f"s3://{s3.bucket()}/ray"
    store = trajstore.open(uri, create=True, storage_options=s3.storage_options)
    with store.writer(run_id="r", env_id="E", flush_bytes=1) as w:
        for _ in range(2):
            w.add_batch(make_batch(np.random.default_rng(1), 20, 3))
    ds = tray.read_steps(uri, columns=["episode_id", "step", "reward"], storage_options=s3.storage_options)
    assert rows(pa.concat_tables(ray.get(ds.to_arrow_refs()))) == rows(store.scan(["episode_id", "step",
                                                                                    "reward"]).read_all())


def outcome(store: trajstore.Store, run: str) -> list[tuple[Any, ...]]:
    eps = store.episodes(run_id=run, complete=True).to_pylist()
    return sorted((e["worker_id"], e["env_index"], e["env_steps"], e["episode_length"], e["seed"]) for e in eps)


def test_gym_rollout_workers_split_the_episodes_and_repeat_with_the_seed(tmp_path: Path) -> None:
    path = str(tmp_path / "store")
    first = tray.rollout(path, "CartPole-v1", num_workers=3, episodes=20, run_id="a", seed=5, num_envs=2,
                         progress=False, policy_version=1, config={"algo": "random", "lr": 3e-4}, tags=["ray"])
    store = trajstore.open(path)
    info = store.run_info("a")  # three workers described the run at once: one description
    assert (info["config"], info["tags"]) == ({"algo": "random", "lr": 3e-4}, ["ray"])
    per_worker = store.stats(by="worker_id", run_id="a").to_pylist()
    assert [w["worker_id"] for w in per_worker] == ["ray-0", "ray-1", "ray-2"]
    assert [w["n_traj"] >= share for w, share in zip(per_worker, (7, 7, 6))] == [True] * 3
    assert first.episodes == sum(w["n_traj"] for w in per_worker)
    assert first.steps == store.sql("SELECT count(*) AS n FROM steps WHERE run_id = 'a'")["n"][0].as_py()
    assert set(store.episodes(run_id="a")["policy_version"].to_pylist()) == {1}
    tray.rollout(path, "CartPole-v1", num_workers=3, episodes=20, run_id="b", seed=5, num_envs=2, progress=False)
    assert outcome(store, "a") == outcome(store, "b")  # the same seed, the same episodes
    # every row: the run's seed as given and its mode (worker_id and env_index tell the envs apart)
    assert store.sql("SELECT DISTINCT mode, seed FROM steps").to_pylist() == [{"mode": "train", "seed": 5}]
    with pytest.raises(trajstore.InputError, match=r"^run_id: run 'a' already holds steps in .*append=True"):
        tray.rollout(path, "CartPole-v1", num_workers=2, episodes=4, run_id="a", seed=9, progress=False)
    tray.rollout(path, "CartPole-v1", num_workers=2, episodes=4, run_id="a", seed=9, num_envs=2, progress=False,
                 append=True)
    assert store.stats(run_id="a")["n_traj"][0].as_py() >= first.episodes + 4
    evaluated = tray.rollout(path, "CartPole-v1", num_workers=2, episodes=5, run_id="ev", seed=3, num_envs=2,
                             progress=False, mode="eval")
    eps = store.episodes(run_id="ev")
    assert evaluated.episodes == eps.num_rows == 5 and all(eps["complete"].to_pylist())
    assert set(eps["mode"].to_pylist()) == {"eval"} and set(eps["seed"].to_pylist()) == {3}
    assert trajstore.check(store).ok


@pytest.mark.s3
def test_jax_rollout_workers_write_to_s3(s3: seaweed.SeaweedFS) -> None:
    uri = f"s3://{s3.bucket()}/jax"
    result = tray.rollout(uri, "cartpole", backend="jax", num_workers=2, steps=4000, run_id="j", seed=0,
                          num_envs=32, progress=False, storage_options=s3.storage_options)
    store = trajstore.open(uri, storage_options=s3.storage_options)
    stored = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
    assert result.steps == stored >= 4000 and sorted(set(store.episodes()["worker_id"].to_pylist())) == \
        ["ray-0", "ray-1"]


@pytest.mark.parametrize("kwargs, message", [
    ({"backend": "torch"}, "backend: must be 'gym' or 'jax'"), ({"num_workers": 0}, "num_workers"),
    ({"episodes": None}, "give episodes=N or steps=N")])
def test_bad_arguments(tmp_path: Path, kwargs: dict[str, Any], message: str) -> None:
    args = {"num_workers": 2, "episodes": 4, "run_id": "x", **kwargs}
    with pytest.raises(trajstore.InputError, match=message):
        tray.rollout(str(tmp_path / "s"), "CartPole-v1", **args)


def test_ray_read_delta_sees_honest_columns(filled: trajstore.Store) -> None:
    """Ray Data's own Delta reader (not trajstore's): every column it shares with ``scan`` holds trajstore's values;
    the next observation is stored only where it is not the next step's obs, under a name that says so."""
    ds = ray.data.read_delta(str(filled.root / "steps"))
    theirs = pa.concat_tables(ray.get(ds.to_arrow_refs()))
    want = filled.scan().read_all()
    assert "next_obs" not in theirs.column_names and "next_obs_sparse" in theirs.column_names
    shared = [c for c in want.column_names if c in theirs.column_names and c not in ("run_id", "env_id")]
    assert {"episode_id", "step", "obs", "action", "reward", "terminated", "truncated"} <= set(shared)
    key = [("episode_id", "ascending"), ("step", "ascending")]
    sparse = theirs.sort_by(key)["next_obs_sparse"].to_pylist()
    theirs, want = theirs.select(shared).sort_by(key), want.select([*shared, "next_obs"]).sort_by(key)
    for name in shared:
        assert theirs[name].to_pylist() == want[name].to_pylist(), name
    assert [s for s in sparse if s is not None] == [w for s, w in zip(sparse, want["next_obs"].to_pylist())
                                                     if s is not None]
