"""The store is an open Delta table (issue 29): every column means what its name says to every engine, the meaning
of each stored column is declared in the Delta schema, and what other tools do to the table (deltalake's OPTIMIZE,
Z-ORDER, DELETE, UPDATE, a polars append) is either read back exactly or refused naming the episode and the version.

Each kind of store: float observations (next_obs stored only where it is not the next step's obs), uint8 frame
stacks (each frame once, episode starts and rows where stacking breaks), a Dict observation with a stacked leaf,
two environment kinds in one store (a typed action column)."""

from __future__ import annotations

import json
import shutil
from pathlib import Path
from typing import Any, Callable

import duckdb
import numpy as np
import polars as pl
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import API_KEY, settings_for
from tests.helpers import steps_table
from trajstore.api.app import create_app
from trajstore.export.lerobot import export_lerobot
from trajstore.query.foreign import ForeignChangeError
from trajstore.schema import to_numpy
from trajstore.store import check

K = 4
KEYS = [("episode_id", "ascending"), ("step", "ascending")]
DATA = Path(__file__).resolve().parents[1] / "data"


def flags(rng: np.random.Generator, T: int, B: int, p: float) -> np.ndarray:
    return rng.random((T, B)) < p


def stacks(rng: np.random.Generator, T: int, B: int, shape: tuple[int, ...]) -> tuple[np.ndarray, np.ndarray]:
    """FrameStackObservation-like stacks of random frames, with a few stacks that do not shift (a reset)."""
    frames = rng.integers(0, 256, (T + K, B, *shape), dtype=np.uint8)
    obs = np.stack([frames[i:i + T] for i in range(K)], axis=2)
    nxt = np.stack([frames[i + 1:i + 1 + T] for i in range(K)], axis=2)
    obs[T // 2, 0, 0] = 0  # stacking breaks here: its oldest frame is not the step before's second
    return obs, nxt


def batch(rng: np.random.Generator, obs: Any, nxt: Any, T: int, B: int, action: Any = None) -> dict[str, Any]:
    return {"obs": obs, "next_obs": nxt, "reward": rng.normal(size=(T, B)).astype(np.float32),
            "action": rng.integers(0, 3, (T, B)) if action is None else action,
            "terminated": flags(rng, T, B, 0.08), "truncated": flags(rng, T, B, 0.03)}


def write_kind(store: trajstore.Store, kind: str, rng: np.random.Generator, calls: int = 3) -> None:
    T, B = 16, 2
    for _ in range(calls):  # episodes cross calls: each call one file (upkeep off)
        if kind == "float":
            v = rng.normal(size=(T + 1, B, 3)).astype(np.float32)
            options: dict[str, Any] = {}
            data = batch(rng, v[:-1], v[1:], T, B)
        elif kind == "stack":
            options = {"frame_stack": {"obs": K}}
            data = batch(rng, *stacks(rng, T, B, (6, 5)), T, B)
        elif kind == "dict":
            options = {"frame_stack": {"obs.pixels": K}}
            pix, nxt_pix = stacks(rng, T, B, (3, 2))
            pos = rng.uniform(-1, 1, (T + 1, B, 2))
            data = batch(rng, {"pixels": pix, "pos": pos[:-1]}, {"pixels": nxt_pix, "pos": pos[1:]}, T, B)
        else:  # motor: a float action, stored under a typed name beside the int one
            m = rng.normal(size=(T + 1, B, 2)).astype(np.float32)
            options = {}
            data = batch(rng, m[:-1], m[1:], T, B, action=rng.normal(size=(T, B, 1)).astype(np.float32))
        with store.writer(run_id="r", env_id=kind, upkeep=None, **options) as w:
            w.add_batch(data)


KINDS = {"float": ["float"], "stack": ["stack"], "dict": ["dict"], "two kinds": ["float", "motor"]}


@pytest.fixture(params=list(KINDS))
def written(request: pytest.FixtureRequest, tmp_path: Path) -> tuple[trajstore.Store, list[str]]:
    store = trajstore.open(tmp_path / "store", create=True)
    rng = np.random.default_rng(len(request.param))
    for kind in KINDS[request.param]:
        write_kind(store, kind, rng)
    return store, KINDS[request.param]


def ours(store: trajstore.Store, env_id: str) -> pa.Table:
    return store.scan(env_id=env_id).read_all().sort_by(KEYS)


def values(column: pa.ChunkedArray | pa.Array | list[Any]) -> list[Any]:
    """Values to compare across engines: lists whatever their fixed sizes, tuples or lists."""
    def plain(v: Any) -> Any:
        if isinstance(v, dict):
            return {k: plain(x) for k, x in v.items()}
        if isinstance(v, (list, tuple)):
            return [plain(x) for x in v]
        return v
    return [plain(v) for v in (column if isinstance(column, list) else column.to_pylist())]


def same_as_ours(theirs: pa.Table, store: trajstore.Store, envs: list[str], engine: str) -> None:
    """Every column an external reader shares with ``scan`` holds, for each environment, either nothing (a column
    of another kind's rows) or exactly trajstore's values; and ``next_obs`` is never a shared name with nulls."""
    for env in envs:
        mine = ours(store, env)
        rows = theirs.filter(pa.compute.equal(theirs["env_id"], env)).sort_by(KEYS)
        assert rows.num_rows == mine.num_rows, (engine, env)
        shared = [c for c in mine.column_names if c in rows.column_names and c not in ("run_id", "env_id")]
        assert {"episode_id", "step", "reward", "action"} <= set(shared)
        for name in shared:
            column = rows[name]
            if column.null_count == rows.num_rows and mine[name].null_count < mine.num_rows:
                continue  # another kind's column: this environment stores the field under a name of its own
            assert column.null_count == mine[name].null_count, (engine, env, name)
            assert values(column) == values(mine[name]), (engine, env, name)


def test_external_readers_see_honest_columns(written: tuple[trajstore.Store, list[str]]) -> None:
    store, envs = written
    table_uri = str(store.root / "steps")
    same_as_ours(DeltaTable(table_uri).to_pyarrow_table(), store, envs, "deltalake")
    same_as_ours(pl.read_delta(table_uri, use_pyarrow=True).to_arrow(), store, envs, "polars")
    paths = ", ".join(f"'{f.path}'" for f in store.maintain.files())
    con = duckdb.connect()
    duck = con.sql(f"SELECT * FROM read_parquet([{paths}], hive_partitioning = true, union_by_name = true)")
    same_as_ours(duck.to_arrow_table(), store, envs, "duckdb")
    # what is stored sparsely or partly has a name that says so, and its meaning is declared in the Delta schema
    fields = {f.name: f.metadata for f in DeltaTable(table_uri).schema().fields}
    assert "next_obs" not in fields and any(n.startswith("next_obs_sparse") for n in fields)
    for name, metadata in fields.items():
        if name.startswith("next_obs_sparse"):
            spec = json.loads(metadata["trajstore"])
            assert spec["field"] == "next_obs" and spec["sparse"] is True
        if name.startswith("obs_new_frames"):
            spec = json.loads(metadata["trajstore"])
            assert spec["field"] == "obs" and spec["stored"] == "new_frames" and spec["frame_stack"]


def test_frame_stack_stores_keep_each_frame_once(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "store", create=True)
    write_kind(store, "stack", np.random.default_rng(3))
    table = DeltaTable(str(store.root / "steps")).to_pyarrow_table()
    assert "obs" not in table.column_names  # no column claims to be the observation
    frames = sum(len(v) for v in table["obs_new_frames"].to_pylist())
    assert frames < K * table.num_rows / 2  # one frame per step, a whole stack only where stacking breaks


def rewrite(store: trajstore.Store, how: str) -> None:
    """What another tool does to the table."""
    table = DeltaTable(str(store.root / "steps"))
    first = store.episodes(complete=True)["episode_id"][0].as_py()
    if how == "optimize":
        table.optimize.compact()
    elif how == "z_order":
        table.optimize.z_order(["step"])
    elif how == "delete_episode":
        table.delete(f"episode_id = {first}")
    elif how == "update_reward":
        table.update({"reward": "reward * 2"})
    elif how == "merge_reward":  # a MERGE that rewrites one episode's rewards
        rows = table.to_pyarrow_table(columns=["episode_id", "step", "reward"], filters=[("episode_id", "=", first)])
        rows = rows.set_column(2, "reward", pa.compute.add(rows["reward"], pa.scalar(1, pa.float32())))
        (table.merge(source=rows, predicate="t.episode_id = s.episode_id AND t.step = s.step", source_alias="s",
                     target_alias="t").when_matched_update({"reward": "s.reward"}).execute())
    elif how == "checkpoint_vacuum":  # the log's own upkeep: compaction, a checkpoint, the old files removed
        table.optimize.compact()
        table.create_checkpoint()
        table.vacuum(retention_hours=0, enforce_retention_duration=False, dry_run=False)
    elif how == "split_files":  # every row rewritten in two appends, an episode cut between them: the first
        rows = table.to_pyarrow_table().sort_by([("env_id", "descending"), *KEYS])  # holds its first two steps only
        eid = rows["episode_id"].to_numpy()            # (a file whose next_obs is null in every row)
        long = next(i for i in range(rows.num_rows - 2) if eid[i] == eid[i + 2])
        first = pa.array(np.isin(np.arange(rows.num_rows), [long, long + 1]))
        table.delete()
        for part in (rows.filter(first), rows.filter(pa.compute.invert(first))):
            pl.from_arrow(part).write_delta(str(store.root / "steps"), mode="append")
    elif how == "append_episode":  # a whole episode again under a new id, in the table's own stored schema
        rows = table.to_pyarrow_table(filters=[("episode_id", "=", first)])
        rows = rows.set_column(rows.column_names.index("episode_id"), "episode_id",
                               pa.array([first + 10**12] * rows.num_rows, pa.int64()))
        pl.from_arrow(rows).write_delta(str(store.root / "steps"), mode="append")


def expected_after(before: dict[str, pa.Table], how: str, first: int) -> dict[str, pa.Table]:
    out = {}
    for env, rows in before.items():
        if how == "delete_episode":
            rows = rows.filter(pa.compute.not_equal(rows["episode_id"], first))
        elif how == "update_reward":
            rows = rows.set_column(rows.column_names.index("reward"), "reward",
                                   pa.compute.multiply(rows["reward"], pa.scalar(2, pa.float32())))
        elif how == "merge_reward":
            mask = pa.compute.equal(rows["episode_id"], first)
            rows = rows.set_column(rows.column_names.index("reward"), "reward", pa.compute.if_else(
                mask, pa.compute.add(rows["reward"], pa.scalar(1, pa.float32())), rows["reward"]))
        elif how == "append_episode":
            again = rows.filter(pa.compute.equal(rows["episode_id"], first))
            again = again.set_column(again.column_names.index("episode_id"), "episode_id",
                                     pa.array([first + 10**12] * again.num_rows, pa.int64()))
            rows = pa.concat_tables([rows, again]).sort_by(KEYS)
        out[env] = rows
    return out


def drop_time(t: pa.Table) -> pa.Table:
    return t.drop_columns([c for c in ("wall_time",) if c in t.column_names])


@pytest.mark.parametrize("how", ["optimize", "z_order", "delete_episode", "update_reward", "merge_reward",
                                 "checkpoint_vacuum", "split_files", "append_episode"])
def test_every_reader_reads_back_what_other_tools_left(written: tuple[trajstore.Store, list[str]], how: str) -> None:
    store, envs = written
    before = {env: ours(store, env) for env in envs}
    first = store.episodes(complete=True)["episode_id"][0].as_py()
    rewrite(store, how)
    store = trajstore.open(store.root)
    want = expected_after(before, how, first)
    for env in envs:
        got = ours(store, env)
        assert got.schema == want[env].schema, (how, env)
        assert drop_time(got).equals(drop_time(want[env])), (how, env)
        sql = store.sql("SELECT obs, next_obs, reward FROM steps ORDER BY episode_id, step", env_id=env)
        assert values(sql["obs"]) == values(want[env]["obs"])
        assert values(sql["next_obs"]) == values(want[env]["next_obs"])
        stats = store.stats(env_id=env, include_incomplete=True)
        assert stats["n_traj"][0].as_py() == len(set(want[env]["episode_id"].to_pylist()))
        returns = store.returns(gamma=1.0, env_id=env)
        rewards = want[env].group_by("episode_id").aggregate([("reward", "sum")])
        expect = dict(zip(rewards["episode_id"].to_pylist(), rewards["reward_sum"].to_pylist()))
        got_returns = dict(zip(returns["episode_id"].to_pylist(), returns["episode_return"].to_pylist()))
        assert got_returns == pytest.approx(expect, rel=1e-5)
        (loaded,) = store.iter_batches(batch_size=10**6, columns=["episode_id", "step", "obs"], env_id=env)
        assert len(loaded["episode_id"]) == want[env].num_rows
    assert check(store).ok, check(store).problems
    with TestClient(create_app(settings_for(store.root))) as client:  # REST reads the same engine
        query = "SELECT obs, next_obs FROM steps ORDER BY episode_id, step"
        answer = client.post("/sql", json={"query": query, "env_id": [envs[0]]},  # sandboxed, in a worker process
                             headers={"Authorization": f"Bearer {API_KEY}"})
        assert answer.status_code == 200, answer.text
        assert [r["obs"] for r in answer.json()["rows"]] == values(want[envs[0]]["obs"])
        assert [r["next_obs"] for r in answer.json()["rows"]] == values(want[envs[0]]["next_obs"])
        for env in envs:
            got = client.get("/stats", params={"env_id": env, "include_incomplete": True}).json()
            assert got[0]["n_traj"] == len(set(want[env]["episode_id"].to_pylist())), got
            steps = client.get(f"/episodes/{want[env]['episode_id'][0].as_py()}/steps").json()
            assert len(steps["steps"]) == pa.compute.sum(pa.compute.equal(want[env]["episode_id"],
                                                                          want[env]["episode_id"][0])).as_py()
    windows = list(store.sequences(3, columns=["obs", "next_obs"], batch_size=8, env_id=envs[0]))
    assert windows
    assert list(store.transitions(2, gamma=0.9, batch_size=8, env_id=envs[0]))
    if "float" in envs:  # an export reads the rows as they now are
        out = store.root.parent / f"lerobot-{how}"
        result = export_lerobot(store, out, where="env_id = 'float'", include_unfinished=True)  # every row
        frames = pa.concat_tables([pq.read_table(f) for f in sorted(out.glob("data/chunk-*/file-*.parquet"))])
        rows = want["float"]
        assert result.steps == rows.num_rows == frames.num_rows
        assert result.episodes == len(set(rows["episode_id"].to_pylist()))
        np.testing.assert_array_equal(to_numpy(frames["observation.state"]), to_numpy(rows["obs"]))
        np.testing.assert_array_equal(frames["next.reward"].to_numpy(), rows["reward"].to_numpy())


@pytest.mark.parametrize("how", ["delete_middle_step", "append_duplicate"])
def test_changes_trajstore_cannot_read_back_are_refused_naming_the_episode_and_version(tmp_path: Path,
                                                                                       how: str) -> None:
    store = trajstore.open(tmp_path / "store", create=True)
    write_kind(store, "stack", np.random.default_rng(5))
    table = DeltaTable(str(store.root / "steps"))
    episode = store.episodes(complete=True).sort_by([("episode_length", "descending")])["episode_id"][0].as_py()
    if how == "delete_middle_step":
        table.delete(f"episode_id = {episode} AND step = 2")
        message = rf"episode {episode} .*step 2 is missing"
    else:
        rows = table.to_pyarrow_table(filters=[("episode_id", "=", episode)])
        pl.from_arrow(rows.slice(0, 2)).write_delta(str(store.root / "steps"), mode="append")
        message = rf"episode {episode} .*step 0 is stored twice"
    version = DeltaTable(str(store.root / "steps")).version()
    store = trajstore.open(store.root)
    readers: list[Callable[[], Any]] = [
        lambda: store.scan(["obs"]).read_all(), lambda: store.stats(), lambda: store.sql("SELECT count(*) FROM steps"),
        lambda: store.episodes(), lambda: list(store.iter_batches(columns=["obs"])),
        lambda: store.returns(gamma=0.9)]
    for read in readers:
        with pytest.raises(ForeignChangeError, match=message + rf".*version {version} added"):
            read()
    report = check(store)
    assert not report.ok and any(f"episode {episode}" in p for p in report.problems), report.problems
    with TestClient(create_app(settings_for(store.root))) as client:
        answer = client.get("/stats")
        assert answer.status_code >= 500 and f"episode {episode}" in answer.text, answer.text


def test_a_store_written_before_encoding_3_reads_as_it_did(tmp_path: Path) -> None:
    """``tests/data/encoding2-store`` was written by the code before this change (``make_encoding2.py``); its scan
    then is saved beside it. It reads the same; ``trajstore compact`` rewrites it under the honest names, after
    which another tool's rewrite of every file keeps it so."""
    shutil.copytree(DATA / "encoding2-store", tmp_path / "store")
    store = trajstore.open(tmp_path / "store")
    envs = ["Vec-v0", "Pix-v0", "Dict-v0", "Motor-v0"]

    def saved(env: str) -> pa.Table:
        with pa.memory_map(str(DATA / f"encoding2-scan-{env}.arrow")) as source:
            return pa.ipc.open_file(source).read_all()

    for env in envs:
        assert ours(store, env).equals(saved(env)), env
    assert check(store).ok
    trajstore.compact(store, progress=False)
    store = trajstore.open(store.root)
    assert {s.format.encoding for s in steps_table(store).schemas(store.maintain.files())} == {3}
    assert "next_obs_sparse" in steps_table(store).log.read().schema.names
    for env in envs:
        assert drop_time(ours(store, env)).equals(drop_time(saved(env))), env
    DeltaTable(str(store.root / "steps")).update({"reward": "reward * 1"})  # every file rewritten by deltalake
    store = trajstore.open(store.root)
    assert all(s.format.foreign for s in steps_table(store).schemas(store.maintain.files()))
    for env in envs:
        assert drop_time(ours(store, env)).equals(drop_time(saved(env))), env


def test_another_tools_rewrite_of_an_old_store_is_refused_not_misread(tmp_path: Path) -> None:
    """An encoding-2 file's meaning was only in its footer: after another tool rewrote it, readers refuse it."""
    shutil.copytree(DATA / "encoding2-store", tmp_path / "store")
    DeltaTable(str(tmp_path / "store" / "steps")).optimize.compact()
    store = trajstore.open(tmp_path / "store")
    with pytest.raises(trajstore.errors.StoreDamagedError, match="another tool rewrote this file"):
        store.scan(["obs", "next_obs"], env_id="Vec-v0").read_all()
    assert not check(store).ok


def test_the_decoding_sql_gives_trajstore_s_steps_in_another_duckdb(written: tuple[trajstore.Store, list[str]],
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    """``trajstore schema --sql`` run unchanged by a DuckDB of the user's own over the committed files: the same
    steps as ``scan`` (float vectors, frame stacks with their starts and breaks, Dict observations, episode ends)."""
    from trajstore.cli.main import main

    store, envs = written
    assert main(["schema", "--store", str(store.root), "--sql"]) == 0
    text = capsys.readouterr().out
    con = duckdb.connect()
    paths = ", ".join(f"'{f.path}'" for f in store.maintain.files())
    con.execute(f"CREATE VIEW stored_steps AS SELECT * FROM read_parquet([{paths}], hive_partitioning = true, "
                "union_by_name = true)")
    con.execute(text)
    for env in envs:
        mine = ours(store, env)
        rows = con.sql(f"SELECT episode_id, step, obs, next_obs, reward, terminated, truncated FROM steps "
                       f"WHERE env_id = '{env}' ORDER BY episode_id, step").fetchall()
        assert len(rows) == mine.num_rows
        for i, name in enumerate(["episode_id", "step", "obs", "next_obs", "reward", "terminated", "truncated"]):
            assert [values([r[i]])[0] for r in rows] == values(mine[name]), (env, name)
    assert main(["schema", "--store", str(store.root)]) == 0
    described = capsys.readouterr().out
    assert "next_obs_sparse" in described and "holds next_obs; null where the next observation is the obs" in described


def test_another_tools_rewrite_of_an_old_environment_beside_new_ones_is_refused(tmp_path: Path) -> None:
    """An old store that new writers added environments to (declared columns in its log): a rewrite that gives the
    old environment's file every column of the table (the new ones' declared) still cannot be read back, and says
    so."""
    shutil.copytree(DATA / "encoding2-store", tmp_path / "store")
    store = trajstore.open(tmp_path / "store")
    write_kind(store, "float", np.random.default_rng(4))  # a new environment, in the current encoding
    DeltaTable(str(tmp_path / "store" / "steps")).optimize.compact()
    store = trajstore.open(tmp_path / "store")
    with pytest.raises(trajstore.errors.StoreDamagedError, match="another tool rewrote this file"):
        store.scan(["obs", "next_obs"], env_id="Vec-v0").read_all()
    assert not check(store).ok


@pytest.mark.spark
def test_the_spark_decoding_sql_gives_trajstore_s_steps_in_spark(
        written: tuple[trajstore.Store, list[str]], spark: Any, capsys: pytest.CaptureFixture[str]) -> None:
    """``trajstore schema --sql --dialect spark`` run unchanged by Spark SQL over the committed files read with their
    partition folders: the same steps as ``scan`` (float vectors, frame stacks with their starts and breaks, Dict
    observations, episode ends, two kinds of environment in one store)."""
    from trajstore.cli.main import main

    store, envs = written
    assert main(["schema", "--store", str(store.root), "--sql", "--dialect", "spark"]) == 0
    text = capsys.readouterr().out
    stored = (spark.read.option("basePath", str(store.root / "steps")).option("mergeSchema", "true")
              .parquet(*[f.path for f in store.maintain.files()]))
    stored.createOrReplaceTempView("stored_steps")
    spark.sql(text)
    names = ["episode_id", "step", "obs", "next_obs", "reward", "terminated", "truncated"]
    for env in envs:
        mine = ours(store, env)
        rows = spark.sql(f"SELECT {', '.join(names)} FROM steps WHERE env_id = '{env}' "
                         "ORDER BY episode_id, step").collect()
        assert len(rows) == mine.num_rows
        for i, name in enumerate(names):
            got = [r[i].asDict(recursive=True) if hasattr(r[i], "asDict") else r[i] for r in rows]
            assert [values([g])[0] for g in got] == values(mine[name]), (env, name)


@pytest.mark.parametrize("action_dtype", ["int64", "int32", "uint8", "float32"])
def test_integer_lineage_and_actions_are_bit_packed_deltas_every_engine_reads(tmp_path: Path,
                                                                              action_dtype: str) -> None:
    """env_steps, wall_time and an integer action are stored as DELTA_BINARY_PACKED (a lineage value as a
    dictionary, the rest plain): the file reads back exactly what a plain write of the same rows reads back, the
    values are the ones given, and deltalake, polars and DuckDB read the table as trajstore does."""
    rng = np.random.default_rng(5)
    T, B = 40, 3
    v = rng.normal(size=(T + 1, B, 3)).astype(np.float32)
    action = rng.integers(0, 200, (T, B)).astype(action_dtype)
    if action_dtype == "float32":
        action = rng.normal(size=(T, B, 2)).astype(np.float32)
    store = trajstore.open(tmp_path / "store", create=True)
    with store.writer(run_id="r", env_id="E", upkeep=None, seed=3) as w:
        for _ in range(2):
            w.add_batch({**batch(rng, v[:-1], v[1:], T, B), "action": action})
    for f in store.maintain.files():
        meta = pq.ParquetFile(f.path).metadata
        encodings = {meta.row_group(0).column(i).path_in_schema: meta.row_group(0).column(i).encodings
                     for i in range(meta.num_columns)}
        deltas = {p for p, e in encodings.items() if "DELTA_BINARY_PACKED" in e}
        assert deltas == {"env_steps", "wall_time"} | ({"action"} if action_dtype != "float32" else set())
        assert {p for p, e in encodings.items() if "RLE_DICTIONARY" in e} == {"seed"}  # flags: bit-packed anyway
        stored = pq.read_table(f.path)
        plain = pa.BufferOutputStream()
        pq.write_table(stored, plain, use_dictionary=False)  # the plain reference: pyarrow's default encodings
        assert pq.read_table(pa.BufferReader(plain.getvalue())).equals(stored)
    got = ours(store, "E")
    t = (got["env_steps"].to_numpy() // B - 1) % T  # env_steps is (t + 1) * B, t counted over both calls
    np.testing.assert_array_equal(to_numpy(got["action"]), action[t, got["env_index"].to_numpy()])
    assert sorted(got["env_steps"].to_pylist()) == [(t + 1) * B for t in range(2 * T) for _ in range(B)]
    assert set(got["seed"].to_pylist()) == {3}
    table_uri = str(store.root / "steps")
    same_as_ours(DeltaTable(table_uri).to_pyarrow_table(), store, ["E"], "deltalake")
    same_as_ours(pl.read_delta(table_uri, use_pyarrow=True).to_arrow(), store, ["E"], "polars")
    paths = ", ".join(f"'{f.path}'" for f in store.maintain.files())
    duck = duckdb.connect().sql(f"SELECT * FROM read_parquet([{paths}], hive_partitioning = true)")
    same_as_ours(duck.to_arrow_table(), store, ["E"], "duckdb")
