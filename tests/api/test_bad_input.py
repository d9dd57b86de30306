"""Bad input anywhere is a 4xx problem document naming the parameter, never a 500, and the keep-alive
connection it came on stays usable (a 500 made uvicorn drop it); an ingest body the store cannot hold is refused
before anything is written or committed."""

from __future__ import annotations

import http.client
import json
import socket
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import urlencode, urlsplit

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import API_KEY, Live, serve, settings_for
from tests.api.test_ingest import ARROW
from tests.api.test_ingest import rows as ingest_rows
from tests.api.test_runs import small_store
from trajstore.api.app import create_app
from trajstore.remote.wire import ipc_bytes

NESTED = "[" * 5000 + "]" * 5000
STATE = {"kind": "sequences", "digest": "0" * 32, "epoch": 0, "position": 0}
BAD_RESUMES = [
    NESTED,  # past the JSON decoder's recursion limit
    "[" * 500 + "]" * 500,  # within it, but no state
    "{" * 300,
    json.dumps({**STATE, "kind": [[[[["deep"]]]]]}),
    json.dumps({**STATE, "epoch": "0"}),
    json.dumps({**STATE, "position": 1e300}),
    json.dumps({**STATE, "position": -1}),
    json.dumps({**STATE, "digest": None}),
    "1" * 5000,  # an integer of more digits than Python converts
    "null",
    '"text"',
]


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Live]:
    path = tmp_path_factory.mktemp("bad") / "store"
    small_store(path)
    yield from serve(create_app(settings_for(path)))


def connection(live: Live) -> http.client.HTTPConnection:
    url = urlsplit(live.url)
    return http.client.HTTPConnection(url.hostname, url.port, timeout=30)


def get(conn: http.client.HTTPConnection, path: str, params: dict) -> tuple[int, dict, bool]:
    """One request on ``conn``: the status, the JSON body, and whether the server keeps the connection."""
    conn.request("GET", f"{path}?{urlencode(params)}")
    response = conn.getresponse()
    body = response.read()
    return response.status, json.loads(body) if body[:1] == b"{" else {}, not response.will_close


@pytest.mark.server
@pytest.mark.parametrize("path,params", [("/sequences", {"length": 2}), ("/transitions", {"n": 1, "gamma": 0.9})])
def test_a_bad_resume_is_422_naming_it_and_the_connection_stays(live: Live, path: str, params: dict) -> None:
    conn = connection(live)
    try:
        conn.connect()
        sock = conn.sock
        for resume in BAD_RESUMES:
            status, problem, kept = get(conn, path, {**params, "resume": resume})
            assert status == 422 and "resume" in problem["detail"], (resume[:40], status, problem)
            assert len(problem["detail"]) < 600, problem["detail"]  # a bounded message, however large the input
            assert kept and conn.sock is sock, resume[:40]
        status, _, kept = get(conn, "/stats", {})
        assert status == 200 and kept and conn.sock is sock
    finally:
        conn.close()


@pytest.mark.server
@pytest.mark.parametrize("params", [{"version": "abc"}, {"version": str(2**70)}, {"cursor": "%%%"},
                                    {"cursor": "WzkyMjMzNzIwMzY4NTQ3NzU4MDhd"}, {"limit": "-1"}])
def test_junk_parameters_keep_the_connection(live: Live, params: dict) -> None:
    conn = connection(live)
    try:
        for path in ("/episodes", "/steps"):
            status, problem, kept = get(conn, path, {**params, "format": "json"} if path == "/steps" else params)
            assert status == 422 and next(iter(params)) in problem["detail"] and kept, (path, status, problem)
        assert get(conn, "/health", {})[0] == 200
    finally:
        conn.close()


