"""Cutting time-major ``(T, B)`` batches into episodes, carrying each env's open episode across batches.

:func:`segment` is the compiled cut used by the writer; :func:`segment_reference` is the plain
loop it is tested against.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable, Literal

import numba
import numpy as np

from trajstore.errors import InputError
from trajstore.write import memory

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
    if autoreset == "off":
        _refuse_unreset(v, d, T, cursors)
    n, n_new, completed, _ = _count(v, d, T, cursors.state)
    new_ids = np.asarray(allocate(n_new), np.int64)
    # outputs allocated outside the compiled code, in Arrow's pool (memory kept from the previous call's rows)
    rows, episode_id, step = (memory.empty(n, np.int64) for _ in range(3))
    after = cursors.copy()
    _cut(v, d, T, cursors, new_ids, rows, episode_id, step, after)
    after.state[reset_envs] = FRESH  # the reset step was seen: the env's next step starts an episode
    return Segments(rows, episode_id, step, after, n_new, completed)


def _ending_in_reset(valid: np.ndarray, kept: np.ndarray, T: int) -> np.ndarray:
    """Envs whose last valid step of the batch is a dropped reset step."""
    idx = np.flatnonzero(valid)
    last = idx[np.r_[idx[1:] // T != idx[:-1] // T, True]] if len(idx) else idx
    return last[~kept[last]] // T


def _refuse_unreset(v: np.ndarray, d: np.ndarray, T: int, cursors: Cursors) -> None:
    bad = _count(v, d, T, cursors.state)[3]
    if bad >= 0:
        raise InputError(f"env {bad // T}, t={bad % T}: a step for an env whose episode already "
                         "ended without a reset; call writer.reset([env]) first, or open the writer with "
                         "autoreset='same-step' (JAX-style) or 'next-step' (gymnasium's default)")


@numba.njit(cache=True)
def _count(v: np.ndarray, d: np.ndarray, T: int, state: np.ndarray) -> tuple[int, int, int, int]:
    """Kept rows, new episodes and completed episodes of a cut over env-major masks ``v`` (kept) and
    ``d`` (done), and the flat index of the first step of an env whose episode ended without a
    reset (-1 if none; only an error with ``autoreset='off'``)."""
    n = n_new = completed = 0
    unreset = -1
    for b in range(len(state)):
        is_open, ended = state[b] == OPEN, state[b] == ENDED
        for i in range(b * T, (b + 1) * T):
            if not v[i]:
                continue
            n += 1
            if not is_open:
                n_new += 1
                if ended and unreset < 0:
                    unreset = i
                is_open = True
            if d[i]:
                completed += 1
                is_open, ended = False, True
    return n, n_new, completed, unreset


def _cut(v: np.ndarray, d: np.ndarray, T: int, before: Cursors, new_ids: np.ndarray, rows: np.ndarray,
         ids: np.ndarray, steps: np.ndarray, after: Cursors) -> None:
    """Fill the kept rows (env-major flat indices), their episode ids and steps, and ``after``."""
    _cut_kernel(v, d, T, before.episode_id, before.next_step, before.state, new_ids, rows, ids, steps,
                after.episode_id, after.next_step, after.state)


@numba.njit(cache=True)
def _cut_kernel(v: np.ndarray, d: np.ndarray, T: int, episode_id: np.ndarray, next_step: np.ndarray,
                state: np.ndarray, new_ids: np.ndarray, rows: np.ndarray, ids: np.ndarray, steps: np.ndarray,
                out_id: np.ndarray, out_next: np.ndarray, out_state: np.ndarray) -> None:
    """An env not open at its first kept step (or after a done) takes the next of ``new_ids``."""
    j = k = 0
    for b in range(len(state)):
        is_open, eid, nxt, seen = state[b] == OPEN, episode_id[b], next_step[b], False
        for i in range(b * T, (b + 1) * T):
            if not v[i]:
                continue
            if not is_open:
                eid, nxt, is_open = new_ids[k], 0, True
                k += 1
            rows[j], ids[j], steps[j] = i, eid, nxt
            j += 1
            nxt += 1
            seen = True
            if d[i]:
                eid, nxt, is_open = -1, 0, False
        if seen:
            out_id[b], out_next[b], out_state[b] = eid, nxt, OPEN if is_open else ENDED


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
