"""Plain reference loops for the file format (trajstore/storage/encoding.py), which the tests check the fast paths
against: :func:`decode_reference` says what each stored row decodes to, one row at a time, and
:func:`encode_reference` where the writer must store what (``next_obs`` only where it is not the next step's
``obs``, each frame of a declared stack once)."""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore.storage.encoding import (
    NEXT,
    OBS,
    EncodingError,
    FileEncoding,
    _stored_frame,
    fixed_numpy,
    frames_array,
    in_frames,
    leaf_column,
    leaves,
    physical_schema,
    with_validity,
)


def _get(value: Any, path: str) -> Any:
    for name in path.split(".")[1:]:
        value = value[name]
    return value


def _set(value: Any, path: str, leaf: Any) -> Any:
    """``value`` with its leaf at ``path`` replaced (a copy of the dicts on the way)."""
    parts = path.split(".")[1:]
    if not parts:
        return leaf
    out = dict(value)
    out[parts[0]] = _set(value[parts[0]], ".".join([OBS, *parts[1:]]), leaf)
    return out


def decode_reference(rows: Sequence[Mapping[str, Any]], fmt: FileEncoding) -> list[dict[str, Any]]:
    """The rows of one file (``to_pylist()``: logical names, physical values, file order) decoded by the letter of
    the format, in plain Python: a stacked leaf is the last k frames of the stored lists of rows t-k+1..t, a null
    ``next_obs`` the decoded ``obs`` of the next row, an image frame's bytes its values."""
    rows = [dict(r) for r in rows]
    if not fmt.encoded:
        return rows

    def follows(i: int) -> bool:
        return i > 0 and rows[i - 1]["episode_id"] == rows[i]["episode_id"] and \
            rows[i - 1]["step"] + 1 == rows[i]["step"]

    paths = [p for p, _ in _reference_leaves(rows)]
    obs = []
    for i, r in enumerate(rows):
        o = r.get(OBS)
        for path, k in fmt.frame_stack:
            if o is None:
                break
            if len(_get(o, path)) == 1 and not follows(i):
                raise EncodingError(f"row {i}: {path} holds one frame without its episode's previous step before it")
            stored = [f for j in range(max(0, i - k + 1), i + 1) for f in _get(rows[j][OBS], path)]
            o = _set(o, path, stored[-k:])
        obs.append(o)
    out = []
    for i, r in enumerate(rows):
        d = dict(r)
        if OBS in r:
            d[OBS] = _values(obs[i], fmt, paths)
        if NEXT in r:
            d[NEXT] = _values(_next_reference(rows, obs, i, fmt, follows), fmt, paths)
        out.append(d)
    return out


def _reference_leaves(rows: list[dict[str, Any]]) -> list[tuple[str, Any]]:
    first = next((r[OBS] for r in rows if r.get(OBS) is not None), None)

    def walk(value: Any, path: str) -> list[tuple[str, Any]]:
        if isinstance(value, dict):
            return [leaf for k, v in value.items() for leaf in walk(v, f"{path}.{k}")]
        return [(path, value)]
    return walk(first, OBS) if first is not None else []


def _values(value: Any, fmt: FileEncoding, paths: list[str]) -> Any:
    """An observation with its image frames (bytes) as the nested lists of their values."""
    for path in paths:
        image = fmt.images.get(path)
        if image is None:
            continue
        dtype, shape = np.dtype(image[0]), image[1]

        def of(b: bytes, dtype: np.dtype = dtype, shape: Any = shape) -> Any:
            return np.frombuffer(b, dtype).reshape(shape).tolist()
        leaf = _get(value, path)
        value = _set(value, path, [of(f) for f in leaf] if path in fmt.stacks else of(leaf))
    return value


def _next_reference(rows: list[dict[str, Any]], obs: list[Any], i: int, fmt: FileEncoding, follows: Any) -> Any:
    n = rows[i][NEXT]
    if n is None:
        if i + 1 >= len(rows) or not follows(i + 1):
            raise EncodingError(f"row {i}: next_obs is null without the episode's next step after it")
        return obs[i + 1]
    for path, _ in _reference_leaves([{OBS: n}]):
        stored = _get(n, path)
        k = fmt.stacks.get(path)
        if k is None and path in fmt.images:
            n = _set(n, path, stored[0])
        elif k is not None and len(stored) != k:
            n = _set(n, path, list(_get(obs[i], path))[1:] + list(stored))
    return n


