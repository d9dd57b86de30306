"""Typed physical names (trajstore.storage.names): a column whose type the log holds otherwise under its name gets
``<name>__<tag>``; names are reserved in the log before a file uses them, so racing writers never share one."""

from __future__ import annotations

import threading
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.storage.names import resolve
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
    layouts = store.table.schemas([f for f in store.files() if f.env_id == "Box-v0"])
    renames = {"action": "action__float32_1d", "next_obs": "next_obs_sparse"}
    assert [layout.format.renames for layout in layouts] == [renames] * 2
    assert store.table.log.read().schema.names.count("action__float32_1d") == 1


def test_a_file_that_breaks_its_encoding_is_reported_by_check(store: trajstore.Store) -> None:
    import pyarrow.parquet as pq

    from trajstore.store import check

    rng = np.random.default_rng(1)
    batch = make_batch(rng, 8, 2, p_terminated=0, p_truncated=0)
    batch["next_obs"][:-1] = batch["obs"][1:]
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch(batch)
    (f,) = store.files()
    table = pq.read_table(f.path)
    assert table["next_obs_sparse"].null_count > 0
    spoiled = table.take(pa.array([0, 2, 1, *range(3, table.num_rows)]))  # steps out of order in the file
    store.table.append(spoiled, run_id="spoiled", env_id="E")  # committed as it is (a buggy tool, say)
    report = check(store)
    assert not report.ok
    assert any("its encoding is broken" in p and "next_obs is null, but the next row is not the same episode's "
               "next step" in p for p in report.problems), report.problems
    with pytest.raises(trajstore.errors.StoreDamagedError, match="breaks its encoding"):
        store.scan(["obs", "next_obs"], run_id="spoiled").read_all()
    assert store.scan(["obs", "next_obs"], run_id="r").read_all().num_rows == 16
