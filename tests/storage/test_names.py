"""Typed physical names (trajstore.storage.names): a column whose type the log holds otherwise under its name gets
``<name>__<tag>``; names are reserved in the log before a file uses them, so racing writers never share one. And the
one rule for the names users give (issue 47): column names every engine of the open table can hold, none two
differing only in case, run/env/agent ids every path takes alike; every name trajstore writes itself passes."""

from __future__ import annotations

import json
import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.helpers import make_batch, steps_table
from trajstore.errors import InputError
from trajstore.storage.names import (
    check_column_name,
    check_distinct,
    check_fields,
    check_id,
    name_problem,
    own_names,
    resolve,
)
from trajstore.storage.table import StepsTable


def test_names_are_plain_until_a_type_differs() -> None:
    log = {"action": pa.int64(), "obs": pa.list_(pa.float32())}
    mapping, new = resolve({"action": pa.int64(), "obs": pa.list_(pa.float32(), 4), "value": pa.float32()}, log)
    assert mapping == {"action": "action", "obs": "obs", "value": "value"}
    assert new == [pa.field("value", pa.float32())]
    mapping, new = resolve({"action": pa.list_(pa.float32(), 1), "obs": pa.list_(pa.binary(7056))}, log,
                           {"obs": pa.list_(pa.list_(pa.list_(pa.uint8(), 84), 84), 4)})
    assert mapping == {"action": "action__float32_1d", "obs": "obs__uint8_3d"}  # tags from the logical type
    assert [(f.name, f.type) for f in new] == [("action__float32_1d", pa.list_(pa.float32())),
                                               ("obs__uint8_3d", pa.list_(pa.binary()))]
    # uint8 is int16 in the log (Delta has no unsigned types): a uint8 column fits an int16 one
    assert resolve({"x": pa.uint8()}, {"x": pa.int16()})[0] == {"x": "x"}
    # a name taken by another type too: the next free one
    taken = {"action": pa.int64(), "action__float32_1d": pa.string()}
    assert resolve({"action": pa.list_(pa.float32(), 1)}, taken)[0] == {"action": "action__float32_1d_2"}
    struct = pa.struct([("a", pa.float32())])
    (name,) = resolve({"obs": struct}, log)[0].values()
    assert name.startswith("obs__struct_") and len(name) == len("obs__struct_") + 6


def test_racing_writers_of_other_kinds_never_share_a_name(tmp_path: Path) -> None:
    """Two writers reserve ``action`` at once with other types, many times over: each gets its own column."""
    for attempt in range(4):
        table = StepsTable(tmp_path / f"t{attempt}")
        got: dict[str, str] = {}
        barrier = threading.Barrier(2)

        def reserve(key: str, t: pa.DataType, table: StepsTable = table, got: dict[str, str] = got,
                    barrier: threading.Barrier = barrier) -> None:
            barrier.wait()
            got[key] = table.reserve({"action": t})["action"]

        threads = [threading.Thread(target=reserve, args=("int", pa.int64())),
                   threading.Thread(target=reserve, args=("box", pa.list_(pa.float32(), 1)))]
        [t.start() for t in threads]
        [t.join() for t in threads]
        assert got["int"] != got["box"] and "action" in got.values()
        log = {f.name: f.type for f in table.log.read().schema}
        assert log[got["int"]] == pa.int64() and log[got["box"]] == pa.list_(pa.float32())


