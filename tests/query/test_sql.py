"""The SQL module: quoting of identifiers and literals (quotes, odd names, unicode), typed filters rendered
with every name quoted, and run ids of any text written and filtered back exactly."""

from __future__ import annotations

import duckdb
import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trajstore
from tests.helpers import make_batch
from trajstore.errors import InputError, UnknownColumnError
from trajstore.query import sql
from trajstore.query.filters import EpisodeFilter
from trajstore.storage.names import id_problem

ODD_NAMES = ['a"b', "x) OR (1=1", "名前", "with space", "semi;colon", "'quoted'", '""', "back\\slash", "🙂"]


@pytest.mark.parametrize("name", ODD_NAMES)
def test_an_identifier_names_exactly_its_column(name: str) -> None:
    con = duckdb.connect()
    con.execute(f"CREATE TABLE t ({sql.ident(name)} INTEGER, other INTEGER)")
    con.execute("INSERT INTO t VALUES (1, 2)")
    assert con.execute(f"SELECT {sql.ident(name)} FROM t").fetchall() == [(1,)]
    assert [r[0] for r in con.execute(sql.describe("t")).fetchall()] == [name, "other"]


@pytest.mark.parametrize("value", ["it's", "'; DROP TABLE t; --", "名前", "🙂", "a\\b", "", "''", "\t"])
def test_a_literal_is_exactly_its_value(value: str) -> None:
    assert duckdb.connect().execute(f"SELECT {sql.literal(value)}").fetchone() == (value,)


def test_literals_of_other_types() -> None:
    con = duckdb.connect()
    row = con.execute(f"SELECT {sql.literal(None)}, {sql.literal(True)}, {sql.literal(np.int64(-7))}, "
                      f"{sql.literal(0.1)}, {sql.literal(2**62)}").fetchone()
    assert row == (None, True, -7, 0.1, 2**62)
    with pytest.raises(InputError, match="finite"):
        sql.literal(float("nan"))
    with pytest.raises(InputError, match="cannot use a bytes"):
        sql.literal(b"x")


def test_in_list_quotes_every_value_and_an_empty_list_selects_nothing() -> None:
    assert sql.in_list("run_id", ["a'b", "c"]) == "\"run_id\" IN ('a''b', 'c')"
    assert sql.in_list("episode_id", 5) == '"episode_id" IN (5)'
    assert sql.in_list("run_id", []) == "false"


def test_page_refuses_negative_or_non_integer_bounds() -> None:
    assert sql.page(10, 20) == " LIMIT 10 OFFSET 20"
    assert sql.page(None) == ""
    with pytest.raises(InputError, match=r"limit: must be a whole number >= 0, got -1"):
        sql.page(-1)
    with pytest.raises(InputError, match=r"offset: must be a whole number >= 0, got 1.5"):
        sql.page(1, 1.5)  # type: ignore[arg-type]


def test_filters_quote_every_identifier_and_value() -> None:
    flt = EpisodeFilter(run_id=["a'b"], complete=True, min_return=3, lineage={"mode": ["eval"], "seed": [1, 2]})
    assert sql.filter_conditions(flt) == ["\"run_id\" IN ('a''b')", '"complete"', '"episode_return" >= 3.0::DOUBLE',
                                          "\"mode\" IN ('eval')", '"seed" IN (1, 2)']


def test_a_lineage_key_that_is_not_a_column_is_refused() -> None:
    with pytest.raises(UnknownColumnError, match=r"lineage: unknown column\(s\) \['x\) OR \(1=1'\]"):
        EpisodeFilter(lineage={"x) OR (1=1": ["v"]})


def test_a_user_condition_cannot_reach_past_its_parentheses(store: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    with store.writer(run_id="a", env_id="E") as w:
        w.add_batch(make_batch(rng, 20, 2))
    with store.writer(run_id="b", env_id="E") as w:
        w.add_batch(make_batch(rng, 20, 2))
    # "true OR true" would select run b too if it were pasted after "run_id IN ('a') AND" unparenthesised
    rows = store.episodes(run_id="a", where="true OR true")
    assert set(rows["run_id"].to_pylist()) == {"a"}


RUN_IDS = st.text(min_size=1, max_size=24).filter(lambda s: id_problem(s, field="run_id") is None)  # writers take


@pytest.mark.slow
@settings(max_examples=40, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(run_id=RUN_IDS)
def test_any_run_id_is_written_and_filtered_back_exactly(store: trajstore.Store, run_id: str) -> None:
    done = np.zeros((3, 1), bool)
    done[-1] = True
    with store.writer(run_id=run_id, env_id="E") as w:
        w.add_batch({"obs": np.zeros((3, 1, 2), np.float32), "action": np.zeros((3, 1), int),
                     "reward": np.ones((3, 1), np.float32), "next_obs": np.zeros((3, 1, 2), np.float32),
                     "terminated": done, "truncated": np.zeros((3, 1), bool)})
    by_keyword = store.episodes(run_id=run_id)
    by_filter = store.episodes(filter=EpisodeFilter(run_id=[run_id]))
    assert set(by_keyword["run_id"].to_pylist()) == {run_id} == set(by_filter["run_id"].to_pylist())
    assert by_keyword["episode_id"].to_pylist() == by_filter["episode_id"].to_pylist()
    assert store.stats(run_id=run_id)["n_traj"][0].as_py() == by_keyword.num_rows
    assert run_id in store.runs()["run_id"].to_pylist()
    scanned = store.scan(["run_id", "step"], run_id=run_id).read_all()
    assert set(scanned["run_id"].to_pylist()) == {run_id} and scanned.num_rows == 3 * by_keyword.num_rows
