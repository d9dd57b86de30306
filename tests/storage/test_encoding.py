"""Encoding 2 (trajstore.storage.encoding): the fast decoder against the plain reference, over dtypes, shapes, frame
stacks, Dict observations and batch splits; what it refuses; the format's metadata."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.storage.encoding_reference import decode_reference, encode_reference
from trajstore.errors import InputError
from trajstore.storage.encoding import (
    EncodingError,
    FileDecoder,
    FileEncoding,
    check_frame_stack,
    check_rows,
    decode_table,
    fixed_numpy,
    from_numpy,
    leaves,
    logical_schema,
)

DTYPES = ["uint8", "int8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32", "float64",
          "bool"]


def leaf_type(dtype: str, shape: tuple[int, ...]) -> pa.DataType:
    t = pa.from_numpy_dtype(np.dtype(dtype))
    for size in reversed(shape):
        t = pa.list_(t, size)
    return t


def frames_of(rng: np.random.Generator, dtype: str, n: int, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "bool":
        return rng.random((n, *shape)) < 0.5
    if np.dtype(dtype).kind == "f":
        out = rng.normal(size=(n, *shape)).astype(dtype)
        if out.size:
            out.reshape(-1)[rng.integers(0, out.size)] = np.nan  # NaN observations round-trip too
        return out
    info = np.iinfo(dtype)
    return rng.integers(max(info.min, -1000), min(info.max, 1000), (n, *shape), endpoint=True).astype(dtype)


def episode_stacks(frames: np.ndarray, k: int, pad: str) -> np.ndarray:
    """FrameStackObservation's stacks over one episode's frames (newest last), padded at its start by repeating
    the first frame ("reset") or with zeros ("zero"); stacks[t] holds frames[t-k+1..t]."""
    n = len(frames) - 1  # frames[t+1] is the frame after step t
    first = frames[:1] if pad == "reset" else np.zeros_like(frames[:1])
    padded = np.concatenate([np.repeat(first, k - 1, axis=0), frames])
    return np.stack([padded[t:t + k] for t in range(n + 1)])  # n + 1 stacks: one per obs, and the last next_obs


def make_file(seed: int, dtype: str, frame: tuple[int, ...], k: int | None, dict_obs: bool,
              lengths: list[int], mismatches: int) -> tuple[pa.Table, FileEncoding]:
    """Rows of one file, logical: episodes one after another (the first may continue an episode: it starts at a
    step > 0), obs stacked (or not) as FrameStackObservation stacks them, some stacks and next_obs spoiled."""
    rng = np.random.default_rng(seed)
    obs_rows, next_rows, eids, steps = [], [], [], []
    for e, n in enumerate(lengths):
        frames = frames_of(rng, dtype, n + 1, frame)
        stacks = episode_stacks(frames, k, "reset" if e % 2 else "zero") if k else frames
        o, nx = stacks[:-1].copy(), stacks[1:].copy()
        first = int(rng.integers(0, 3)) if e == 0 else 0
        obs_rows.append(o), next_rows.append(nx)
        eids += [1000 + e] * n
        steps += list(range(first, first + n))
    obs, nxt = np.concatenate(obs_rows), np.concatenate(next_rows)
    for _ in range(mismatches):  # a frame that breaks the shift, or a next_obs that is not the next obs
        i = int(rng.integers(0, len(obs)))
        (obs if rng.random() < 0.5 else nxt)[i] = frames_of(rng, dtype, 1, obs.shape[1:])[0]
    t = leaf_type(dtype, obs.shape[1:])
    stacks = {"obs": k} if k else {}
    columns: dict[str, Any] = {"episode_id": pa.array(eids, pa.int64()), "step": pa.array(steps, pa.int32())}
    if dict_obs:
        plain = rng.integers(0, 5, len(obs))
        plain_next = np.r_[plain[1:], 7]
        struct = pa.struct([("pixels", t), ("mode", pa.int64())])
        columns["obs"] = pa.StructArray.from_arrays([from_numpy(obs, t), pa.array(plain)], fields=list(struct))
        columns["next_obs"] = pa.StructArray.from_arrays([from_numpy(nxt, t), pa.array(plain_next)],
                                                         fields=list(struct))
        stacks = {"obs.pixels": k} if k else {}
    else:
        columns["obs"], columns["next_obs"] = from_numpy(obs, t), from_numpy(nxt, t)
    columns["reward"] = pa.array(rng.normal(size=len(obs)).astype(np.float32))
    table = pa.table(columns)  # frames of 2+ dimensions are images: stored as their bytes
    return table, FileEncoding.for_obs(table.schema.field("obs").type, frame_stack=stacks)


def assert_same(got: pa.Table, want: pa.Table) -> None:
    """Equal column by column, observation leaves bit for bit (NaN included) and in the same dtype."""
    assert got.column_names == want.column_names
    for name in want.column_names:
        a, b = got[name].combine_chunks(), want[name].combine_chunks()
        assert a.type == b.type, name
        if name in ("obs", "next_obs"):
            for path, _ in leaves(b.type):
                x, y = (fixed_numpy(_at(c, path)) for c in (a, b))
                assert x.dtype == y.dtype and x.shape == y.shape and x.tobytes() == y.tobytes(), (name, path)
        else:
            assert a.equals(b), name


def _at(arr: pa.Array, path: str) -> pa.Array:
    for part in path.split(".")[1:]:
        arr = arr.field(part)
    return arr


def decode_in_batches(encoded: pa.Table, fmt: FileEncoding, sizes: list[int]) -> pa.Table:
    obs = logical_schema(encoded.schema, fmt).field("obs").type
    decoder = FileDecoder(fmt, obs)
    out, start = [], 0
    for size in sizes + [encoded.num_rows]:
        piece = encoded.slice(start, size)
        start += piece.num_rows
        for batch in piece.to_batches():
            out += decoder.push(batch)
    out += decoder.finish()
    return pa.Table.from_batches(out)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**16), dtype=st.sampled_from(DTYPES),
       frame=st.sampled_from([(), (2,), (2, 3), (3, 2, 2)]), k=st.sampled_from([None, 2, 4]), dict_obs=st.booleans(),
       lengths=st.lists(st.integers(1, 9), min_size=1, max_size=4), mismatches=st.integers(0, 3),
       sizes=st.lists(st.integers(1, 7), max_size=4))
def test_the_fast_decoder_gives_back_what_was_encoded(seed: int, dtype: str, frame: tuple[int, ...], k: int | None,
                                                      dict_obs: bool, lengths: list[int], mismatches: int,
                                                      sizes: list[int]) -> None:
    table, fmt = make_file(seed, dtype, frame, k, dict_obs, lengths, mismatches)
    encoded = encode_reference(table, fmt)
    assert_same(decode_in_batches(encoded, fmt, sizes), table)
    assert_same(decode_table(encoded, fmt), table)
    plain = pa.Table.from_pylist(decode_reference(encoded.to_pylist(), fmt), schema=table.schema)
    assert_same(plain, table)
    assert check_rows(encoded.to_batches(max_chunksize=3), fmt, table.schema.field("obs").type) == table.num_rows


def test_each_frame_is_stored_once_and_next_obs_only_where_it_is_not_the_next_obs() -> None:
    table, fmt = make_file(3, "uint8", (4, 4), 4, False, [6, 5], 0)
    assert fmt.images == {"obs": ("uint8", (4, 4))}
    encoded = encode_reference(table, fmt)
    assert encoded.schema.field("obs").type == pa.list_(pa.binary(16))  # each image frame as its 16 bytes
    counts = np.diff(encoded["obs"].combine_chunks().offsets.to_numpy())
    assert counts.tolist() == [4] + [1] * 5 + [4] + [1] * 4  # an anchor at each episode start, then one frame
    next_counts = [None if v is None else len(v) for v in encoded["next_obs"].to_pylist()]
    assert next_counts == [None] * 5 + [1] + [None] * 4 + [1]  # only each episode's last next_obs, one frame


def test_a_stack_that_does_not_shift_is_an_anchor() -> None:
    table, fmt = make_file(4, "float32", (3,), 3, False, [6], 0)
    obs = fixed_numpy(table["obs"].combine_chunks()).copy()
    obs[3, 0] += 1  # the oldest frame of step 3 is not step 2's middle frame: stored whole
    table = table.set_column(2, "obs", from_numpy(obs, table.schema.field("obs").type))
    counts = np.diff(encode_reference(table, fmt)["obs"].combine_chunks().offsets.to_numpy())
    assert counts.tolist() == [3, 1, 1, 3, 1, 1]
    assert_same(decode_table(encode_reference(table, fmt), fmt), table)


def test_rows_that_break_the_encoding_are_refused_naming_the_row() -> None:
    table, fmt = make_file(5, "uint8", (2,), 2, False, [4, 3], 0)
    encoded = encode_reference(table, fmt)
    obs_t = table.schema.field("obs").type
    moved = pa.concat_tables([encoded.slice(0, 2), encoded.slice(3, 1), encoded.slice(2, 1), encoded.slice(4)])
    with pytest.raises(EncodingError, match=r"row 2 \(episode 1000, step 3\): obs holds one frame, but the row "
                                            r"before it is not the same episode's previous step"):
        decode_table(moved, fmt)  # rows out of step order
    with pytest.raises(EncodingError, match=r"row 1 \(episode 1000, step 1\): next_obs is null, but the next row "
                                            r"is not the same episode's next step"):
        check_rows(moved.drop_columns(["obs"]).to_batches(), fmt, obs_t)
    cut = encoded.slice(1)  # its first row keeps one frame without the row before it
    with pytest.raises(EncodingError, match=r"row 0 \(episode 1000, step \d+\): obs holds one frame, but the row "
                                            r"before it is not the same episode's previous step"):
        decode_table(cut, fmt)
    with pytest.raises(EncodingError, match="obs holds one frame"):
        check_rows(cut.to_batches(), fmt, obs_t)
    last = encoded.slice(0, 3)  # ends on a null next_obs: the next obs it stands for is not there
    with pytest.raises(EncodingError, match=r"row 2 .*next_obs is null, but (the next row|it is the file's last)"):
        decode_table(last, fmt)
    with pytest.raises(EncodingError, match="next_obs is null, but it is the file's last row"):
        check_rows(last.to_batches(max_chunksize=1), fmt, obs_t)


@pytest.mark.parametrize(("stacks", "message"), [
    ({"obs.nope": 4}, r"frame_stack: 'obs.nope' is not a leaf of the observation; its leaves are \['obs.mode', "
                      r"'obs.pixels'\]"),
    ({"obs.mode": 4}, r"frame_stack: 'obs.mode' is int64 per step, not a stack of 4 frames"),
    ({"obs.pixels": 3}, r"frame_stack: 'obs.pixels' is uint8\[4,8,8\] per step, not a stack of 3 frames"),
    ({"obs.pixels": 1}, r"frame_stack: 'obs.pixels' must be a stack size >= 2, got 1"),
])
def test_frame_stacks_that_do_not_fit_are_refused_naming_the_leaf(stacks: dict[str, int], message: str) -> None:
    obs = pa.struct([("pixels", leaf_type("uint8", (4, 8, 8))), ("mode", pa.int64())])
    assert check_frame_stack(obs, {"obs.pixels": 4}) == {"obs.pixels": 4}
    with pytest.raises(InputError, match=message):
        check_frame_stack(obs, stacks)


def test_the_format_round_trips_through_metadata_and_refuses_what_it_cannot_read() -> None:
    fmt = FileEncoding.create(frame_stack={"obs": 4}, columns={"action": "action__float32_1d", "reward": "reward"})
    assert fmt.renames == {"action": "action__float32_1d"}
    assert FileEncoding.of(fmt.metadata()) == fmt and FileEncoding.of(None) == FileEncoding()
    assert fmt.metadata() == {b"trajstore": b'{"encoding":3,"frame_stack":{"obs":4},'
                                            b'"columns":{"action":"action__float32_1d"}}'}
    with pytest.raises(EncodingError, match="encoding 4 is newer than this trajstore reads"):
        FileEncoding.of({b"trajstore": b'{"encoding": 4}'}, where="f.parquet")
    with pytest.raises(EncodingError, match="f.parquet: its 'trajstore' metadata is not a trajstore format"):
        FileEncoding.of({b"trajstore": b"[1, 2"}, where="f.parquet")
    physical = pa.schema([("obs", pa.list_(pa.list_(pa.uint8(), 2))), ("next_obs", pa.list_(pa.list_(pa.uint8(), 2))),
                          ("action__float32_1d", pa.list_(pa.float32(), 1))])
    logical = logical_schema(physical, fmt)
    assert logical.names == ["obs", "next_obs", "action"]
    assert logical.field("obs").type == logical.field("next_obs").type == leaf_type("uint8", (4, 2))
    images = FileEncoding.for_obs(leaf_type("uint8", (4, 84, 84)), frame_stack={"obs": 4})
    assert images.metadata() == {b"trajstore": b'{"encoding":3,"frame_stack":{"obs":4},'
                                               b'"frames":{"obs":["uint8",[84,84]]}}'}
    physical = pa.schema([("obs", pa.list_(pa.binary(7056))), ("next_obs", pa.list_(pa.binary(7056)))])
    assert logical_schema(physical, images).field("obs").type == leaf_type("uint8", (4, 84, 84))
