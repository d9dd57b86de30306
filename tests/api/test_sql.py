"""POST /sql: one read-only SELECT over the views; every way out of the store is refused and nothing changes."""

from __future__ import annotations

import hashlib
from pathlib import Path

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

import trajstore
from trajstore.api.app import create_app
from tests.api.helpers import settings_for


def fingerprint(root: Path) -> dict[str, str]:
    """Every file under the store (and beside it) with a hash of its bytes."""
    return {str(p.relative_to(root.parent)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.parent.rglob("*")) if p.is_file()}


def test_select_over_both_views(client: TestClient, populated: Path) -> None:
    q = ("SELECT e.run_id, count(*) AS n, sum(s.reward) AS r FROM steps s JOIN episodes e USING (episode_id) "
         "GROUP BY e.run_id ORDER BY e.run_id")
    body = client.post("/sql", json={"query": q}).json()
    assert body["columns"] == ["run_id", "n", "r"] and not body["truncated"]
    assert body["rows"] == trajstore.open(populated).sql(q).to_pylist()


def test_arrow_and_row_limit(client: TestClient) -> None:
    response = client.post("/sql", json={"query": "SELECT step FROM steps", "max_rows": 10},
                           headers={"Accept": "application/vnd.apache.arrow.stream"})
    table = pa.ipc.open_stream(response.content).read_all()
    assert table.num_rows == 10 and response.headers["x-trajstore-truncated"] == "true"


ESCAPES = [
    ("COPY (SELECT * FROM steps) TO '{root}/steps/stolen.csv'", 403, "only SELECT"),
    ("COPY (SELECT 1) TO '/tmp/trajstore-escape.csv'", 403, "only SELECT"),
    ("ATTACH '/tmp/trajstore-escape.db' AS x", 403, "only SELECT"),
    ("INSTALL httpfs", 403, "only SELECT"),
    ("LOAD httpfs", 403, "only SELECT"),
    ("SET enable_external_access = true", 403, "only SELECT"),
    ("RESET memory_limit", 403, "only SELECT"),
    ("PRAGMA version", 403, "only SELECT"),
    ("CREATE TABLE t AS SELECT * FROM steps", 403, "only SELECT"),
    ("DROP VIEW steps", 403, "only SELECT"),
    ("SELECT 1; COPY (SELECT 1) TO 'x.csv'", 403, "exactly one SELECT"),
    ("SELECT 1; SELECT 2", 403, "exactly one SELECT"),
    ("SELECT * FROM read_csv('/etc/passwd')", 403, "outside the store"),
    ("SELECT * FROM read_text('/etc/hostname')", 403, "outside the store"),
    ("SELECT * FROM read_blob('/etc/hostname')", 403, "outside the store"),
    ("SELECT * FROM glob('/etc/*')", 403, "outside the store"),
    ("SELECT * FROM read_parquet('{root}/../*/*.parquet')", 403, "outside the store"),
    ("SELECT getenv('HOME')", 400, "getenv"),
]


@pytest.mark.parametrize("query, status, words", ESCAPES)
def test_escapes_are_refused_and_nothing_changes(client: TestClient, populated: Path, query: str,
                                                 status: int, words: str) -> None:
    before = fingerprint(populated)
    response = client.post("/sql", json={"query": query.format(root=populated)})
    assert response.status_code == status, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert words in response.json()["detail"]
    assert fingerprint(populated) == before
    assert not Path("/tmp/trajstore-escape.csv").exists() and not Path("/tmp/trajstore-escape.db").exists()


def test_a_long_query_is_interrupted_at_the_time_limit(populated: Path) -> None:
    with TestClient(create_app(settings_for(populated, sql_timeout_s=0.5))) as c:
        response = c.post("/sql", json={"query": "SELECT count(*) FROM range(1000000000000) a, range(100) b"})
        assert response.status_code == 408 and "time limit" in response.json()["detail"]
        assert c.post("/sql", json={"query": "SELECT 42 AS x"}).json()["rows"] == [{"x": 42}]


def test_memory_limit(populated: Path) -> None:
    with TestClient(create_app(settings_for(populated, sql_memory_limit="20MB"))) as c:
        q = "SELECT list(i) FROM range(100000000) t(i) GROUP BY i % 3"
        response = c.post("/sql", json={"query": q})
    assert response.status_code == 400 and "memory" in response.json()["detail"].lower()


def test_bad_sql_is_a_client_error(client: TestClient) -> None:
    response = client.post("/sql", json={"query": "SELEC nothing"})
    assert response.status_code == 400 and "syntax error" in response.json()["detail"]
