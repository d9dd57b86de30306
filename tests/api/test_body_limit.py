"""Request bodies bounded before they are read (issue 27): a declared body over its route's limit refused at once,
a chunked one as soon as it passes it, both as a 413 problem document naming the limit in bytes and its setting,
on every route that takes a body and on those that take none. The server's memory under a 2 GB body is measured
in ``test_memory_bounds.py``."""

from __future__ import annotations

import json
import socket
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import API_KEY, Live, serve, settings_for
from trajstore.api import body_limit
from trajstore.api.app import create_app
from trajstore.api.settings import ServiceSettings

KiB, MiB = 1 << 10, 1 << 20
AUTH = {"Authorization": f"Bearer {API_KEY}"}
ARROW = "application/vnd.apache.arrow.stream"


def chunks(total: int, size: int = 64 * KiB) -> Iterator[bytes]:
    """``total`` bytes in pieces of ``size``, never held at once: a body of unknown length (chunked)."""
    piece = b"x" * size
    for _ in range(total // size):
        yield piece


def refusal(response: httpx.Response, limit: int, setting: str) -> str:
    """The detail of a 413 problem document that names ``limit`` and ``setting``."""
    assert response.status_code == 413, response.text[:300]
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["type"] == "urn:trajstore:error:BodyTooLargeError" and problem["status"] == 413
    assert f"the limit of {limit} bytes" in problem["detail"] and setting in problem["detail"], problem["detail"]
    return problem["detail"]


def test_every_route_that_takes_a_body_has_its_own_limit(client: TestClient) -> None:
    paths = client.app.openapi()["paths"]
    with_body = {path for path, operations in paths.items() for op in operations.values() if "requestBody" in op}
    assert with_body == set(body_limit.ROUTES)
    description = paths["/sql"]["post"]["description"]
    assert "TRAJSTORE_SQL_MAX_BODY_BYTES" in description and "1 MiB, 1048576 bytes" in description
    assert ServiceSettings().sql_max_body_bytes == MiB


def raw_request(url: str, head: str) -> tuple[str, float]:
    """Send ``head`` (request line and headers) and no body; the whole answer until the server closes, and how
    long it took."""
    host, port = url.removeprefix("http://").split(":")
    with socket.create_connection((host, int(port)), timeout=10) as conn:
        started = time.monotonic()
        conn.sendall(head.replace("\n", "\r\n").encode() + b"\r\n\r\n")
        answer = b""
        while piece := conn.recv(65536):
            answer += piece
        return answer.decode(), time.monotonic() - started


@pytest.mark.server
@pytest.mark.parametrize("path, headers, limit, setting", [
    ("/sql", "Content-Type: application/json", MiB, "TRAJSTORE_SQL_MAX_BODY_BYTES"),
    ("/runs/r/batches?env_id=E", f"Content-Type: {ARROW}\nAuthorization: Bearer {API_KEY}", 256 * MiB,
     "TRAJSTORE_MAX_BODY_BYTES"),
])
def test_a_declared_body_over_the_limit_is_refused_at_once(live: Live, path: str, headers: str, limit: int,
                                                            setting: str) -> None:
    # 2 GB announced, none sent: the answer comes without waiting for a byte of it, and the connection is closed
    answer, took = raw_request(live.url, f"POST {path} HTTP/1.1\nHost: test\n{headers}\nContent-Length: 2000000000")
    head, _, body = answer.partition("\r\n\r\n")
    assert head.startswith("HTTP/1.1 413 ") and "connection: close" in head.lower(), head
    assert "content-type: application/problem+json" in head.lower() and took < 2
    detail = json.loads(body)["detail"]
    assert detail.startswith("request body: its Content-Length of 2000000000 bytes is over the limit of "
                             f"{limit} bytes") and setting in detail and "nothing of it was read" in detail
    assert httpx.post(live.url + "/sql", json={"query": "SELECT 1 AS x"}).json()["rows"] == [{"x": 1}]


@pytest.mark.server
def test_a_chunked_body_is_refused_once_it_passes_the_limit(live: Live) -> None:
    response = httpx.post(live.url + "/sql", content=chunks(64 * MiB), headers={"Content-Type": "application/json"},
                          timeout=60)
    detail = refusal(response, MiB, "TRAJSTORE_SQL_MAX_BODY_BYTES")
    assert "of POST /sql" in detail and "while it was read" in detail
    assert response.headers["connection"] == "close"
    assert httpx.post(live.url + "/sql", json={"query": "SELECT 1 AS x"}).json()["rows"] == [{"x": 1}]


def test_the_longest_query_fits_in_the_sql_limit(client: TestClient) -> None:
    # 100,000 characters, each escaped as \u00e9 in JSON: ~600 kB, under 1 MiB
    query = "SELECT 1 AS x --" + "\u00e9" * (100_000 - 16)
    body = json.dumps({"query": query}).encode()
    assert 500 * KiB < len(body) < MiB
    answer = client.post("/sql", content=body, headers={"Content-Type": "application/json"})
    assert answer.status_code == 200 and answer.json()["rows"] == [{"x": 1}], answer.text[:300]
    longer = json.dumps({"query": query + "\u00e9" * 100_000}).encode()  # 1.2 MB: refused unread
    refusal(client.post("/sql", content=longer, headers={"Content-Type": "application/json"}), MiB,
            "TRAJSTORE_SQL_MAX_BODY_BYTES")


@pytest.fixture
def small_ingest(tmp_path: Path) -> Iterator[Live]:
    trajstore.open(tmp_path / "store", create=True)
    yield from serve(create_app(settings_for(tmp_path / "store", max_body_bytes=100_000)))


@pytest.mark.server
def test_an_ingest_body_over_its_limit_is_refused_declared_or_chunked(small_ingest: Live) -> None:
    url = small_ingest.url + "/runs/r/batches"
    headers = {**AUTH, "Content-Type": ARROW}
    for content in (b"\0" * 200_000, chunks(8 * MiB)):
        response = httpx.post(url, params={"env_id": "E"}, content=content, headers=headers, timeout=60)
        refusal(response, 100_000, "TRAJSTORE_MAX_BODY_BYTES")
    assert trajstore.open(small_ingest.app.state.store.uri).maintain.files() == []
    access = httpx.get(small_ingest.url + "/ingest", headers=AUTH).json()
    assert access["max_body_bytes"] == 100_000


def test_a_route_that_takes_no_body_is_sent_a_small_one_at_most(client: TestClient) -> None:
    detail = refusal(client.request("DELETE", "/runs/nosuchrun", content=b"x" * (body_limit.OTHER_BYTES + 1),
                                    headers=AUTH), body_limit.OTHER_BYTES, "a route that takes no body")
    assert "of DELETE /runs/nosuchrun" in detail
    assert client.request("GET", "/stats", content=b"{}").status_code == 200  # a small body is ignored, as before


@pytest.mark.server
def test_a_chunked_body_within_the_limit_is_read_whole(live: Live) -> None:
    body = b'{"query": "SELECT 42 AS x", "max_rows": 5' + b" " * (MiB - 100) + b"}"  # JSON padded to 1 MiB - 58
    pieces = (body[i:i + 1000] for i in range(0, len(body), 1000))  # in 1,049 pieces
    answer = httpx.post(live.url + "/sql", content=pieces, headers={"Content-Type": "application/json"}, timeout=60)
    assert answer.status_code == 200 and answer.json()["rows"] == [{"x": 42}], answer.text[:300]
