"""An unexpected error is a 500 problem document, and the client's keep-alive connection stays usable after it
(Starlette's own handler of ``Exception`` re-raises, and uvicorn then closes the connection)."""

from __future__ import annotations

import http.client
import json
from pathlib import Path
from typing import Iterator

import pytest

import trajstore
from tests.api.helpers import Live, serve, settings_for
from trajstore.api.app import create_app

pytestmark = pytest.mark.server  # the tiers: tests/tiers.py


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    trajstore.open(tmp_path / "store", create=True)
    app = create_app(settings_for(tmp_path / "store"))

    def boom() -> None:
        raise RuntimeError("a bug")

    app.add_api_route("/boom", boom)
    yield from serve(app)


def test_a_500_keeps_the_connection(live: Live) -> None:
    host, port = live.url.removeprefix("http://").split(":")
    conn = http.client.HTTPConnection(host, int(port), timeout=10)
    try:
        conn.request("GET", "/boom")
        response = conn.getresponse()
        body = json.loads(response.read())
        assert response.status == 500 and response.getheader("Content-Type") == "application/problem+json"
        assert body["detail"] == "internal error; see the server log" and "a bug" not in json.dumps(body)
        assert (response.getheader("Connection") or "").lower() != "close"
        local = conn.sock.getsockname()
        conn.request("GET", "/health")  # on the same socket: a closed one would fail here (or reconnect)
        again = conn.getresponse()
        assert again.status == 200 and json.loads(again.read())["status"] == "ok"
        assert conn.sock is not None and conn.sock.getsockname() == local
    finally:
        conn.close()
