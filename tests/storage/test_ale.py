"""Real Atari frame stacks (ale-py's Breakout through gymnasium's AtariPreprocessing and FrameStackObservation(4)),
recorded from a vector env under both autoreset modes, with terminated (a life lost) and truncated (time limit)
ends: written with ``frame_stack={"obs": 4}``, each frame is stored once, and every reader gives back exactly the
stacks that were written, ``next_obs`` included."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest

import trajstore
from trajstore.schema import to_numpy

ale_py = pytest.importorskip("ale_py")
pytest.importorskip("cv2")  # AtariPreprocessing resizes with OpenCV

import gymnasium as gym  # noqa: E402
from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation  # noqa: E402

T, B = 90, 3


def make_env() -> gym.Env:
    env = gym.make("ALE/Breakout-v5", frameskip=1, max_episode_steps=120)  # 120 frames: 30 agent steps at most
    env = AtariPreprocessing(env, frame_skip=4, screen_size=84, grayscale_obs=True, terminal_on_life_loss=True)
    return FrameStackObservation(env, 4)


def record(mode: str) -> dict[str, Any]:
    """A (T, B) batch stepped by a random policy, as a writer with ``autoreset=mode`` takes it (same-step: the
    true final stacks from ``info["final_obs"]`` as next_obs at episode ends)."""
    gym.register_envs(ale_py)
    autoreset = gym.vector.AutoresetMode.SAME_STEP if mode == "same-step" else gym.vector.AutoresetMode.NEXT_STEP
    envs = gym.vector.SyncVectorEnv([make_env] * B, autoreset_mode=autoreset)
    envs.action_space.seed(0)
    obs, _ = envs.reset(seed=0)
    out: dict[str, list[np.ndarray]] = {k: [] for k in ("obs", "action", "reward", "next_obs", "terminated",
                                                         "truncated")}
    for _ in range(T):
        action = envs.action_space.sample()
        nxt, reward, terminated, truncated, info = envs.step(action)
        following = nxt.copy()
        if mode == "same-step":
            for b in np.flatnonzero(terminated | truncated):
                following[b] = info["final_obs"][b]
        for name, value in zip(out, (obs, action, reward.astype(np.float32), following, terminated, truncated)):
            out[name].append(np.asarray(value))
        obs = nxt
    envs.close()
    batch: dict[str, Any] = {name: np.stack(values) for name, values in out.items()}
    batch["extras"] = {"t": np.repeat(np.arange(T)[:, None], B, axis=1)}
    return batch


@pytest.mark.parametrize("mode", ["same-step", "next-step"])
def test_atari_frame_stacks_round_trip_exactly_with_each_frame_stored_once(tmp_path: Path, mode: str) -> None:
    batch = record(mode)
    done = batch["terminated"] | batch["truncated"]
    assert batch["obs"].dtype == np.uint8 and batch["obs"].shape == (T, B, 4, 84, 84)
    assert batch["terminated"].any() and batch["truncated"].any()  # both kinds of end
    store = trajstore.open(tmp_path / "store", create=True)
    with store.writer(run_id="atari", env_id="ALE/Breakout-v5", autoreset=mode, frame_stack={"obs": 4},
                      flush_bytes=200_000) as w:  # several files: episodes cross them
        w.add_batch({k: v[:40] if k != "extras" else {"t": v["t"][:40]} for k, v in batch.items()})
        w.add_batch({k: v[40:] if k != "extras" else {"t": v["t"][40:]} for k, v in batch.items()})
    assert len(store.maintain.files()) > 1

    rows = store.scan(["t", "env_index", "episode_id", "step", "obs", "next_obs"]).read_all()
    t, b = rows["t"].to_numpy(), rows["env_index"].to_numpy()
    stored = T * B - (int(done[:-1].sum()) if mode == "next-step" else 0)  # next-step: a reset step after each end
    assert rows.num_rows == stored
    obs, nxt = to_numpy(rows["obs"]), to_numpy(rows["next_obs"])
    assert obs.dtype == np.uint8 and nxt.dtype == np.uint8
    np.testing.assert_array_equal(obs, batch["obs"][t, b])
    np.testing.assert_array_equal(nxt, batch["next_obs"][t, b])

    (loaded,) = store.iter_batches(batch_size=stored, columns=["t", "env_index", "obs", "next_obs"])
    at = (loaded["t"], loaded["env_index"])
    np.testing.assert_array_equal(loaded["obs"], batch["obs"][at])
    np.testing.assert_array_equal(loaded["next_obs"], batch["next_obs"][at])
    episode = int(rows["episode_id"][0].as_py())
    sql = store.sql(f"SELECT t, env_index, obs, next_obs FROM steps WHERE episode_id = {episode} ORDER BY step")
    at = (sql["t"].to_numpy(), sql["env_index"].to_numpy())
    np.testing.assert_array_equal(np.array(sql["obs"].to_pylist(), np.uint8), batch["obs"][at])
    np.testing.assert_array_equal(np.array(sql["next_obs"].to_pylist(), np.uint8), batch["next_obs"][at])

    frames = 0  # frames the files hold: one per step, a whole stack (4) where a stack starts in a file
    for f in store.maintain.files():
        table = pq.read_table(f.path, columns=["obs_new_frames"])
        frames += sum(len(stack) for stack in table["obs_new_frames"].to_pylist())
    episodes_in_files = sum(len(np.unique(pq.read_table(f.path, columns=["episode_id"])["episode_id"]))
                            for f in store.maintain.files())
    assert frames == stored + 3 * episodes_in_files  # every frame once (4x less than the stacks' frames)
    sparse = "next_obs_sparse_new_frames"
    next_null = sum(pq.read_table(f.path, columns=[sparse])[sparse].null_count for f in store.maintain.files())
    assert next_null >= stored - episodes_in_files  # next_obs stored only where it is not the next step's obs
