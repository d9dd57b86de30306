"""Exports of one agent of multi-agent runs (``agent=``, ``trajstore export … --agent``): each episode's rows of that
agent, in step order, are an episode of the dataset, equal to the agent's rows as ``store.sql`` reads them; complete
when the agent's own last row ended it (``agent_episodes.complete``). Real envs: mpe2's simple_spread and PettingZoo's
knights_archers_zombies (agents killed before the episode ends); the real minari opens the Minari datasets, and the
LeRobot files are read as a plain Parquet reader sees them (and by the real lerobot where its venv exists)."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trajstore
from tests.export.test_lerobot import CHECK, LEROBOT_PYTHON
from trajstore import cli
from trajstore.errors import InputError
from trajstore.export.lerobot import export_lerobot
from trajstore.export.minari import export_minari
from trajstore.schema import to_numpy

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")

from mpe2 import simple_spread_v3

from trajstore.integrations.pettingzoo import RecordParallelToStore
from trajstore.rollout import parallel_rollout

minari = pytest.importorskip("minari")


@pytest.fixture
def spread(tmp_path: Path) -> trajstore.Store:
    """simple_spread: 3 complete episodes of 10 env steps and one stopped after 4 (unfinished)."""
    store = trajstore.open(tmp_path / "spread", create=True)
    parallel_rollout(store, lambda: simple_spread_v3.parallel_env(max_cycles=10), run_id="spread", episodes=3,
                     steps=3 * 3 * 10 + 3 * 4, seed=1, progress=False)
    return store


def agent_rows(store: trajstore.Store, agent: str, episode_ids: list[int]) -> dict[str, np.ndarray]:
    """The agent's rows of ``episode_ids`` in (episode_id, step) order: the reference."""
    rows = store.sql(f"SELECT episode_id, env_id, obs, action, next_obs, reward, terminated, truncated FROM steps "
                     f"WHERE agent_id = '{agent}' AND episode_id IN ({', '.join(map(str, episode_ids))}) "
                     "ORDER BY episode_id, step")
    out = {name: to_numpy(rows[name]) for name in rows.column_names if name != "env_id"}
    out["env_id"] = np.array(rows["env_id"].to_pylist())
    return out


def complete(store: trajstore.Store, agent: str, *, unfinished: bool = False) -> list[int]:
    """The episodes the agent ended (with ``unfinished``: every one it acted in), by id."""
    cond = "" if unfinished else " AND complete"
    return store.sql(f"SELECT episode_id FROM agent_episodes WHERE agent_id = '{agent}'{cond} "
                     "ORDER BY episode_id").column(0).to_pylist()


def same_as_minari(dataset_id: str, store: trajstore.Store, agent: str, episode_ids: list[int]) -> None:
    loaded = list(minari.load_dataset(dataset_id).iterate_episodes())
    assert len(loaded) == len(episode_ids)
    for e, eid in zip(loaded, episode_ids):
        want = agent_rows(store, agent, [eid])
        np.testing.assert_array_equal(e.observations[:-1], want["obs"])
        np.testing.assert_array_equal(e.observations[-1], want["next_obs"][-1])
        np.testing.assert_array_equal(e.actions, want["action"])
        np.testing.assert_array_equal(e.rewards, want["reward"])
        assert e.terminations.tolist() == want["terminated"].tolist()
        assert e.truncations.tolist() == want["truncated"].tolist()


def test_minari_holds_the_agents_own_trajectories(datasets: Path, spread: trajstore.Store,
                                                  capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["export", "minari", "--store", str(spread.root), "--agent", "agent_1", "spread/agent1-v0"]) == 0
    assert "exported 3 episode(s) of agent 'agent_1', 30 step(s)" in capsys.readouterr().out
    ended = complete(spread, "agent_1")
    assert len(ended) == 3
    same_as_minari("spread/agent1-v0", spread, "agent_1", ended)
    dataset = minari.load_dataset("spread/agent1-v0")
    assert dataset.total_steps == 30 and "agent 'agent_1'" in dataset.storage.metadata["description"]
    result = export_minari(spread, "spread/all-v0", agent="agent_0", include_unfinished=True)
    assert (result.episodes, result.steps) == (4, 34)
    same_as_minari("spread/all-v0", spread, "agent_0", complete(spread, "agent_0", unfinished=True))


