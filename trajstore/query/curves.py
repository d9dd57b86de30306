"""Learning curves: where each episode lies in its ``(run_id, env_id)`` series, counted over all its writers.

Each writer records ``env_steps``, its own env steps over all its envs at every stored step (see
``schemas/step.v1.json``); a series may have had many writers (remote workers, processes, a training loop
opening a writer per iteration), each counting from 0. :func:`total_env_steps` walks a series' episodes in
wall-time order (``ended_at``, then ``env_steps``) and adds, for each one, its writer's steps since that writer's
previous episode, so that the total at an episode is the steps all the series' writers had taken when it ended
(up to each writer's latest stored episode end).

Writers are told apart within one ``worker_id`` (``host:pid`` by default, shared by the writers a process opens
one after the other): a writer's count never decreases, so a drop starts a new writer; and a writer's episode
ids share one random token (see :mod:`trajstore.storage.episode_ids`) that it replaces only after using 2**24
ids, so an unseen token is a new writer unless the token before it had used at least half of its ids. Episodes
without ``env_steps`` (written before it was recorded) add their length.
"""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore.storage.episode_ids import COUNTER_BITS

SPENT_TOKEN = 1 << (COUNTER_BITS - 1)  # counters a token must have reached before it can be a writer's older one


def total_env_steps(walk: pa.Table) -> np.ndarray:
    """The series' env steps at each episode of ``walk``: every episode of some series, sorted by
    ``run_id, env_id, ended_at, env_steps, episode_id`` (:data:`trajstore.query.sql.WALK`)."""
    n = walk.num_rows
    if n == 0:
        return np.zeros(0, np.int64)
    series = _run_starts_of(_codes(walk["run_id"])) | _run_starts_of(_codes(walk["env_id"]))
    worker = _codes(walk["worker_id"])
    group = np.cumsum(series) * (worker.max() + 2) + worker + 1  # one group per (series, worker_id)
    ids = walk["episode_id"].to_numpy()
    known = walk["env_steps"].is_valid().to_numpy(zero_copy_only=False)
    steps = pc.fill_null(walk["env_steps"], 0).to_numpy().astype(np.int64)
    token_first, token_counter = _token_marks(group, ids >> COUNTER_BITS, ids & ((1 << COUNTER_BITS) - 1))
    order = np.argsort(group, kind="stable")  # each writer group's episodes together, in walk order
    first = _run_starts_of(group[order])
    s, k = steps[order], known[order]
    prev, prev_known, prev_counter = _shifted(s), _shifted(k), _shifted(token_counter[order])
    new_writer = first | ~prev_known | (s < prev) | (token_first[order] & (prev_counter < SPENT_TOKEN))
    added = np.empty(n, np.int64)
    added[order] = np.where(~k, walk["episode_length"].to_numpy()[order], np.where(new_writer, s, s - prev))
    return _cumsum_per_run(added, series)


def _codes(column: pa.ChunkedArray) -> np.ndarray:
    """One integer per distinct value of ``column`` (-1 for null)."""
    indices = pc.dictionary_encode(column.combine_chunks()).indices
    return pc.fill_null(indices, -1).to_numpy().astype(np.int64)


def _run_starts_of(values: np.ndarray) -> np.ndarray:
    """True where ``values`` differs from the value before it (and at the first)."""
    return np.r_[True, values[1:] != values[:-1]]


def _shifted(values: np.ndarray) -> np.ndarray:
    """``values`` one place later (the first place repeats the first value; callers mask it)."""
    return np.r_[values[:1], values[:-1]]


def _token_marks(group: np.ndarray, token: np.ndarray, counter: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per episode: whether it is the first (in walk order) of its token in its writer group, and the highest
    id counter of that token so far."""
    order = np.lexsort((token, group))  # stable: walk order within each (group, token)
    starts = _run_starts_of(group[order]) | _run_starts_of(token[order])
    offset = np.cumsum(starts) << COUNTER_BITS  # later runs above earlier ones: one running max does all
    running = np.maximum.accumulate(offset + counter[order]) - offset
    first, highest = np.empty(len(order), bool), np.empty(len(order), np.int64)
    first[order], highest[order] = starts, running
    return first, highest


def _cumsum_per_run(values: np.ndarray, starts: np.ndarray) -> np.ndarray:
    """Running sums of ``values`` that start again at every ``starts``."""
    total = np.cumsum(values)
    start = np.maximum.accumulate(np.where(starts, np.arange(len(values)), 0))
    return total - (total - values)[start]
