"""``parallel_rollout`` through a ``RemoteStore`` into a real service stores exactly what a local ``parallel_rollout``
with the same seed stores: mpe2's simple_spread (3 alike agents, episodes cut across ingest requests) and
simple_tag (agents of two kinds, whose writers send rows of one episode in requests of their own)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trajstore
from tests.api.helpers import API_KEY, serve, settings_for
from trajstore.api.app import create_app
from trajstore.remote.writer import RemoteStore
from trajstore.rollout import parallel_rollout

pytest.importorskip("mpe2")
from mpe2 import simple_spread_v3, simple_tag_v3

pytestmark = pytest.mark.server  # the tiers: tests/tiers.py

# every stored column but the episode ids (drawn at random by each writer) and wall times; episodes in the order
# they were played (their first env step), agents by name
ROWS = ("SELECT agent_id, step, obs, action, reward, next_obs, terminated, truncated, env_steps, env_index, seed, "
        "mode, min(env_steps) OVER (PARTITION BY episode_id) AS episode_start FROM steps WHERE run_id = 'r' "
        "ORDER BY episode_start, agent_id, step")


def stored_rows(store: Any) -> pa.Table:
    return store.sql(ROWS)


def episodes_in_many_files(store: trajstore.Store) -> int:
    """How many episodes have rows in more than one committed file (sent in more than one ingest request)."""
    files: dict[int, int] = {}
    for f in store.maintain.files():
        for eid in set(pq.read_table(f.path, columns=["episode_id"])["episode_id"].to_pylist()):
            files[eid] = files.get(eid, 0) + 1
    return sum(n > 1 for n in files.values())


@pytest.mark.parametrize("env, episodes", [(lambda: simple_spread_v3.parallel_env(N=3), 30),
                                           (simple_tag_v3.parallel_env, 3)], ids=["simple_spread", "simple_tag"])
def test_a_remote_parallel_rollout_stores_what_a_local_one_does(tmp_path: Path, env: Any, episodes: int,
                                                               monkeypatch: pytest.MonkeyPatch) -> None:
    # rows handed to the writers every 512 (not 16,384): episodes then go out in more than one request
    monkeypatch.setattr("trajstore.write.agents.ROWS_PER_CALL", 512)
    local = trajstore.open(tmp_path / "local", create=True)
    served = trajstore.open(tmp_path / "served", create=True)
    options = {"run_id": "r", "episodes": episodes, "seed": 3, "progress": False, "flush_bytes": 1}
    mine = parallel_rollout(local, env(), **options)
    for live in serve(create_app(settings_for(served.root))):
        with RemoteStore(live.url, api_key=API_KEY) as remote:
            theirs = parallel_rollout(remote, env(), **options)
            assert stored_rows(remote).equals(stored_rows(local))  # read back through POST /sql too
    assert (theirs.steps, theirs.episodes, theirs.episode_returns) == (mine.steps, mine.episodes,
                                                                      mine.episode_returns)
    served = trajstore.open(served.root)
    assert episodes_in_many_files(served) >= 1  # episodes continued agent by agent across requests
    expected = stored_rows(local)
    assert expected.num_rows == mine.steps and stored_rows(served).equals(expected)
    assert served.sql("SELECT count(*) AS n FROM episodes WHERE complete")["n"][0].as_py() == episodes
    report = trajstore.check(served)
    assert report.ok, report.format()
