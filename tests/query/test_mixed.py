"""Every environment in one store: CartPole (Discrete int64 action, float32[4] obs), Pendulum (float32[1] action),
an Atari-like image env (uint8 (4, 84, 84) frame stacks) and a Dict-observation env. Statistics, episodes and SQL
work across all of them; readers that return arrays work per environment and name the env ids when asked to mix
what cannot be one column; external Delta readers see honest, typed columns."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.helpers import make_batch, stacked_stream, steps_table
from trajstore.errors import InputError
from trajstore.rollout import gym_rollout
from trajstore.schema import to_numpy
from trajstore.store import plumbing

IMAGE = "Breakout-like-v0"


@pytest.fixture(scope="module")
def mixed(tmp_path_factory: pytest.TempPathFactory) -> tuple[trajstore.Store, dict[str, Any]]:
    store = trajstore.open(tmp_path_factory.mktemp("mixed") / "store", create=True)
    gym_rollout(store, "CartPole-v1", run_id="gym", num_envs=2, steps=300, seed=0, progress=False)
    gym_rollout(store, "Pendulum-v1", run_id="gym", num_envs=2, steps=300, seed=0, progress=False, append=True)
    frames = stacked_stream(np.random.default_rng(1), 30, 2, shape=(84, 84), p_end=0.1)
    with store.writer(run_id="pixels", env_id=IMAGE, frame_stack={"obs": 4}) as w:
        w.add_batch(frames)
    rng = np.random.default_rng(2)
    batch = make_batch(rng, 25, 2, extras={"t": np.repeat(np.arange(25)[:, None], 2, axis=1)})
    pos = rng.normal(size=(26, 2, 2)).astype(np.float64)
    batch["obs"] = {"pos": pos[:-1], "mode": np.zeros((25, 2), np.int8)}
    batch["next_obs"] = {"pos": pos[1:], "mode": np.zeros((25, 2), np.int8)}
    with store.writer(run_id="dict", env_id="Dict-v0") as w:
        w.add_batch(batch)
    return store, {"frames": frames, "dict": batch}


def test_statistics_episodes_and_sql_work_across_every_environment(mixed: tuple[trajstore.Store, Any]) -> None:
    store, _ = mixed
    envs = [IMAGE, "CartPole-v1", "Dict-v0", "Pendulum-v1"]
    assert store.stats(by="env_id", include_incomplete=True)["env_id"].to_pylist() == envs
    assert sorted(set(store.episodes(limit=None)["env_id"].to_pylist())) == envs
    counts = store.sql("SELECT env_id, count(*) AS n, sum(reward) AS r FROM steps GROUP BY env_id ORDER BY env_id")
    per_env = {env: sum(f.rows for f in store.maintain.files() if f.env_id == env) for env in envs}
    assert counts["env_id"].to_pylist() == envs and counts["n"].to_pylist() == list(per_env.values())
    assert per_env[IMAGE] == 60 and per_env["Dict-v0"] == 50
    assert store.sql("SELECT DISTINCT typeof(action) AS t FROM steps")["t"].to_pylist() == ["VARIANT"]
    query = "SELECT typeof(action) AS a, typeof(obs) AS o FROM steps LIMIT 1"
    types = {env: store.sql(query, env_id=env).to_pylist()[0] for env in envs}
    assert types == {"CartPole-v1": {"a": "BIGINT", "o": "FLOAT[]"}, "Pendulum-v1": {"a": "FLOAT[]", "o": "FLOAT[]"},
                     IMAGE: {"a": "BIGINT", "o": "UTINYINT[][][]"},
                     "Dict-v0": {"a": "BIGINT", "o": 'STRUCT(pos DOUBLE[], "mode" TINYINT)'}}
    both = store.sql("SELECT avg(action) AS a FROM steps", env_id=["CartPole-v1", IMAGE])  # one type: no VARIANT
    assert 0 <= both["a"][0].as_py() <= 3
    assert store.sql("SELECT count(*) AS n FROM steps", run_id="pixels")["n"][0].as_py() == 60


def test_arrays_come_per_environment_in_their_own_types(mixed: tuple[trajstore.Store, Any]) -> None:
    store, written = mixed
    got = store.scan(["env_index", "step", "episode_id", "obs", "next_obs", "action"], env_id=IMAGE).read_all()
    obs = to_numpy(got["obs"])
    assert obs.dtype == np.uint8 and obs.shape[1:] == (4, 84, 84)
    pendulum = next(store.iter_batches(batch_size=64, columns=["obs", "action"], env_id="Pendulum-v1"))
    assert pendulum["action"].dtype == np.float32 and pendulum["action"].shape == (64, 1)
    cartpole = next(store.iter_batches(batch_size=64, columns=["obs", "action"], env_id="CartPole-v1"))
    assert cartpole["action"].dtype == np.int64 and cartpole["obs"].shape == (64, 4)
    both = next(store.iter_batches(batch_size=600, columns=["obs"], env_id=["CartPole-v1", "Pendulum-v1"]))
    assert both["obs"].dtype == object  # one float32 array per row: shapes (4,) and (3,)
    d = store.scan(["t", "env_index", "obs"], env_id="Dict-v0").read_all()
    values = to_numpy(d["obs"])
    assert values["pos"].dtype == np.float64 and values["mode"].dtype == np.int8
    at = (d["t"].to_numpy(), d["env_index"].to_numpy())
    np.testing.assert_array_equal(values["pos"], written["dict"]["obs"]["pos"][at])
    window = next(store.sequences(4, columns=["obs", "action"], where=f"env_id = '{IMAGE}'", batch_size=8))
    assert window["obs"].dtype == np.uint8 and window["obs"].shape == (8, 4, 4, 84, 84)
    n_step = next(store.transitions(2, gamma=0.9, columns=["obs"], where="env_id = 'Pendulum-v1'", batch_size=8))
    assert n_step["next_obs"].dtype == np.float32 and n_step["next_obs"].shape == (8, 3)


def test_mixing_what_cannot_be_one_column_names_the_environments(mixed: tuple[trajstore.Store, Any]) -> None:
    store, _ = mixed
    with pytest.raises(InputError, match=r"columns: 'action' is stored in types that cannot be one column by the "
                                         r"selected environments \(.*CartPole-v1.*: int64; .*Pendulum-v1: "
                                         r"float32\[1\]\); select one with env_id="):
        store.scan(["action"])
    with pytest.raises(InputError, match=r"'obs' .*Breakout-like-v0: uint8\[4,84,84\]"):
        list(store.iter_batches(columns=["obs"]))
    with pytest.raises(InputError, match=r"columns: 'obs' is stored in types that cannot be one array"):
        store.sequences(4, columns=["obs"], where="env_id IN ('CartPole-v1', 'Pendulum-v1')")
    total = sum(f.rows for f in store.maintain.files())
    assert store.scan(["reward", "episode_id"]).read_all().num_rows == total  # columns every env stores alike


def test_the_log_holds_typed_columns_that_external_delta_readers_read(mixed: tuple[trajstore.Store, Any]) -> None:
    import deltalake
    import polars as pl

    store, _ = mixed
    log = {f.name: f.type for f in steps_table(store).log.read().schema}
    assert log["action"] == pa.int64() and log["action__float32_1d"] == pa.list_(pa.float32())
    assert log["obs"] == pa.list_(pa.float32()) and log["obs_new_frames"] == pa.list_(pa.binary())  # named so
    assert [n for n in log if n.startswith("obs__struct_")]  # the Dict observation's struct
    path = Path(str(store.root)) / "steps"
    dataset = deltalake.DeltaTable(str(path)).to_pyarrow_dataset()
    total = sum(f.rows for f in store.maintain.files())
    assert dataset.count_rows() == total
    table = dataset.to_table(columns=["env_id", "action", "action__float32_1d", "obs_new_frames"])
    per_env = {env: table.filter(pa.compute.equal(table["env_id"], env)) for env in ("CartPole-v1", "Pendulum-v1")}
    pendulum = per_env["Pendulum-v1"].num_rows
    assert per_env["CartPole-v1"]["action"].null_count == 0 and per_env["Pendulum-v1"]["action"].null_count == pendulum
    assert per_env["Pendulum-v1"]["action__float32_1d"].null_count == 0
    images = table.filter(pa.compute.equal(table["env_id"], IMAGE))["obs_new_frames"]
    assert images.null_count == 0 and {len(b) for f in images.to_pylist() for b in f} == {84 * 84}
    frame = pl.scan_delta(str(path), use_pyarrow=True).select(pl.col("reward").count().alias("n"),
                                                              pl.col("reward").sum().alias("r"))
    n, r = frame.collect().row(0)
    assert n == total and r == pytest.approx(store.sql("SELECT sum(reward) AS r FROM steps")["r"][0].as_py(), rel=1e-5)


def test_sandboxed_sql_takes_the_same_selection(mixed: tuple[trajstore.Store, Any]) -> None:
    store, written = mixed
    result = plumbing(store).sandboxed_sql("SELECT t, env_index, obs FROM steps ORDER BY t, env_index",
                                           env_id="Dict-v0")
    pos = np.array([r["pos"] for r in result.table["obs"].to_pylist()])
    t, b = result.table["t"].to_numpy(), result.table["env_index"].to_numpy()
    np.testing.assert_array_equal(pos, written["dict"]["obs"]["pos"][t, b])
    images = plumbing(store).sandboxed_sql("SELECT obs FROM steps LIMIT 3", run_id="pixels").table
    assert np.array(images["obs"].to_pylist(), np.uint8).shape == (3, 4, 84, 84)
    for query in (store.sql, plumbing(store).sandboxed_sql):  # an unknown run is named, as by every reader
        with pytest.raises(trajstore.RunNotFoundError, match="pixel"):
            query("SELECT count(*) FROM steps", run_id="pixel")


def test_image_functions_outlive_the_cursors_that_registered_them(mixed: tuple[trajstore.Store, Any]) -> None:
    """The store's own queries run on cursors of one DuckDB database, closed after each query: the function that
    makes image bytes values again must stay callable for the next cursor (it once pointed at a freed object)."""
    import gc

    store, written = mixed
    episode = store.episodes(env_id=IMAGE, limit=1)["episode_id"][0].as_py()
    first = None
    for _ in range(4):
        rows = store.episode_steps(episode, ["obs", "next_obs"])  # a cursor of the store's database each time
        gc.collect()
        values = np.array(rows["obs"].to_pylist(), np.uint8)
        assert values.shape[1:] == (4, 84, 84)
        first = values if first is None else first
        np.testing.assert_array_equal(values, first)


def test_exports_take_one_environment_and_name_those_that_cannot_be_mixed(mixed: tuple[trajstore.Store, Any]) -> None:
    from trajstore.export.episodes import select

    store, _ = mixed
    with pytest.raises(InputError, match=r"columns: '(obs|action)' is stored in types that cannot be one .*"
                                         r"CartPole-v1.*; export one environment at a time"):
        select(store, run_id="gym", include_unfinished=True)  # Pendulum's 150 steps per env end no episode
    with pytest.raises(InputError, match="nothing to export"):  # an export holds complete episodes unless asked
        select(store, where="env_id = 'Pendulum-v1'")
    with select(store, where="env_id = 'Pendulum-v1'", include_unfinished=True) as selection:
        assert selection.env_ids == ["Pendulum-v1"] and selection.kinds["action"] == (np.dtype(np.float32), (1,))
        episodes = list(selection)
    stored = store.scan(["episode_id", "step", "action", "next_obs"], env_id="Pendulum-v1").read_all()
    for episode in episodes[:5]:
        rows = stored.filter(pa.compute.equal(stored["episode_id"], episode.episode_id)).sort_by("step")
        np.testing.assert_array_equal(episode.action, to_numpy(rows["action"]))
        np.testing.assert_array_equal(episode.next_obs, to_numpy(rows["next_obs"]))


@pytest.mark.server
def test_the_service_and_the_client_work_per_environment(mixed: tuple[trajstore.Store, Any]) -> None:
    """Over REST as in the library: statistics across everything, arrays per environment in their own types, and
    a mix that cannot be one array refused with a problem naming the column and the env ids."""
    import httpx

    from tests.api.helpers import serve, settings_for
    from trajstore.api.app import create_app
    from trajstore.errors import RemoteError

    store, written = mixed
    for live in serve(create_app(settings_for(Path(str(store.root))))):
        with trajstore.Client(live.url) as client:
            assert len(client.stats(by="env_id", include_incomplete=True)) == 4
            pendulum = next(client.iter_batches(batch_size=16, columns=["obs", "action"], env_id="Pendulum-v1"))
            assert pendulum["action"].dtype == np.float32 and pendulum["action"].shape == (16, 1)
            frames = next(client.iter_batches(batch_size=8, columns=["obs", "next_obs"], env_id=IMAGE))
            assert frames["obs"].dtype == np.uint8 and frames["next_obs"].shape == (8, 4, 84, 84)
            with pytest.raises(RemoteError, match=r"422.*'action' .*(Pendulum-v1: float32\[1\]; CartPole-v1: int64|"
                                                    r"CartPole-v1: int64; Pendulum-v1: float32\[1\])"):
                next(client.iter_batches(batch_size=16, columns=["action"], run_id="gym"))
        answer = httpx.get(f"{live.url}/steps", params={"columns": "action"})
        assert answer.status_code == 422 and "CartPole-v1" in answer.json()["detail"], answer.text


def test_a_column_typed_differently_reads_in_each_env_s_own_type(mixed: tuple[trajstore.Store, Any]) -> None:
    """``action`` is CartPole's int64 and Pendulum's float32[1]: a query that selects one environment's rows gets its
    own values in its own type (as with ``env_id=``), never VARIANT structs; one that mixes them gets each value's
    JSON text."""
    store, _ = mixed
    order = "ORDER BY env_id, episode_id, step, env_index"
    for env, arrow_type in (("CartPole-v1", pa.int64()), ("Pendulum-v1", pa.list_(pa.float32()))):
        got = store.sql(f"SELECT action FROM steps WHERE env_id = '{env}' {order}")
        own = store.sql(f"SELECT action FROM steps {order}", env_id=env)
        assert got.schema.field("action").type == own.schema.field("action").type == arrow_type
        assert got.equals(own) and got.num_rows > 0
    both = store.sql(f"SELECT env_id, action FROM steps WHERE run_id = 'gym' {order}")
    assert both.schema.field("action").type == pa.string()
    own = store.sql(f"SELECT env_id, action FROM steps {order}", env_id=["CartPole-v1"]).to_pylist() + \
        store.sql(f"SELECT env_id, action FROM steps {order}", env_id=["Pendulum-v1"]).to_pylist()
    decoded = [json.loads(a) for a in both["action"].to_pylist()]
    assert decoded[:3] == [r["action"] for r in own[:3]] and all(isinstance(a, int) for a in decoded[:3])
    assert decoded[-1] == pytest.approx(own[-1]["action"]) and isinstance(decoded[-1], list)
    assert len(decoded) == len(own)


def test_the_sandbox_gives_a_mixed_column_as_json_text(mixed: tuple[trajstore.Store, Any]) -> None:
    store, _ = mixed
    query = "SELECT env_id, action FROM steps WHERE run_id = 'gym' ORDER BY env_id, episode_id, step, env_index"
    sandboxed = plumbing(store).sandboxed_sql(query).table
    assert sandboxed.schema.field("action").type == pa.string()
    assert sandboxed.equals(store.sql(query))