@pytest.mark.server
def test_the_longest_filter_the_schema_allows_gets_an_answer_from_the_app(live: Live) -> None:
    """A ``where`` of 10,000 characters (the schema's most), each percent-encoded as 12 bytes, is a request head
    of 120 KB; arriving in pieces, it passed uvicorn's default 16 KiB for an unfinished head, which answered a bare
    400 in plain text (schemathesis found it)."""
    url = urlsplit(live.url)
    for n, status, says in [(10_000, 422, "where: unexpected"), (10_001, 422, "at most 10000 characters")]:
        query = urlencode({"by": "run_id", "where": "\U000f3d6e" * n})
        head = f"GET /compare?{query} HTTP/1.1\r\nHost: {url.netloc}\r\nConnection: close\r\n\r\n".encode()
        with socket.create_connection((url.hostname, url.port), timeout=30) as sock:
            for i in range(0, len(head), 8192):  # as a slow client, or a busy loopback, delivers it
                sock.sendall(head[i:i + 8192])
                time.sleep(0.002)
            answer = http.client.HTTPResponse(sock)
            answer.begin()
            body = answer.read()
        assert answer.status == status and answer.getheader("content-type") == "application/problem+json", \
            (answer.status, body[:200])
        assert says in json.loads(body)["detail"]


def extra(name: str, values: pa.Array) -> pa.Table:
    return ingest_rows(n_episodes=1, length=4, first_id=99).append_column(name, values)


BAD_BODIES = {
    "a union": (extra("u", pa.UnionArray.from_sparse(pa.array([0, 1, 0, 1], pa.int8()),
                                                     [pa.array([1, 2, 3, 4]), pa.array(list("abcd"))])), "u"),
    "an extension type": (extra("id", pa.array([b"0" * 16] * 4, pa.uuid())), "id"),
    "a timestamp in another zone": (extra("w", pa.array([1, 2, 3, 4], pa.timestamp("ns", tz="Mars/Olympus"))), "w"),
    "decimals": (extra("d", pa.array([1, 2, 3, 4], pa.decimal128(5, 2))), "d"),
    "a map": (extra("m", pa.array([[("k", 1)]] * 4, pa.map_(pa.string(), pa.int64()))), "m"),
    "nulls": (extra("x", pa.nulls(4)), "x"),
    "dictionary strings": (extra("c", pa.array(list("abab")).dictionary_encode()), "c"),
    "a struct field of a bad type": (extra("s", pa.array([{"a": {"b": 1}}] * 4, pa.struct(
        [("a", pa.struct([("b", pa.decimal128(5, 2))]))]))), "s.a.b"),
    "a column twice": (pa.Table.from_arrays([*ingest_rows(1, 4, first_id=99).columns, pa.array([99] * 4)],
                                            names=[*ingest_rows(1, 4).column_names, "episode_id"]), "episode_id"),
    "an episode that does not continue": (extra("fine", pa.array([1.0] * 4)).set_column(
        1, "step", pa.array([5, 6, 7, 8], pa.int32())), "step"),
}


@pytest.mark.parametrize("case", sorted(BAD_BODIES))
def test_a_body_the_store_cannot_hold_is_422_and_changes_nothing(tmp_path: Path, case: str) -> None:
    store = trajstore.open(tmp_path / "s", create=True)
    auth = {"Authorization": f"Bearer {API_KEY}", "content-type": ARROW}
    body, field = BAD_BODIES[case]
    with TestClient(create_app(settings_for(tmp_path / "s"))) as c:
        first = c.post("/runs/r/batches", params={"env_id": "E"}, content=ipc_bytes(ingest_rows(2, 4)), headers=auth)
        assert first.status_code == 201, first.text
        history, schema = store.history(), store.schema()
        r = c.post("/runs/r/batches", params={"env_id": "E"}, content=ipc_bytes(body), headers=auth)
        assert r.status_code == 422 and r.json()["detail"].startswith(f"{field}:"), r.text
        assert store.history().num_rows == history.num_rows and store.schema() == schema  # not even a new column
        again = c.post("/runs/r/batches", params={"env_id": "E"}, content=ipc_bytes(ingest_rows(1, 4, first_id=7)),
                       headers=auth)
        assert again.status_code == 201 and c.get("/stats").json()[0]["n_traj"] == 3
