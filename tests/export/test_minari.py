"""Export to Minari (the optional extra; skipped without it): minari.load_dataset opens the same episodes, in every
storage format; bad ids and failed exports leave nothing behind."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch, stacked_stream
from trajstore import cli
from trajstore.errors import InputError, RunNotFoundError
from trajstore.export import episodes as selection_module
from trajstore.export import minari as minari_export
from trajstore.export.minari import export_minari
from trajstore.rollout import gym_rollout

minari = pytest.importorskip("minari")


@pytest.fixture
def small_groups(monkeypatch: pytest.MonkeyPatch) -> None:
    """Exports read a few episodes at a time and write fewer per batch (not the whole small store at once)."""
    monkeypatch.setattr(selection_module, "GROUP_BYTES", 3_000)
    monkeypatch.setattr(minari_export, "BATCH_EPISODES", 3)


def same_episodes(dataset_id: str, store: trajstore.Store, run_id: str) -> None:
    """Every episode minari loads equals the store's, in episode_id order."""
    loaded = list(minari.load_dataset(dataset_id).iterate_episodes())
    stored = store.episodes(run_id=run_id, complete=True)
    assert [len(e.rewards) for e in loaded] == stored["episode_length"].to_pylist()
    for e, episode_id in zip(loaded, stored["episode_id"].to_pylist()):
        steps = store.sql(f"SELECT obs, next_obs, action, reward, terminated, truncated FROM steps "
                          f"WHERE episode_id = {episode_id} ORDER BY step")
        obs = np.array(steps["obs"].to_pylist(), np.float32)
        np.testing.assert_array_equal(e.observations[:-1], obs)
        np.testing.assert_array_equal(e.observations[-1], np.array(steps["next_obs"][-1].as_py(), np.float32))
        np.testing.assert_array_equal(e.actions, steps["action"].to_numpy())
        np.testing.assert_array_equal(e.rewards, steps["reward"].to_numpy())
        assert e.terminations.tolist() == steps["terminated"].to_pylist()
        assert e.truncations.tolist() == steps["truncated"].to_pylist()


def test_the_exported_dataset_holds_the_same_episodes(datasets: Path, store: trajstore.Store, small_groups: None,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    gym_rollout(store, "CartPole-v1", run_id="r", num_envs=2, episodes=6, seed=0, progress=False)
    gym_rollout(store, "CartPole-v1", run_id="other", num_envs=1, episodes=2, seed=1, progress=False)
    assert cli.main(["export", "minari", "--store", str(store.root), "--run", "r", "cartpole/ts-v0"]) == 0
    shown = capsys.readouterr()
    n = store.episodes(run_id="r", complete=True).num_rows
    assert "Minari dataset cartpole/ts-v0" in shown.out
    assert f"{n}/{n} [" not in shown.err  # its progress bar only on a terminal (tests/cli/test_parser.py)
    same_episodes("cartpole/ts-v0", store, "r")
    dataset = minari.load_dataset("cartpole/ts-v0")
    lengths = store.episodes(run_id="r", complete=True)["episode_length"].to_numpy()
    assert (dataset.total_episodes, dataset.total_steps) == (n, lengths.sum())
    assert dataset.spec.env_spec.id == "CartPole-v1" and \
        dataset.storage.metadata["dataset_size"] == dataset.storage.get_size()
    assert list(minari.list_local_datasets()) == ["cartpole/ts-v0"]


@pytest.mark.parametrize("data_format", ["parquet", "hdf5"])
def test_every_storage_format(datasets: Path, store: trajstore.Store, small_groups: None, data_format: str) -> None:
    gym_rollout(store, "CartPole-v1", run_id="r", num_envs=2, episodes=5, seed=2, progress=False)
    export_minari(store, f"cartpole/{data_format}-v1", run_id="r", data_format=data_format)
    assert minari.load_dataset(f"cartpole/{data_format}-v1").storage.metadata["data_format"] == data_format
    same_episodes(f"cartpole/{data_format}-v1", store, "r")


def test_bad_ids_and_runs_are_named_and_leave_nothing(datasets: Path, store: trajstore.Store,
                                                      capsys: pytest.CaptureFixture[str],
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    gym_rollout(store, "CartPole-v1", run_id="r", num_envs=1, episodes=2, seed=0, progress=False)
    for bad in ("bad id", "cartpole/no-version", "", "a/../b-v0", "-v0"):
        with pytest.raises(InputError, match="dataset_id: .* is not a Minari dataset id"):
            export_minari(store, bad, run_id="r")
        assert cli.main(["export", "minari", "--store", str(store.root), "--", bad]) == 2
        assert capsys.readouterr().err.count("\n") == 1
    with pytest.raises(RunNotFoundError, match="run_id: no run 'x'"):
        export_minari(store, "cartpole/a-v0", run_id="x")
    with pytest.raises(InputError, match="data_format: one of"):
        export_minari(store, "cartpole/a-v0", run_id="r", data_format="csv")
    assert not datasets.exists() or [p.name for p in datasets.iterdir()] == []
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(store.root / "trajstore.json"))  # a file
    with pytest.raises(InputError, match="MINARI_DATASETS_PATH: cannot use .*trajstore.json"):
        export_minari(store, "cartpole/a-v0", run_id="r")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(datasets))
    export_minari(store, "cartpole/a-v0", run_id="r")  # every failure above left nothing in the way
    with pytest.raises(InputError, match="dataset_id: a local Minari dataset 'cartpole/a-v0' exists already"):
        export_minari(store, "cartpole/a-v0", run_id="r")
    assert list(minari.list_local_datasets()) == ["cartpole/a-v0"]


