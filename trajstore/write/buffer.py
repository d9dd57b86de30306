"""A writer's rows until its next flush, already as they will be stored (encoding 2, see
:mod:`~trajstore.storage.encoding`).

Each call's rows are gathered once from the caller's time-major arrays, env-major (one ``np.take`` per column;
for a stacked observation leaf, only the frames that are stored). On the way, every step is checked bit for bit,
by compiled loops that make no full-size temporaries: ``next_obs[t]`` against the next step's ``obs`` (null where
equal), and each stack against the previous step's shifted by one frame (one frame where it is, the whole stack
elsewhere). An env's last row of a call waits for the next call (its ``next_obs`` is compared with that call's
first ``obs`` of the env) or for the flush (then it is stored). At a flush, rows are ordered env by env, calls in
order, so each episode's rows are contiguous and in step order: by zero-copy slices when rows are wide (images),
by one ``take`` when they are narrow and envs many. Both give the same rows (a test checks). That ordering is done
by the thread that encodes the flush, not the one adding rows.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Mapping

import numba
import numpy as np
import pyarrow as pa

from trajstore.storage.encoding import (
    NEXT,
    OBS,
    FileEncoding,
    frames_array,
    in_frames,
    leaves,
    physical_next_type,
    physical_obs_type,
    stored_frame,
    with_validity,
)

WIDE_ROW_BYTES = 1024  # rows wider than this are ordered by slices at a flush, narrower ones by a take


def _and_rows_equal(a: np.ndarray, ai: np.ndarray, b: np.ndarray, bi: np.ndarray, out: np.ndarray) -> None:
    """``out[r] &= a[ai[r]] == b[bi[r]]`` (rows of bytes), for the rows still true; compared a word at a time."""
    word = _word(a.shape[1])
    _rows_equal_words(a.view(word), ai, b.view(word), bi, out)


def _and_shifted_equal(a: np.ndarray, ai: np.ndarray, b: np.ndarray, bi: np.ndarray, frame: int,
                       out: np.ndarray) -> None:
    """``out[r] &= a[ai[r]][:-frame] == b[bi[r]][frame:]`` (rows of bytes; ``frame`` bytes), for the rows still
    true; compared a word at a time."""
    word = _word(a.shape[1], frame)
    _shifted_equal_words(a.view(word), ai, b.view(word), bi, frame // word.itemsize, out)


def _word(*sizes: int) -> np.dtype:
    """The widest unsigned integer that divides every size (in bytes): bytes compared 8 at a time are compared
    ~6x faster (measured on 84x84 frames) than one at a time."""
    return next(np.dtype(f"u{w}") for w in (8, 4, 2, 1) if all(s % w == 0 for s in sizes))


@numba.njit(cache=True, nogil=True)
def _rows_equal_words(a: np.ndarray, ai: np.ndarray, b: np.ndarray, bi: np.ndarray, out: np.ndarray) -> None:
    """``out[r] &= a[ai[r]] == b[bi[r]]`` (rows of bytes), for the rows still true."""
    width = a.shape[1]
    for r in range(len(out)):
        if not out[r]:
            continue
        i, k = ai[r], bi[r]
        for c in range(width):
            if a[i, c] != b[k, c]:
                out[r] = False
                break


@numba.njit(cache=True, nogil=True)
def _shifted_equal_words(a: np.ndarray, ai: np.ndarray, b: np.ndarray, bi: np.ndarray, frame: int,
                         out: np.ndarray) -> None:
    """``out[r] &= a[ai[r]][:-frame] == b[bi[r]][frame:]`` (a stack without its newest frame against another
    without its oldest), for the rows still true."""
    width = a.shape[1] - frame
    for r in range(len(out)):
        if not out[r]:
            continue
        i, k = ai[r], bi[r]
        for c in range(width):
            if a[i, c] != b[k, c + frame]:
                out[r] = False
                break


@numba.njit(cache=True, nogil=True)
def _and_next_equal_words(nxt: np.ndarray, obs: np.ndarray, tm: np.ndarray, num_envs: int, out: np.ndarray) -> None:
    """``out[r] &= nxt[tm[r]] == obs[tm[r + 1]]`` (rows of words of time-major ``(T*B, …)`` arrays), for the rows
    still true. Where row r + 1 is the same env's next time index (``tm[r] + B``), as it is for all but skipped
    steps, the answer comes from one pass over the arrays in memory order (``next_obs[t]`` against ``obs[t + 1]``,
    every env at once): env by env, the rows lie ``B`` apart, and visiting them in that order would wait for
    memory at almost every row."""
    cells = len(nxt) - num_envs
    width = nxt.shape[1]
    same = np.zeros(max(cells, 0), np.bool_)
    for i in range(cells):  # indexed by (row, word): ~2x faster than through row views (measured)
        equal = True
        for c in range(width):
            if nxt[i, c] != obs[i + num_envs, c]:
                equal = False
                break
        same[i] = equal
    for r in range(len(out) - 1):
        if not out[r]:
            continue
        i, k = tm[r], tm[r + 1]
        if k == i + num_envs:
            out[r] = same[i]
            continue
        for c in range(width):
            if nxt[i, c] != obs[k, c]:
                out[r] = False
                break


def _bytes(leaf: np.ndarray) -> np.ndarray:
    """A contiguous ``(rows, …)`` array as ``(rows, bytes per row)`` uint8 (a view)."""
    width = leaf.dtype.itemsize * int(np.prod(leaf.shape[1:], dtype=np.int64))
    return leaf.reshape(len(leaf), width // leaf.dtype.itemsize).view(np.uint8)


@dataclass
class _Call:
    """One call's rows (env-major) and the final validity of its ``next_obs`` (pending rows may be cleared)."""

    batch: pa.RecordBatch
    counts: np.ndarray  # rows per env
    next_valid: np.ndarray


