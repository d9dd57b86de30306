"""``Client.follow``: the service's commits (``/events``) and their rows (``/commits/{version}``), as
``Store.follow`` gives them, under a concurrent writer, resumable from a version."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator

import pytest

import trajstore
from tests.api.helpers import Live, serve, settings_for
from tests.helpers import step_keys, write_commits
from trajstore.api.app import create_app

pytestmark = pytest.mark.server  # the tiers: tests/tiers.py


@pytest.fixture
def live(tmp_path: Path) -> Iterator[Live]:
    trajstore.open(tmp_path / "store", create=True)
    yield from serve(create_app(settings_for(tmp_path / "store")))


def test_client_follow_delivers_every_step_once_in_commit_order(live: Live) -> None:
    store: trajstore.Store = live.app.state.store
    write_commits(store, 2, run_id="before", steps=4, seed=1)
    start = store.version
    writer = threading.Thread(target=write_commits, args=(store, 25), kwargs={"steps": 4, "seed": 1})
    got = []
    with trajstore.Client(live.url) as client:
        follower = client.follow(["run_id", "episode_id", "step"], run_id="live", since=start, timeout=5)
        writer.start()
        for commit in follower:
            got.append(commit)
            if not writer.is_alive() and commit.version == store.version:
                break
        writer.join()
        versions = [c.version for c in got]
        assert versions == sorted(set(versions)) and all(c.runs == ["live"] for c in got)
        delivered = [k for c in got for k in step_keys(c.rows)]
        stored = step_keys(store.scan(["episode_id", "step"], run_id="live").read_all())
        assert len(delivered) == len(set(delivered)) == len(stored) == 25 * 4 * 8
        assert set(delivered) == set(stored)
        local = {c.version: step_keys(c.rows) for c in store.follow(["episode_id", "step"], run_id="live", since=start,
                                                             timeout=0)}
        assert {c.version: step_keys(c.rows) for c in got} == local
        middle = versions[len(versions) // 2]
        rest = []
        for commit in client.follow(["episode_id", "step"], since=middle, timeout=60):
            rest.append(commit)
            if commit.version >= versions[-1]:  # ends on the last version, not on an idle wait a loaded CI can miss
                break
        assert [c.version for c in rest] == [v for v in versions if v > middle]


def test_commits_route_gives_a_versions_rows_or_404(live: Live) -> None:
    store: trajstore.Store = live.app.state.store
    write_commits(store, 3, steps=4, seed=1)
    with trajstore.Client(live.url) as client:
        rows = client._table("GET", f"/commits/{store.version}", params={"columns": ["step"]})
        assert rows.num_rows == 32 and rows.column_names == ["step"]
        assert client._table("GET", "/commits/0").num_rows == 0  # the table's creation adds no rows
        with pytest.raises(trajstore.RemoteError, match="not committed yet"):
            client._table("GET", f"/commits/{store.version + 1}")
