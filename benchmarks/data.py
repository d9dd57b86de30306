"""Synthetic CartPole-sized rollouts as a JAX-style ``lax.scan`` would yield them: time-major ``(T, B)`` batches.

Every env runs episodes back to back (same-step autoreset). Episode lengths are geometric with mean 100,
capped at CartPole-v1's time limit of 500 (those episodes are truncated, the rest terminated), so episodes
cross batch boundaries and the last one of each env is still running when the rollout stops.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

MEAN_EPISODE = 100
TIME_LIMIT = 500
OBS_DIM = 4


@dataclass
class Rollout:
    """The batches plus what is known about them in advance."""

    batches: list[dict[str, np.ndarray]]
    steps: int
    envs: int
    horizon: int
    complete_episodes: int
    truncated_episodes: int

    @property
    def bytes(self) -> int:
        return sum(a.nbytes for b in self.batches for a in b.values())


def _done_masks(rng: np.random.Generator, total_t: int, envs: int) -> tuple[np.ndarray, np.ndarray]:
    draws = 2 * total_t // MEAN_EPISODE + 50
    while True:
        lengths = np.minimum(rng.geometric(1 / MEAN_EPISODE, size=(envs, draws)), TIME_LIMIT)
        ends = np.cumsum(lengths, axis=1) - 1
        if (ends[:, -1] >= total_t).all():
            break
        draws *= 2
    env = np.broadcast_to(np.arange(envs)[:, None], ends.shape)
    inside = ends < total_t
    terminated = np.zeros((total_t, envs), bool)
    truncated = np.zeros((total_t, envs), bool)
    cut = inside & (lengths == TIME_LIMIT)
    terminated[ends[inside & ~cut], env[inside & ~cut]] = True
    truncated[ends[cut], env[cut]] = True
    return terminated, truncated


def make_rollout(steps: int, *, envs: int = 1000, horizon: int = 250, seed: int = 0) -> Rollout:
    """About ``steps`` transitions (rounded down to a multiple of ``envs``) in batches of ``horizon`` steps
    (fewer when the rollout is short)."""
    total_t = max(1, steps // envs)
    horizon = max(1, min(horizon, total_t // 4))  # at least four batches, so episodes cross batches
    rng = np.random.default_rng(seed)
    terminated, truncated = _done_masks(rng, total_t, envs)
    states = rng.standard_normal((total_t + 1, envs, OBS_DIM), dtype=np.float32)
    action = rng.integers(0, 2, size=(total_t, envs), dtype=np.int64)
    batches = []
    for t0 in range(0, total_t, horizon):
        t1 = min(t0 + horizon, total_t)
        batches.append({
            "obs": np.ascontiguousarray(states[t0:t1]),
            "action": np.ascontiguousarray(action[t0:t1]),
            "reward": np.ones((t1 - t0, envs), np.float32),
            "next_obs": np.ascontiguousarray(states[t0 + 1:t1 + 1]),
            "terminated": np.ascontiguousarray(terminated[t0:t1]),
            "truncated": np.ascontiguousarray(truncated[t0:t1]),
        })
    return Rollout(batches, total_t * envs, envs, horizon, int(terminated.sum() + truncated.sum()),
                   int(truncated.sum()))
