"""add_column: a derived column written in one commit, equal to a numpy reference, queryable like a stored one."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import trajstore
from tests.storage.helpers import fill_two_runs
from trajstore.errors import InputError


def fill(store: trajstore.Store) -> None:
    fill_two_runs(store, seed=3, batches=4, steps=9, envs=3)


def test_an_sql_expression_becomes_a_stored_column(store: trajstore.Store) -> None:
    fill(store)
    version = store.version
    report = store.maintain.add_column("shaped", "reward * 0.5 + 0.1")
    assert report.version == store.version  # the column in the schema, then the files swapped in one commit
    assert store.history(limit=2)["operation"].to_pylist() == ["add_columns", "add_column"]
    rows = store.sql("SELECT reward, shaped FROM steps")
    np.testing.assert_allclose(rows["shaped"].to_numpy(), rows["reward"].to_numpy() * np.float32(0.5) + 0.1,
                               rtol=1e-6)
    assert report.rows == rows.num_rows
    scanned = store.scan(["episode_id", "shaped"]).read_all()
    assert scanned.num_rows == rows.num_rows and scanned["shaped"].null_count == 0
    by = store.stats(by="run_id", where="run_id = 'a'")
    assert by["n_traj"][0].as_py() > 0
    assert trajstore.open(store.uri, version=version).schema().get_field_index("shaped") == -1


def test_a_window_over_whole_episodes_that_cross_files(store: trajstore.Store) -> None:
    fill(store)
    store.maintain.add_column("prev_reward", "coalesce(lag(reward) OVER (PARTITION BY episode_id ORDER BY step), 0)")
    rows = store.sql("SELECT episode_id, step, reward, prev_reward FROM steps ORDER BY episode_id, step")
    ids, reward = rows["episode_id"].to_numpy(), rows["reward"].to_numpy()
    expected = np.where(np.r_[False, ids[1:] == ids[:-1]], np.r_[0, reward[:-1]], 0)  # the plain loop's answer
    np.testing.assert_array_equal(rows["prev_reward"].to_numpy(), expected)


def test_a_function_with_a_where(store: trajstore.Store) -> None:
    fill(store)
    report = store.maintain.add_column("neg", lambda t: pc.negate(t["reward"]), steps_where="run_id = 'b'")
    rows = store.sql("SELECT run_id, reward, neg FROM steps")
    b = rows.filter(pc.equal(rows["run_id"], "b"))
    np.testing.assert_array_equal(b["neg"].to_numpy(), -b["reward"].to_numpy())
    assert rows.filter(pc.equal(rows["run_id"], "a"))["neg"].null_count == rows.num_rows - b.num_rows
    assert report.rows == b.num_rows and report.type == pa.float32()


def test_a_where_over_episodes_gives_their_steps_a_value(store: trajstore.Store) -> None:
    """``where`` is a condition over ``episodes`` as on every reader; one over steps is ``steps_where``."""
    fill(store)
    chosen = store.episodes(where="episode_length > 3 AND run_id = 'a'")["episode_id"]
    assert 0 < len(chosen) < store.episodes().num_rows
    report = store.maintain.add_column("marked", "reward + 1", where="episode_length > 3 AND run_id = 'a'")
    rows = store.sql("SELECT episode_id, step, marked FROM steps")
    inside = pc.is_in(rows["episode_id"], chosen)
    assert rows.filter(inside)["marked"].null_count == 0 and report.rows == pc.sum(inside).as_py()
    assert rows.filter(pc.invert(inside))["marked"].null_count == rows.num_rows - report.rows
    both = store.maintain.add_column("first", "reward", where="run_id = 'a'", steps_where="step = 0")
    firsts = store.sql("SELECT count(*) AS n FROM steps WHERE run_id = 'a' AND step = 0")["n"][0].as_py()
    assert both.rows == firsts == store.sql("SELECT count(first) AS n FROM steps")["n"][0].as_py()
    with pytest.raises(InputError, match=r"^where: .*\"step\".*a condition over the episodes view"):
        store.maintain.add_column("nope", "reward", where="step = 0")


def test_bad_columns_are_named(store: trajstore.Store) -> None:
    fill(store)
    with pytest.raises(InputError, match="name: 'reward' is already a column"):
        store.maintain.add_column("reward", "reward + 1")
    with pytest.raises(InputError, match="name: 'a b' cannot be a column name: it holds ' '"):
        store.maintain.add_column("a b", "reward + 1")
    with pytest.raises(InputError, match="expression: .*nope"):
        store.maintain.add_column("x", "nope + 1")
    with pytest.raises(InputError, match="returned 1 values for a table of"):
        store.maintain.add_column("x", lambda t: pa.array([1.0]))
    version = store.version
    assert store.version == version


@pytest.mark.parametrize(("name", "message"), [
    ("", r"name: '' cannot be a column name: it is empty"),
    ("Reward", r"name: 'Reward' cannot be a column name: it differs only in case from 'reward'"),
    ("Episode_Return", r"name: 'Episode_Return' and 'episode_return' \(a column already there\) differ only in case"),
    ("Shaped", r"name: 'Shaped' and 'shaped' \(a column already there\) differ only in case"),
    ("next_obs_sparse", r"name: 'next_obs_sparse' cannot be a column name"),
    ("a;b", r"name: 'a;b' cannot be a column name: it holds ';'"),
])
def test_a_name_no_engine_holds_is_refused_and_nothing_is_written(store: trajstore.Store, name: str,
                                                                   message: str) -> None:
    """The names every write path refuses (issue 47), and one that differs only in case from a column of the views
    (Delta refused Reward beside reward only after the files were rewritten)."""
    fill(store)
    store.maintain.add_column("shaped", "reward * 2")
    version = store.version
    with pytest.raises(InputError, match=message):
        store.maintain.add_column(name, "reward + 1")
    assert trajstore.open(store.uri).version == version
    assert store.maintain.add_column("TimeLimit.truncated", "truncated").rows > 0  # a dot is a name every engine holds
