"""Dtypes kept: every integer, float and bool dtype is stored as written and comes back as written from every
reader (scan, SQL, iter_batches, sequences, transitions, follow, export's episodes, the REST routes and the
Client), for a vector observation and for image frame stacks (stored as bytes), written locally and through a
RemoteWriter."""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trajstore
from tests.api.helpers import API_KEY, Live, serve, settings_for
from tests.helpers import make_batch
from trajstore.schema import to_numpy

DTYPES = ["bool", "int8", "uint8", "int16", "uint16", "int32", "uint32", "int64", "uint64", "float16", "float32",
          "float64"]
T, B = 9, 2
DUCKDB = {"bool": "BOOLEAN", "int8": "TINYINT", "uint8": "UTINYINT", "int16": "SMALLINT", "uint16": "USMALLINT",
          "int32": "INTEGER", "uint32": "UINTEGER", "int64": "BIGINT", "uint64": "UBIGINT", "float16": "FLOAT",
          "float32": "FLOAT", "float64": "DOUBLE"}


def values(rng: np.random.Generator, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
    if dtype == "bool":
        return rng.random(shape) < 0.5
    if np.dtype(dtype).kind == "f":
        return rng.normal(size=shape).astype(dtype)
    info = np.iinfo(dtype)
    return rng.integers(info.min, info.max, shape, dtype=dtype, endpoint=True)  # the extremes of the type too


def batch_of(dtype: str, seed: int) -> dict[str, Any]:
    """A (T, B) batch whose obs (3,), image frame stack (2, 4, 5), action (2,) and an extra are of ``dtype``;
    next_obs is the next step's obs (stored once) except at episode ends; ``t`` says each step's time index."""
    rng = np.random.default_rng(seed)
    batch = make_batch(rng, T, B, p_terminated=0.15, p_truncated=0.05,
                       extras={"t": np.repeat(np.arange(T)[:, None], B, axis=1), "x": values(rng, dtype, (T, B))})
    vec = values(rng, dtype, (T + 1, B, 3))
    frames = values(rng, dtype, (T + 2, B, 4, 5))
    stacks = np.stack([frames[:-1][:T + 1], frames[1:][:T + 1]], axis=2)  # (T+1, B, 2, 4, 5): shifts by a frame
    batch["obs"] = {"vec": vec[:-1], "img": stacks[:-1]}
    batch["next_obs"] = {"vec": vec[1:], "img": stacks[1:]}
    batch["action"] = values(rng, dtype, (T, B, 2))
    return batch


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    store = trajstore.open(tmp_path_factory.mktemp("dtypes") / "store", create=True)
    for i, dtype in enumerate(DTYPES):
        with store.writer(run_id="local", env_id=f"E-{dtype}", frame_stack={"obs.img": 2}) as w:
            w.add_batch(batch_of(dtype, i))
    return store


@pytest.fixture(scope="module")
def live(store: trajstore.Store) -> Iterator[Live]:
    from trajstore.api.app import create_app

    yield from serve(create_app(settings_for(Path(str(store.root)))))


def expected(dtype: str, rows: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """The written values at each returned row's (t, env_index)."""
    batch = batch_of(dtype, DTYPES.index(dtype))
    t, b = rows["t"], rows["env_index"]
    return {"vec": batch["obs"]["vec"][t, b], "img": batch["obs"]["img"][t, b],
            "next_vec": batch["next_obs"]["vec"][t, b], "next_img": batch["next_obs"]["img"][t, b],
            "action": batch["action"][t, b], "x": batch["extras"]["x"][t, b]}


def same(got: np.ndarray, want: np.ndarray) -> None:
    assert got.dtype == want.dtype and got.shape == want.shape, (got.dtype, got.shape, want.dtype, want.shape)
    assert got.tobytes() == want.tobytes()  # bit for bit (NaN none here, -0.0 kept)


def check_rows(dtype: str, arrays: dict[str, Any]) -> None:
    want = expected(dtype, {"t": np.asarray(arrays["t"]), "env_index": np.asarray(arrays["env_index"])})
    same(np.asarray(arrays["obs"]["vec"]), want["vec"])
    same(np.asarray(arrays["obs"]["img"]), want["img"])
    same(np.asarray(arrays["next_obs"]["vec"]), want["next_vec"])
    same(np.asarray(arrays["next_obs"]["img"]), want["next_img"])
    same(np.asarray(arrays["action"]), want["action"])
    same(np.asarray(arrays["x"]), want["x"])


COLUMNS = ["t", "env_index", "obs", "next_obs", "action", "x"]


@pytest.mark.parametrize("dtype", DTYPES)
def test_scan_iter_batches_and_follow_return_the_dtype(store: trajstore.Store, dtype: str) -> None:
    env = f"E-{dtype}"
    table = store.scan(COLUMNS, env_id=env).read_all()
    check_rows(dtype, {c: to_numpy(table[c]) for c in COLUMNS})
    (batch,) = list(store.iter_batches(batch_size=T * B, columns=COLUMNS, env_id=env))
    check_rows(dtype, batch)
    (arrow,) = list(store.iter_batches(batch_size=T * B, columns=COLUMNS, env_id=env, format="arrow"))
    check_rows(dtype, {c: to_numpy(arrow.column(c)) for c in COLUMNS})
    followed = [c.rows for c in store.follow(COLUMNS, env_id=env, since=-1, timeout=0)]
    rows = pa.concat_tables(followed)
    check_rows(dtype, {c: to_numpy(rows[c]) for c in COLUMNS})


@pytest.mark.parametrize("dtype", DTYPES)
def test_sql_returns_the_dtype(store: trajstore.Store, dtype: str) -> None:
    env = f"E-{dtype}"
    got = store.sql("SELECT t, env_index, obs.vec AS vec, obs.img AS img, next_obs.img AS nimg, action, x, "
                    "typeof(obs.img) AS ty FROM steps ORDER BY t, env_index", env_id=env)
    assert got["ty"][0].as_py() == DUCKDB[dtype] + "[][][]"
    want = expected(dtype, {"t": got["t"].to_numpy(), "env_index": got["env_index"].to_numpy()})
    cast = np.float32 if dtype == "float16" else dtype  # DuckDB has no 16-bit float
    for name, key in (("vec", "vec"), ("img", "img"), ("nimg", "next_img"), ("action", "action"), ("x", "x")):
        column = got[name]
        arr = np.array(column.to_pylist(), dtype=cast)  # Python ints and floats hold every value exactly
        assert arr.tobytes() == want[key].astype(cast).tobytes()


@pytest.mark.parametrize("dtype", DTYPES)
def test_loaders_return_the_dtype(store: trajstore.Store, dtype: str) -> None:
    import torch

    where = f"env_id = 'E-{dtype}'"
    windows = next(store.sequences(2, columns=["obs", "action", "x"], where=where, batch_size=512))
    assert windows["obs"]["img"].dtype == np.dtype(dtype) and windows["action"].dtype == np.dtype(dtype)
    tensors = next(store.sequences(2, columns=["obs"], where=where, batch_size=512, format="torch"))
    assert tensors["obs"]["img"].dtype == torch.from_numpy(np.zeros(1, dtype)).dtype
    n_step = next(store.transitions(3, gamma=0.5, columns=["obs", "t"], where=where, batch_size=512))
    assert n_step["next_obs"]["img"].dtype == np.dtype(dtype) and n_step["obs"]["vec"].dtype == np.dtype(dtype)
    assert n_step["obs"]["img"].shape[1:] == (2, 4, 5)


@pytest.mark.parametrize("dtype", ["uint8", "float32", "bool"])
def test_exports_read_frame_stacks_whole_in_their_dtype(tmp_path: Path, dtype: str) -> None:
    from trajstore.export.episodes import select

    store = trajstore.open(tmp_path / "store", create=True)
    batch = batch_of(dtype, 1)
    batch["obs"], batch["next_obs"] = batch["obs"]["img"], batch["next_obs"]["img"]
    with store.writer(run_id="r", env_id="E", frame_stack={"obs": 2}) as w:
        w.add_batch(batch)
    with select(store, include_unfinished=True) as selection:  # every step written, the unfinished ones too
        assert selection.kinds["obs"] == (np.dtype(dtype), (2, 4, 5)) == selection.kinds["next_obs"]
        episodes = list(selection.groups(max_bytes=200))  # small groups: whole episodes read back a few at a time
        assert sum(len(g) for g in episodes) == selection.episodes and len(episodes) > 1
    assert sum(g.steps for g in episodes) == T * B
    for episode in (e for g in episodes for e in g):
        t = store.scan(["episode_id", "t", "env_index"], episode_id=episode.episode_id).read_all()
        same(episode.obs, batch["obs"][t["t"].to_numpy(), t["env_index"].to_numpy()])
        same(episode.next_obs, batch["next_obs"][t["t"].to_numpy(), t["env_index"].to_numpy()])


@pytest.mark.parametrize("dtype", ["uint8", "float16", "int64", "bool"])
def test_the_rest_routes_and_the_client_return_the_dtype(store: trajstore.Store, live: Live, dtype: str) -> None:
    env = f"E-{dtype}"
    with trajstore.Client(live.url) as client:
        (batch,) = list(client.iter_batches(batch_size=T * B, columns=COLUMNS, env_id=env))
        check_rows(dtype, batch)
        followed = pa.concat_tables([c.rows for c in client.follow(COLUMNS, env_id=env, since=-1, timeout=1)])
        check_rows(dtype, {c: to_numpy(followed[c]) for c in COLUMNS})  # next_obs and stacks decoded, exact
        got = client.sql("SELECT t, env_index, obs.img AS img FROM steps ORDER BY t, env_index", env_id=env)
        want = expected(dtype, {"t": got["t"].to_numpy(), "env_index": got["env_index"].to_numpy()})
        cast = np.float32 if dtype == "float16" else dtype
        np.testing.assert_array_equal(np.array(got["img"].to_pylist(), cast), want["img"].astype(cast))


@pytest.mark.parametrize("dtype", ["uint8", "float64", "int16"])
def test_a_remote_writer_stores_the_dtype_encoded(live: Live, store: trajstore.Store, dtype: str) -> None:
    env = f"Remote-{dtype}"
    with trajstore.RemoteWriter(live.url, api_key=API_KEY, run_id="remote", env_id=env,
                                frame_stack={"obs.img": 2}) as w:
        w.add_batch(batch_of(dtype, DTYPES.index(dtype)))
    table = store.scan(COLUMNS, env_id=env).read_all()
    check_rows(dtype, {c: to_numpy(table[c]) for c in COLUMNS})
    (f,) = [f for f in store.files() if f.env_id == env]
    layout = store.table.schemas([f])[0]
    assert layout.format.encoded and layout.format.stacks == {"obs.img": 2}  # stored as sent: encoded
    assert layout.format.images == {"obs.img": (dtype, (4, 5))}


def test_a_remote_writer_sends_whole_rows_where_the_service_takes_no_encoding_2(live: Live,
                                                                                store: trajstore.Store) -> None:
    """A service older than encoding 2 says so in GET /ingest (no "encodings", or [1]); the writer then decodes
    its rows before sending them (here the switch the writer sets from that answer, on a current service)."""
    with trajstore.Client(live.url, api_key=API_KEY) as client:
        assert client.check_ingest()["encodings"] == [1, 2]
    with trajstore.RemoteWriter(live.url, api_key=API_KEY, run_id="remote", env_id="Remote-old",
                                frame_stack={"obs.img": 2}) as w:
        w.sink.encoded = False  # type: ignore[attr-defined]
        w.add_batch(batch_of("uint8", DTYPES.index("uint8")))
    (f,) = [f for f in store.files() if f.env_id == "Remote-old"]
    stored = store.table.schemas([f])[0].format  # stored as sent: every row whole, nothing left sparse
    assert pq.read_table(f.path, columns=[stored.physical("next_obs")]).column(0).null_count == 0
    table = store.scan(COLUMNS, env_id="Remote-old").read_all()
    check_rows("uint8", {c: to_numpy(table[c]) for c in COLUMNS})
