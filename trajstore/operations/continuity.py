"""Whether rows that name their own episodes continue them: among themselves, and after what is stored.

A local :class:`~trajstore.write.writer.Writer` draws its own episode ids and cuts its batches itself, so
its rows are whole by construction and need none of this. Rows of an ingest request name episode ids and
steps themselves; before they are committed, :func:`request_spans` checks each episode's rows among
themselves (steps contiguous, only the last one terminated or truncated), and :func:`check_continues`
checks them against the store's committed rows of the same ids (:func:`stored_ends`: one aggregate per id,
over the files whose logged id range may hold it): a new episode starts at step 0, a stored one goes on
right after its last stored step, in its own run and environment, and only if it has not ended.

>>> import numpy as np
>>> spans = request_spans(np.array([9, 9, 4]), np.array([0, 1, 0]), np.array([False, True, False]))
>>> spans.episode_id.tolist(), spans.first.tolist(), spans.last.tolist()
([4, 9], [0, 0], [0, 1])
>>> check_continues(spans, [], run_id="r", env_id="E")
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError
from trajstore.query import sql
from trajstore.query.snapshot import cursor
from trajstore.storage.log import DataFile, files_holding
from trajstore.storage.table import steps_dataset

KEY_SCHEMA = pa.schema([("run_id", pa.string()), ("env_id", pa.string()), ("episode_id", pa.int64()),
                        ("step", pa.int32()), ("terminated", pa.bool_()), ("truncated", pa.bool_())])


@dataclass(frozen=True)
class Spans:
    """The episodes of one request: ids (sorted, unique), and the first and last step each has in it."""

    episode_id: np.ndarray
    first: np.ndarray
    last: np.ndarray


@dataclass(frozen=True)
class StoredEnd:
    """What the store holds of one episode id in one partition: its last step and the step that ended it."""

    run_id: str
    env_id: str
    episode_id: int
    last_step: int
    end_step: int | None


def request_spans(episode_id: np.ndarray, step: np.ndarray, ended: np.ndarray) -> Spans:
    """Each episode's first and last step among rows (in any order); raises :class:`InputError` naming the
    episode and the step when an episode repeats or skips a step, or goes on after its terminated or
    truncated step. ``ended`` is ``terminated | truncated`` per row."""
    if not len(episode_id):
        return Spans(np.empty(0, np.int64), np.empty(0, np.int32), np.empty(0, np.int32))
    order = np.lexsort((step, episode_id))
    ids, steps, ends = episode_id[order], step[order], ended[order]
    same = ids[1:] == ids[:-1]
    _refuse_repeats_and_gaps(ids, steps, same)
    first = np.flatnonzero(np.r_[True, ~same])
    last = np.r_[first[1:] - 1, len(ids) - 1]
    early = np.flatnonzero(ends[:-1] & same)
    if len(early):
        i = int(early[0])
        end = int(steps[last[np.searchsorted(first, i, side="right") - 1]])
        raise InputError(f"terminated/truncated: episode_id {ids[i]} ends at step {steps[i]}, but the rows go on "
                         f"to step {end}; only an episode's last step may be terminated or truncated")
    return Spans(ids[first], steps[first], steps[last])


def _refuse_repeats_and_gaps(ids: np.ndarray, steps: np.ndarray, same: np.ndarray) -> None:
    bad = np.flatnonzero(same & (steps[1:] != steps[:-1] + 1))
    if not len(bad):
        return
    i = int(bad[0])
    if steps[i + 1] == steps[i]:
        raise InputError(f"step: episode_id {ids[i]} has step {steps[i]} more than once")
    raise InputError(f"step: episode_id {ids[i]} goes from step {steps[i]} to step {steps[i + 1]}; "
                     f"expected step {steps[i] + 1} (an episode's steps are contiguous)")


def stored_ends(files: Sequence[DataFile], episode_ids: np.ndarray) -> list[StoredEnd]:
    """The committed rows of ``episode_ids`` (sorted, unique) in ``files`` (one version's), one aggregate per
    id and partition; only files whose logged episode_id range may hold one of the ids are read."""
    files = files_holding(files, episode_ids)
    if not files or not len(episode_ids):
        return []
    con = cursor()
    try:  # through a pyarrow dataset over the table's filesystem: the same for a directory and for S3
        con.register("stored_keys", steps_dataset(files, KEY_SCHEMA))
        found = con.execute(sql.stored_episode_ends("stored_keys", episode_ids.tolist())).fetchall()
    finally:
        con.close()
    return [StoredEnd(r, e, int(i), int(last), None if end is None else int(end)) for r, e, i, last, end in found]


def check_continues(spans: Spans, stored: Sequence[StoredEnd], *, run_id: str, env_id: str) -> None:
    """Raise :class:`InputError` naming the episode and the step unless each episode of ``spans`` starts at
    step 0 (an id the store lacks) or continues one of ``run_id``/``env_id`` that has not ended right after
    its last stored step."""
    held = {s.episode_id: s for s in stored if (s.run_id, s.env_id) == (run_id, env_id)}
    for s in stored:
        if (s.run_id, s.env_id) != (run_id, env_id):
            first = int(spans.first[np.searchsorted(spans.episode_id, s.episode_id)])
            raise InputError(f"episode_id: episode_id {s.episode_id} (step {first} here) belongs to run_id "
                             f"{s.run_id!r}, env_id {s.env_id!r}, not to run_id {run_id!r}, env_id {env_id!r}; "
                             "rows may only continue episodes of their own run and environment")
    new = ~np.isin(spans.episode_id, np.fromiter(held, np.int64, len(held)))
    late = np.flatnonzero(new & (spans.first != 0))
    if len(late):
        eid, first = spans.episode_id[late[0]], spans.first[late[0]]
        raise InputError(f"step: episode_id {eid} starts at step {first}, but the store holds none of its steps; "
                         "expected step 0")
    for i in np.flatnonzero(~new).tolist():
        _check_after(held[int(spans.episode_id[i])], int(spans.first[i]))


def _check_after(s: StoredEnd, first: int) -> None:
    if s.end_step is not None:
        raise InputError(f"step: episode_id {s.episode_id} ended at step {s.end_step} (terminated or truncated); "
                         f"step {first} cannot follow it")
    if first != s.last_step + 1:
        raise InputError(f"step: episode_id {s.episode_id} continues at step {first}, but the store holds its "
                         f"steps up to {s.last_step}; expected step {s.last_step + 1}")
