"""Run by tests/export/test_lerobot.py with the real lerobot release (in .venv-lerobot, `make lerobot-venv`):
open each exported folder with ``LeRobotDataset`` offline and compare it with what the store holds.

    python lerobot_check.py CASES.json

``CASES.json`` lists ``{"root": folder, "expected": file.npz}``; the ``.npz`` holds the store's steps in export
order (``episode_id, step``): obs, action, next_obs, reward, terminated, truncated, episode_id, env_id, fps; for
a store of pictures also ``obs_picture``/``next_obs_picture`` (each step's picture, ``(C, H, W)`` uint8) and, for
frame stacks, ``obs_stack`` (each step's whole stack of pictures, ``(k, C, H, W)``), which ``delta_timestamps``
must give back.
Prints one ``OK`` line per dataset; any difference raises (exit status 1) naming the feature and the frame.
"""

from __future__ import annotations

import json
import sys

import numpy as np
import torch
from lerobot.datasets.lerobot_dataset import LeRobotDataset

IMAGES = {"observation.image": "obs_picture", "next.observation.image": "next_obs_picture"}
STEP_FEATURES = {"observation.state": "obs", "action": "action", "next.observation.state": "next_obs",
                 "next.reward": "reward", "next.terminated": "terminated", "next.truncated": "truncated"}


def same(name: str, got: np.ndarray, want: np.ndarray) -> None:
    if got.shape != want.shape or not np.array_equal(got, want):
        bad = np.flatnonzero((got.reshape(len(got), -1) != want.reshape(len(want), -1)).any(axis=1)) \
            if got.shape == want.shape else []
        raise AssertionError(f"{name}: shape {got.shape} vs {want.shape}; first differing frame "
                             f"{bad[0] if len(bad) else '?'}")


def frames(ds: LeRobotDataset) -> dict[str, np.ndarray]:
    """Every frame through __getitem__, in order, collated by a DataLoader."""
    out: dict[str, list] = {}
    for batch in torch.utils.data.DataLoader(ds, batch_size=512, shuffle=False, num_workers=0):
        for k, v in batch.items():
            out.setdefault(k, []).append(np.asarray(v) if not isinstance(v, torch.Tensor) else v.numpy())
    return {k: np.concatenate(v) for k, v in out.items()}


def check(root: str, want: dict[str, np.ndarray]) -> str:
    fps = int(want["fps"])
    ds = LeRobotDataset("local/trajstore-export", root=root)
    ids = want["episode_id"]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    lengths = np.diff(np.r_[starts, len(ids)])
    assert len(ds) == len(ids) and ds.num_episodes == len(starts), (len(ds), ds.num_episodes)
    got = frames(ds)
    for name, column in STEP_FEATURES.items():
        if name not in ds.meta.features:  # observations that are pictures: image features instead
            assert column in ("obs", "next_obs") and IMAGES.keys() <= ds.meta.features.keys(), name
            continue
        expected = want[column]
        declared = tuple(ds.meta.features[name]["shape"])
        if declared == (1,):  # a scalar per step: stored and served as a scalar
            expected = expected.reshape(len(expected))
        same(name, got[name], expected)
    for name, column in IMAGES.items():
        if name in ds.meta.features:  # PIL's decoding, as a float in [0, 1]: the stored bytes / 255
            same(name, np.rint(got[name] * 255).astype(np.uint8), want[column])
    same("next.done", got["next.done"], want["terminated"] | want["truncated"])
    episode_index = np.repeat(np.arange(len(starts)), lengths)
    frame_index = np.arange(len(ids)) - np.repeat(starts, lengths)
    same("episode_index", got["episode_index"], episode_index)
    same("frame_index", got["frame_index"], frame_index)
    same("index", got["index"], np.arange(len(ids)))
    same("timestamp", got["timestamp"], (frame_index / fps).astype(np.float32))
    assert list(got["task"]) == list(want["env_id"]), "task"
    episodes = ds.meta.episodes
    same("length", np.asarray(episodes["length"]), lengths)
    same("dataset_from_index", np.asarray(episodes["dataset_from_index"]), starts)
    same("trajstore/episode_id", np.asarray(episodes["trajstore/episode_id"]), ids[starts])
    check_stats(ds, got, len(ids))
    check_windows(root, want, starts, lengths, fps)
    batch = next(iter(torch.utils.data.DataLoader(ds, batch_size=64, shuffle=True, num_workers=2)))
    observation = "observation.image" if "observation.image" in ds.meta.features else "observation.state"
    assert batch[observation].shape[0] == min(64, len(ds))
    files = {(e["data/chunk_index"], e["data/file_index"]) for e in episodes}
    return f"OK {root}: {len(ids)} frames, {len(starts)} episodes, {len(files)} data file(s)"