def test_an_environment_keeps_its_names(store: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    box = make_batch(rng, 5, 2)
    box["action"] = rng.normal(size=(5, 2, 1)).astype(np.float32)
    for env, batch in (("Int-v0", make_batch(rng, 5, 2)), ("Box-v0", box), ("Box-v0", box)):
        with store.writer(run_id="r", env_id=env) as w:
            w.add_batch(batch)
    layouts = steps_table(store).schemas([f for f in store.maintain.files() if f.env_id == "Box-v0"])
    renames = {"action": "action__float32_1d", "next_obs": "next_obs_sparse"}
    assert [layout.format.renames for layout in layouts] == [renames] * 2
    assert steps_table(store).log.read().schema.names.count("action__float32_1d") == 1


def test_a_file_that_breaks_its_encoding_is_reported_by_check(store: trajstore.Store) -> None:
    import pyarrow.parquet as pq

    from trajstore.store import check

    rng = np.random.default_rng(1)
    batch = make_batch(rng, 8, 2, p_terminated=0, p_truncated=0)
    batch["next_obs"][:-1] = batch["obs"][1:]
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch(batch)
    (f,) = store.maintain.files()
    table = pq.read_table(f.path)
    assert table["next_obs_sparse"].null_count > 0
    spoiled = table.take(pa.array([0, 2, 1, *range(3, table.num_rows)]))  # steps out of order in the file
    steps_table(store).append(spoiled, run_id="spoiled", env_id="E")  # committed as it is (a buggy tool, say)
    report = check(store)
    assert not report.ok
    assert any("its encoding is broken" in p and "next_obs is null, but the next row is not the same episode's "
               "next step" in p for p in report.problems), report.problems
    with pytest.raises(trajstore.errors.StoreDamagedError, match="breaks its encoding"):
        store.scan(["obs", "next_obs"], run_id="spoiled").read_all()
    assert store.scan(["obs", "next_obs"], run_id="r").read_all().num_rows == 16


@pytest.mark.parametrize(("name", "problem"), [
    ("", "it is empty"),
    (" reward2", "it begins or ends with whitespace"),
    ("x\t", "it begins or ends with whitespace"),
    ("a b", "it holds ' '"),
    ("a\nb", r"it holds '\\n'"),
    ("a\x00b", r"it holds '\\x00'"),
    ("f(x)", r"it holds '\('"),
    ("a=b", "it holds '='"),
    ("a,b", "it holds ','"),
    ("x" * 129, "it has 129 characters"),
    ("\ud800", r"it holds '\\ud800'"),
    ("Reward", "it differs only in case from 'reward', a column trajstore fills or stores itself"),
    ("Run_Id", "it differs only in case from 'run_id', a column trajstore fills or stores itself"),
    ("next_obs_sparse", "'next_obs_sparse' is a column trajstore fills or stores itself"),
    ("OBS_BYTES", "it differs only in case from 'obs_bytes'"),
    ("Seed", "it differs only in case from the step column 'seed'"),
    ("action__float32_1d", "trajstore stores 'action' under names of the form action__<type>"),
])
def test_names_no_engine_holds_or_trajstore_takes_are_refused(name: str, problem: str) -> None:
    with pytest.raises(InputError, match=f"extras: .* cannot be a column name: {problem}"):
        check_column_name(name, field="extras")


def test_the_names_trajstore_writes_itself_pass() -> None:
    """Every lineage column of ``schemas/step.v1.json`` under its own name, the info keys gymnasium and SB3 report,
    other scripts' letters, a name of 128 characters; the step columns are trajstore's own (never given)."""
    lineage = list(trajstore.schema.lineage_columns())
    assert lineage and all(name_problem(n) is None for n in lineage)
    for name in ["TimeLimit.truncated", "is_success", "episode", "lives", "terminal_observation", "return_2",
                 "élan", "x" * 128, "my__thing"]:
        assert check_column_name(name, field="extras") == name
    assert {"next_obs_sparse", "obs_new_frames", "obs_bytes", "next_obs_sparse_bytes"} <= own_names()
    assert {c["name"] for c in trajstore.schema.step_columns()} <= own_names()


def test_stores_trajstore_writes_have_no_name_problems(tmp_path: Path) -> None:
    """A mixed store (lineage of every kind), a pixel store (frame stacks stored under their names), a store of info
    keys and multi-agent rows: ``check`` finds no column whose name breaks the rule."""
    from tests.helpers import write_mixed_store, write_pixel_store
    from trajstore.rollout import gym_rollout
    from trajstore.store import check

    stores = [write_mixed_store(tmp_path / "mixed", seed=0, commits=2), write_pixel_store(tmp_path / "pixels")]
    rolled = trajstore.open(tmp_path / "rolled", create=True)
    gym_rollout(rolled, "CartPole-v1", run_id="r", num_envs=2, episodes=3, seed=0, info_keys=["TimeLimit.truncated"],
                progress=False)
    for store in [*stores, rolled]:
        report = check(store)
        assert report.ok, report.problems


@pytest.mark.parametrize(("field", "value", "problem"), [
    ("run_id", "", "it is empty"),
    ("run_id", " ", "whitespace at either end"),
    ("run_id", "a\nb", r"it holds '\\n'"),
    ("run_id", "a\tb", r"it holds '\\t'"),
    ("run_id", "a/b", "it holds '/'; a run id is a segment of the REST API's paths"),
    ("run_id", "x" * 201, "it has 201 characters"),
    ("run_id", "€" * 30, r"its folder name run_id=… is 277 bytes percent-encoded; at most 255"),
    ("env_id", "__HIVE_DEFAULT_PARTITION__", "it is the folder name Hive partitioning reads back as null"),
    ("env_id", 3, "it is not a string but int"),
    ("agent_id", "a\rb", r"it holds '\\r'"),
])
def test_ids_every_path_refuses(field: str, value: object, problem: str) -> None:
    with pytest.raises(InputError, match=f"{field} must be a non-empty string .*: {problem}"):
        check_id(value, field=field)


def test_ids_every_path_takes() -> None:
    for field, value in [("run_id", "ppo-1.seed=3"), ("run_id", "x" * 200), ("env_id", "ALE/Breakout-v5"),
                         ("env_id", "ä"), ("agent_id", "adversary_0"), ("agent_id", "a/b")]:
        assert check_id(value, field=field) == value


def test_names_that_differ_only_in_case_are_refused() -> None:
    check_distinct(["a", "b"], ["a", "c"], field="extras")  # the same column again is no clash
    with pytest.raises(InputError, match=r"extras: 'Foo' and 'foo' \(given beside it\) differ only in case"):
        check_distinct(["foo", "Foo"], field="extras")
    with pytest.raises(InputError, match=r"extras: 'Foo' and 'foo' \(a column already there\) differ only in case"):
        check_distinct(["Foo"], ["foo"], field="extras")
    with pytest.raises(InputError, match=r"extras: 'x' is given twice"):
        check_distinct(["x", "x"], field="extras")


def test_struct_fields_every_engine_holds() -> None:
    check_fields(pa.list_(pa.struct([("pos", pa.float32()), ("TimeLimit.truncated", pa.bool_())])), field="info")
    with pytest.raises(InputError, match=r"info\.: '' cannot be a field name: it is empty"):
        check_fields(pa.list_(pa.struct([("", pa.float32())]), 2), field="info")
    with pytest.raises(InputError, match=r"info\.a\.b c: 'b c' cannot be a field name: it holds ' '"):
        check_fields(pa.struct([("a", pa.struct([("b c", pa.int8())]))]), field="info")
    with pytest.raises(InputError, match=r"info: 'A' and 'a' \(given beside it\) differ only in case"):
        check_fields(pa.struct([("a", pa.int8()), ("A", pa.int8())]), field="info")


def test_a_name_taken_in_another_case_is_not_reused() -> None:
    """Delta refuses two columns whose names differ only in case: a name the log holds in another case (one whose
    name was not checked, or a racing writer's) is passed over for a typed one."""
    mapping, new = resolve({"Foo": pa.float32(), "bar": pa.int64()}, {"foo": pa.float32(), "BAR": pa.int64()})
    assert mapping == {"Foo": "Foo__float32", "bar": "bar__int64"}
    assert [f.name for f in new] == ["Foo__float32", "bar__int64"]
    assert json.loads(new[0].metadata[b"trajstore"]) == {"field": "Foo"}  # the table says which field it holds
