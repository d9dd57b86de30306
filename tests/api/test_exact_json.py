"""64-bit integers over JSON (trajstore/api/ints.py): episode ids are decimal strings in every JSON body, any other
integer beyond ±(2**53 - 1) too; inputs take them as strings or numbers; the Client and Arrow keep int64.

The store holds two episodes whose ids are one apart above 2**62, so a reader that parses JSON numbers as doubles
(JavaScript's ``JSON.parse``, jq) would read both as the same number: ``as_double`` reads the bodies that way."""

from __future__ import annotations

import base64
import json
from pathlib import Path
from typing import Any, Iterator

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

from tests.api.helpers import ID_A, ID_B, LENGTHS, SEED, VERSIONS, Live, serve, settings_for, write_adjacent_ids
from trajstore.api.app import create_app
from trajstore.remote.client import Client

ARROW = {"Accept": "application/vnd.apache.arrow.stream"}


@pytest.fixture(scope="module")
def store_path(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("exact") / "store"
    write_adjacent_ids(path)
    return path


@pytest.fixture(scope="module")
def client(store_path: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(store_path))) as c:
        yield c


def as_double(text: str) -> Any:
    """The body as JavaScript's JSON.parse reads it: every JSON number a double."""
    return json.loads(text, parse_int=float)


def test_the_two_ids_are_one_double() -> None:
    assert ID_A != ID_B and float(ID_A) == float(ID_B)


def test_episode_pages_carry_ids_and_large_integers_as_strings(client: TestClient) -> None:
    body = as_double(client.get("/episodes", params={"limit": 2}).text)
    items = {e["episode_id"]: e for e in body["items"]}
    assert set(items) == {str(ID_A), str(ID_B)}  # two episodes, two ids, for a reader of doubles too
    assert {k: e["episode_length"] for k, e in items.items()} == {str(ID_A): 3.0, str(ID_B): 5.0}
    assert {e["seed"] for e in items.values()} == {str(SEED)}
    assert items[str(ID_A)]["policy_version"] == 7 and items[str(ID_B)]["policy_version"] == str(VERSIONS[ID_B])
    arrow = pa.ipc.open_stream(client.get("/episodes", headers=ARROW).content).read_all()
    assert arrow.schema.field("episode_id").type == pa.int64()  # Arrow unchanged
    assert sorted(arrow["episode_id"].to_pylist()) == [ID_A, ID_B]


@pytest.mark.parametrize("episode_id", [ID_A, ID_B])
def test_steps_of_an_id_past_two_to_the_53_are_that_episodes(client: TestClient, episode_id: int) -> None:
    body = as_double(client.get(f"/episodes/{episode_id}/steps").text)
    assert body["episode_id"] == str(episode_id)
    assert [s["step"] for s in body["steps"]] == list(range(LENGTHS[episode_id]))
    assert {s["episode_id"] for s in body["steps"]} == {str(episode_id)}
    assert {s["reward"] for s in body["steps"]} == {1.0 if episode_id == ID_A else 2.0}


def test_an_id_past_int64_is_refused_naming_it(client: TestClient) -> None:
    for path in (f"/episodes/{2**63}/steps", f"/episodes?episode_id={-(2**63) - 1}", "/episodes/1e3/steps"):
        response = client.get(path)
        assert response.status_code == 422, path
        assert "episode_id" in response.text


def test_filters_take_ids_as_strings_or_numbers(client: TestClient) -> None:
    # On the wire a number and a decimal string are the same characters; httpx sends an int as its digits.
    for value in (str(ID_B), ID_B):
        page = client.get("/episodes", params={"episode_id": value}).json()
        assert [e["episode_id"] for e in page["items"]] == [str(ID_B)]
    seeded = client.get("/episodes", params={"seed": str(SEED), "policy_version": VERSIONS[ID_B]}).json()
    assert [e["episode_id"] for e in seeded["items"]] == [str(ID_B)]


def test_step_pages_and_their_cursors_are_exact(client: TestClient) -> None:
    items, cursor, pages = [], None, 0
    while True:
        body = as_double(client.get("/steps", params={"format": "json", "limit": 2, "columns": "episode_id,step",
                                                      **({"cursor": cursor} if cursor else {})}).text)
        items += body["items"]
        pages += 1
        cursor = body["next_cursor"]
        if cursor is None:
            break
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        assert all(isinstance(k, str) for k in key)  # the cursor's own key is exact too
    assert pages == 5
    assert [(r["episode_id"], r["step"]) for r in items] == \
        [(str(ID_A), float(s)) for s in range(3)] + [(str(ID_B), float(s)) for s in range(5)]


