"""Dtypes kept: every integer, float and bool dtype is stored as written and comes back as written from every
reader (scan, SQL, iter_batches, sequences, transitions, follow, export's episodes, the REST routes and the
Client), for a vector observation and for image frame stacks (stored as bytes), written locally and through a
RemoteWriter."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trajstore
from tests.api.helpers import API_KEY, Live, serve, settings_for
from tests.helpers import make_batch, steps_table
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


@pytest.fixture
def own(store: trajstore.Store, tmp_path: Path) -> Iterator[tuple[trajstore.Store, Live]]:
    """A copy of ``store`` and the service over it, for a test that writes through the service (the module's
    store stays as made)."""
    from trajstore.api.app import create_app

    copy = trajstore.open(shutil.copytree(store.root, tmp_path / "store"))
    for live in serve(create_app(settings_for(Path(str(copy.root))))):
        yield copy, live


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


@pytest.mark.server
@pytest.mark.parametrize("dtype", ["uint8", "float16", "int64", "bool"])
def test_the_rest_routes_and_the_client_return_the_dtype(store: trajstore.Store, live: Live, dtype: str) -> None:
    env = f"E-{dtype}"
    with trajstore.Client(live.url) as client:
        (batch,) = list(client.iter_batches(batch_size=T * B, columns=COLUMNS, env_id=env))
        check_rows(dtype, batch)
        chunks = []
        for commit in client.follow(COLUMNS, env_id=env, since=-1, timeout=60):  # ends on the rows, not an idle wait
            chunks.append(commit.rows)
            if sum(c.num_rows for c in chunks) >= T * B:
                break
        followed = pa.concat_tables(chunks)
        check_rows(dtype, {c: to_numpy(followed[c]) for c in COLUMNS})  # next_obs and stacks decoded, exact
        got = client.sql("SELECT t, env_index, obs.img AS img FROM steps ORDER BY t, env_index", env_id=env)
        want = expected(dtype, {"t": got["t"].to_numpy(), "env_index": got["env_index"].to_numpy()})
        cast = np.float32 if dtype == "float16" else dtype
        np.testing.assert_array_equal(np.array(got["img"].to_pylist(), cast), want["img"].astype(cast))


@pytest.mark.server
@pytest.mark.parametrize("dtype", ["uint8", "float64", "int16"])
def test_a_remote_writer_stores_the_dtype_encoded(own: tuple[trajstore.Store, Live], dtype: str) -> None:
    store, live = own
    env = f"Remote-{dtype}"
    with trajstore.RemoteWriter(live.url, api_key=API_KEY, run_id="remote", env_id=env,
                                frame_stack={"obs.img": 2}) as w:
        w.add_batch(batch_of(dtype, DTYPES.index(dtype)))
    table = store.scan(COLUMNS, env_id=env).read_all()
    check_rows(dtype, {c: to_numpy(table[c]) for c in COLUMNS})
    (f,) = [f for f in store.maintain.files() if f.env_id == env]
    layout = steps_table(store).schemas([f])[0]
    assert layout.format.encoded and layout.format.stacks == {"obs.img": 2}  # stored as sent: encoded
    assert layout.format.images == {"obs.img": (dtype, (4, 5))}


@pytest.mark.server
def test_a_remote_writer_sends_whole_rows_where_the_service_takes_no_encoding_2(
        own: tuple[trajstore.Store, Live]) -> None:
    """A service older than encoding 2 says so in GET /ingest (no "encodings", or [1]); the writer then decodes
    its rows before sending them (here the switch the writer sets from that answer, on a current service)."""
    store, live = own
    with trajstore.Client(live.url, api_key=API_KEY) as client:
        assert client.check_ingest()["encodings"] == [1, 2]
    with trajstore.RemoteWriter(live.url, api_key=API_KEY, run_id="remote", env_id="Remote-old",
                                frame_stack={"obs.img": 2}) as w:
        w.sink.encoded = False  # type: ignore[attr-defined]
        w.add_batch(batch_of("uint8", DTYPES.index("uint8")))
    (f,) = [f for f in store.maintain.files() if f.env_id == "Remote-old"]
    stored = steps_table(store).schemas([f])[0].format  # stored as sent: every row whole, nothing left sparse
    assert pq.read_table(f.path, columns=[stored.physical("next_obs")]).column(0).null_count == 0
    table = store.scan(COLUMNS, env_id="Remote-old").read_all()
    check_rows("uint8", {c: to_numpy(table[c]) for c in COLUMNS})


# --- rewards: float32, or float64 kept as written ------------------------------------------------------------

def reward_batch(dtype: str, seed: int) -> dict[str, Any]:
    """A (T, B) batch whose rewards are of ``dtype``, each one a value float32 cannot hold (float64's last bits);
    ``t`` says each step's time index and ``k`` the batch's ``seed``."""
    rng = np.random.default_rng(seed)
    batch = make_batch(rng, T, B, p_terminated=0.2, extras={"t": np.repeat(np.arange(T)[:, None], B, axis=1),
                                                            "k": np.full((T, B), seed)})
    batch["reward"] = (rng.normal(size=(T, B)) + 1e-9).astype(dtype)
    return batch


def written_rewards(dtype: str, rows: pa.Table) -> np.ndarray:
    """The rewards written at each row's batch ``k``, time ``t`` and ``env_index``, as ``dtype``."""
    k, t, env = (rows[c].to_numpy() for c in ("k", "t", "env_index"))
    out = np.empty(rows.num_rows, dtype)
    for seed in np.unique(k):
        at = k == seed
        out[at] = reward_batch(dtype, int(seed))["reward"][t[at], env[at]]
    return out


WHERE = ["k", "t", "env_index", "reward"]


@pytest.fixture(scope="module")
def rewards(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    """Run ``r32`` writes float32 rewards in R32; ``r64`` float64 ones in R64 (two files, one partition); ``late``
    float64 ones in R32, which holds float32 rewards already."""
    store = trajstore.open(tmp_path_factory.mktemp("rewards") / "store", create=True)
    with store.writer(run_id="r32", env_id="R32") as w:
        w.add_batch(reward_batch("float32", 0))
    with store.writer(run_id="r64", env_id="R64") as w:
        w.add_batch(reward_batch("float64", 1))
        w.flush()
        w.add_batch(reward_batch("float64", 2))
    with store.writer(run_id="late", env_id="R32") as w:
        w.add_batch(reward_batch("float64", 3))
    return store


def test_float64_rewards_are_kept_as_written(rewards: trajstore.Store) -> None:
    rows = rewards.scan(WHERE, run_id="r64").read_all()
    assert to_numpy(rows["reward"]).dtype == np.float64 and rows.num_rows == 2 * T * B
    same(to_numpy(rows["reward"]), written_rewards("float64", rows))  # bit for bit: not narrowed
    r32 = rewards.scan(WHERE, run_id="r32").read_all()
    same(to_numpy(r32["reward"]), written_rewards("float32", r32))  # float32 stays float32
    late = rewards.scan(WHERE, run_id="late").read_all()  # an environment keeps the reward type it has
    same(to_numpy(late["reward"]), written_rewards("float64", late).astype(np.float32))


def rewards_by_step(table: Any) -> dict[tuple[int, int], float]:
    columns = table if isinstance(table, dict) else table.to_pydict()
    return dict(zip(zip(np.asarray(columns["episode_id"]).tolist(), np.asarray(columns["step"]).tolist()),
                    np.asarray(columns["reward"]).tolist()))


def test_every_reader_gives_float64_rewards_exactly(rewards: trajstore.Store) -> None:
    want = rewards_by_step(rewards.scan(["episode_id", "step", "reward"], run_id="r64").read_all())
    assert len(want) == 2 * T * B
    assert rewards_by_step(rewards.sql("SELECT episode_id, step, reward FROM steps", run_id="r64")) == want
    assert rewards.sql("SELECT DISTINCT typeof(reward) AS t FROM steps", env_id="R64")["t"].to_pylist() == ["DOUBLE"]
    assert rewards.sql("SELECT DISTINCT typeof(reward) AS t FROM steps", env_id="R32")["t"].to_pylist() == ["FLOAT"]
    (batch,) = list(rewards.iter_batches(batch_size=2 * T * B, columns=["episode_id", "step", "reward"],
                                         run_id="r64"))
    assert batch["reward"].dtype == np.float64 and rewards_by_step(batch) == want
    where = "run_id = 'r64'"
    windows = next(rewards.sequences(1, columns=["reward"], where=where, batch_size=4096))
    assert windows["reward"].dtype == np.float64
    assert rewards_by_step({"episode_id": windows["episode_id"], "step": windows["start"],
                            "reward": windows["reward"][:, 0]}) == want
    one_step = next(rewards.transitions(1, gamma=0.9, where=where, batch_size=4096))
    assert one_step["reward"].dtype == np.float64 and rewards_by_step(one_step) == want


@pytest.mark.server
def test_the_service_and_a_remote_writer_keep_float64_rewards(rewards: trajstore.Store, tmp_path: Path) -> None:
    from trajstore.api.app import create_app

    rewards = trajstore.open(shutil.copytree(rewards.root, tmp_path / "store"))  # it writes: a copy of its own
    want = rewards_by_step(rewards.scan(["episode_id", "step", "reward"], run_id="r64").read_all())
    for live in serve(create_app(settings_for(Path(str(rewards.root))))):
        with trajstore.Client(live.url) as client:
            (batch,) = list(client.iter_batches(batch_size=2 * T * B, columns=["episode_id", "step", "reward"],
                                                run_id="r64"))
            assert batch["reward"].dtype == np.float64 and rewards_by_step(batch) == want
            assert rewards_by_step(client.sql("SELECT episode_id, step, reward FROM steps", run_id="r64")) == want
        with trajstore.RemoteWriter(live.url, api_key=API_KEY, run_id="remote", env_id="Remote-R64") as w:
            w.add_batch(reward_batch("float64", 1))
        sent = rewards.scan(WHERE, run_id="remote").read_all()
        same(to_numpy(sent["reward"]), written_rewards("float64", sent))


def test_float64_rewards_under_other_engines_and_their_compaction(tmp_path: Path) -> None:
    """The open table: float64 rewards beside float32 ones are under the typed name ``reward__float64`` (the log
    has one type per name), every row's reward in exactly one of the two; deltalake's compaction rewrites the
    files (adding the other name, null) and ``reward`` still means each row's reward to every trajstore reader."""
    import deltalake
    import polars as pl

    store = trajstore.open(tmp_path / "store", create=True)
    for run, dtype, seeds in (("r32", "float32", (0, 4)), ("r64", "float64", (1, 2))):
        with store.writer(run_id=run, env_id=run.upper()) as w:
            for seed in seeds:  # two files per partition: something to compact
                w.add_batch(reward_batch(dtype, seed))
                w.flush()
    query = "SELECT run_id, episode_id, step, reward FROM steps ORDER BY episode_id, step"
    before = store.sql(query)
    folder = str(tmp_path / "store" / "steps")
    for read in (deltalake.DeltaTable(folder).to_pyarrow_table(), pl.read_delta(folder, use_pyarrow=True).to_arrow()):
        assert read.schema.field("reward").type == pa.float32()
        assert read.schema.field("reward__float64").type == pa.float64()
        for run, name, other in (("r32", "reward", "reward__float64"), ("r64", "reward__float64", "reward")):
            mine = read.filter(pa.compute.equal(read["run_id"], run))
            assert mine[other].null_count == mine.num_rows == 2 * T * B
            ours = before.filter(pa.compute.equal(before["run_id"], run))
            assert sorted(mine[name].to_pylist()) == sorted(ours["reward"].to_pylist())
    metrics = deltalake.DeltaTable(folder).optimize.compact()
    assert metrics["numFilesRemoved"] == 4 and metrics["numFilesAdded"] == 2
    again = trajstore.open(tmp_path / "store")
    after = again.sql(query)
    assert after.equals(before) and after.schema.field("reward").type == pa.float64()
    for run, dtype in (("r32", "float32"), ("r64", "float64")):
        rows = again.scan(WHERE, run_id=run).read_all()
        same(to_numpy(rows["reward"]), written_rewards(dtype, rows))
    assert trajstore.check(again).ok


def test_rewards_gymnasium_and_pettingzoo_hand_over_are_stored_as_float32(tmp_path: Path) -> None:
    """gymnasium gives every reward as a Python float or in a float64 array, whatever precision the env computed
    it in, and PettingZoo as Python floats: rollouts and recorders store them as the schema's float32, as before."""
    import gymnasium as gym

    from trajstore.integrations import RecordToStore
    from trajstore.rollout import gym_rollout
    from trajstore.write.agents import AgentWriter

    store = trajstore.open(tmp_path / "store", create=True)
    gym_rollout(store, "CartPole-v1", run_id="rollout", num_envs=2, episodes=2, progress=False)
    env = RecordToStore(gym.make("Pendulum-v1"), store, run_id="recorded")
    env.reset(seed=0)
    for _ in range(5):
        env.step(env.action_space.sample())
    env.close()
    with AgentWriter(store, run_id="agents", env_id="Pair-v0", agents=["a", "b"]) as w:
        w.add(0, {a: (np.zeros(2, np.float32), 0, 0.1, np.zeros(2, np.float32), True, False) for a in "ab"})
        w.end_episode()
    for run in ("rollout", "recorded", "agents"):
        assert to_numpy(store.scan(["reward"], run_id=run).read_all()["reward"]).dtype == np.float32, run
