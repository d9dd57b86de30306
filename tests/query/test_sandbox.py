"""The sandbox on its own: one SELECT only, over the two views and no file at all, cut at its row, time and
memory limits, and the trusted path (``Store.sql``) untouched by it."""

from __future__ import annotations

from pathlib import Path

import duckdb
import numpy as np
import pytest

import trajstore
from tests.helpers import INSIDE_ESCAPES, PATH_REVEALING, make_batch, plant_uncommitted
from trajstore.errors import QueryError, QueryRefusedError, QueryTimeoutError
from trajstore.query import sandbox


@pytest.fixture
def filled(store: trajstore.Store) -> trajstore.Store:
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(0), 50, 4))
    return store


@pytest.mark.parametrize("query, kind", [
    ("CREATE TABLE t (x INT)", "CREATE"), ("COPY (SELECT 1) TO 'x.csv'", "COPY"), ("PRAGMA version", "PRAGMA"),
    ("SET threads = 1", "SET"), ("ATTACH 'x.db'", "ATTACH")])
def test_only_select_statements(query: str, kind: str) -> None:
    with pytest.raises(QueryRefusedError, match=f"only SELECT statements are allowed, got {kind}"):
        sandbox.check_statement(duckdb.connect(), query)


def test_exactly_one_statement_and_syntax_errors() -> None:
    con = duckdb.connect()
    sandbox.check_statement(con, "SELECT 1")
    with pytest.raises(QueryRefusedError, match="exactly one SELECT statement is allowed, got 2 statements"):
        sandbox.check_statement(con, "SELECT 1; SELECT 2")
    with pytest.raises(QueryError, match="query: Parser Error"):
        sandbox.check_statement(con, "SELEC 1")


def test_rows_are_cut_at_the_limit_and_said_so(filled: trajstore.Store) -> None:
    result = filled.sandboxed_sql("SELECT step FROM steps", sandbox.Limits(max_rows=7))
    assert result.table.num_rows == 7 and result.truncated
    whole = filled.sandboxed_sql("SELECT count(*) AS n FROM steps", sandbox.Limits(max_rows=7))
    assert whole.table["n"][0].as_py() == 200 and not whole.truncated


def test_files_outside_the_store_are_refused(filled: trajstore.Store, tmp_path: object) -> None:
    with pytest.raises(QueryRefusedError, match="reaches outside the store"):
        filled.sandboxed_sql("SELECT * FROM read_csv('/etc/passwd')")
    with pytest.raises(QueryError, match="getenv does not exist"):
        filled.sandboxed_sql("SELECT getenv('HOME')")


def test_time_limit(filled: trajstore.Store) -> None:
    with pytest.raises(QueryTimeoutError, match="time limit of 0.3 s"):
        filled.sandboxed_sql("SELECT count(*) FROM range(1000000000000) a, range(100) b",
                             sandbox.Limits(timeout_s=0.3))


def test_the_trusted_path_is_not_sandboxed(filled: trajstore.Store) -> None:
    # Store.sql is the caller's own process: their files, their rules (the CLI opts into the sandbox)
    assert filled.sql("SELECT 1 AS x FROM range(1)")["x"].to_pylist() == [1]


@pytest.mark.parametrize("query", INSIDE_ESCAPES)
def test_the_stores_own_log_and_uncommitted_files_are_refused(filled: trajstore.Store, query: str) -> None:
    plant_uncommitted(filled.root)
    with pytest.raises(QueryRefusedError, match="outside the store"):
        filled.sandboxed_sql(query.format(root=filled.root))


@pytest.mark.parametrize("query", PATH_REVEALING)
def test_settings_and_views_name_no_path_of_the_store(filled: trajstore.Store, query: str) -> None:
    text = str(filled.sandboxed_sql(query).table.to_pylist())
    assert str(filled.root) not in text and str(filled.root.resolve()) not in text
    assert str(Path.cwd()) not in text  # nor of the process (DuckDB's temporary directory is relative to it)


def test_the_views_read_the_committed_steps(filled: trajstore.Store) -> None:
    plant_uncommitted(filled.root)
    q = "SELECT * FROM steps ORDER BY episode_id, step"
    assert filled.sandboxed_sql(q, sandbox.Limits(max_rows=10_000)).table.equals(filled.sql(q))