def test_an_interrupted_export_leaves_nothing(datasets: Path, store: trajstore.Store, small_groups: None,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    gym_rollout(store, "CartPole-v1", run_id="r", num_envs=2, episodes=8, seed=0, progress=False)
    real = minari_export._write_batch
    calls = {"n": 0}

    def interrupted(*args: Any) -> None:
        calls["n"] += 1
        if calls["n"] == 2:
            raise KeyboardInterrupt
        real(*args)

    monkeypatch.setattr(minari_export, "_write_batch", interrupted)
    with pytest.raises(KeyboardInterrupt):
        export_minari(store, "new/space/ts-v0", run_id="r")
    assert [p.name for p in datasets.iterdir()] == []  # no dataset, no namespace, no hidden stage
    monkeypatch.setattr(minari_export, "_write_batch", real)
    export_minari(store, "new/space/ts-v0", run_id="r")
    assert minari.namespace.list_local_namespaces() == ["new", "new/space"]
    same_episodes("new/space/ts-v0", store, "r")


@pytest.mark.parametrize("data_format", ["arrow", "hdf5"])
def test_picture_observations_are_uint8_boxes_of_their_shape(datasets: Path, store: trajstore.Store,
                                                             small_groups: None, data_format: str) -> None:
    """Frame stacks (declared with frame_stack: each frame stored once) come back whole, as the env returned
    them, in a Box(0, 255, (4, 24, 32), uint8); RGB pictures too."""
    rng = np.random.default_rng(5)
    with store.writer(run_id="stacks", env_id="Stacks-v0", frame_stack={"obs": 4}) as w:
        w.add_batch(stacked_stream(rng, 50, 2, shape=(24, 32), noise=True, p_end=0.08))
    batch = make_batch(rng, 30, 2)
    pictures = rng.integers(0, 256, (31, 2, 16, 20, 3), dtype=np.uint8)
    batch["obs"], batch["next_obs"] = pictures[:-1], pictures[1:]
    with store.writer(run_id="rgb", env_id="Rgb-v0") as w:
        w.add_batch(batch)
    for run, shape in (("stacks", (4, 24, 32)), ("rgb", (16, 20, 3))):
        dataset_id = f"{run}/{data_format}-v0"
        export_minari(store, dataset_id, run_id=run, data_format=data_format)
        dataset = minari.load_dataset(dataset_id)
        space = dataset.observation_space
        assert (space.shape, space.dtype, space.low.min(), space.high.max()) == (shape, np.uint8, 0, 255)
        loaded = list(dataset.iterate_episodes())
        stored = store.episodes(run_id=run, complete=True)["episode_id"].to_pylist()
        assert len(loaded) == len(stored)
        for e, episode_id in zip(loaded, stored):
            steps = store.scan(["step", "obs", "next_obs"], episode_id=episode_id).read_all().sort_by("step")
            obs = np.array(steps["obs"].to_pylist(), np.uint8)
            assert e.observations.dtype == np.uint8 and e.observations.shape == (len(obs) + 1, *shape)
            np.testing.assert_array_equal(e.observations[:-1], obs)
            np.testing.assert_array_equal(e.observations[-1], np.array(steps["next_obs"][-1].as_py(), np.uint8))
