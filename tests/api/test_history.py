"""GET /history and ?version= on the read routes: the service reads any version a Python caller can open."""

from __future__ import annotations

from pathlib import Path

import pyarrow as pa
import pytest
from fastapi import FastAPI
from fastapi.routing import APIRoute
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import API_KEY, serve, settings_for
from tests.api.test_runs import small_store
from trajstore.api.app import create_app
from trajstore.errors import RemoteError


def test_history_and_reads_at_a_version(tmp_path: Path) -> None:
    store = small_store(tmp_path / "s")
    before = store.version
    stats_before = store.stats().to_pylist()[0]
    store.maintain.delete(run_id="a")
    with TestClient(create_app(settings_for(tmp_path / "s"))) as c:
        h = c.get("/history").json()
        assert [v["operation"] for v in h] == ["create", "add_columns", "append", "append", "delete"]
        assert h[-1]["run_ids"] == ["a"] and h[-1]["rows_removed"] == 20
        assert c.get("/history", params={"limit": 1}).json() == h[-1:]
        old = c.get("/stats", params={"version": before}).json()
        assert old[0]["n_traj"] == stats_before["n_traj"] != c.get("/stats").json()[0]["n_traj"]
        sql = c.post("/sql", params={"version": before}, json={"query": "SELECT count(*) AS n FROM steps"})
        assert sql.status_code == 200
        assert {e["run_id"] for e in c.get("/episodes", params={"version": before}).json()["items"]} == {"a", "b"}
        steps = c.get("/steps", params={"version": before, "run_id": "a"})
        assert steps.status_code == 200 and len(steps.content) > 0
        bad = c.get("/stats", params={"version": 99})
        assert bad.status_code == 404 and "version: must be a version of this store, 0..4" in bad.json()["detail"]
    assert trajstore.open(tmp_path / "s").version == before + 1


def arrow_batches(content: bytes) -> list[pa.RecordBatch]:
    return [b.replace_schema_metadata(None) for b in pa.ipc.open_stream(content)]


def test_every_read_route_reads_the_version_asked(tmp_path: Path) -> None:
    store = small_store(tmp_path / "s")
    before = store.version
    store.maintain.delete(run_id="a")
    old = trajstore.open(tmp_path / "s", version=before)
    with TestClient(create_app(settings_for(tmp_path / "s"))) as c:
        for path, params, local in [
            ("/sequences", {"length": 2, "pad": "true"}, lambda s: s.sequences(2, pad=True, format="arrow")),
            ("/transitions", {"n": 2, "gamma": 0.9}, lambda s: s.transitions(2, gamma=0.9, format="arrow")),
        ]:
            then = c.get(path, params={**params, "version": before})
            assert then.status_code == 200, then.text
            assert arrow_batches(then.content) == [b.replace_schema_metadata(None) for b in local(old)]
            assert arrow_batches(then.content) != arrow_batches(c.get(path, params=params).content)
        for path in ("/curves", "/curves/binned", "/curves/histogram"):
            then = c.get(path, params={"version": before}).json()
            assert sorted(s["run_id"] for s in then["series"]) == ["a", "b"], path
            assert [s["run_id"] for s in c.get(path).json()["series"]] == ["b"], path
        assert c.get("/curves/binned", params={"version": before}).json()["version"] == before
        assert [v["version"] for v in c.get("/history", params={"version": 1}).json()] == [0, 1]
        commit = c.get("/commits/2", params={"version": 1})  # the append of run b came after version 1
        assert commit.status_code == 404 and "version 2: not committed as of version 1" in commit.json()["detail"]
        assert c.get("/commits/2", params={"version": 2}).status_code == 200


@pytest.mark.server
def test_the_client_passes_the_version(tmp_path: Path) -> None:
    store = small_store(tmp_path / "s")
    before = store.version
    store.maintain.delete(run_id="a")
    old = trajstore.open(tmp_path / "s", version=before)
    for live in serve(create_app(settings_for(tmp_path / "s"))):
        with trajstore.Client(live.url) as client:
            assert set(client.runs(version=before)["run_id"].to_pylist()) == {"a", "b"}
            assert client.stats(version=before)["n_traj"][0].as_py() == old.stats()["n_traj"][0].as_py()
            assert client.sql("SELECT count(*) AS n FROM steps", version=before)["n"][0].as_py() == 40
            assert client.episodes(version=before).num_rows == old.episodes().num_rows
            assert sum(len(b["reward"]) for b in client.iter_batches(batch_size=8, version=before)) == 40
            assert [b["episode_id"].tolist() for b in client.sequences(2, version=before)] == \
                [b["episode_id"].tolist() for b in old.sequences(2)]
            assert [b["step"].tolist() for b in client.transitions(1, gamma=0.5, version=before)] == \
                [b["step"].tolist() for b in old.transitions(1, gamma=0.5)]
            with pytest.raises(RemoteError, match="404.*must be a version of this store"):
                client.stats(version=99)


