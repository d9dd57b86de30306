"""Discounted returns and per-step return-to-go, exact in float64 at any episode length and gamma.

``G_t = r_t + gamma * G_{t+1}`` is evaluated by its own recursion (one compiled pass), never by
the ``sum(r * gamma**k) / gamma**t`` window trick, which overflows on long episodes.
"""

from __future__ import annotations

import numba
import numpy as np

from trajstore.errors import InputError


def check_gamma(gamma: float) -> float:
    try:
        g = float(gamma)
    except (TypeError, ValueError):
        raise InputError(f"gamma must be a number in [0, 1], got {gamma!r}") from None
    if not 0.0 <= g <= 1.0:
        raise InputError(f"gamma must be in [0, 1], got {gamma}")
    return g


def discounted_sum(rewards: np.ndarray, gamma: float) -> float:
    """``sum_t gamma**t * r_t`` of one episode (the first reward undiscounted), like imitation's."""
    g = check_gamma(gamma)
    out = _rtg_sorted(np.asarray(rewards, np.float64), np.array([0], np.int64), g)
    return float(out[0]) if len(out) else 0.0


def return_to_go(episode_id: np.ndarray, step: np.ndarray, reward: np.ndarray,
                 gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Per-step return-to-go for rows in any order whose episodes are stored as runs of consecutive steps.

    Returns ``(order, G)``: ``order`` sorts the rows by ``(episode_id, step)`` and ``G[i]`` is the
    return-to-go of row ``order[i]``.
    """
    g = check_gamma(gamma)
    episode_id = np.ascontiguousarray(episode_id, np.int64)
    step = np.ascontiguousarray(step, np.int64)
    starts = _piece_starts(episode_id, step)
    piece_order = np.lexsort((step[starts], episode_id[starts]))
    order = _gather(starts, len(episode_id), piece_order)
    sorted_ids = episode_id[order]
    ep_starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]]) if len(order) else \
        np.zeros(0, np.int64)
    return order, _rtg_sorted(np.asarray(reward, np.float64)[order], ep_starts.astype(np.int64), g)


@numba.njit(cache=True)
def _piece_starts(episode_id: np.ndarray, step: np.ndarray) -> np.ndarray:
    """Row indices where a run of consecutive steps of one episode begins."""
    n = len(episode_id)
    out = np.empty(n, np.int64)
    k = 0
    for i in range(n):
        if i == 0 or episode_id[i] != episode_id[i - 1] or step[i] != step[i - 1] + 1:
            out[k] = i
            k += 1
    return out[:k]


@numba.njit(cache=True)
def _gather(starts: np.ndarray, n: int, piece_order: np.ndarray) -> np.ndarray:
    """Row permutation visiting the pieces in ``piece_order``."""
    out = np.empty(n, np.int64)
    k = 0
    for p in piece_order:
        end = starts[p + 1] if p + 1 < len(starts) else n
        for i in range(starts[p], end):
            out[k] = i
            k += 1
    return out


@numba.njit(cache=True)
def _rtg_sorted(reward: np.ndarray, episode_starts: np.ndarray, gamma: float) -> np.ndarray:
    """Return-to-go over rows sorted by (episode, step); ``episode_starts`` marks each episode's first row."""
    n = len(reward)
    out = np.empty(n, np.float64)
    e = len(episode_starts) - 1
    g = 0.0
    for i in range(n - 1, -1, -1):
        g = reward[i] + gamma * g
        out[i] = g
        if e >= 0 and i == episode_starts[e]:
            g = 0.0
            e -= 1
    return out