@dataclass
class _Envs:
    """Per env, its last buffered row: episode (-1: none buffered), step, where it is, whether its ``next_obs``
    waits for the next call, and the bytes a following row is compared with (its stacks, its next_obs)."""

    episode_id: np.ndarray
    step: np.ndarray
    call: np.ndarray
    row: np.ndarray
    pending: np.ndarray
    stacks: dict[str, np.ndarray] = field(default_factory=dict)  # path -> (B, bytes of one stack)
    nexts: dict[str, np.ndarray] = field(default_factory=dict)  # path -> (B, bytes of one next_obs leaf)

    @classmethod
    def empty(cls, num_envs: int) -> _Envs:
        return cls(np.full(num_envs, -1, np.int64), np.zeros(num_envs, np.int64), np.zeros(num_envs, np.int64),
                   np.zeros(num_envs, np.int64), np.zeros(num_envs, bool))


@dataclass
class Rows:
    """One call's kept rows: env-major, with each row's time-major index into the call's ``(T*B, …)`` arrays,
    env, episode, step and whether it ended its episode."""

    tm: np.ndarray
    env: np.ndarray
    episode_id: np.ndarray
    step: np.ndarray
    ends: np.ndarray
    tick: np.ndarray  # the row's time index in the call


class RowBuffer:
    """The rows of one writer since its last flush (see the module's description)."""

    def __init__(self, num_envs: int, obs_type: pa.DataType, fmt: FileEncoding, *, compact: bool = True) -> None:
        self.num_envs = num_envs
        self.compact = compact  # null next_obs where it is the next row's obs (not for agents: see agent_id)
        self.obs_type = obs_type
        self.stacks = fmt.stacks
        self.paths = [p for p, _ in leaves(obs_type)]
        self.frames = {p: stored_frame(t, fmt, p) for p, t in leaves(obs_type)}
        self.listed = {p for p in self.paths if in_frames(fmt, p)}  # next_obs leaves stored as list<frame>
        self.physical_obs = physical_obs_type(obs_type, fmt)
        self.physical_next = physical_next_type(obs_type, fmt)
        self._calls: list[_Call] = []
        self._envs = _Envs.empty(num_envs)
        self.nbytes = 0
        self.rows = 0

    def __bool__(self) -> bool:
        return bool(self._calls)

    # --- one call ---

    def add(self, columns: dict[str, pa.Array], obs: Mapping[str, np.ndarray], nxt: Mapping[str, np.ndarray],
            rows: Rows) -> None:
        """Add a call's rows: ``columns`` (every column but obs/next_obs, gathered), ``obs`` and ``nxt`` by leaf
        path as contiguous ``(T*B, *shape)`` arrays of the stored dtype."""
        n = len(rows.tm)
        first = np.r_[True, rows.env[1:] != rows.env[:-1]] if n else np.zeros(0, bool)
        inside = ~first & np.r_[False, rows.episode_id[1:] == rows.episode_id[:-1]] if n else first
        before = self._continues(rows, first)  # first rows of an env continuing its buffered last row
        obs_array = self._obs(obs, rows, inside, before)
        null = self._next_nulls(obs, nxt, rows, first)
        self._resolve(obs, rows, first, before)
        next_array = self._next(obs, nxt, rows, ~null)
        counts = np.bincount(rows.env, minlength=self.num_envs).astype(np.int64)
        cols = {**columns, OBS: obs_array, NEXT: next_array}
        batch = pa.RecordBatch.from_arrays(list(cols.values()), names=list(cols))
        self._calls.append(_Call(batch, counts, ~null))
        self._remember(obs, nxt, rows, ~null)
        self.nbytes += batch.nbytes
        self.rows += n

    def _continues(self, rows: Rows, first: np.ndarray) -> np.ndarray:
        """Per row: whether it is an env's first row of the call and its episode's next step after that env's
        last buffered row."""
        out = np.zeros(len(rows.tm), bool)
        j = np.flatnonzero(first)
        b = rows.env[j]
        out[j] = (self._envs.episode_id[b] == rows.episode_id[j]) & (self._envs.step[b] + 1 == rows.step[j])
        return out

    def _obs(self, obs: Mapping[str, np.ndarray], rows: Rows, inside: np.ndarray, before: np.ndarray) -> pa.Array:
        out = {}
        for path in self.paths:
            k = self.stacks.get(path)
            leaf = obs[path]
            if k is None:
                out[path] = frames_array(np.take(leaf, rows.tm, axis=0), self.frames[path])
                continue
            anchor = self._anchors(leaf, k, rows, inside, before, path)
            out[path] = _frames(leaf, k, rows.tm, np.where(anchor, k, 1), self.frames[path])
        return _struct(self.obs_type, out, self.physical_obs, None)

    def _anchors(self, leaf: np.ndarray, k: int, rows: Rows, inside: np.ndarray, before: np.ndarray,
                 path: str) -> np.ndarray:
        """Rows whose stack is not the previous step's shifted by one frame (or has no previous step here)."""
        raw = _bytes(leaf)
        frame = raw.shape[1] // k
        shifted = inside.copy()
        j = np.flatnonzero(inside)
        ok = np.ones(len(j), bool)
        _and_shifted_equal(raw, rows.tm[j], raw, rows.tm[j - 1], frame, ok)
        shifted[j] = ok
        j = np.flatnonzero(before)
        if len(j):
            ok = np.ones(len(j), bool)
            _and_shifted_equal(raw, rows.tm[j], self._envs.stacks[path], rows.env[j], frame, ok)
            shifted[j] = ok
        return ~shifted

    def _next_nulls(self, obs: Mapping[str, np.ndarray], nxt: Mapping[str, np.ndarray], rows: Rows,
                    first: np.ndarray) -> np.ndarray:
        """Rows whose ``next_obs`` is the next row's ``obs`` bit for bit (that row in this call)."""
        n = len(rows.tm)
        cand = np.zeros(n, bool)
        if not self.compact:
            return cand
        if n:
            cand[:-1] = ~first[1:] & (rows.episode_id[1:] == rows.episode_id[:-1])
        for path in self.paths:
            a, b = _bytes(nxt[path]), _bytes(obs[path])
            word = _word(a.shape[1])
            _and_next_equal_words(a.view(word), b.view(word), rows.tm, self.num_envs, cand)
        return cand

    def _resolve(self, obs: Mapping[str, np.ndarray], rows: Rows, first: np.ndarray, before: np.ndarray) -> None:
        """Decide the waiting ``next_obs`` of the envs that have rows in this call: null where it is this call's
        first ``obs`` of the env (the same episode's next step), stored otherwise."""
        j = np.flatnonzero(first)
        b = rows.env[j]
        waiting = self._envs.pending[b]
        if not waiting.any():
            return
        j, b = j[waiting], b[waiting]
        ok = before[j].copy()
        for path in self.paths:
            _and_rows_equal(self._envs.nexts[path], b, _bytes(obs[path]), rows.tm[j], ok)
        for env in b[ok]:
            self._calls[self._envs.call[env]].next_valid[self._envs.row[env]] = False
        self._envs.pending[b] = False

    def _next(self, obs: Mapping[str, np.ndarray], nxt: Mapping[str, np.ndarray], rows: Rows,
              stored: np.ndarray) -> pa.Array:
        """The stored ``next_obs`` of the rows (null where ``stored`` is false)."""
        j = np.flatnonzero(stored)
        out = {}
        for path in self.paths:
            leaf = nxt[path]
            k = self.stacks.get(path)
            if k is not None:
                raw, ok = _bytes(leaf), np.ones(len(j), bool)
                _and_shifted_equal(raw, rows.tm[j], _bytes(obs[path]), rows.tm[j], raw.shape[1] // k, ok)
                counts = np.zeros(len(stored), np.int64)
                counts[j] = np.where(ok, 1, k)
                out[path] = _frames(leaf, k, rows.tm, counts, self.frames[path], valid=stored)
            elif path in self.listed:  # an image: its one frame where stored
                values = frames_array(np.take(leaf, rows.tm[j], axis=0), self.frames[path])
                out[path] = _list(stored.astype(np.int64), values, stored)
            else:  # small: as in obs, every row's slot filled, null where not stored
                out[path] = frames_array(np.take(leaf, rows.tm, axis=0), self.frames[path])
        if pa.types.is_struct(self.physical_next):
            return _struct(self.obs_type, out, self.physical_next, stored)
        return out[OBS] if OBS in self.listed else with_validity(out[OBS], stored)

    def _remember(self, obs: Mapping[str, np.ndarray], nxt: Mapping[str, np.ndarray], rows: Rows,
                  stored: np.ndarray) -> None:
        """Each env's last row of this call becomes its last buffered row."""
        n = len(rows.tm)
        if not n:
            return
        last = np.flatnonzero(np.r_[rows.env[1:] != rows.env[:-1], True])
        b = rows.env[last]
        envs = self._envs
        envs.episode_id[b], envs.step[b] = rows.episode_id[last], rows.step[last]
        envs.call[b], envs.row[b] = len(self._calls) - 1, last
        envs.pending[b] = ~rows.ends[last] & stored[last] & self.compact
        for path in self.paths:
            if path in self.stacks:
                _keep(envs.stacks, path, _bytes(obs[path]), rows.tm[last], b, self.num_envs)
            _keep(envs.nexts, path, _bytes(nxt[path]), rows.tm[last], b, self.num_envs)

    # --- the flush ---

    def take(self) -> Flush:
        """Every buffered row (put in file order by :meth:`Flush.table`, on the thread that encodes it), and an
        empty buffer; the next call's rows start a new file (its first row of each episode an anchor, nothing
        waits)."""
        calls, self._calls = self._calls, []
        self._envs = _Envs.empty(self.num_envs)
        self.nbytes = self.rows = 0
        batches = [_final(c) for c in calls]
        counts = np.stack([c.counts for c in calls]) if calls else np.zeros((0, self.num_envs), np.int64)
        return Flush(batches, counts)


@dataclass
class Flush:
    """The rows of one flush as the calls gave them (each call's env-major), and how many each env has per call;
    once :meth:`ordered` (on the thread that encodes them), in file order instead."""

    batches: list[pa.RecordBatch]
    counts: np.ndarray  # (calls, envs)
    _ordered: pa.Table | None = None

    def ordered(self, *, by: str | None = None) -> pa.Table:
        """The rows in file order (env by env, calls in order), kept so in place of the calls' rows: by zero-copy
        slices when rows are wide; else, where every env has as many rows in a call as the others (a JAX scan's
        batches), by block copies of each fixed-width column (one strided copy per call, no index) and one
        ``take`` per other column; else by one ``take`` per column. Each column of the calls is let go once
        ordered. ``by`` forces the ordering: ``"slices"``, ``"blocks"`` or ``"take"`` (default: as said)."""
        if self._ordered is not None:
            return self._ordered
        how = by or ("slices" if self._wide() else "blocks" if _uniform(self.counts) else "take")
        if len(self.batches) <= 1:
            self._ordered = pa.Table.from_batches(self.batches) if self.batches else pa.table({})
        elif how == "slices":
            self._ordered = pa.Table.from_batches(_env_slices(self.batches, self.counts), schema=self.schema)
        else:
            if how == "blocks" and not _uniform(self.counts):
                raise ValueError("blocks: every env must have as many rows in a call as the others")
            order: pa.Array | None = None
            schema = self.schema
            columns = [[b.column(i) for b in self.batches] for i in range(len(schema))]
            self.batches = []
            out = []
            for i, f in enumerate(schema):
                column = _blocks(columns[i], f.type, self.counts) if how == "blocks" else None
                if column is None:
                    order = pa.array(_env_order(self.counts)) if order is None else order
                    column = pa.chunked_array(columns[i], f.type).take(order).combine_chunks()
                out.append(column)
                columns[i] = []
            self._ordered = pa.Table.from_arrays(out, schema=schema)
        self.batches = []
        return self._ordered

    def release(self) -> None:
        """Let the rows go (written already); the counts stay."""
        self._ordered, self.batches = None, []

    def _wide(self) -> bool:
        return sum(b.nbytes for b in self.batches) > WIDE_ROW_BYTES * max(self.num_rows, 1)

    @property
    def num_rows(self) -> int:
        return int(self.counts.sum())

    @property
    def schema(self) -> pa.Schema:
        return self._ordered.schema if self._ordered is not None else self.batches[0].schema

    def split(self, parts: int) -> list[Flush]:
        """The rows of consecutive ranges of envs, about as many in each of ``parts`` (fewer where there are
        fewer envs with rows); each env's rows stay in one part, so its episodes and their encoding do."""
        per_env = self.counts.sum(axis=0)
        cuts = np.searchsorted(np.cumsum(per_env), np.arange(1, parts) * per_env.sum() / parts)
        bounds = sorted({0, *(int(c) + 1 for c in cuts), len(per_env)})
        starts = np.cumsum(self.counts, axis=1) - self.counts  # each env's first row in each call's batch
        out = []
        for lo, hi in zip(bounds[:-1], bounds[1:]):
            counts = self.counts[:, lo:hi]
            if counts.sum():
                out.append(Flush([b.slice(int(starts[c, lo]), int(counts[c].sum())) for c, b in
                                  enumerate(self.batches)], counts))
        return out


def _keep(store: dict[str, np.ndarray], path: str, raw: np.ndarray, at: np.ndarray, envs: np.ndarray,
          num_envs: int) -> None:
    """Copy rows ``at`` of ``raw`` into the per-env array ``store[path]`` at ``envs``."""
    if path not in store or store[path].shape[1] != raw.shape[1]:
        store[path] = np.zeros((num_envs, raw.shape[1]), np.uint8)
    store[path][envs] = raw[at]


def _frames(leaf: np.ndarray, k: int, tm: np.ndarray, counts: np.ndarray, frame: pa.DataType,
            valid: np.ndarray | None = None) -> pa.Array:
    """A stacked leaf as ``list<frame>``: per row its newest frame (count 1) or whole stack (count k), gathered
    in one ``np.take``; rows with count 0 null (``valid``)."""
    starts = tm * k + np.where(counts == k, 0, k - 1)
    offsets = np.r_[0, np.cumsum(counts)]
    idx = np.repeat(starts - offsets[:-1], counts) + np.arange(offsets[-1])
    frames = leaf.reshape(len(leaf) * k, *leaf.shape[2:])
    return _list(counts, frames_array(np.take(frames, idx, axis=0), frame), valid)


def _list(counts: np.ndarray, values: pa.Array, valid: np.ndarray | None) -> pa.Array:
    offsets = pa.array(np.r_[0, np.cumsum(counts)].astype(np.int32))
    mask = None if valid is None else pa.array(~valid)
    return pa.ListArray.from_arrays(offsets, values, mask=mask)


def _struct(t: pa.DataType, leaves_: Mapping[str, pa.Array], physical: pa.DataType, valid: np.ndarray | None,
            path: str = OBS) -> pa.Array:
    """A (struct) column of ``physical`` type from its leaves' arrays; null where ``valid`` is false."""
    if not pa.types.is_struct(t):
        return leaves_[path]
    children = [_struct(f.type, leaves_, physical.field(f.name).type, None, f"{path}.{f.name}") for f in t]
    mask = None if valid is None else pa.array(~valid)
    return pa.StructArray.from_arrays(children, fields=list(physical), mask=mask)


def _final(call: _Call) -> pa.RecordBatch:
    """A call's batch with its ``next_obs`` validity as decided."""
    i = call.batch.schema.get_field_index(NEXT)
    column = call.batch.column(i)
    decided = with_validity(column, call.next_valid) if (~call.next_valid).sum() != column.null_count else column
    return call.batch.set_column(i, call.batch.schema.field(i), decided)


def _env_slices(batches: list[pa.RecordBatch], counts: np.ndarray) -> list[pa.RecordBatch]:
    """Zero-copy slices of the calls' batches, env by env, calls in order."""
    starts = np.cumsum(counts, axis=1) - counts
    return [batches[c].slice(int(starts[c, b]), int(counts[c, b]))
            for b in range(counts.shape[1]) for c in range(counts.shape[0]) if counts[c, b]]


def _uniform(counts: np.ndarray) -> bool:
    """Whether every env has as many rows in each call as the others (its calls' rows are ``(B, T_c)`` blocks)."""
    return bool(len(counts)) and bool((counts == counts[:, :1]).all())


def _blocks(chunks: list[pa.Array], t: pa.DataType, counts: np.ndarray) -> pa.Array | None:
    """One column of uniform calls (see :func:`_uniform`) in file order by block copies, or None where its values
    are not one fixed-width buffer (strings, structs, lists, nulls inside a fixed-size list): the caller takes.
    Call c's rows are ``(B, T_c)`` env-major, so env b's rows of every call go to one ``(B, sum T_c)`` grid by a
    strided copy per call (no index, no random access); the rows' validity goes along the same way."""
    width = _fixed_width(t)
    if width is None and not pa.types.is_boolean(t):
        return None
    values = [_row_values(c, width) for c in chunks]
    if any(v is None for v in values):
        return None
    per_call = counts[:, 0]
    grid = _grid([v for v in values if v is not None], per_call, counts.shape[1])
    valid = None
    if any(c.null_count for c in chunks):
        valid = _grid([np.asarray(c.is_valid()).reshape(-1, 1) for c in chunks], per_call, counts.shape[1])[:, 0]
    if width is None:  # booleans: packed by Arrow
        return pa.array(grid[:, 0], t, mask=None if valid is None else ~valid)
    column = _from_bytes(t, grid.reshape(-1))
    return column if valid is None else with_validity(column, valid)


def _grid(values: list[np.ndarray], per_call: np.ndarray, num_envs: int) -> np.ndarray:
    """Calls' ``(B * T_c, w)`` row arrays as one ``(B * sum T_c, w)`` array, env by env, calls in order."""
    rows = int(per_call.sum())
    out = np.empty((num_envs, rows, values[0].shape[1]), values[0].dtype)
    at = 0
    for v, n in zip(values, per_call):
        out[:, at:at + n] = v.reshape(num_envs, n, v.shape[1])
        at += n
    return out.reshape(num_envs * rows, values[0].shape[1])


def _fixed_width(t: pa.DataType) -> int | None:
    """Bytes per row of a type whose values lie in one buffer at a fixed byte width (numbers, timestamps and
    fixed-size lists of them), else None."""
    size = 1
    while pa.types.is_fixed_size_list(t):
        size, t = size * t.list_size, t.value_type
    try:
        bits = t.bit_width
    except ValueError:
        return None
    return size * bits // 8 if bits % 8 == 0 and not pa.types.is_dictionary(t) else None


def _row_values(chunk: pa.Array, width: int | None) -> np.ndarray | None:
    """A chunk's values as ``(rows, width)`` bytes (a view; booleans: ``(rows, 1)`` bool, a copy), or None where
    values under a fixed-size list have nulls of their own."""
    if width is None:
        return np.asarray(chunk.fill_null(False) if chunk.null_count else chunk).reshape(-1, 1)
    inner, start = chunk, chunk.offset
    while pa.types.is_fixed_size_list(inner.type):
        k, inner = inner.type.list_size, inner.values
        start = start * k + inner.offset
        if inner.null_count:
            return None
    if not len(chunk):
        return np.zeros((0, width), np.uint8)
    item = inner.type.bit_width // 8
    raw = np.frombuffer(inner.buffers()[1], np.uint8)
    return raw[start * item:start * item + len(chunk) * width].reshape(len(chunk), width)


def _from_bytes(t: pa.DataType, raw: np.ndarray) -> pa.Array:
    """An array of the fixed-width type ``t`` (see :func:`_fixed_width`) over the bytes ``raw`` (not copied)."""
    if pa.types.is_fixed_size_list(t):
        child = _from_bytes(t.value_type, raw)
        return pa.Array.from_buffers(t, len(child) // t.list_size, [None], children=[child])
    return pa.Array.from_buffers(t, len(raw) // (t.bit_width // 8), [None, pa.py_buffer(raw)])


def _env_order(counts: np.ndarray) -> np.ndarray:
    """Row indices into the calls' batches concatenated, env by env, calls in order."""
    base = np.cumsum(counts.sum(axis=1)) - counts.sum(axis=1)  # first row of each call
    starts = base[:, None] + np.cumsum(counts, axis=1) - counts  # (calls, envs)
    runs_start = starts.T.reshape(-1)
    runs_len = counts.T.reshape(-1)
    total = int(runs_len.sum())
    offsets = np.cumsum(runs_len) - runs_len
    return np.repeat(runs_start - offsets, runs_len) + np.arange(total)


def gather(value: Any, tm: np.ndarray) -> Any:
    """Rows ``tm`` (time-major flat indices) of a ``(T, B, …)`` array (or dict of them): one copy."""
    if isinstance(value, Mapping):
        return {k: gather(v, tm) for k, v in value.items()}
    flat = value.reshape(value.shape[0] * value.shape[1], *value.shape[2:])
    return np.take(flat, tm, axis=0)
