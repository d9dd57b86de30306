"""Cutting time-major ``(T, B)`` batches into episodes, carrying each env's open episode across batches.

:func:`segment` is the vectorised cut used by the writer; :func:`segment_reference` is the plain
loop it is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import numpy as np

from trajstore.errors import InputError

Autoreset = Literal["same-step", "next-step", "off"]

FRESH, OPEN, ENDED = 0, 1, 2


@dataclass
class Cursors:
    """Per-env state between batches: the open episode's id and next step, and whether it just ended."""

    episode_id: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    next_step: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int64))
    state: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int8))

    @classmethod
    def empty(cls, num_envs: int) -> Cursors:
        return cls(np.full(num_envs, -1, np.int64), np.zeros(num_envs, np.int64), np.zeros(num_envs, np.int8))

    @property
    def num_envs(self) -> int:
        return len(self.state)

    def copy(self) -> Cursors:
        return Cursors(self.episode_id.copy(), self.next_step.copy(), self.state.copy())


@dataclass
class Segments:
    """Result of cutting one batch: which ``(b, t)`` cells are kept, in env-major order, and their ids."""

    rows: np.ndarray          # flat indices into the (B, T) env-major layout
    episode_id: np.ndarray    # int64 per kept row
    step: np.ndarray          # int64 per kept row
    cursors: Cursors          # state after the batch
    new_episodes: int         # ids drawn from the allocator
    completed: int            # episodes that ended in this batch


def _drop_reset_steps(v: np.ndarray, d: np.ndarray, T: int, cursors: Cursors) -> np.ndarray:
    """Next-step autoreset: the first valid step of an env after a kept done is gymnasium's reset step.

    A reset step's own flags are ignored, so in a run of ``r`` done flags right before a step (with
    the env's ended state at the batch start counting as one more) the step is a reset step iff
    that count is odd.
    """
    idx = np.flatnonzero(v)
    n = len(idx)
    pos = np.arange(n)
    env = idx // T
    first = np.ones(n, bool)
    first[1:] = env[1:] != env[:-1]
    env_start = np.maximum.accumulate(np.where(first, pos, 0)) if n else pos
    last_not_done = np.maximum.accumulate(np.where(d[idx], -1, pos)) if n else pos
    prev_not_done = np.r_[-1, last_not_done[:-1]] if n else pos
    run = pos - np.maximum(prev_not_done + 1, env_start)
    from_start = (prev_not_done < env_start) & (cursors.state[env] == ENDED)
    keep = v.copy()
    keep[idx[(run + from_start) % 2 == 1]] = False
    return keep


def segment(valid: np.ndarray, done: np.ndarray, cursors: Cursors,
            allocate: Callable[[int], np.ndarray], *, autoreset: Autoreset = "same-step") -> Segments:
    """Cut a ``(T, B)`` batch given its ``valid`` and ``done`` masks; ``cursors`` is not modified.

    Rows are returned env-major (all of env 0's kept steps in time order, then env 1's, …), so each
    episode's steps of this batch are contiguous.
    """
    T, B = valid.shape
    v = np.ascontiguousarray(valid.T).ravel()
    d = np.ascontiguousarray((done & valid).T).ravel()
    reset_envs = np.zeros(0, np.int64)
    if autoreset == "next-step":
        kept = _drop_reset_steps(v, d, T, cursors)
        reset_envs = _ending_in_reset(v, kept, T)
        v, d = kept, d & kept
    idx = np.flatnonzero(v)
    n = len(idx)
    env = np.repeat(np.arange(B), v.reshape(B, T).sum(axis=1))  # = idx // T, without the division
    dv = d[idx]
    first = np.ones(n, bool)
    first[1:] = env[1:] != env[:-1]
    starts = first.copy()
    starts[1:] |= dv[:-1]
    start_pos = np.flatnonzero(starts)
    seg_len = np.diff(np.append(start_pos, n))
    seg_env = env[start_pos]
    seg_first = first[start_pos]
    if autoreset == "off":
        _refuse_unreset(seg_env, seg_first, idx[start_pos] % T, cursors)
    continues = seg_first & (cursors.state[seg_env] == OPEN)
    seg_ids = np.empty(len(start_pos), np.int64)
    seg_ids[continues] = cursors.episode_id[seg_env[continues]]
    n_new = int((~continues).sum())
    seg_ids[~continues] = allocate(n_new)
    offset = np.where(continues, cursors.next_step[seg_env], 0)
    step = np.arange(n) - np.repeat(start_pos - offset, seg_len)  # np.repeat over segments: cheaper than
    episode_id = np.repeat(seg_ids, seg_len)                       # a cumsum and gathers per row
    after = _advance(cursors, env, dv, episode_id, step)
    after.state[reset_envs] = FRESH  # the reset step was seen: the env's next step starts an episode
    return Segments(idx, episode_id, step, after, n_new, int(dv.sum()))


def _ending_in_reset(valid: np.ndarray, kept: np.ndarray, T: int) -> np.ndarray:
    """Envs whose last valid step of the batch is a dropped reset step."""
    idx = np.flatnonzero(valid)
    last = idx[np.r_[idx[1:] // T != idx[:-1] // T, True]] if len(idx) else idx
    return last[~kept[last]] // T


def _refuse_unreset(seg_env: np.ndarray, seg_first: np.ndarray, seg_t: np.ndarray, cursors: Cursors) -> None:
    bad = (~seg_first) | (cursors.state[seg_env] == ENDED)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        raise InputError(f"env {int(seg_env[i])}, t={int(seg_t[i])}: a step for an env whose episode already "
                         "ended without a reset; call writer.reset([env]) first, or open the writer with "
                         "autoreset='same-step' (JAX-style) or 'next-step' (gymnasium's default)")


def _advance(cursors: Cursors, env: np.ndarray, dv: np.ndarray, episode_id: np.ndarray,
             step: np.ndarray) -> Cursors:
    out = cursors.copy()
    if len(env) == 0:
        return out
    last = np.r_[env[1:] != env[:-1], True]
    e = env[last]
    out.episode_id[e] = np.where(dv[last], -1, episode_id[last])
    out.next_step[e] = np.where(dv[last], 0, step[last] + 1)
    out.state[e] = np.where(dv[last], ENDED, OPEN)
    return out


def segment_reference(valid: np.ndarray, done: np.ndarray, cursors: Cursors,
                      allocate: Callable[[int], np.ndarray]) -> Segments:
    """Plain-loop same-step segmentation, the specification :func:`segment` is tested against."""
    T, B = valid.shape
    c = cursors.copy()
    rows, ids, steps, n_new, completed = [], [], [], 0, 0
    for b in range(B):
        for t in range(T):
            if not valid[t, b]:
                continue
            if c.state[b] != OPEN:
                c.episode_id[b], c.next_step[b], c.state[b] = int(allocate(1)[0]), 0, OPEN
                n_new += 1
            rows.append(b * T + t)
            ids.append(c.episode_id[b])
            steps.append(c.next_step[b])
            c.next_step[b] += 1
            if done[t, b]:
                c.episode_id[b], c.next_step[b], c.state[b] = -1, 0, ENDED
                completed += 1
    return Segments(np.array(rows, np.int64), np.array(ids, np.int64), np.array(steps, np.int64), c,
                    n_new, completed)
