"""The replay routes (issue 50) probed as issue 47 probed the others, against a real ``trajstore serve``: no request
text reaches SQL (a ``where`` is parsed, every other parameter typed), an update's body is bounded on the wire and
decoded (a zstd bomb refused before it is decoded), bad input is a clear 4xx with nothing stored, and nothing is
answered without the API key."""

from __future__ import annotations

import shutil
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import httpx
import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.security.conftest import BUDGETS, CANARY, SECRET, auth
from tests.served import Server
from trajstore.remote.wire import ARROW_STREAM, ipc_bytes

pytestmark = [pytest.mark.server, pytest.mark.security]


@pytest.fixture(scope="module")
def replays(probed: Path, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Server]:
    """One server for this module over a copy of ``probed`` (a replay may make the loaders' array copies beside its
    table, which the session's ``server`` must not): its tests open replays and send updates that are all refused,
    so its ``priorities`` table stays empty, as each of them checks."""
    copy = tmp_path_factory.mktemp("replays") / "store"
    shutil.copytree(probed, copy)
    with Server(copy, **BUDGETS) as live:
        live.store = copy
        yield live


def open_replay(server: Server, **params: Any) -> httpx.Response:
    return httpx.post(server.url + "/replays", params=params, headers=auth(), timeout=60)


def priorities(server: Server) -> int:
    return trajstore.open(server.store).sql("SELECT count(*) AS n FROM priorities").to_pylist()[0]["n"]


@pytest.mark.parametrize("where", [
    "1=1; COPY (SELECT 'x') TO 'canary.txt'",
    "episode_id IN (SELECT episode_id FROM read_csv('canary.txt'))",
    "run_id = 'a' UNION SELECT * FROM read_text('canary.txt')",
    "length(getenv('HOME')) > 0",
])
def test_a_where_is_parsed_never_run_as_sql(replays: Server, probed: Path, where: str) -> None:
    server = replays
    written = sorted(p.name for p in server.store.parent.iterdir())
    answer = open_replay(server, where=where)
    assert answer.status_code == 422, answer.text
    assert answer.json()["detail"].startswith("where")
    assert (probed.parent / CANARY).read_text() == SECRET
    assert sorted(p.name for p in server.store.parent.iterdir()) == written  # no file written beside the store
    assert open_replay(server, where="episode_return > 10", commit="false").status_code == 201


def test_the_routes_answer_nothing_without_the_key(replays: Server) -> None:
    server = replays
    assert httpx.post(server.url + "/replays", timeout=60).status_code == 401
    replay_id = open_replay(server, commit="false", env_id="CartPole-v1").json()["replay_id"]
    for method, path in [("GET", ""), ("GET", "/sample"), ("POST", "/update"), ("POST", "/commit"), ("DELETE", "")]:
        for headers in ({}, {"Authorization": "Bearer not-the-key"}):
            answer = httpx.request(method, f"{server.url}/replays/{replay_id}{path}", headers=headers, timeout=60)
            assert answer.status_code == 401, (method, path, answer.text)
    assert httpx.get(f"{server.url}/replays/{replay_id}/sample", headers=auth(), timeout=60).status_code == 200


def test_an_update_bomb_is_refused_before_it_is_decoded(replays: Server) -> None:
    server = replays
    replay_id = open_replay(server, priorities="bombed", env_id="CartPole-v1").json()["replay_id"]
    n = 20_000_000  # 320 MB of zeros decoded, a few hundred KB of zstd on the wire
    table = pa.table({"index": np.zeros(n, np.int64), "priority": np.zeros(n)})
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as writer:
        writer.write_table(table)
    body = sink.getvalue().to_pybytes()
    assert len(body) < 16 * 1024 * 1024
    before = server.rss(workers=False)
    t = time.monotonic()
    answer = httpx.post(f"{server.url}/replays/{replay_id}/update", content=body,
                        headers={**auth(), "Content-Type": ARROW_STREAM}, timeout=60)
    assert answer.status_code == 413, answer.text
    assert "REPLAY_MAX_BODY_BYTES" in answer.json()["detail"] and time.monotonic() - t < 5
    assert server.rss(workers=False) - before < 64 * 1024 * 1024
    assert httpx.post(f"{server.url}/replays/{replay_id}/commit", headers=auth(), timeout=60).json() == \
        {"version": None}
    assert priorities(server) == 0


def test_a_body_over_the_limit_is_refused_unread(fresh_server: Callable[..., Server]) -> None:
    server = fresh_server(replay_max_body_bytes=4096)
    replay_id = open_replay(server, commit="false", env_id="CartPole-v1").json()["replay_id"]
    body = ipc_bytes(pa.table({"index": np.zeros(1000, np.int64), "priority": np.ones(1000)}))
    answer = httpx.post(f"{server.url}/replays/{replay_id}/update", content=body,
                        headers={**auth(), "Content-Type": ARROW_STREAM}, timeout=60)
    assert answer.status_code == 413 and "REPLAY_MAX_BODY_BYTES" in answer.json()["detail"]


@pytest.mark.parametrize("params", [
    {"alpha": "nan"}, {"beta": "inf"}, {"eps": "-1e-9"}, {"capacity": "1e3"}, {"length": "2**40"},
    {"priorities": "x'; DROP TABLE priorities; --"}, {"priorities": "a" * 200}, {"draw_seed": "abc"},
    {"poll": "1e9"}, {"columns": "obs) FROM steps; --"}, {"agent_id": "x", "run_id": "nope"}, {"version": "1"},
])
def test_bad_parameters_are_a_4xx_and_open_nothing(replays: Server,
                                                   params: dict[str, Any]) -> None:
    server = replays
    answer = open_replay(server, **params)
    assert 400 <= answer.status_code < 500 and answer.headers["content-type"] == "application/problem+json", \
        answer.text
    assert answer.json()["detail"]
    assert priorities(server) == 0


def test_bad_updates_store_nothing(replays: Server) -> None:
    server = replays
    replay_id = open_replay(server, priorities="probed", env_id="CartPole-v1").json()["replay_id"]
    url = f"{server.url}/replays/{replay_id}"
    for table in (pa.table({"index": [0, 1], "priority": [1.0, -5.0]}),
                  pa.table({"index": [0, 2**40], "priority": [1.0, 1.0]}),
                  pa.table({"index": [0], "priority": [float("inf")]}),
                  pa.table({"index": pa.array([2**64 - 1], pa.uint64()), "priority": [1.0]}),
                  pa.table({"index": [0], "priority": pa.array([None], pa.float64())})):
        answer = httpx.post(url + "/update", content=ipc_bytes(table),
                            headers={**auth(), "Content-Type": ARROW_STREAM}, timeout=60)
        assert answer.status_code == 422, answer.text
    assert httpx.delete(url, headers=auth(), timeout=60).json()["version"] is None  # nothing to commit
    assert priorities(server) == 0
