"""Bad input anywhere is a 4xx problem document naming the parameter, never a 500, and the keep-alive
connection it came on stays usable (a 500 made uvicorn drop it)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Iterator
from urllib.parse import urlencode, urlsplit

import pytest

from tests.api.helpers import Live, serve, settings_for
from tests.api.test_runs import small_store
from trajstore.api.app import create_app

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