def check_stats(ds: LeRobotDataset, got: dict[str, np.ndarray], n: int) -> None:
    """meta/stats.json over every frame: count, min, max and mean as numpy computes them over the frames."""
    for name, feature in ds.meta.features.items():
        s = ds.meta.stats[name]
        values = got[name].astype(np.float64)
        d = feature["shape"][-1] if tuple(feature["shape"]) != (1,) else 1
        if feature["dtype"] == "image":  # (N, C, H, W) in [0, 1]: per channel, shaped (C, 1, 1)
            values = values.transpose(0, 2, 3, 1)
            assert s["mean"].shape == (d, 1, 1), (name, s["mean"].shape)
            s = {k: v.reshape(-1) if k != "count" else v for k, v in s.items()}
        values = values.reshape(-1, d)
        assert s["count"].tolist() == [n], (name, s["count"])
        np.testing.assert_allclose(s["min"], values.min(axis=0), err_msg=name)
        np.testing.assert_allclose(s["max"], values.max(axis=0), err_msg=name)
        np.testing.assert_allclose(s["mean"], values.mean(axis=0), rtol=1e-6, atol=1e-9, err_msg=name)
        np.testing.assert_allclose(s["std"], values.std(axis=0), rtol=1e-5, atol=1e-7, err_msg=name)
        for q in ("q01", "q10", "q50", "q90", "q99"):
            assert s[q].shape == s["mean"].shape, (name, q)


def check_windows(root: str, want: dict[str, np.ndarray], starts: np.ndarray, lengths: np.ndarray,
                  fps: int) -> None:
    """``delta_timestamps`` windows: the neighbouring frames of the same episode, clamped and marked padding at
    the episode's ends."""
    deltas = [-2, -1, 0, 1]
    images = "obs_picture" in want
    observation = "observation.image" if images else "observation.state"
    k = want["obs_stack"].shape[1] if "obs_stack" in want else 2
    ds = LeRobotDataset("local/trajstore-export", root=root,
                        delta_timestamps={"action": [d / fps for d in deltas],
                                          observation: [d / fps for d in range(1 - k, 1)]})
    action = want["action"].reshape(len(want["action"]), -1)
    for i in np.unique(np.r_[starts, starts + lengths - 1, np.linspace(0, len(action) - 1, 50).astype(int)]):
        e = np.searchsorted(starts, i, side="right") - 1
        lo, hi = starts[e], starts[e] + lengths[e] - 1
        item = ds[int(i)]
        wanted = np.clip(i + np.array(deltas), lo, hi)
        got = item["action"].numpy().reshape(len(deltas), -1)
        same(f"action window at frame {i}", got, action[wanted])
        pad = (i + np.array(deltas) < lo) | (i + np.array(deltas) > hi)
        same(f"action_is_pad at frame {i}", item["action_is_pad"].numpy(), pad)
        assert tuple(item[observation].shape)[0] == k
        if "obs_stack" in want:  # the frames before, clamped at the episode's start: the stack the env returned
            same(f"observation.image stack at frame {i}", np.rint(item[observation].numpy() * 255).astype(np.uint8),
                 want["obs_stack"][i])


def main() -> int:
    cases = json.loads(open(sys.argv[1]).read())
    for case in cases:
        with np.load(case["expected"]) as data:
            print(check(case["root"], dict(data)), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
