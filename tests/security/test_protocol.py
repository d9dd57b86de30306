"""Foreign deletion vectors (issue 47, item 4): rows another engine deleted through a deletion vector are never
served. The probe found a table whose episode another engine deleted that way (deltalake itself confirms it deleted)
served by trajstore with the episode live; now, once such a commit lands under a running ``trajstore serve``, every
data route answers 409 ``UnsupportedTableError`` naming the feature and the version (no rows), ``/health`` and
``/ready`` say why, and a version from before the delete (``?version=N``) still answers as it was."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any, Callable

import httpx
import pytest

import trajstore
from tests import delta_protocol
from tests.security.conftest import get
from tests.served import Server
from trajstore.errors import RemoteError, UnsupportedTableError

pytestmark = [pytest.mark.server, pytest.mark.security]

READ_ROUTES: list[tuple[str, dict[str, Any]]] = [
    ("/stats", {}), ("/episodes", {}), ("/runs", {}), ("/steps", {}), ("/returns", {"gamma": 0.9}),
    ("/sequences", {"length": 4}), ("/curves/groups", {"by": "config.algo", "metric": "episode_return"}),
]
HEALTH_WAIT_S = 30  # /health answers with a check at most 1 s old: it reports the delete well before this


def health_after(live: Server, deadline: float) -> dict[str, Any]:
    """``/health`` once its check has seen the store degraded (it answers with a check up to a second old)."""
    while True:
        body = get(live, "/health").json()
        if body["status"] == "degraded" or time.monotonic() > deadline:
            return body
        time.sleep(0.1)


def test_rows_another_engine_deleted_are_never_served(fresh_server: Callable[..., Server]) -> None:
    live = fresh_server()
    store = trajstore.open(live.store)
    before, stats = store.version, get(live, "/stats").json()
    gone = store.episodes(run_id="ppo-0").sort_by("episode_id")["episode_id"][0].as_py()
    deleted = delta_protocol.delete_episode(Path(live.store) / "steps", gone)
    assert gone not in delta_protocol.deltalake_episodes(Path(live.store) / "steps")  # deltalake: it is deleted

    refusals = [get(live, path, **params) for path, params in READ_ROUTES]
    refusals.append(get(live, f"/episodes/{gone}/steps"))
    refusals.append(httpx.post(live.url + "/sql", json={"query": "SELECT episode_id FROM episodes"}, timeout=60))
    for answer in refusals:
        assert answer.status_code == 409, (answer.request.url, answer.status_code, answer.text[:300])
        problem = answer.json()
        assert problem["type"] == "urn:trajstore:error:UnsupportedTableError"
        assert f"at version {deleted}: rows of it were deleted through deletion vectors" in problem["detail"]
        assert "deletionVectors" in problem["detail"] and "REORG TABLE" in problem["detail"]
        assert set(problem) <= {"type", "title", "status", "detail", "instance"}  # a problem document, no rows

    with pytest.raises(UnsupportedTableError, match=f"at version {deleted}.*deletionVectors") as raised:
        trajstore.Client(live.url).stats()  # the Client raises what a Store would (and a RemoteError, 409)
    assert isinstance(raised.value, RemoteError) and raised.value.status == 409

    health = health_after(live, time.monotonic() + HEALTH_WAIT_S)
    assert health["status"] == "degraded" and health["version"] == deleted
    assert "deletionVectors" in health["problem"]
    ready = get(live, "/ready")
    assert ready.status_code == 503 and "deletionVectors" in ready.json()["detail"]

    assert get(live, "/stats", version=before).json() == stats  # the version before reads as it was
    old = httpx.post(live.url + "/sql", params={"version": before}, timeout=60,
                     json={"query": f"SELECT count(*) AS n FROM episodes WHERE episode_id = {gone}"})
    assert old.status_code == 200 and old.json()["rows"] == [{"n": 1}], old.text[:300]