JUNK_VERSIONS = ["abc", "-1", "1.5", "1e3", "", str(2**63), "99999999999999999999999"]


def routes(app: FastAPI) -> list[tuple[str, str]]:
    """Every (method, path) of the app, path parameters filled with values that exist in small_store."""
    fill = {"{run_id}": "a", "{episode_id}": "1", "{version}": "1", "{name}": "dashboard.js"}
    out, todo = [], list(app.routes)
    while todo:
        route = todo.pop(0)
        if hasattr(route, "original_router"):  # an included router (FastAPI >= 0.165)
            todo += route.original_router.routes
        elif isinstance(route, APIRoute):
            path = route.path
            for key, value in fill.items():
                path = path.replace(key, value)
            out += [(method, path) for method in sorted(route.methods)]
    return out


def test_junk_versions_are_422_on_every_route_and_a_version_where_it_means_nothing_too(tmp_path: Path) -> None:
    small_store(tmp_path / "s")
    app = create_app(settings_for(tmp_path / "s"))
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with TestClient(app) as c:
        found = routes(app)
        assert ("GET", "/sequences") in found and ("DELETE", "/runs/a") in found and ("GET", "/ready") in found
        for method, path in found:
            for junk in JUNK_VERSIONS:
                r = c.request(method, path, params={"version": junk}, headers=auth)
                assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", \
                    (method, path, junk, r.status_code)
                assert "version" in r.json()["detail"], (method, path, junk)
        for method, path in [("GET", "/health"), ("GET", "/ready"), ("GET", "/events"), ("DELETE", "/runs/a"),
                             ("POST", "/runs/a/batches"), ("GET", "/ingest"), ("GET", "/dashboard")]:
            r = c.request(method, path, params={"version": 1}, headers=auth)
            assert r.status_code == 422 and f"version: has no meaning on {method}" in r.json()["detail"], (path, r.text)
        assert [r["run_id"] for r in c.get("/runs").json()] == ["a", "b"]  # the refused delete deleted nothing


def test_a_removed_version_is_404_cached_or_not(tmp_path: Path) -> None:
    store = small_store(tmp_path / "s")
    before = store.version
    store.maintain.delete(run_id="a")
    reads = [("GET", "/stats", {}), ("GET", "/episodes", {}), ("GET", "/steps", {}), ("GET", "/runs", {}),
             ("GET", "/returns", {"gamma": 0.9}), ("GET", "/sequences", {"length": 2}),
             ("GET", "/transitions", {"n": 1, "gamma": 0.9}), ("GET", "/curves/binned", {}),
             ("GET", "/steps", {"format": "json"}), ("POST", "/sql", {})]
    body = {"query": "SELECT count(*) AS n FROM steps"}
    with TestClient(create_app(settings_for(tmp_path / "s"))) as cached:
        for method, path, params in reads:  # every route reads the version, and keeps it open
            if path.startswith("/curves"):
                continue  # a store keeps the curves it binned (of that version): they would be answered again
            r = cached.request(method, path, params={**params, "version": before},
                               json=body if method == "POST" else None)
            assert r.status_code == 200, (path, r.text)
        store.maintain.vacuum(older_than=0)
        with TestClient(create_app(settings_for(tmp_path / "s"))) as fresh:
            for c in (cached, fresh):
                for method, path, params in reads:
                    r = c.request(method, path, params={**params, "version": before},
                                  json=body if method == "POST" else None)
                    assert r.status_code == 404 and r.headers["content-type"] == "application/problem+json", \
                        (path, r.status_code, r.text)
                    assert f"version {before} can no longer be read" in r.json()["detail"], (path, r.text)
                    assert "damaged" not in r.json()["detail"].replace("not damaged", ""), r.text
                assert c.get("/ready").status_code == 200 and c.get("/stats").status_code == 200
