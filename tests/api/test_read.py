"""The read endpoints answer what the store answers, as JSON or Arrow, with problem+json errors."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import Live, settings_for
from tests.helpers import assert_same_stats
from trajstore.api.app import create_app

ARROW = {"Accept": "application/vnd.apache.arrow.stream"}


def test_health_and_readiness(client: TestClient, populated: Path) -> None:
    health = client.get("/health").json()
    store = trajstore.open(populated)
    assert health["status"] == "ok" and health["version"] == store.version
    assert 0 <= health["versions_since_checkpoint"] <= store.version + 1
    ready = client.get("/ready").json()
    assert ready["status"] == "ready" and ready["files"] == len(trajstore.open(populated).maintain.files())


def test_runs_count_episodes_and_steps(client: TestClient, populated: Path) -> None:
    runs = {r["run_id"]: r for r in client.get("/runs").json()}
    store = trajstore.open(populated)
    for run_id, run in runs.items():
        expected = store.sql(f"SELECT count(*) AS n FROM steps WHERE run_id = '{run_id}'").column("n")[0].as_py()
        assert run["steps"] == expected == sum(e["steps"] for e in run["envs"])
    assert sorted(runs) == ["alpha", "beta"]
    assert sorted(e["env_id"] for e in runs["alpha"]["envs"]) == ["Acrobot-v1", "CartPole-v1"]
    assert runs["beta"]["complete_episodes"] >= 30 and runs["beta"]["last_write"]


def test_stats_match_the_store(client: TestClient, populated: Path) -> None:
    got = client.get("/stats", params={"by": ["run_id", "env_id"], "gamma": 0.9}).json()
    expected = trajstore.open(populated).stats(by=["run_id", "env_id"], gamma=0.9).to_pylist()
    assert len(got) == len(expected) == 3
    for g, e in zip(got, expected):
        assert g.keys() == e.keys()
        for k in e:
            assert g[k] == (pytest.approx(e[k]) if isinstance(e[k], float) else e[k])


def test_stats_as_arrow(client: TestClient) -> None:
    response = client.get("/stats", params={"run_id": "beta"}, headers=ARROW)
    assert response.headers["content-type"] == "application/vnd.apache.arrow.stream"
    table = pa.ipc.open_stream(response.content).read_all()
    assert table.column("n_traj")[0].as_py() == client.get("/stats", params={"run_id": "beta"}).json()[0]["n_traj"]


def test_episodes_filter_sort_paginate(client: TestClient, populated: Path) -> None:
    params = {"run_id": "alpha", "env_id": "CartPole-v1", "complete": "true", "min_return": 15,
              "order_by": "-episode_return", "limit": 7}
    first = client.get("/episodes", params=params).json()
    second = client.get("/episodes", params={**params, "offset": 7}).json()
    store = trajstore.open(populated)
    expected = store.episodes(run_id="alpha", env_id="CartPole-v1", complete=True, where="episode_return >= 15",
                              order_by="-episode_return")
    assert first["total"] == expected.num_rows and first["limit"] == 7
    ids = [e["episode_id"] for e in first["items"] + second["items"]]
    assert ids == [str(e) for e in expected.column("episode_id").to_pylist()[:14]]
    returns = [e["episode_return"] for e in first["items"]]
    assert returns == sorted(returns, reverse=True) and min(returns) >= 15
    beyond = client.get("/episodes", params={**params, "offset": expected.num_rows}).json()
    assert beyond["items"] == [] and beyond["total"] == expected.num_rows  # a page past the end still counts


def test_episodes_by_several_keys(client: TestClient, populated: Path) -> None:
    page = client.get("/episodes", params={"order_by": "-complete,-ended_at", "limit": 1000}).json()
    want = trajstore.open(populated).episodes(order_by="-complete,-ended_at")["episode_id"].to_pylist()
    assert [e["episode_id"] for e in page["items"]] == [str(e) for e in want][:page["limit"]]
    complete = [e["complete"] for e in page["items"]]
    assert complete == sorted(complete, reverse=True) and False in complete
    for bad in ("-complete,", "complete,,ended_at", "-complete;ended_at"):
        response = client.get("/episodes", params={"order_by": bad})
        assert response.status_code == 422 and "order_by" in response.text, bad


def test_episodes_lineage_filter(client: TestClient) -> None:
    page = client.get("/episodes", params={"mode": "eval", "limit": 1000}).json()
    assert page["total"] > 0 and {e["run_id"] for e in page["items"]} == {"beta"}
    assert {e["policy_version"] for e in page["items"]} == {2}
    none = client.get("/episodes", params={"policy_version": 99}).json()
    assert none["total"] == 0 and none["items"] == []


def test_page_size_has_a_hard_maximum(populated: Path) -> None:
    with TestClient(create_app(settings_for(populated, max_page_size=5))) as c:
        page = c.get("/episodes", params={"limit": 1000}).json()
    assert page["limit"] == 5 and len(page["items"]) == 5 and page["total"] > 5


def test_episode_steps_in_order(client: TestClient, populated: Path) -> None:
    episode = client.get("/episodes", params={"complete": "true", "limit": 1, "order_by": "-episode_length"}).json()
    eid, length = episode["items"][0]["episode_id"], episode["items"][0]["episode_length"]
    body = client.get(f"/episodes/{eid}/steps", params={"columns": ["reward", "terminated"]}).json()
    assert [s["step"] for s in body["steps"]] == list(range(length))
    assert set(body["steps"][0]) == {"step", "reward", "terminated"}
    arrow = pa.ipc.open_stream(client.get(f"/episodes/{eid}/steps", headers=ARROW).content).read_all()
    assert arrow.num_rows == length and "obs" in arrow.column_names


def test_returns_per_episode_and_per_step(client: TestClient, populated: Path) -> None:
    store = trajstore.open(populated)
    eid = store.episodes(complete=True, limit=1).column("episode_id")[0].as_py()
    per_step = client.get("/returns", params={"gamma": 0.5, "per": "step", "episode_id": eid}).json()
    expected = store.returns(gamma=0.5, per="step", episode_id=eid).column("return_to_go").to_pylist()
    assert [r["return_to_go"] for r in per_step] == pytest.approx(expected)
    per_episode = client.get("/returns", params={"gamma": 0.5, "episode_id": eid}).json()
    assert per_episode[0]["discounted_return"] == pytest.approx(expected[0])


@pytest.mark.parametrize("url, status, words", [
    ("/episodes/12345/steps", 404, "no such episode"),
    ("/episodes?order_by=height", 422, "order_by: unknown column"),
    ("/stats?gamma=1.5", 422, "gamma"),
    ("/stats?by=colour", 422, "by: unknown column"),
    ("/returns", 422, "gamma"),
    ("/steps?columns=nope", 422, "nope"),
    ("/nowhere", 404, "Not Found"),
])
def test_errors_are_problem_documents(client: TestClient, url: str, status: int, words: str) -> None:
    response = client.get(url)
    assert response.status_code == status
    assert response.headers["content-type"] == "application/problem+json"
    problem = response.json()
    assert problem["status"] == status and problem["title"]
    assert words in (problem.get("detail") or "") + problem["title"]


def test_openapi_declares_problem_responses(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    assert "Problem" in spec["components"]["schemas"]
    for path, methods in spec["paths"].items():
        for method, op in methods.items():
            for code in ("422", "500"):
                assert "application/problem+json" in op["responses"][code]["content"], (method, path, code)


READS = ["/runs", "/episodes", "/stats", "/returns?gamma=0.9", "/returns?gamma=0.9&per=step", "/steps",
         "/steps?format=json", "/curves", "/schema"]


@pytest.mark.parametrize("damage", ["delete", "garble"])
def test_a_damaged_committed_file_is_503_naming_it_and_ready_fails(populated: Path, tmp_path: Path,
                                                                    damage: str) -> None:
    import shutil

    copy = tmp_path / "store"
    shutil.copytree(populated, copy)
    victim = trajstore.open(copy).maintain.files()[0].path
    if damage == "delete":
        Path(victim).unlink()
    else:  # same size, not Parquet any more: only reading it tells
        Path(victim).write_bytes(b"\0" * Path(victim).stat().st_size)
    with TestClient(create_app(settings_for(copy))) as c:
        for url in [*READS, f"/episodes/{_first_episode(copy)}/steps"]:
            response = c.get(url)
            assert response.status_code == 503, (url, response.status_code, response.text[:300])
            detail = response.json()["detail"]
            assert victim in detail and "trajstore check" in detail, (url, detail)
        sql = c.post("/sql", json={"query": "SELECT count(*) FROM steps"})
        assert sql.status_code == 503 and victim in sql.json()["detail"]
        ready = c.get("/ready")
        assert ready.status_code == 503 and victim in ready.json()["detail"]
        health = c.get("/health")  # the process itself is alive, and says what it found
        assert health.status_code == 200 and health.json()["status"] == "degraded"
        assert victim in health.json()["problem"]  # a garbled file of the right size: as a read found it


def _first_episode(path: Path) -> int:
    import pyarrow.parquet as pq

    last = trajstore.open(path).maintain.files()[-1].path
    return pq.read_table(last, columns=["episode_id"])["episode_id"][0].as_py()


def test_a_run_the_store_lacks_is_404_naming_it(client: TestClient) -> None:
    for params in ({"run_id": "nosuchrun"}, {"run_id": ["alpha", "nosuchrun"]}):
        for path in ("/stats", "/episodes"):
            response = client.get(path, params=params)
            assert response.status_code == 404
            assert "run_id: no run 'nosuchrun' in " in response.json()["detail"]
            assert response.json()["detail"].endswith("; its runs: alpha, beta")
    assert "no run 'caf\u00e9'" in client.get("/stats", params={"run_id": "caf\u00e9"}).json()["detail"]
    assert client.get("/stats", params={"run_id": "alpha"}).status_code == 200


def test_one_run_or_404(client: TestClient) -> None:
    alpha = client.get("/runs/alpha").json()
    assert alpha["run_id"] == "alpha" and {e["env_id"] for e in alpha["envs"]} == {"CartPole-v1", "Acrobot-v1"}
    missing = client.get("/runs/nosuchrun")
    assert missing.status_code == 404 and "no run 'nosuchrun'" in missing.json()["detail"]


@pytest.mark.server
def test_group_by_as_a_name_a_list_or_comma_separated(live: Live, populated: Path) -> None:
    store = trajstore.open(populated)
    want = store.stats(by=["run_id", "env_id"])
    assert_same_stats(store.stats(by="run_id,env_id"), want)
    with trajstore.Client(live.url) as c:
        assert_same_stats(c.stats(by=["run_id", "env_id"]), want)
        assert_same_stats(c.stats(by="run_id,env_id"), want)
        assert_same_stats(c.stats(by="run_id"), store.stats(by="run_id"))


def test_unknown_columns_are_one_status_and_one_message_everywhere(client: TestClient) -> None:
    for url, field, view in (("/steps?columns=nope", "columns", "steps"),
                             ("/steps?format=json&columns=step,nope", "columns", "steps"),
                             (f"/episodes/{1}/steps?columns=nope", "columns", "steps"),
                             ("/stats?by=nope", "by", "episodes"),
                             ("/episodes?order_by=-nope", "order_by", "episodes")):
        response = client.get(url)
        assert response.status_code == 422, url
        assert response.json()["detail"].startswith(f"{field}: unknown column(s) ['nope'] of {view}; expected"), url


def test_a_single_valued_parameter_given_twice_is_refused(client: TestClient) -> None:
    response = client.get("/episodes", params=[("complete", "true"), ("complete", "false")])
    assert response.status_code == 422 and response.json()["detail"].startswith("complete: given 2 times")
    assert client.get("/episodes", params=[("run_id", "alpha"), ("run_id", "beta")]).status_code == 200


@pytest.mark.slow
def test_each_route_refuses_a_repeat_of_what_its_openapi_document_says_takes_one_value(populated: Path) -> None:
    """A fresh app describes each route's query parameters from that route alone (its first request does not wait
    for the whole document): a parameter given twice is refused by name exactly where the app's OpenAPI document
    gives it a single value, on every GET route without path parameters (but the event stream)."""
    with TestClient(create_app(settings_for(populated))) as fresh:
        document = fresh.app.openapi()
        fresh.app.openapi_schema = None  # the requests below describe each route on its own, as a new app does
        checked = 0
        for path, operations in document["paths"].items():
            if "get" not in operations or "{" in path or path == "/events":
                continue
            for param in operations["get"].get("parameters", []):
                if param["in"] != "query":
                    continue
                schema = param.get("schema", {})
                array = schema.get("type") == "array" or any(s.get("type") == "array" for s in schema.get("anyOf", []))
                answer = fresh.get(path, params=[(param["name"], "1"), (param["name"], "1")])
                refused = answer.status_code == 422 and \
                    answer.json()["detail"].startswith(f"{param['name']}: given 2 times")
                assert refused != array, (path, param["name"], answer.status_code, answer.text[:200])
                checked += 1
        assert checked > 50


def test_schema_as_arrow_or_json(client: TestClient, populated: Path) -> None:
    store = trajstore.open(populated)
    arrow = client.get("/schema", headers={"Accept": "application/vnd.apache.arrow.stream"})
    assert pa.ipc.open_stream(arrow.content).schema.equals(store.schema())
    assert pa.ipc.open_stream(client.get("/schema").content).schema.equals(store.schema())  # Arrow by default
    for env in (None, "Acrobot-v1"):
        response = client.get("/schema", params={"env_id": env} if env else {}, headers={"Accept": "application/json"})
        assert response.status_code == 200 and response.headers["content-type"] == "application/json"
        assert response.json() == {"columns": [{"name": f.name, "type": str(f.type), "nullable": f.nullable}
                                               for f in store.schema(env)], "images": []}  # no pictures
    obs = {c["name"]: c["type"] for c in client.get("/schema", params={"env_id": "CartPole-v1"},
                                                    headers={"Accept": "application/json"}).json()["columns"]}["obs"]
    assert obs.startswith("fixed_size_list<") and obs.endswith("[4]")  # CartPole's four floats


def test_curves_take_by_as_python_does(client: TestClient, populated: Path) -> None:
    """``GET /curves?by=…`` groups runs as ``store.curves(by=…)`` does: learning curves across seeds, not each run's
    episodes (which it answered before, ignoring ``by``)."""
    params = {"by": "run_id", "bins": 4, "reps": 50}
    expected = trajstore.open(populated).curves(by="run_id", bins=4, reps=50)
    assert expected.num_rows > 0 and set(expected["run_id"].to_pylist()) == {"alpha", "beta"}
    arrow = pa.ipc.open_stream(client.get("/curves", params=params, headers=ARROW).content).read_all()
    assert arrow.equals(expected)
    rows = client.get("/curves", params=params).json()
    assert [r["run_id"] for r in rows] == expected["run_id"].to_pylist()
    assert [r["value"] for r in rows] == pytest.approx(expected["value"].to_pylist())
