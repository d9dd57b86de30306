"""/health and /ready on a store whose latest version cannot be read (issue 27): /health stays 200 (the process
answers) and says so in its body (``status`` degraded, ``problem``), /ready is 503 naming the problem; the check never keeps a probe waiting on a
slow store, and runs once however many probes come."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Iterator
from urllib.parse import unquote

import numpy as np
import pytest
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import settings_for
from tests.helpers import make_batch
from trajstore.api.app import create_app
from trajstore.api.routes import health


@pytest.fixture
def written(tmp_path: Path) -> Path:
    """A store of three commits, written with the library."""
    store = trajstore.open(tmp_path / "store", create=True)
    for seed in range(3):
        with store.writer(run_id="r", env_id="E") as w:
            w.add_batch(make_batch(np.random.default_rng(seed), 20, 2))
    return tmp_path / "store"


def newest_commit(path: Path) -> Path:
    return max((path / "steps" / "_delta_log").glob("*.json"))


@pytest.fixture
def client_of(written: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(written))) as c:
        yield c


def test_a_readable_store_is_ok(client_of: TestClient, written: Path) -> None:
    version, behind = trajstore.open(written).log_lag()
    assert client_of.get("/health").json() == {"status": "ok", "version": version,
                                               "versions_since_checkpoint": behind}
    assert client_of.get("/ready").status_code == 200


def test_a_corrupt_newest_log_entry_is_reported_by_health_and_ready_is_503(written: Path) -> None:
    newest_commit(written).write_text('{"commitInfo": {"timestamp": 1\n')  # cut short, as by a torn write
    with TestClient(create_app(settings_for(written))) as c:
        answer = c.get("/health")
        assert answer.status_code == 200
        body = answer.json()
        assert body["status"] == "degraded" and body["version"] is None, body
        assert body["problem"].startswith(f"the latest version cannot be read: the commit log of {written} "
                                          "cannot be read: ") and "trajstore check" in body["problem"], body
        ready = c.get("/ready")
        assert ready.status_code == 503 and ready.headers["content-type"] == "application/problem+json"
        assert f"the commit log of {written} cannot be read" in ready.json()["detail"]


def test_a_missing_file_of_the_newest_commit_is_reported_by_health_and_ready_is_503(written: Path) -> None:
    version = trajstore.open(written).version
    added = [json.loads(line)["add"]["path"] for line in newest_commit(written).read_text().splitlines()
             if '"add"' in line]
    victim = written / "steps" / unquote(added[0])
    victim.unlink()  # what a compaction whose landed commit was reported as failed did (issue 27)
    with TestClient(create_app(settings_for(written))) as c:
        answer = c.get("/health")
        assert answer.status_code == 200
        body = answer.json()
        assert body["status"] == "degraded" and body["version"] == version, body
        assert body["problem"].startswith(f"version {version} cannot be read: ") and str(victim) in body["problem"]
        assert "committed file is missing" in body["problem"], body
        ready = c.get("/ready")
        assert ready.status_code == 503 and str(victim) in ready.json()["detail"]


def test_a_slow_store_never_keeps_a_probe_waiting_and_is_checked_once(written: Path,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    app = create_app(settings_for(written))
    store: trajstore.Store = app.state.store
    calls: list[float] = []
    slow = threading.Event()
    slow.set()
    log_lag = store.log_lag

    def slow_log_lag() -> tuple[int, int]:  # the log answers after 5 s while `slow` is set
        calls.append(time.monotonic())
        if slow.is_set():
            time.sleep(5)
        return log_lag()

    monkeypatch.setattr(store, "log_lag", slow_log_lag)
    monkeypatch.setattr(health, "FRESH_S", 0.0)
    with TestClient(app) as c:
        probes, took = [], []
        for _ in range(2):  # while the first check runs
            started = time.monotonic()
            probes.append(c.get("/health").json())
            took.append(time.monotonic() - started)
        assert max(took) < health.LOG_TIMEOUT_S + 1, took  # not the 5 s of the check (SQL workers start meanwhile)
        assert probes == [{"status": "checking", "version": None, "versions_since_checkpoint": None}] * 2
        assert len(calls) == 1
        time.sleep(max(0.0, calls[0] + 5.5 - time.monotonic()))  # the first check ends
        slow.clear()
        ended = c.get("/health").json()  # a new check, quick now
        assert ended["status"] == "ok" and ended["version"] == store.version and "checked_s_ago" not in ended
        slow.set()
        stale = c.get("/health").json()  # slow again: the last check that ended, and its age
        assert stale["status"] == "ok" and 0 <= stale["checked_s_ago"] < 5, stale
    assert len(calls) == 3
