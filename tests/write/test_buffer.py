"""The writer's side of encoding 2 (trajstore.write.buffer): frame stacks and next_obs stored once, checked on
every step, across calls and flushes, under both autoreset modes; every file exactly what the plain reference
encoder says; the flush ordering by slices identical to the ordering by take; the bytes that reach the disk."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gymnasium import spaces

import trajstore
from tests.helpers import make_batch, slice_batch, stacked_stream, steps_table
from tests.storage.encoding_reference import encode_reference
from trajstore.errors import InputError, SchemaMismatchError
from trajstore.storage.encoding import FileSchema, decode_table
from trajstore.write import buffer as buffer_module


def write(store: trajstore.Store, stream: dict[str, Any], cuts: list[int], *, flush_at: tuple[int, ...] = (),
          **options: Any) -> None:
    """``stream`` in calls cut at ``cuts`` (time indices), flushed after the calls listed in ``flush_at``."""
    T = stream["reward"].shape[0]
    bounds = [0, *sorted(c for c in cuts if 0 < c < T), T]
    with store.writer(run_id="r", env_id="Pixels-v0", **options) as w:
        for i, (a, b) in enumerate(zip(bounds, bounds[1:])):
            w.add_batch(slice_batch(stream, a, b))
            if i in flush_at:
                w.flush()


def physical_files(store: trajstore.Store) -> list[tuple[pa.Table, FileSchema]]:
    """Each file's stored columns as the file holds them, under the names of the fields they store (``obs`` for
    ``obs_new_frames``, ``next_obs`` for ``next_obs_sparse``), and its schema."""
    out = []
    for f in store.maintain.files():
        table = pq.ParquetFile(f.path).read()
        layout = FileSchema.of(table.schema)
        names = layout.format.logical_names()
        out.append((table.rename_columns([names.get(n, n) for n in table.column_names]), layout))
    return out


def logical(table: pa.Table, layout: FileSchema) -> pa.Table:
    names = layout.format.logical_names()
    renamed = table.rename_columns([names.get(n, n) for n in table.column_names])
    return renamed.replace_schema_metadata(None)


def assert_stored_as_the_reference_says(store: trajstore.Store) -> None:
    """Each file holds exactly what the plain encoder makes of its decoded rows: nothing stored twice that it
    would store once, nothing stored once that differs."""
    for table, layout in physical_files(store):
        rows = logical(table, layout)
        decoded = decode_table(rows, layout.format)
        again = logical(encode_reference(decoded, layout.format), layout)
        for name in ("obs", "next_obs"):
            assert stored_values(again[name]) == stored_values(rows[name]), name


def stored_values(column: pa.ChunkedArray) -> list[bytes | None]:
    """Per row, None where null, else the bytes of every value it stores (lists flattened, struct fields in order):
    equal for equal bits, NaN included."""
    arr = column.combine_chunks()
    valid = arr.is_valid().to_pylist()
    return [_bytes(arr.slice(i, 1)) if ok else None for i, ok in enumerate(valid)]


def _bytes(arr: pa.Array) -> bytes:
    if pa.types.is_struct(arr.type):
        return b"|".join(_bytes(arr.field(i)) for i in range(arr.type.num_fields))
    while pa.types.is_list(arr.type) or pa.types.is_fixed_size_list(arr.type):
        arr = arr.flatten()
    if pa.types.is_fixed_size_binary(arr.type):  # image frames: their bytes
        return str(len(arr)).encode() + b":" + b"".join(arr.to_pylist())
    return str(len(arr)).encode() + b":" + arr.to_numpy(zero_copy_only=False).tobytes()


def assert_round_trip(store: trajstore.Store, stream: dict[str, Any]) -> None:
    """Every stored row's obs and next_obs are the stream's at its (t, env), whatever the reader."""
    got = store.scan(["env_index", "t", "obs", "next_obs"]).read_all()
    t, env = got["t"].to_numpy(), got["env_index"].to_numpy()
    from trajstore.schema import to_numpy

    obs = to_numpy(got["obs"])
    assert obs.dtype == np.uint8 and obs.shape[1:] == stream["obs"].shape[2:]  # the stacks, as written
    np.testing.assert_array_equal(obs, stream["obs"][t, env])
    np.testing.assert_array_equal(to_numpy(got["next_obs"]), stream["next_obs"][t, env])


@pytest.mark.parametrize("autoreset", ["same-step", "next-step"])
@pytest.mark.parametrize(("cuts", "flush_at"), [([], ()), ([1, 2, 7, 30], ()), ([5, 17, 18, 40], (1, 2))])
def test_frame_stacks_round_trip_and_each_frame_is_stored_once(store: trajstore.Store, autoreset: str,
                                                               cuts: list[int], flush_at: tuple[int, ...]) -> None:
    stream = stacked_stream(np.random.default_rng(len(cuts) + len(flush_at)), 60, 3, autoreset=autoreset)
    write(store, stream, cuts, flush_at=flush_at, frame_stack={"obs": 4}, autoreset=autoreset)
    assert_round_trip(store, stream)
    assert_stored_as_the_reference_says(store)
    assert len(store.maintain.files()) == 1 + len(flush_at)
    # one frame per stored step, plus the padding of each episode's first stack in each file
    for table, _ in physical_files(store):
        counts = np.diff(table["obs"].combine_chunks().offsets.to_numpy())
        eid, step = table["episode_id"].to_numpy(), table["step"].to_numpy()
        starts = np.r_[True, (eid[1:] != eid[:-1]) | (step[1:] != step[:-1] + 1)]
        assert counts.tolist() == np.where(starts, 4, 1).tolist()
        stored_next = table["next_obs"].combine_chunks()
        ends = np.r_[starts[1:], True]
        assert (~stored_next.is_valid().to_numpy(zero_copy_only=False)).tolist() == (~ends).tolist()
        assert set(np.diff(stored_next.offsets.to_numpy())[ends]) == {1}  # the final obs: one new frame


def test_stacks_that_do_not_shift_and_next_obs_that_differ_are_stored_whole(store: trajstore.Store) -> None:
    stream = stacked_stream(np.random.default_rng(5), 30, 2)
    stream["obs"][10, 0, 0] = 7  # the oldest frame of a stack changed: it is not the previous one shifted
    stream["next_obs"][20, 1] = 9  # a next_obs that is not the next step's obs
    stream["obs"][25, 1, -1, 0, 0] ^= 1  # a new frame that differs from the next_obs before it by one bit
    write(store, stream, [11, 21], frame_stack={"obs": 4})
    assert_round_trip(store, stream)
    assert_stored_as_the_reference_says(store)
    table, _ = physical_files(store)[0]
    rows = {(e, s): (len(o), None if n is None else len(n)) for e, s, o, n in
            zip(table["episode_id"].to_pylist(), table["step"].to_pylist(), table["obs"].to_pylist(),
                table["next_obs"].to_pylist())}
    got = store.scan(["episode_id", "step", "env_index", "t"]).read_all().to_pylist()
    at = {(r["t"], r["env_index"]): (r["episode_id"], r["step"]) for r in got}
    if (10, 0) in at:
        assert rows[at[(10, 0)]][0] == 4
    if (20, 1) in at and (21, 1) in at and at[(21, 1)][0] == at[(20, 1)][0]:
        assert rows[at[(20, 1)]][1] == 4  # whole: it is neither the next obs nor obs shifted by one frame
    if (24, 1) in at and (25, 1) in at and at[(25, 1)][0] == at[(24, 1)][0]:
        assert rows[at[(24, 1)]][1] is not None and rows[at[(25, 1)]][0] == 1


def test_next_obs_is_compared_bit_for_bit(store: trajstore.Store) -> None:
    """NaN observations are stored once (their bits are equal) and come back as written; -0.0 is not 0.0."""
    rng = np.random.default_rng(6)
    T, B = 12, 2
    obs = rng.normal(size=(T + 1, B, 3)).astype(np.float32)
    obs[3:6, :, 1] = np.nan
    obs[8, 0, 0] = -0.0
    batch = make_batch(rng, T, B, p_terminated=0, p_truncated=0)
    batch["obs"], batch["next_obs"] = obs[:-1], obs[1:].copy()
    batch["next_obs"][7, 0, 0] = 0.0  # the next obs holds -0.0: equal as numbers, not as bits
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch(slice_batch(batch, 0, 5))
        w.add_batch(slice_batch(batch, 5, T))
    got = store.scan(["env_index", "step", "obs", "next_obs"]).read_all()
    env, step = got["env_index"].to_numpy(), got["step"].to_numpy()
    from trajstore.schema import to_numpy

    assert to_numpy(got["obs"]).tobytes() == obs[:-1][step, env].tobytes()
    assert to_numpy(got["next_obs"]).tobytes() == batch["next_obs"][step, env].tobytes()
    stored = physical_files(store)[0][0]["next_obs"]
    assert stored.null_count == T * B - 1 - B  # only the one that differs, and each env's last
    assert_stored_as_the_reference_says(store)


def test_dict_observations_with_a_stacked_leaf(store: trajstore.Store) -> None:
    rng = np.random.default_rng(7)
    stream = stacked_stream(rng, 40, 2, shape=(6, 5))
    mode = rng.integers(0, 3, (41, 2))
    stream["obs"] = {"pixels": stream["obs"], "mode": mode[:-1]}
    stream["next_obs"] = {"pixels": stream["next_obs"], "mode": mode[1:]}
    space = spaces.Dict({"mode": spaces.Discrete(3), "pixels": spaces.Box(0, 255, (4, 6, 5), np.uint8)})
    write(store, stream, [13, 27], frame_stack={"obs.pixels": 4}, observation_space=space)
    got = store.scan(["env_index", "t", "obs", "next_obs"]).read_all()
    t, env = got["t"].to_numpy(), got["env_index"].to_numpy()
    from trajstore.schema import to_numpy

    for name in ("obs", "next_obs"):
        values = to_numpy(got[name])
        np.testing.assert_array_equal(values["pixels"], stream[name]["pixels"][t, env])
        np.testing.assert_array_equal(values["mode"], stream[name]["mode"][t, env])
    assert_stored_as_the_reference_says(store)
    sql = store.sql("SELECT t, env_index, obs.pixels AS p, next_obs.mode AS m FROM steps ORDER BY t, env_index")
    np.testing.assert_array_equal(np.array(sql["p"].to_pylist(), np.uint8),
                                  stream["obs"]["pixels"][sql["t"].to_numpy(), sql["env_index"].to_numpy()])


@pytest.mark.parametrize("noise", [False, True])
def test_slices_and_take_order_a_flush_alike(noise: bool) -> None:
    """The two ways a flush orders rows env by env give the same table, and the same file bytes."""
    import copy

    stream = stacked_stream(np.random.default_rng(8), 50, 4, noise=noise)
    store = trajstore.open(Path(__import__("tempfile").mkdtemp()) / "s", create=True)
    with store.writer(run_id="r", env_id="E", frame_stack={"obs": 4}) as w:
        for a, b in [(0, 9), (9, 10), (10, 33), (33, 50)]:
            w.add_batch(slice_batch(stream, a, b))
        twin = copy.copy(w._buffer)  # the same calls, taken twice
        tables = {"slices": w._buffer.take().ordered(by="slices"), "take": twin.take().ordered(by="take")}  # type: ignore[union-attr]
    assert tables["slices"].num_rows == 200 and tables["slices"].equals(tables["take"])
    sinks = {}
    for by, table in tables.items():
        sink = pa.BufferOutputStream()
        pq.write_table(table, sink, compression="zstd")
        sinks[by] = sink.getvalue().to_pybytes()
    assert sinks["slices"] == sinks["take"]


def test_image_rows_are_ordered_by_slices_and_narrow_rows_by_take(monkeypatch: pytest.MonkeyPatch,
                                                                  tmp_path: Path) -> None:
    seen: list[str] = []
    original = buffer_module._env_slices
    monkeypatch.setattr(buffer_module, "_env_slices", lambda *a: seen.append("slices") or original(*a))
    wide = stacked_stream(np.random.default_rng(9), 20, 3, noise=True, shape=(16, 16))
    store = trajstore.open(tmp_path / "wide", create=True)
    write(store, wide, [5, 12])
    assert seen == ["slices"]
    assert_round_trip_shape(store, wide)
    narrow = make_batch(np.random.default_rng(9), 20, 64, extras={"t": np.repeat(np.arange(20)[:, None], 64, 1)})
    store = trajstore.open(tmp_path / "narrow", create=True)
    write(store, narrow, [5, 12])
    assert seen == ["slices"]  # ordered by one take
    got = store.scan(["env_index", "t", "obs"]).read_all()
    assert got["env_index"].to_pylist() == sorted(got["env_index"].to_pylist())  # env by env
    from trajstore.schema import to_numpy

    np.testing.assert_array_equal(to_numpy(got["obs"]), narrow["obs"][got["t"].to_numpy(), got["env_index"].to_numpy()])


def assert_round_trip_shape(store: trajstore.Store, stream: dict[str, Any]) -> None:
    got = store.scan(["env_index", "t", "obs"]).read_all()
    from trajstore.schema import to_numpy

    np.testing.assert_array_equal(to_numpy(got["obs"]), stream["obs"][got["t"].to_numpy(), got["env_index"].to_numpy()])


def test_frame_stacks_that_do_not_fit_are_refused_naming_the_leaf(store: trajstore.Store) -> None:
    stream = stacked_stream(np.random.default_rng(10), 10, 2)
    with pytest.raises(InputError, match=r"frame_stack: 'obs.pixels' is not a leaf of the observation; its leaves "
                                         r"are \['obs'\]"):
        write(store, stream, [], frame_stack={"obs.pixels": 4})
    with pytest.raises(InputError, match=r"frame_stack: 'obs' is uint8\[4,8,8\] per step, not a stack of 3 frames"):
        write(store, stream, [], frame_stack={"obs": 3})
    with pytest.raises(InputError, match=r"frame_stack: 'obs' is float32\[4\] per step, not a stack of 3 frames"):
        store.writer(run_id="r", env_id="E", frame_stack={"obs": 3},
                     observation_space=spaces.Box(0, 1, (4,), np.float32))
    with pytest.raises(InputError, match=r"frame_stack: expected a dict of observation leaf -> stack size"):
        store.writer(run_id="r", env_id="E", frame_stack=4)  # type: ignore[arg-type]
    assert store.maintain.files() == []


def test_frame_stacks_store_each_frame_once_on_disk(tmp_path: Path) -> None:
    """Random-noise frames (incompressible): the bytes handed to the compressor and on disk per step are one
    frame's (each image frame as its bytes), where a writer without frame_stack hands it the four of each stack
    (zstd's window finds the repeated frames again on disk, at the cost of compressing four times the bytes)."""
    T, B, shape = 200, 4, (32, 32)
    stream = stacked_stream(np.random.default_rng(11), T, B, noise=True, shape=shape, p_end=0.01)
    frame = int(np.prod(shape))
    sizes = {}
    for name, options in (("stacked", {"frame_stack": {"obs": 4}}), ("plain", {})):
        store = trajstore.open(tmp_path / name, create=True)
        write(store, stream, [50, 120], **options)
        (f,) = store.maintain.files()
        meta = pq.read_metadata(f.path)
        raw = sum(meta.row_group(g).column(c).total_uncompressed_size for g in range(meta.num_row_groups)
                  for c in range(meta.num_columns)
                  if meta.row_group(g).column(c).path_in_schema.split(".")[0].startswith(("obs", "next_obs")))
        sizes[name] = (raw / (T * B), f.size / (T * B))
        assert_round_trip(store, stream)
    raw, disk = sizes["stacked"]
    assert raw < 1.1 * frame + 64 and disk < 1.1 * frame + 64, sizes  # each frame once (episode starts aside)
    assert sizes["plain"][0] > 3.9 * frame, sizes  # next_obs deduplicated, every frame of each stack kept: 4


def test_a_rollout_passes_frame_stack_through(store: trajstore.Store) -> None:
    """gym_rollout of FrameStackObservation(CartPole) with frame_stack: the stacks come back as the env made
    them, one frame stored per step."""
    import gymnasium as gym

    from trajstore.rollout import gym_rollout

    venv = gym.vector.SyncVectorEnv([lambda: gym.wrappers.FrameStackObservation(gym.make("CartPole-v1"), 4)] * 3)
    gym_rollout(store, venv, run_id="r", env_id="Stacked-v0", steps=400, seed=0, progress=False,
                frame_stack={"obs": 4})
    got = store.scan(["episode_id", "step", "obs", "next_obs"]).read_all().sort_by([("episode_id", "ascending"),
                                                                                    ("step", "ascending")])
    from trajstore.schema import to_numpy

    obs, nxt = to_numpy(got["obs"]), to_numpy(got["next_obs"])
    assert obs.shape[1:] == (4, 4) and obs.dtype == np.float32
    same = np.r_[got["episode_id"].to_numpy()[1:] == got["episode_id"].to_numpy()[:-1]]
    np.testing.assert_array_equal(obs[1:][same], nxt[:-1][same])  # next_obs is the next step's obs
    np.testing.assert_array_equal(obs[1:][same][:, :-1], obs[:-1][same][:, 1:])  # stacks shift by one frame
    table = physical_files(store)[0][0]
    counts = np.diff(table["obs"].combine_chunks().offsets.to_numpy())
    assert (counts == 4).sum() == store.stats(include_incomplete=True)["n_traj"][0].as_py()  # one anchor each
    assert_stored_as_the_reference_says(store)


def test_a_space_declared_for_a_stacked_leaf_refuses_other_shapes(store: trajstore.Store) -> None:
    stream = stacked_stream(np.random.default_rng(12), 10, 2, shape=(8, 7))
    space = spaces.Box(0, 255, (4, 8, 8), np.uint8)
    with pytest.raises(SchemaMismatchError, match=r"obs: expected shape \(4, 8, 8\) uint8 per step"):
        write(store, stream, [], frame_stack={"obs": 4}, observation_space=space)


def test_deletes_derived_columns_and_compaction_keep_what_decodes(store: trajstore.Store) -> None:
    """Rewrites keep each file's format and each episode's rows in order: whole episodes go, a column is added,
    files of one format are joined; every remaining step decodes to what was written."""
    from trajstore.store import check, compact

    stream = stacked_stream(np.random.default_rng(13), 40, 3)
    write(store, stream, [10, 25], flush_at=(0, 1), frame_stack={"obs": 4})
    assert len(store.maintain.files()) == 3
    episodes = store.episodes(limit=None)["episode_id"].to_pylist()
    store.maintain.delete(steps_where=f"episode_id IN ({episodes[1]}, {episodes[-2]})")
    store.maintain.add_column("doubled", "reward * 2")
    compact(store, progress=False)
    assert len(store.maintain.files()) == 1 and check(store).ok
    got = store.scan(["env_index", "t", "obs", "next_obs", "doubled", "reward"]).read_all()
    from trajstore.schema import to_numpy

    t, env = got["t"].to_numpy(), got["env_index"].to_numpy()
    np.testing.assert_array_equal(to_numpy(got["obs"]), stream["obs"][t, env])
    np.testing.assert_array_equal(to_numpy(got["next_obs"]), stream["next_obs"][t, env])
    np.testing.assert_allclose(got["doubled"].to_numpy(), got["reward"].to_numpy() * 2)
    assert steps_table(store).schemas(store.maintain.files())[0].format.stacks == {"obs": 4}


def test_a_call_copies_only_the_frames_it_stores(store: trajstore.Store) -> None:
    """The writer gathers the frames it stores once and checks every step without full-size temporaries: what a
    call of 8 envs' 84x84 frame stacks allocates (numpy's allocations, traced) is about the frames stored (one per
    step, anchors aside), far below one copy of the batch's obs."""
    import tracemalloc

    stream = stacked_stream(np.random.default_rng(14), 65, 8, shape=(84, 84), noise=True, p_end=0.0)
    frame = 84 * 84
    with store.writer(run_id="r", env_id="Pixels-v0", frame_stack={"obs": 4}, flush_bytes=1 << 40) as w:
        w.add_batch(slice_batch(stream, 0, 1))  # types fixed, kernels compiled
        tracemalloc.start()
        w.add_batch(slice_batch(stream, 1, 65))
        _, peak = tracemalloc.get_traced_memory()
        tracemalloc.stop()
    stored = 64 * 8 * frame  # one new frame per step
    assert peak < 1.5 * stored, (peak, stored)
    assert peak < 0.4 * stream["obs"][1:65].nbytes  # a quarter of one copy of obs: no full-size temporaries
    assert_round_trip(store, stream)


@pytest.mark.parametrize("stacked", [False, True])
def test_a_big_last_flush_is_two_files_that_read_back_as_one(monkeypatch: pytest.MonkeyPatch, tmp_path: Path,
                                                             stacked: bool) -> None:
    """A flush that waits sends a big buffer as two files (envs split in two ranges), encoded at once: every row
    reads back as written, each env's rows in one file, and each file is what the plain encoder makes of it."""
    from trajstore.write import writer as writer_module

    stream = stacked_stream(np.random.default_rng(3), 40, 6, noise=True) if stacked else \
        make_batch(np.random.default_rng(3), 40, 6, extras={"t": np.repeat(np.arange(40)[:, None], 6, 1)})
    if stacked:
        stream["extras"] = {"t": np.repeat(np.arange(40)[:, None], 6, 1)}
    options: dict[str, Any] = {"frame_stack": {"obs": 4}} if stacked else {}
    monkeypatch.setattr(writer_module, "SPLIT_BYTES", 1)
    split = trajstore.open(tmp_path / "split", create=True)
    write(split, stream, [9, 25], flush_at=(0,), **options)
    monkeypatch.setattr(writer_module, "SPLIT_BYTES", 1 << 40)
    whole = trajstore.open(tmp_path / "whole", create=True)
    write(whole, stream, [9, 25], flush_at=(0,), **options)
    assert len(split.maintain.files()) == 4 and len(whole.maintain.files()) == 2  # each flush: two files, or one
    columns = ["env_index", "t", "episode_id", "step", "obs", "next_obs", "reward"]
    order = ["env_index", "t"]

    def rows(store: trajstore.Store) -> pa.Table:
        return store.scan(columns).read_all().sort_by([(c, "ascending") for c in order])

    a, b = rows(split), rows(whole)
    assert a.num_rows == 40 * 6
    for c in ("env_index", "t", "step", "obs", "next_obs", "reward"):
        assert a[c].combine_chunks().equals(b[c].combine_chunks()), c
    flushes: dict[bool, list[set[int]]] = {}  # the first flush's files (t < 9), the last one's
    for table, _ in physical_files(split):
        flushes.setdefault(min(table["t"].to_pylist()) < 9, []).append(set(table["env_index"].to_pylist()))
    for envs in flushes.values():  # each env's rows in one of its flush's two files
        assert len(envs) == 2 and not envs[0] & envs[1] and envs[0] | envs[1] == set(range(6))
    if stacked:
        assert_round_trip(split, stream)
    assert_stored_as_the_reference_says(split)


def test_blocks_and_take_order_uniform_calls_alike(monkeypatch: pytest.MonkeyPatch) -> None:
    """Calls in which every env has as many rows (a JAX scan's batches, the last one cut short) are ordered by
    block copies: the same table as the ordering by take, nulls (next_obs, a masked extra) and booleans too."""
    import copy

    rng = np.random.default_rng(11)
    T, B = 23, 6
    obs = rng.standard_normal((T + 1, B, 3)).astype(np.float32)
    stream = make_batch(rng, T, B, extras={
        "value": np.ma.masked_array(rng.standard_normal((T, B)), mask=rng.random((T, B)) < 0.3),
        "flag": rng.random((T, B)) < 0.5, "tag": np.full((T, B), 7, np.int16)})
    stream["obs"], stream["next_obs"] = obs[:-1], obs[1:].copy()
    stream["next_obs"][4, 2] += 1  # one next_obs that is not the next obs: stored
    seen: list[int] = []
    original = buffer_module._blocks
    monkeypatch.setattr(buffer_module, "_blocks", lambda *a: seen.append(1) or original(*a))
    store = trajstore.open(Path(__import__("tempfile").mkdtemp()) / "s", create=True)
    with store.writer(run_id="r", env_id="E", worker_id="w") as w:
        for a, b in [(0, 8), (8, 16), (16, 23)]:
            w.add_batch(slice_batch(stream, a, b))
        twin = copy.copy(w._buffer)
        default, take = w._buffer.take(), twin.take()  # type: ignore[union-attr]
        tables = {"blocks": default.ordered(), "take": take.ordered(by="take")}
    assert seen  # the default for uniform calls
    assert tables["blocks"].num_rows == T * B and tables["blocks"].equals(tables["take"])
    assert tables["blocks"]["next_obs"].null_count == tables["take"]["next_obs"].null_count > 0
    assert tables["blocks"]["value"].null_count > 0
    assert tables["blocks"]["env_index"].to_pylist() == sorted(tables["blocks"]["env_index"].to_pylist())


def test_calls_with_skipped_steps_are_ordered_by_take() -> None:
    rng = np.random.default_rng(12)
    valid = rng.random((10, 4)) < 0.8
    stream = make_batch(rng, 10, 4, valid=valid)
    store = trajstore.open(Path(__import__("tempfile").mkdtemp()) / "s", create=True)
    with store.writer(run_id="r", env_id="E") as w:
        for a, b in [(0, 5), (5, 10)]:
            w.add_batch(slice_batch(stream, a, b))
        flush = w._buffer.take()  # type: ignore[union-attr]
        assert not buffer_module._uniform(flush.counts)
        with pytest.raises(ValueError, match="blocks"):
            copy_ = buffer_module.Flush(list(flush.batches), flush.counts)
            copy_.ordered(by="blocks")
        got = flush.ordered()
    assert got.num_rows == int(valid.sum())
    assert got["env_index"].to_pylist() == sorted(got["env_index"].to_pylist())
