"""GET /history and ?version= on the read routes: the service reads any version a Python caller can open."""

from __future__ import annotations

from pathlib import Path

from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import settings_for
from tests.api.test_runs import small_store
from trajstore.api.app import create_app


def test_history_and_reads_at_a_version(tmp_path: Path) -> None:
    store = small_store(tmp_path / "s")
    before = store.version
    stats_before = store.stats().to_pylist()[0]
    store.delete(run_id="a")
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
