"""Ingest on its own: rows already cut into episodes are checked field by field against the schema and the
stored types, and committed once per idempotency key."""

from __future__ import annotations

from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from trajstore.errors import InputError, SchemaMismatchError
from trajstore.storage.ingest import append_rows, validate_rows


def rows(n: int = 4, episode_id: int = 7, **change: Any) -> pa.Table:
    cols: dict[str, Any] = {
        "episode_id": pa.array([episode_id] * n, pa.int64()), "step": pa.array(range(n), pa.int32()),
        "obs": pa.array([[0.0, 1.0]] * n, pa.list_(pa.float32(), 2)), "action": pa.array([1] * n, pa.int64()),
        "reward": pa.array([1.0] * n, pa.float32()), "next_obs": pa.array([[1.0, 0.0]] * n, pa.list_(pa.float32(), 2)),
        "terminated": pa.array([False] * (n - 1) + [True]), "truncated": pa.array([False] * n)}
    for name, value in change.items():
        if value is None:
            cols.pop(name)
        else:
            cols[name] = value
    return pa.table(cols)


@pytest.mark.parametrize("change, message", [
    ({"reward": None}, "reward: missing column"),
    ({"run_id": pa.array(["x"] * 4)}, "run_id: comes from the request"),
    ({"step": pa.array([0, None, 2, 3], pa.int32())}, "step: 1 null value"),
    ({"step": pa.array([0.0, 1, 2, 3])}, "step: expected integers"),
    ({"step": pa.array([-1, 0, 1, 2], pa.int32())}, "step: must be >= 0"),
    ({"terminated": pa.array([0, 0, 0, 1])}, "terminated: expected bool"),
    ({"reward": pa.array(["a"] * 4)}, "reward: expected float32 or float64"),
    ({"reward": pa.array([1.0, np.inf, 1.0, 1.0], pa.float32())}, "reward must be finite: got inf at row 1"),
    ({"step": pa.array([0, 1, 1, 2], pa.int32())}, "episode_id 7 has step 1 more than once"),
])
def test_bad_rows_are_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        validate_rows(rows(**change), None)


def test_rows_are_cast_to_the_stored_types_and_stamped() -> None:
    stored = pa.schema([("reward", pa.float64()), ("obs", pa.list_(pa.float32(), 2))])
    out = validate_rows(rows(step=pa.array(range(4), pa.int64())), stored)
    assert out["step"].type == pa.int32() and out["reward"].type == pa.float64()
    assert out["wall_time"].type == pa.timestamp("us", tz="UTC")
    with pytest.raises(SchemaMismatchError, match="obs: the store holds fixed_size_list<item: float>\\[3\\]"):
        validate_rows(rows(), pa.schema([("obs", pa.list_(pa.float32(), 3))]))


def test_one_commit_per_idempotency_key(store: trajstore.Store) -> None:
    first = append_rows(store.table, rows(), run_id="r", env_id="E", idempotency_key="k1")
    again = append_rows(store.table, rows(), run_id="r", env_id="E", idempotency_key="k1")
    assert first[1] is False and again == (None, True)
    assert store.stats()["n_traj"][0].as_py() == 1 and len(store.files()) == 1
