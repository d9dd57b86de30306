"""Export to Minari (the optional extra; skipped without it): minari.load_dataset opens the same episodes."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

import trajstore
from trajstore.errors import InputError, RunNotFoundError
from trajstore.export.minari import export_minari
from trajstore.rollout import gym_rollout

minari = pytest.importorskip("minari")


def test_the_exported_dataset_holds_the_same_episodes(datasets: Path, store: trajstore.Store,
                                                      capsys: pytest.CaptureFixture[str]) -> None:
    gym_rollout(store, "CartPole-v1", run_id="r", num_envs=2, episodes=6, seed=0, progress=False)
    gym_rollout(store, "CartPole-v1", run_id="other", num_envs=1, episodes=2, seed=1, progress=False)
    from trajstore import cli

    assert cli.main(["export", "minari", "--store", str(store.root), "--run", "r", "cartpole/ts-v0"]) == 0
    shown = capsys.readouterr()
    n = store.episodes(run_id="r").num_rows
    assert "Minari dataset cartpole/ts-v0" in shown.out
    assert f"{n}/{n} [" not in shown.err  # its progress bar only on a terminal (tests/cli/test_parser.py)
    loaded = list(minari.load_dataset("cartpole/ts-v0").iterate_episodes())
    stored = store.episodes(run_id="r")
    assert [len(e.rewards) for e in loaded] == stored["episode_length"].to_pylist()
    np.testing.assert_allclose([e.rewards.sum() for e in loaded], stored["episode_return"].to_numpy(), rtol=1e-6)
    for e, episode_id in zip(loaded, stored["episode_id"].to_pylist()):
        steps = store.sql(f"SELECT obs, next_obs, action, terminated, truncated FROM steps "
                          f"WHERE episode_id = {episode_id} ORDER BY step")
        obs = np.array(steps["obs"].to_pylist(), np.float32)
        np.testing.assert_array_equal(e.observations[:-1], obs)
        np.testing.assert_array_equal(e.observations[-1], np.array(steps["next_obs"][-1].as_py(), np.float32))
        np.testing.assert_array_equal(e.actions, steps["action"].to_numpy())
        assert e.terminations.tolist() == steps["terminated"].to_pylist()
        assert e.truncations.tolist() == steps["truncated"].to_pylist()


def test_bad_exports_are_named(datasets: Path, store: trajstore.Store) -> None:
    gym_rollout(store, "CartPole-v1", run_id="r", num_envs=1, episodes=1, seed=0, progress=False)
    with pytest.raises(RunNotFoundError, match="run_id: no run 'x'"):
        export_minari(store, "cartpole/a-v0", run_id="x")
    export_minari(store, "cartpole/a-v0", run_id="r")
    with pytest.raises(InputError, match="name: a local Minari dataset 'cartpole/a-v0' exists already"):
        export_minari(store, "cartpole/a-v0", run_id="r")
