"""``GET /events``: Server-Sent Events announcing each commit; subscribers leave nothing behind."""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pytest

import trajstore
from tests.api.helpers import Live, serve, settings_for, steps_batch
from trajstore.api.app import create_app


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    trajstore.open(tmp_path / "store", create=True)
    yield from serve(create_app(settings_for(tmp_path / "store")))


def events(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    name = None
    for line in lines:
        if line.startswith("event: "):
            name = line[len("event: "):]
        elif line.startswith("data: "):
            yield name or "message", json.loads(line[len("data: "):])


def write(store: trajstore.Store, run_id: str, batches: int) -> None:
    rng = np.random.default_rng(0)
    with store.writer(run_id=run_id, env_id="Toy-v0") as w:
        for _ in range(batches):
            w.add_batch(steps_batch(rng, 5, 4))
            w.flush()


def wait_for(condition: Any, seconds: float = 10.0) -> None:
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError("condition not reached")
        time.sleep(0.02)


@pytest.mark.server
def test_each_commit_is_announced_with_its_runs_and_rows(live: Live) -> None:
    store = live.app.state.store
    with httpx.stream("GET", live.url + "/events", timeout=30) as r:
        assert r.headers["content-type"].startswith("text/event-stream")
        got = events(r.iter_lines())
        name, hello = next(got)
        assert name == "hello" and hello["version"] == store.version
        write(store, "run-a", 3)
        announced = [next(got) for _ in range(store.version - hello["version"])]
    commits = [a for n, a in announced if n == "commit"]
    assert [c["version"] for c in commits] == list(range(hello["version"] + 1, store.version + 1))
    data = [c for c in commits if c["rows_added"]]
    assert len(data) == 3 and all(c["runs"] == ["run-a"] and c["rows_added"] == 20 for c in data)
    assert sum(c["rows_added"] for c in commits) == store.scan(["step"]).read_all().num_rows


@pytest.mark.server
def test_subscribers_are_removed_on_disconnect(live: Live) -> None:
    for _ in range(25):
        with httpx.stream("GET", live.url + "/events", timeout=30) as r:
            assert next(events(r.iter_lines()))[0] == "hello"
    hub = live.app.state.events
    wait_for(lambda: hub.subscribers == 0)
    wait_for(lambda: not hub.watching)
    with httpx.stream("GET", live.url + "/events", timeout=30) as r:  # a new listener starts a new watcher
        got = events(r.iter_lines())
        next(got)
        assert hub.subscribers == 1 and hub.watching
        write(live.app.state.store, "run-b", 1)
        assert next(got)[0] == "commit"
    wait_for(lambda: hub.subscribers == 0)


@pytest.mark.server
def test_events_are_open_to_readers_like_other_reads(live: Live) -> None:
    # reads need no key (only writes do, see api/deps.py); a wrong key does not matter to a read either
    for headers in ({}, {"Authorization": "Bearer wrong"}):
        with httpx.stream("GET", live.url + "/events", timeout=30, headers=headers) as r:
            assert r.status_code == 200 and next(events(r.iter_lines()))[0] == "hello"


def test_a_subscriber_that_falls_behind_loses_the_oldest_and_is_told() -> None:
    import asyncio
    from concurrent.futures import ThreadPoolExecutor

    from trajstore.api.events import QUEUE_SIZE, Announcement, Subscriber

    async def fill() -> list[Announcement]:
        sub = Subscriber()
        for v in range(QUEUE_SIZE + 3):
            sub.put(Announcement(v, ["r"], 1, 1, 0))
        return [sub.queue.get_nowait() for _ in range(sub.queue.qsize())]

    with ThreadPoolExecutor(1) as pool:  # a thread of its own: Playwright's sync API may hold this one's loop
        got = pool.submit(asyncio.run, fill()).result()
    assert len(got) == QUEUE_SIZE and [a.version for a in got] == list(range(3, QUEUE_SIZE + 3))
    assert [a.lagged for a in got[-3:]] == [True] * 3 and not any(a.lagged for a in got[:-3])
