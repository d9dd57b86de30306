"""The schema files in schemas/ and the Arrow types the writer actually stores."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gymnasium import spaces

import trajstore
from tests.helpers import make_batch
from trajstore import schema as sch
from trajstore.errors import InputError

SCHEMAS = Path(__file__).resolve().parent.parent / "schemas"
ARROW = {"string": pa.string(), "int64": pa.int64(), "int32": pa.int32(), "float32": pa.float32(),
         "float64": pa.float64(), "bool": pa.bool_(), "timestamp[us, UTC]": pa.timestamp("us", tz="UTC")}


def load(name: str) -> dict[str, Any]:
    return json.loads((SCHEMAS / name).read_text())


@pytest.mark.parametrize("name", ["step.v1.json", "episode.v1.json"])
def test_schema_files_are_valid_json_with_version_and_columns(name: str) -> None:
    spec = load(name)
    assert spec["version"] == 1
    assert spec["$id"] == f"trajstore/{name}"
    names = [c["name"] for c in spec["columns"]]
    assert len(names) == len(set(names))
    for c in spec["columns"]:
        assert c["type"] in ARROW or c["type"] == "space", c
    assert sch.load(name) == spec  # the library reads these very files


def test_step_schema_names_the_design_columns() -> None:
    spec = load("step.v1.json")
    names = [c["name"] for c in spec["columns"]]
    assert names[:10] == ["run_id", "env_id", "episode_id", "step", "obs", "action", "reward", "next_obs",
                          "terminated", "truncated"]
    assert spec["partition_by"] == ["run_id", "env_id"]
    lineage = {c["name"]: c["type"] for c in spec["lineage"]}
    assert {"env_index", "worker_id", "policy_version", "seed"} <= set(lineage)


def _write(store: trajstore.Store, reward: str = "float32", **writer_options: Any) -> pa.Schema:
    rng = np.random.default_rng(0)
    batch = make_batch(rng, 4, 2, obs_dim=3, extras={"log_prob": rng.standard_normal((4, 2)),
                                                      "value": rng.standard_normal((4, 2))})
    batch["reward"] = batch["reward"].astype(reward)  # the schema's float32, or float64 (accepted, kept)
    with store.writer(run_id="r", env_id="e", policy_version=np.int16(3), seed=7, mode="train",
                      **writer_options) as w:
        w.add_batch(batch)
    (f,) = store.maintain.files()
    return pq.read_schema(f.path)


@pytest.mark.parametrize("reward", ["float32", "float64"])
def test_stored_arrow_types_follow_the_step_schema(store: trajstore.Store, reward: str) -> None:
    stored = _write(store, reward)
    spec = load("step.v1.json")
    for c in spec["columns"]:
        if c.get("role") == "partition":
            assert c["name"] not in stored.names  # kept in the folder names
        elif c.get("role") == "agent":
            assert c["name"] not in stored.names  # only a writer of multi-agent episodes stores agent_id
        elif c["type"] != "space":
            assert stored.field(c["name"]).type == ARROW[reward if "accepts" in c else c["type"]], c["name"]
    for c in spec["lineage"]:
        assert stored.field(c["name"]).type == ARROW[c["type"]], c["name"]
    assert stored.field("obs").type == pa.list_(pa.float32(), 3)
    # stored where it is not the next step's obs, under a name that says so; readers give next_obs whole
    assert stored.field("next_obs_sparse").type == pa.list_(pa.float32(), 3) and "next_obs" not in stored.names
    assert stored.field("next_obs_sparse").nullable
    assert store.schema().field("next_obs").type == pa.list_(pa.float32(), 3)
    assert stored.field("action").type == pa.int64()
    # the same types through DuckDB, partition columns included
    described = {r["column_name"]: r["column_type"] for r in store.sql("DESCRIBE steps").to_pylist()}
    assert described["run_id"] == described["env_id"] == "VARCHAR"
    assert (described["episode_id"], described["step"], described["reward"]) == \
        ("BIGINT", "INTEGER", {"float32": "FLOAT", "float64": "DOUBLE"}[reward])
    assert described["terminated"] == described["truncated"] == "BOOLEAN"


def test_terminated_and_truncated_are_separate_columns(store: trajstore.Store) -> None:
    stored = _write(store)
    assert "done" not in stored.names
    assert {"terminated", "truncated"} <= set(stored.names)


def test_episode_view_types_follow_the_episode_schema(store: trajstore.Store) -> None:
    _write(store)
    episodes = store.episodes()
    spec = load("episode.v1.json")
    for c in spec["columns"]:
        t = episodes.schema.field(c["name"]).type
        if pa.types.is_timestamp(t):  # DuckDB names UTC by its zone database name
            assert (t.unit, t.tz in ("UTC", "Etc/UTC")) == ("us", True), c["name"]
        else:
            assert t == ARROW[c["type"]], c["name"]
    lineage = [c["name"] for c in load("step.v1.json")["lineage"] if c["in_episodes"]]
    assert [n for n in episodes.column_names if n in lineage] == lineage
    assert not {"log_prob", "value"} & set(episodes.column_names)


@pytest.mark.parametrize(("space", "role", "expected"), [
    (spaces.Box(-1, 1, (4,), np.float32), "observation", pa.list_(pa.float32(), 4)),
    (spaces.Box(0, 255, (2, 3), np.uint8), "observation", pa.list_(pa.list_(pa.uint8(), 3), 2)),
    (spaces.Box(-1, 1, (2,), np.float64), "action", pa.list_(pa.float64(), 2)),
    (spaces.Box(0, 255, (4, 84, 84), np.uint8), "observation",
     pa.list_(pa.list_(pa.list_(pa.uint8(), 84), 84), 4)),
    (spaces.Discrete(3, start=1), "action", pa.int64()),
    (spaces.Box(-1, 1, (2,), np.float16), "action", pa.list_(pa.float16(), 2)),
    (spaces.Discrete(3), "action", pa.int64()),
    (spaces.MultiDiscrete([2, 5, 3]), "action", pa.list_(pa.int64(), 3)),
    (spaces.MultiBinary(4), "observation", pa.list_(pa.int8(), 4)),
    (spaces.Dict({"a": spaces.Discrete(2), "b": spaces.Box(0, 1, (2,), np.float32)}), "observation",
     pa.struct([("a", pa.int64()), ("b", pa.list_(pa.float32(), 2))])),
])
def test_space_types(space: Any, role: str, expected: pa.DataType) -> None:
    assert sch.type_of_space(space, role=role) == expected


def test_unsupported_space_is_refused() -> None:
    with pytest.raises(InputError, match=r"action_space: unsupported gymnasium space Text"):
        sch.type_of_space(spaces.Text(4), role="action")


def test_space_types_are_what_the_writer_stores(store: trajstore.Store) -> None:
    obs_space = spaces.Box(0, 255, (2, 3), np.uint8)
    stored = _write_images(store, obs_space)
    assert stored.field("obs_bytes").type == pa.binary(6)  # an image frame: its bytes, named so
    assert store.schema().field("obs").type == sch.type_of_space(obs_space, role="observation")
    assert store.scan(["obs"]).read_all().schema.field("obs").type == sch.type_of_space(obs_space, role="observation")


def _write_images(store: trajstore.Store, space: Any) -> pa.Schema:
    rng = np.random.default_rng(1)
    batch = make_batch(rng, 2, 2)
    batch["obs"] = batch["next_obs"] = rng.integers(0, 255, (2, 2, 2, 3)).astype(np.uint8)
    with store.writer(run_id="r", env_id="e", observation_space=space) as w:
        w.add_batch(batch)
    return pq.read_schema(store.maintain.files()[0].path)


def test_agent_ids_are_stored_as_the_step_schema_says(tmp_path: Path) -> None:
    from trajstore.write.agents import AgentWriter

    store = trajstore.open(tmp_path / "s", create=True)
    with AgentWriter(store, run_id="r", env_id="E", agents=["a_0", "b_0"]) as w:
        w.add(0, {a: (np.zeros(2, np.float32), 0, 1.0, np.ones(2, np.float32), True, False) for a in ("a_0", "b_0")})
    spec = {c["name"]: c for c in load("step.v1.json")["columns"]}
    stored = pq.read_schema(store.maintain.files()[0].path)
    assert stored.field("agent_id").type == ARROW[spec["agent_id"]["type"]]
    described = {r["column_name"]: r["column_type"] for r in store.sql("DESCRIBE steps").to_pylist()}
    assert described["agent_id"] == "VARCHAR"