def test_an_agent_killed_early_is_a_complete_episode(datasets: Path, tmp_path: Path) -> None:
    """knights_archers_zombies, each episode stopped as soon as an agent is killed while others play on: the killed
    agent's trajectory ended (terminated on its last row) and is exported; the others' did not and are not."""
    pytest.importorskip("pygame")
    from pettingzoo.butterfly import knights_archers_zombies_v11

    store = trajstore.open(tmp_path / "kaz", create=True)
    env = knights_archers_zombies_v11.parallel_env(max_cycles=300, spawn_delay=5, max_zombies=20)
    rng = np.random.default_rng(0)
    killed = []
    with RecordParallelToStore(env, store, run_id="kaz") as rec:
        for e in range(3):
            rec.reset(seed=e)
            while env.agents:
                _, _, term, _, _ = rec.step({a: int(rng.integers(env.action_space(a).n)) for a in env.agents})
                if env.agents and any(term.values()):
                    killed += [a for a, t in term.items() if t]
                    break
    assert killed and store.sql("SELECT count(*) FROM episodes WHERE NOT complete")[0][0].as_py() >= 1
    agent = killed[0]
    ended = complete(store, agent)
    others = [a for a in ("archer_0", "archer_1", "knight_0", "knight_1") if a not in killed]
    assert len(ended) > len(complete(store, others[0]))  # its own end counts, not the episode's
    export_minari(store, "kaz/killed-v0", agent=agent)
    same_as_minari("kaz/killed-v0", store, agent, ended)
    assert minari.load_dataset("kaz/killed-v0").observation_space.shape == env.observation_space(agent).shape


def test_lerobot_holds_the_agents_own_trajectories(spread: trajstore.Store, tmp_path: Path) -> None:
    result = export_lerobot(spread, tmp_path / "out", agent="agent_2", fps=10)
    ended = complete(spread, "agent_2")
    want = agent_rows(spread, "agent_2", ended)
    root = tmp_path / "out"
    info = json.loads((root / "meta/info.json").read_text())
    assert (info["total_frames"], info["total_episodes"]) == (len(want["reward"]), 3) == (result.steps,
                                                                                           result.episodes)
    frames = pa.concat_tables([pq.read_table(f) for f in sorted(root.glob("data/chunk-*/file-*.parquet"))])
    np.testing.assert_array_equal(to_numpy(frames["observation.state"]), want["obs"])
    np.testing.assert_array_equal(to_numpy(frames["next.observation.state"]), want["next_obs"])
    np.testing.assert_array_equal(frames["action"].to_numpy(), want["action"])
    np.testing.assert_array_equal(frames["next.reward"].to_numpy(), want["reward"])
    np.testing.assert_array_equal(frames["next.done"].to_numpy(zero_copy_only=False),
                                  want["terminated"] | want["truncated"])
    assert frames["frame_index"].to_pylist() == list(range(10)) * 3
    episodes = pq.read_table(root / "meta/episodes/chunk-000/file-000.parquet")
    assert episodes["trajstore/episode_id"].to_pylist() == ended
    assert episodes["trajstore/agent_id"].to_pylist() == ["agent_2"] * 3
    assert episodes["length"].to_pylist() == [10, 10, 10]


@pytest.mark.lerobot
@pytest.mark.skipif(not LEROBOT_PYTHON.exists(), reason="no lerobot venv: build it with `make lerobot-venv` "
                                                        "(needs Python >= 3.12)")
def test_the_real_lerobot_opens_an_agents_export(spread: trajstore.Store, tmp_path: Path) -> None:
    export_lerobot(spread, tmp_path / "agent", agent="agent_0", fps=15)
    np.savez(tmp_path / "agent.npz", fps=15, **agent_rows(spread, "agent_0", complete(spread, "agent_0")))
    (tmp_path / "cases.json").write_text(json.dumps([{"root": str(tmp_path / "agent"),
                                                      "expected": str(tmp_path / "agent.npz")}]))
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf"), "PYTHONPATH": ""}
    done = subprocess.run([str(LEROBOT_PYTHON), str(CHECK), str(tmp_path / "cases.json")], capture_output=True,
                          text=True, env=env, timeout=600)
    assert done.returncode == 0 and done.stdout.count("OK ") == 1, done.stdout + done.stderr[-6000:]


def test_multi_agent_runs_without_an_agent_are_refused_naming_them(datasets: Path, spread: trajstore.Store,
                                                                   tmp_path: Path,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    assert cli.main(["export", "lerobot", "--store", str(spread.root), str(tmp_path / "out")]) != 0
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "--run: 'spread' holds multi-agent episodes" in err
    assert "export one agent (--agent …), one of agent_0, agent_1, agent_2;" in err
    assert not (tmp_path / "out").exists()
    cases: list[tuple[Any, str]] = [("nobody", r"^agent: no rows of 'nobody' in the store; its agents are "
                                               r"'agent_0', 'agent_1', 'agent_2'$"),
                                    ("agent_0,agent_1", r"^agent: expected one agent id"),
                                    ("", r"^agent: expected one agent id")]
    for agent, message in cases:
        with pytest.raises(InputError, match=message):
            export_minari(spread, "spread/bad-v0", agent=agent)
    assert list(minari.list_local_datasets()) == []