def encode_reference(table: pa.Table, fmt: FileEncoding) -> pa.Table:
    """``table`` (logical columns, rows in file order) encoded by the letter of the format, in plain Python: where
    ``next_obs`` is the next row's ``obs`` bit for bit (same episode, next step) it is null, and a stacked leaf
    holds its newest frame wherever its stack is the row before's shifted by one frame (an anchor elsewhere).
    What the writer stores for the same rows in the same file."""
    eid, step = table["episode_id"].to_pylist(), table["step"].to_pylist()
    n = table.num_rows
    obs_t = table.schema.field(OBS).type
    physical = physical_schema(table.schema, fmt)
    paths = [p for p, _ in leaves(obs_t)]
    o = {p: fixed_numpy(leaf_column(table[OBS].combine_chunks(), p)) for p in paths}
    x = {p: fixed_numpy(leaf_column(table[NEXT].combine_chunks(), p)) for p in paths} \
        if NEXT in table.column_names else {}

    def follows(i: int) -> bool:
        return 0 < i < n and eid[i - 1] == eid[i] and step[i - 1] + 1 == step[i]

    def same(a: np.ndarray, b: np.ndarray) -> bool:
        return a.tobytes() == b.tobytes()

    null = [bool(x) and follows(i + 1) and all(same(x[p][i], o[p][i + 1]) for p in paths) for i in range(n)]
    obs_leaves, next_leaves = {}, {}
    for path, t in leaves(obs_t):
        k = fmt.stacks.get(path)
        frame = _stored_frame(t.value_type if k else t, fmt.images.get(path))
        if k is None:
            obs_leaves[path] = frames_array(o[path], frame)
            stored = [[x[path][i]] if not null[i] else [] for i in range(n)] if x else []
            if x and not in_frames(fmt, path):  # as in obs (null where next_obs is: set below)
                next_leaves[path] = frames_array(x[path], frame)
                continue
        else:
            anchor = [not follows(i) or not same(o[path][i][:-1], o[path][i - 1][1:]) for i in range(n)]
            obs_leaves[path] = _lists([list(o[path][i]) if anchor[i] else [o[path][i][-1]] for i in range(n)], frame)
            stored = [[] if null[i] else [x[path][i][-1]] if same(x[path][i][:-1], o[path][i][1:])
                      else list(x[path][i]) for i in range(n)] if x else []
        if x:
            next_leaves[path] = _lists(stored, frame, valid=[not v for v in null])
    columns = {name: table[name].combine_chunks() for name in table.column_names}
    columns[OBS] = _reference_struct(obs_t, obs_leaves, physical.field(fmt.physical(OBS)).type, None)
    if x:
        valid = pa.array([not v for v in null])
        column = _reference_struct(obs_t, next_leaves, physical.field(fmt.physical(NEXT)).type, valid)
        if not pa.types.is_struct(obs_t) and not in_frames(fmt, OBS):
            column = with_validity(column, ~np.array(null))
        columns[NEXT] = column
    return pa.table(list(columns.values()), schema=physical)


def _lists(rows: list[list[np.ndarray]], frame: pa.DataType, valid: list[bool] | None = None) -> pa.Array:
    flat = [f for r in rows for f in r]
    values = frames_array(np.stack(flat), frame) if flat else pa.array([], frame)
    offsets = pa.array(np.r_[0, np.cumsum([len(r) for r in rows])].astype(np.int32))
    return pa.ListArray.from_arrays(offsets, values, mask=None if valid is None else pa.array([not v for v in valid]))


def _reference_struct(t: pa.DataType, arrays: Mapping[str, pa.Array], physical: pa.DataType,
                      valid: pa.Array | None, path: str = OBS) -> pa.Array:
    if not pa.types.is_struct(t):
        return arrays[path]
    children = [_reference_struct(f.type, arrays, physical.field(f.name).type, None, f"{path}.{f.name}") for f in t]
    mask = None if valid is None else pc.invert(valid)
    return pa.StructArray.from_arrays(children, fields=list(physical), mask=mask)
