"""Keyset cursors of the JSON pages of ``/steps`` and ``/episodes``: walking every page gives every row once,
in order, equal to one full read."""

from __future__ import annotations

import base64
import json
from typing import Any, Iterator

import numpy as np
import pytest
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import settings_for, steps_batch
from trajstore.api.app import create_app


@pytest.fixture(scope="module")
def client(tmp_path_factory: pytest.TempPathFactory) -> Iterator[TestClient]:
    path = tmp_path_factory.mktemp("cursors") / "store"
    store = trajstore.open(path, create=True)
    rng = np.random.default_rng(3)
    for run in ("a", "b"):
        with store.writer(run_id=run, env_id="Toy-v0") as w:
            for _ in range(4):
                w.add_batch(steps_batch(rng, 10, 6, p_done=0.15))
                w.flush()
    with TestClient(create_app(settings_for(path))) as c:
        yield c


def walk(client: TestClient, path: str, params: dict[str, Any]) -> list[dict[str, Any]]:
    items, cursor, pages = [], None, 0
    while True:
        body = client.get(path, params={**params, **({"cursor": cursor} if cursor else {})}).json()
        items += body["items"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            assert len(body["items"]) < params["limit"] or body["items"] == []
            return items
        assert pages < 10_000


@pytest.mark.slow
@pytest.mark.parametrize("limit", [3, 37, 1000])  # 3: 80 pages, most ending inside an episode
def test_steps_pages_by_cursor_give_every_row_once_in_order(client: TestClient, limit: int) -> None:
    store: trajstore.Store = client.app.state.store
    params = {"format": "json", "limit": limit, "columns": "episode_id,step,reward", "run_id": "b"}  # 240 rows
    got = walk(client, "/steps", params)
    full = store.sql("SELECT episode_id, step, reward FROM steps WHERE run_id = 'b' ORDER BY episode_id, step")
    full = full.to_pylist()
    assert [(int(r["episode_id"]), r["step"]) for r in got] == [(r["episode_id"], r["step"]) for r in full]
    assert [r["reward"] for r in got] == pytest.approx([r["reward"] for r in full])


def test_steps_cursor_keeps_the_filter_and_the_columns_asked(client: TestClient) -> None:
    store: trajstore.Store = client.app.state.store
    got = walk(client, "/steps", {"format": "json", "limit": 100, "columns": "reward", "run_id": "b"})  # 3 pages
    assert set(got[0]) == {"reward"}
    assert len(got) == store.sql("SELECT count(*) AS n FROM steps WHERE run_id = 'b'")["n"][0].as_py()


@pytest.mark.parametrize("order_by", ["episode_id", "-episode_id"])
def test_episode_pages_by_cursor_give_every_episode_once_in_order(client: TestClient, order_by: str) -> None:
    store: trajstore.Store = client.app.state.store
    got = walk(client, "/episodes", {"limit": 15, "order_by": order_by})  # 6 pages
    full = store.episodes(order_by=order_by)["episode_id"].to_pylist()
    assert [r["episode_id"] for r in got] == [str(e) for e in full]  # decimal strings: exact in any JSON reader
    first = client.get("/episodes", params={"limit": 15, "order_by": order_by}).json()
    assert first["total"] == len(full)


def test_offset_pages_still_work_and_say_where_the_next_cursor_is(client: TestClient) -> None:
    body = client.get("/steps", params={"format": "json", "limit": 5, "offset": 5, "columns": "episode_id,step"}).json()
    after = client.get("/steps", params={"format": "json", "limit": 5, "cursor": body["next_cursor"]}).json()
    ten = client.get("/steps", params={"format": "json", "limit": 15, "columns": "episode_id,step"}).json()["items"]
    assert body["items"] == ten[5:10]
    assert [(r["episode_id"], r["step"]) for r in after["items"]] == [(r["episode_id"], r["step"]) for r in ten[10:]]


def cursor(key: list) -> str:
    return base64.urlsafe_b64encode(json.dumps(key).encode()).decode().rstrip("=")


@pytest.mark.parametrize(("path", "params", "message"), [
    ("/steps", {"format": "json", "cursor": "garbage!"}, "cursor: not a cursor of this page"),
    ("/episodes", {"cursor": "WzEsMl0"}, "cursor: not a cursor of this page"),
    ("/episodes", {"cursor": cursor([2**63])}, "cursor: not a cursor of this page"),  # no episode_id is that large
    ("/steps", {"format": "json", "cursor": cursor([-(2**63) - 1, 0])}, "cursor: not a cursor of this page"),
    ("/steps", {"format": "json", "cursor": cursor([[[[[[1]]]]], 0])}, "cursor: not a cursor of this page"),
    ("/steps", {"format": "json", "cursor": cursor([1, 0, 2])}, "cursor: not a cursor of this page"),  # agent: text
    ("/steps", {"format": "json", "cursor": cursor([1, 0, ""])}, "cursor: not a cursor of this page"),
    ("/steps", {"format": "json", "cursor": cursor([1, 0, "a", "b"])}, "cursor: not a cursor of this page"),
    ("/episodes", {"cursor": cursor([1, "a"])}, "cursor: not a cursor of this page"),
    ("/steps", {"format": "json", "cursor": base64.urlsafe_b64encode(b"[" * 140).decode()},
     "cursor: not a cursor of this page"),
    ("/episodes", {"cursor": "WzFd", "order_by": "-episode_return"}, "pages with a cursor are in episode_id order")])
def test_bad_cursors_are_refused_with_the_reason(client: TestClient, path: str, params: dict, message: str) -> None:
    r = client.get(path, params=params)
    assert r.status_code == 422 and message in r.text
