"""DELETE /runs/{run_id}: behind the API key, 200 with what it removed, 404 problem+json for an unknown run."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import API_KEY, settings_for
from tests.helpers import make_batch
from trajstore.api.app import create_app
from trajstore.store import plumbing


def small_store(path: Path) -> trajstore.Store:
    store = trajstore.open(path, create=True)
    rng = np.random.default_rng(0)
    for run in ("a", "b"):
        with store.writer(run_id=run, env_id="E") as w:
            w.add_batch(make_batch(rng, 10, 2))
    return store


def test_delete_a_run(tmp_path: Path) -> None:
    store = small_store(tmp_path / "s")
    steps = store.sql("SELECT count(*) AS n FROM steps WHERE run_id = 'a'")["n"][0].as_py()
    episodes = store.episodes(run_id="a").num_rows
    with TestClient(create_app(settings_for(tmp_path / "s"))) as c:
        assert c.delete("/runs/a").status_code == 401
        assert c.delete("/runs/a", headers={"Authorization": "Bearer wrong"}).status_code == 401
        auth = {"Authorization": f"Bearer {API_KEY}"}
        r = c.delete("/runs/a", headers=auth)
        assert r.status_code == 200, r.text
        assert r.json() | {"version": 0} == {"run_id": "a", "episodes": episodes, "steps": steps, "files_removed": 1,
                                             "files_rewritten": 0, "version": 0}
        assert [run["run_id"] for run in c.get("/runs").json()] == ["b"]
        missing = c.delete("/runs/a", headers=auth)
        assert missing.status_code == 404 and missing.headers["content-type"] == "application/problem+json"
        assert "run_id: no run 'a'" in missing.json()["detail"]
        old = c.get("/runs", params={"version": r.json()["version"] - 1}).json()  # still readable at a version
        assert [run["run_id"] for run in old] == ["a", "b"]


def test_delete_is_refused_without_a_configured_key(tmp_path: Path) -> None:
    small_store(tmp_path / "s")
    with TestClient(create_app(settings_for(tmp_path / "s", api_key=None))) as c:
        assert c.delete("/runs/a", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 403


def test_a_method_the_path_lacks_names_every_method_it_has(tmp_path: Path) -> None:
    small_store(tmp_path / "s")
    with TestClient(create_app(settings_for(tmp_path / "s"))) as c:
        r = c.put("/runs/a")
        assert r.status_code == 405 and r.headers["allow"] == "DELETE, GET, PATCH"
        assert c.post("/runs").headers["allow"] == "GET"


def test_runs_with_the_statistics_of_their_latest_episodes(tmp_path: Path) -> None:
    store = small_store(tmp_path / "s")
    with TestClient(create_app(settings_for(tmp_path / "s"))) as c:
        assert all(env["latest"] is None for run in c.get("/runs").json() for env in run["envs"])  # only if asked
        for gamma in (None, 0.5):
            want = {(r["run_id"], r["env_id"]): r for r in plumbing(store).latest_stats(3, gamma=gamma).to_pylist()}
            body = c.get("/runs", params={"last": 3, **({"gamma": gamma} if gamma is not None else {})}).json()
            got = {(run["run_id"], env["env_id"]): env["latest"] for run in body for env in run["envs"]}
            assert got.keys() == want.keys() and all(v is not None for v in got.values())
            for key, row in want.items():
                assert {k: got[key][k] for k in row if k not in ("run_id", "env_id")} == \
                    {k: v for k, v in row.items() if k not in ("run_id", "env_id")}
            assert all((got[k]["discounted_return_mean"] is None) == (gamma is None) for k in got)
        assert c.get("/runs", params={"last": 0}).status_code == 422


def test_config_integers_past_two_to_the_53_come_back_exact(tmp_path: Path) -> None:
    """A config's integers beyond ±(2**53 - 1) are decimal strings in every JSON answer (api/ints.py), so a reader
    that parses numbers as doubles gets them exact; the others stay numbers."""
    small_store(tmp_path / "s")
    config = {"seed": 2**53 + 1, "neg": -(2**63), "max": 2**64 - 1, "safe": 2**53 - 1, "lr": 0.5, "nested": [2**60]}
    exact = {"seed": str(2**53 + 1), "neg": str(-(2**63)), "max": str(2**64 - 1), "safe": 2**53 - 1, "lr": 0.5,
             "nested": [str(2**60)]}
    with TestClient(create_app(settings_for(tmp_path / "s"))) as c:
        changed = c.patch("/runs/a", json={"config": config}, headers={"Authorization": f"Bearer {API_KEY}"})
        assert changed.status_code == 200, changed.text
        assert changed.json()["config"] == exact
        assert next(r for r in c.get("/runs").json() if r["run_id"] == "a")["config"] == exact
        assert c.get("/runs/a").json()["config"] == exact
    assert trajstore.open(tmp_path / "s").run_info("a")["config"] == config  # stored as given


@pytest.mark.slow
def test_a_store_holding_a_poisoned_description_answers_naming_the_run(tmp_path: Path) -> None:
    """A description an older trajstore stored unchecked (a lone surrogate) made /runs 500 for good: now every run is
    answered, the bad one with its problem, and PATCH with a config repairs it."""
    import json
    import shutil

    from deltalake import DeltaTable

    small_store(tmp_path / "s")
    shutil.rmtree(tmp_path / "s" / "runs")  # described as an older trajstore did: a property of the steps table
    DeltaTable(str(tmp_path / "s" / "steps")).alter.set_table_properties(
        {"trajstore.run.a": json.dumps({"config": {"t": "\ud800"}})}, raise_if_not_exists=False)
    auth = {"Authorization": f"Bearer {API_KEY}"}
    with TestClient(create_app(settings_for(tmp_path / "s"))) as c:
        runs = c.get("/runs")
        assert runs.status_code == 200, runs.text
        bad = next(r for r in runs.json() if r["run_id"] == "a")
        assert bad["config"] == {} and "run 'a'" in bad["problem"] and "lone surrogate" in bad["problem"]
        assert c.get("/runs/a").status_code == 200
        assert c.get("/stats", params={"by": "config.t"}).status_code == 200
        assert c.patch("/runs/a", json={"config": {"t": "fixed"}}, headers=auth).status_code == 200
        fixed = c.get("/runs/a").json()
        assert fixed["config"] == {"t": "fixed"} and fixed["problem"] is None
