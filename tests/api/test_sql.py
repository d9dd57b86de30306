"""POST /sql: one read-only SELECT over the views; every way out of the store is refused and nothing changes."""

from __future__ import annotations

from pathlib import Path
from typing import Iterator

import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

import trajstore
from trajstore.api.app import create_app
from tests.api.helpers import settings_for
from tests.helpers import INSIDE_ESCAPES, PATH_REVEALING, fingerprint, make_batch, plant_uncommitted


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


@pytest.fixture(scope="module")
def planted(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small store with a Parquet file under ``steps/`` that no commit lists."""
    path = tmp_path_factory.mktemp("sql") / "store"
    with trajstore.open(path, create=True).writer(run_id="r", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(0), 50, 4))
    plant_uncommitted(path)
    return path


@pytest.fixture(scope="module")
def planted_client(planted: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(planted))) as c:
        yield c


@pytest.mark.parametrize("query", INSIDE_ESCAPES)
def test_the_stores_log_and_uncommitted_files_are_refused(planted_client: TestClient, planted: Path,
                                                          query: str) -> None:
    before = fingerprint(planted)
    response = planted_client.post("/sql", json={"query": query.format(root=planted)})
    assert response.status_code == 403, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert "outside the store" in response.json()["detail"] and "uncommitted" not in response.text
    assert fingerprint(planted) == before


@pytest.mark.parametrize("query", PATH_REVEALING)
def test_settings_and_views_name_no_path_of_the_store(planted_client: TestClient, planted: Path,
                                                      query: str) -> None:
    response = planted_client.post("/sql", json={"query": query})
    assert response.status_code == 200 and response.json()["rows"]
    assert str(planted) not in response.text and str(planted.resolve()) not in response.text
    assert str(Path.cwd()) not in response.text


def test_the_views_are_the_committed_steps(planted_client: TestClient, planted: Path) -> None:
    q = "SELECT episode_id, step, reward FROM steps ORDER BY episode_id, step"
    body = planted_client.post("/sql", json={"query": q}).json()
    assert body["rows"] == trajstore.open(planted).sql(q).to_pylist()
