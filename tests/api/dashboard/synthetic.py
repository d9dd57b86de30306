"""Synthetic learning runs for the dashboard's tests, benchmark and screenshots.

Each run is a vector env whose episodes get longer and better as training goes on (CartPole-like:
terminated early, truncated at 500 steps), written with the library writer in ``(T, B)`` batches,
with ``policy_version`` lineage (one writer per version) and ``value`` / ``log_prob`` extras. Every
env stops after its last complete episode of a version (a validity mask), so every episode is complete.

>>> import tempfile, trajstore
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> write_learning_runs(store, episodes=200, runs=2, num_envs=4)
>>> 190 <= store.stats().column("n_traj")[0].as_py() <= 210
True
"""

from __future__ import annotations

import numpy as np

from trajstore.store import Store

TIME_LIMIT = 500
OBS_DIM = 4


def _episode_masks(rng: np.random.Generator, episodes: int, B: int,
                   mean_len: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``(terminated, truncated, valid)`` masks of ``episodes`` back-to-back episodes over ``B`` envs (a few more
    when several envs end at the same step); every env stops after its last complete episode (``valid`` False)."""
    draws = 2 * -(-episodes // B) + 8
    lengths = np.minimum(np.ceil(rng.gamma(4.0, mean_len / 4, size=(B, draws))).astype(np.int64), TIME_LIMIT)
    ends = np.cumsum(lengths, axis=1) - 1
    T = int(np.sort(ends, axis=None)[episodes - 1]) + 1
    terminated = np.zeros((T, B), bool)
    truncated = np.zeros((T, B), bool)
    last = np.full(B, -1)
    for b in range(B):
        e, n = ends[b][ends[b] < T], lengths[b][ends[b] < T]
        terminated[e[n < TIME_LIMIT], b] = True
        truncated[e[n >= TIME_LIMIT], b] = True
        last[b] = e[-1] if len(e) else -1
    return terminated, truncated, np.arange(T)[:, None] <= last[None, :]


def _age(done: np.ndarray) -> np.ndarray:
    """Index of every step inside its episode, from the ``(T, B)`` end mask."""
    T = done.shape[0]
    t = np.arange(T)[:, None]
    start = np.zeros_like(done, dtype=np.int64)
    start[1:] = np.where(done[:-1], t[1:], 0)
    return t - np.maximum.accumulate(start, axis=0)


def _batch(rng: np.random.Generator, age: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
           phase: np.ndarray, progress: float, mean_len: float) -> dict:
    def obs(a: np.ndarray) -> np.ndarray:
        angle = a[..., None] * (0.05 * np.arange(1, OBS_DIM + 1)) + phase[None, :, None]
        return (np.sin(angle) * np.exp(-a[..., None] / 400)).astype(np.float32)

    shape = age.shape
    quality = 0.4 + 0.6 * progress
    return {"obs": obs(age), "action": rng.integers(0, 2, shape), "next_obs": obs(age + 1),
            "reward": np.clip(rng.normal(quality, 0.3, shape), 0, None).astype(np.float32),
            "terminated": terminated, "truncated": truncated,
            "extras": {
                "value": (np.maximum(mean_len - age, 0) * quality + rng.normal(0, 2, shape)).astype(np.float32),
                "log_prob": (np.log(0.5) * (1 - 0.8 * progress) + rng.normal(0, 0.05, shape)).astype(np.float32)}}


def write_learning_runs(store: Store, *, episodes: int, runs: int = 3, num_envs: int = 64, versions: int = 8,
                        horizon: int = 256, env_id: str = "Synthetic-v0", run_prefix: str = "ppo-seed",
                        seed: int = 0) -> None:
    """``episodes`` complete episodes (a few more on ties), over ``runs`` runs of ``versions`` policy versions."""
    rng = np.random.default_rng(seed)
    per_version = -(-episodes // (runs * versions))
    for r in range(runs):
        phase = rng.uniform(0, 2 * np.pi, num_envs)
        for v in range(versions):
            progress = min(1.0, (v + 0.5) / versions * (1 + 0.25 * r))
            mean_len = 20 + 150 * progress
            terminated, truncated, valid = _episode_masks(rng, per_version, num_envs, mean_len)
            age = _age(terminated | truncated)
            with store.writer(run_id=f"{run_prefix}{r}", env_id=env_id, policy_version=v) as w:
                for t0 in range(0, len(valid), horizon):
                    s = slice(t0, t0 + horizon)
                    batch = _batch(rng, age[s], terminated[s], truncated[s], phase, progress, mean_len)
                    w.add_batch({**batch, "valid": valid[s]})
