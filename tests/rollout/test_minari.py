"""Importing Minari datasets (the optional ``minari`` extra; skipped without it): every episode stored,
obs/next_obs aligned, flags kept apart, episodes cut without a flag kept incomplete."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import gymnasium as gym
import numpy as np
import pytest

import trajstore
from trajstore.rollout.minari import import_minari

minari = pytest.importorskip("minari")


def collect(dataset_id: str, episodes: int, *, seed: int = 0, data_format: str = "arrow") -> Any:
    """A CartPole dataset from Minari's own DataCollector with random actions."""
    env = minari.DataCollector(gym.make("CartPole-v1"), record_infos=False, data_format=data_format)
    env.reset(seed=seed)
    env.action_space.seed(seed)
    for _ in range(episodes):
        done = False
        while not done:
            _, _, terminated, truncated, _ = env.step(env.action_space.sample())
            done = terminated or truncated
        env.reset()
    return env.create_dataset(dataset_id=dataset_id, algorithm_name="random", author="test",
                              author_email="test@example.org", code_permalink="https://example.org")


@pytest.mark.parametrize("data_format", ["arrow", "hdf5"])  # hdf5 is Minari's default (needs h5py)
def test_every_episode_is_stored_with_its_transitions(datasets: Path, store: trajstore.Store,
                                                      data_format: str) -> None:
    dataset = collect("cartpole/random-v0", 12, data_format=data_format)
    result = import_minari(store, "cartpole/random-v0", progress=False)
    assert (result.run_id, result.env_id, result.episodes) == ("cartpole-random-v0", "CartPole-v1", 12)
    reference = list(dataset.iterate_episodes())
    stored_steps = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
    assert result.steps == sum(len(e.rewards) for e in reference) == stored_steps
    eps = store.episodes(order_by="episode_id").to_pylist()
    assert [(e["episode_length"], e["episode_return"], e["terminated"], e["truncated"]) for e in eps] == \
        [(len(e.rewards), float(e.rewards.sum()), bool(e.terminations[-1]), bool(e.truncations[-1])) for e in reference]
    stats = store.stats().to_pylist()[0]
    returns = [float(e.rewards.sum()) for e in reference]
    assert stats["n_traj"] == 12 and stats["return_mean"] == pytest.approx(np.mean(returns))
    assert stats["return_std"] == pytest.approx(np.std(returns))
    # the transitions: obs and next_obs are consecutive observations, flags only on the last step
    for stored, ref in zip(eps, reference):
        steps = store.sql(f"SELECT obs, next_obs, action, terminated FROM steps WHERE episode_id = "
                          f"{stored['episode_id']} ORDER BY step")
        np.testing.assert_array_equal(np.stack(steps["obs"].to_numpy(zero_copy_only=False)), ref.observations[:-1])
        np.testing.assert_array_equal(np.stack(steps["next_obs"].to_numpy(zero_copy_only=False)), ref.observations[1:])
        np.testing.assert_array_equal(steps["action"].to_numpy(), ref.actions)
        assert steps["terminated"].to_pylist() == ref.terminations.tolist()


def test_an_episode_without_a_final_flag_stays_incomplete_and_apart(datasets: Path, store: trajstore.Store) -> None:
    rng = np.random.default_rng(1)

    def episode(T: int, terminated: bool) -> Any:
        from minari.data_collector import EpisodeBuffer

        flags = [False] * T
        flags[-1] = terminated
        return EpisodeBuffer(observations=list(rng.normal(size=(T + 1, 4)).astype(np.float32)),
                             actions=list(rng.integers(0, 2, T)), rewards=[1.0] * T, terminations=flags,
                             truncations=[False] * T)

    minari.create_dataset_from_buffers("toy/cut-v0", [episode(5, False), episode(3, True), episode(4, False)],
                                       env=gym.make("CartPole-v1"), algorithm_name="test", data_format="arrow",
                                       author="test", author_email="test@example.org",
                                       code_permalink="https://example.org")
    result = import_minari(store, "toy/cut-v0", run_id="cut", env_id="Toy-v0", progress=False)
    assert (result.steps, result.episodes) == (12, 1)
    eps = store.episodes(run_id="cut", order_by="episode_id").to_pylist()
    assert [(e["episode_length"], e["complete"]) for e in eps] == [(5, False), (3, True), (4, False)]
    assert store.stats(include_incomplete=True)["n_traj"][0].as_py() == 3


def test_cli_import_stores_a_dataset_and_refuses_unknown_ones(datasets: Path, tmp_path: Path,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from trajstore import cli

    collect("cartpole/cli-v0", 4, seed=2)
    path = str(tmp_path / "store")
    assert cli.main(["import", "minari", "cartpole/cli-v0", "--store", path, "--run", "offline"]) == 0
    out, err = capsys.readouterr()
    assert "imported" in out and "4 complete episodes" in out and "'offline'" in out
    assert "steps/s" not in err  # its progress bar only on a terminal (tests/cli/test_parser.py)
    assert trajstore.open(path).stats(run_id="offline")["n_traj"][0].as_py() == 4
    assert cli.main(["import", "minari", "nope/missing-v0", "--store", path]) != 0
    err = capsys.readouterr().err
    assert err.startswith("trajstore: error: dataset: no local Minari dataset 'nope/missing-v0'")
    assert "cartpole/cli-v0" in err and "`minari download nope/missing-v0`" in err and "Traceback" not in err
    assert "download=True" not in err  # a CLI user cannot pass that