def test_a_cursor_of_json_numbers_is_taken(client: TestClient) -> None:
    cursor = base64.urlsafe_b64encode(json.dumps([ID_A, 2]).encode()).decode().rstrip("=")
    body = client.get("/steps", params={"format": "json", "columns": "episode_id,step", "cursor": cursor}).json()
    assert [(r["episode_id"], r["step"]) for r in body["items"]] == [(str(ID_B), s) for s in range(5)]


def test_stats_and_returns_by_episode_are_exact(client: TestClient) -> None:
    stats = as_double(client.get("/stats", params={"by": "episode_id"}).text)
    assert {r["episode_id"]: r["len_mean"] for r in stats} == {str(ID_A): 3.0, str(ID_B): 5.0}
    per_step = as_double(client.get("/returns", params={"gamma": 1.0, "per": "step"}).text)
    assert sorted({r["episode_id"] for r in per_step}) == [str(ID_A), str(ID_B)] and len(per_step) == 8


def test_sql_json_rows_follow_the_rule_and_arrow_keeps_int64(client: TestClient) -> None:
    query = ("SELECT episode_id, seed, count(*) AS n, max(episode_id) OVER () AS last, [episode_id, 1] AS pair, "
             "NULL::BIGINT AS nothing FROM steps GROUP BY episode_id, seed ORDER BY episode_id")
    body = as_double(client.post("/sql", json={"query": query}).text)
    assert body["columns"] == ["episode_id", "seed", "n", "last", "pair", "nothing"]
    assert body["rows"] == [{"episode_id": str(e), "seed": str(SEED), "n": float(LENGTHS[e]), "last": str(ID_B),
                             "pair": [str(e), 1.0], "nothing": None} for e in (ID_A, ID_B)]
    small = client.post("/sql", json={"query": "SELECT 2::BIGINT ** 53 - 1 AS safe, (2::BIGINT ** 53)::BIGINT AS "
                                                "past, -(2::BIGINT ** 53)::BIGINT AS below"}).json()
    assert small["rows"] == [{"safe": 2**53 - 1, "past": str(2**53), "below": str(-(2**53))}]
    arrow = pa.ipc.open_stream(client.post("/sql", json={"query": query}, headers=ARROW).content).read_all()
    assert arrow["episode_id"].to_pylist() == [ID_A, ID_B] and arrow.schema.field("seed").type == pa.int64()


def test_curves_keep_ids_and_large_versions_exact(client: TestClient) -> None:
    series = as_double(client.get("/curves").text)["series"]
    assert len(series) == 1
    assert series[0]["episode_id"] == [str(ID_A), str(ID_B)]
    assert series[0]["policy_version"] == [7.0, str(VERSIONS[ID_B])]


def test_openapi_says_strings_or_numbers_in_and_strings_out(client: TestClient) -> None:
    doc = client.get("/openapi.json").json()
    steps = doc["paths"]["/episodes/{episode_id}/steps"]["get"]
    schema = next(p for p in steps["parameters"] if p["name"] == "episode_id")["schema"]
    assert [s["type"] for s in schema["anyOf"]] == ["integer", "string"]
    filters = {p["name"]: p["schema"] for p in doc["paths"]["/episodes"]["get"]["parameters"]}
    for name in ("episode_id", "seed", "policy_version"):
        assert [s["type"] for s in filters[name]["items"]["anyOf"]] == ["integer", "string"]
    assert doc["components"]["schemas"]["StepRows"]["properties"]["episode_id"]["type"] == "string"
    rows = doc["components"]["schemas"]["SqlResult"]["properties"]["rows"]
    assert "2**53" in rows["description"] and rows["items"]["properties"]["episode_id"]["anyOf"][0]["type"] == "string"
    stats = doc["paths"]["/stats"]["get"]["responses"]["200"]["content"]["application/json"]["schema"]
    assert "decimal string" in stats["items"]["description"]


@pytest.fixture(scope="module")
def live(store_path: Path) -> Iterator[Live]:
    yield from serve(create_app(settings_for(store_path)))


@pytest.mark.server
def test_the_client_gives_ints_back(live: Live) -> None:
    with Client(live.url) as client:
        assert sorted(client.episodes()["episode_id"].to_pylist()) == [ID_A, ID_B]
        assert client.episodes(episode_id=str(ID_B))["episode_id"].to_pylist() == [ID_B]
        steps = client.episode_steps(str(ID_A))
        assert steps.schema.field("episode_id").type == pa.int64() and set(steps["episode_id"].to_pylist()) == {ID_A}
        rows = client.sql("SELECT episode_id, seed FROM episodes ORDER BY episode_id", as_="dicts")
        assert rows == [{"episode_id": ID_A, "seed": SEED}, {"episode_id": ID_B, "seed": SEED}]
        assert sorted(client.stats(by="episode_id")["episode_id"].to_pylist()) == [ID_A, ID_B]
