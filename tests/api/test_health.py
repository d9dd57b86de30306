"""/health and /ready on a store whose latest version cannot be read (issue 27): /health stays 200 (the process
answers) and says so in its body (``status`` degraded, ``problem``), /ready is 503 naming the problem; the check
never keeps a probe waiting on a slow store, and runs one at a time however many probes come."""

from __future__ import annotations

import json
import threading
import time
from pathlib import Path
from typing import Any, Iterator
from urllib.parse import unquote

import numpy as np
import pytest
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import settings_for
from tests.helpers import make_batch
from trajstore.api.app import create_app
from trajstore.api.routes import health
from trajstore.plumbing import Plumbing
from trajstore.store import plumbing


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


def health_of(client: TestClient) -> dict[str, Any]:
    """/health's answer (always 200) once a check of the store has ended: on a busy machine the first one may take
    longer than a probe waits (``checking``)."""
    deadline = time.monotonic() + 30
    while True:
        answer = client.get("/health")
        assert answer.status_code == 200
        if answer.json()["status"] != "checking" or time.monotonic() > deadline:
            return answer.json()
        time.sleep(0.1)


@pytest.fixture
def client_of(written: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(written))) as c:
        yield c


def test_a_readable_store_is_ok(client_of: TestClient, written: Path) -> None:
    version, behind = plumbing(trajstore.open(written)).log_lag()
    assert health_of(client_of) == {"status": "ok", "version": version,
                                               "versions_since_checkpoint": behind}
    assert client_of.get("/ready").status_code == 200


def test_a_corrupt_newest_log_entry_is_reported_by_health_and_ready_is_503(written: Path) -> None:
    newest_commit(written).write_text('{"commitInfo": {"timestamp": 1\n')  # cut short, as by a torn write
    with TestClient(create_app(settings_for(written))) as c:
        body = health_of(c)
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
        body = health_of(c)
        assert body["status"] == "degraded" and body["version"] == version, body
        assert body["problem"].startswith(f"version {version} cannot be read: ") and str(victim) in body["problem"]
        assert "committed file is missing" in body["problem"], body
        ready = c.get("/ready")
        assert ready.status_code == 503 and str(victim) in ready.json()["detail"]


def test_a_slow_store_never_keeps_a_probe_waiting_and_is_checked_once_at_a_time(
        written: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    answers = threading.Event()  # the log answers only while this is set
    running, most = [0], [0]
    log_lag = Plumbing.log_lag

    def slow_log_lag(self: Plumbing) -> tuple[int, int]:
        running[0] += 1
        most[0] = max(most[0], running[0])
        try:
            assert answers.wait(60), "the test never let the log answer"
            return log_lag(self)
        finally:
            running[0] -= 1

    monkeypatch.setattr(Plumbing, "log_lag", slow_log_lag)
    monkeypatch.setattr(health, "FRESH_S", 0.0)
    app = create_app(settings_for(written))  # its first check starts, and waits on the log
    store: trajstore.Store = app.state.store
    with TestClient(app) as c:
        for _ in range(3):  # the log does not answer: neither do these wait for it
            started = time.monotonic()
            probe = c.get("/health").json()
            assert time.monotonic() - started < 5  # 0.5 s, plus whatever the starting SQL workers' load adds
            assert probe == {"status": "checking", "version": None, "versions_since_checkpoint": None}
        answers.set()
        ended = health_of(c)
        behind = log_lag(plumbing(store))[1]
        assert ended == {"status": "ok", "version": store.version, "versions_since_checkpoint": behind}
        answers.clear()  # slow again: the last check that ended, and how long ago
        stale = c.get("/health").json()
        assert stale["status"] == "ok" and stale["version"] == store.version and 0 <= stale["checked_s_ago"] < 10
        answers.set()
    assert most[0] == 1  # one check at a time, however many probes came
