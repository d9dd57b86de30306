"""Client.replay over a real server: the batches and updates of a local Store.replay, priorities committed to the
store and resumed, bad input a clear 4xx with nothing stored, and the service's budgets for open replays."""

from __future__ import annotations

import re
import time
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.api.helpers import API_KEY, Live, serve, settings_for
from tests.helpers import make_batch
from trajstore.api.app import create_app
from trajstore.errors import RemoteError
from trajstore.remote.wire import ARROW_STREAM, ipc_bytes

pytestmark = pytest.mark.server  # the tiers: tests/tiers.py


@pytest.fixture
def path(tmp_path: Path) -> Path:
    store = trajstore.open(tmp_path / "store", create=True)
    rng = np.random.default_rng(0)
    for run in ("a", "b"):
        with store.writer(run_id=run, env_id="E-v0") as w:
            w.add_batch(make_batch(rng, 40, 4, obs_dim=4, p_terminated=0.06, p_truncated=0.03))
    return tmp_path / "store"


def served(path: Path, **settings: Any) -> Iterator[Live]:
    return serve(create_app(settings_for(path, **settings)))


@pytest.fixture
def live(path: Path) -> Iterator[Live]:
    yield from served(path)


def same(remote: dict[str, Any], local: dict[str, Any]) -> None:
    assert list(remote) == list(local)
    for name in local:
        assert remote[name].dtype == local[name].dtype and remote[name].shape == local[name].shape, name
        np.testing.assert_array_equal(remote[name], local[name], err_msg=name)


@pytest.mark.parametrize("kwargs", [dict(n=3, gamma=0.9, run_id="b"), dict(length=8, stride=2, pad=True),
                                    dict(columns=["obs", "reward"], where="episode_return > 0", alpha=0.0)])
def test_the_batches_and_updates_are_the_local_replays(live: Live, path: Path, kwargs: dict[str, Any]) -> None:
    store = trajstore.open(path)
    rng = np.random.default_rng(1)
    with trajstore.Client(live.url, api_key=API_KEY) as client, \
            client.replay(priorities=None, seed=5, **kwargs) as remote, \
            store.replay(priorities=None, seed=5, **kwargs) as local:
        assert len(remote) == len(local) > 0
        for _ in range(3):
            got, want = remote.sample(64), local.sample(64)
            same(got, want)
            priority = rng.exponential(1.0, 64)
            remote.update(got["index"], priority)
            local.update(want["index"], priority)


def test_priorities_are_committed_and_a_new_replay_resumes_from_them(live: Live, path: Path) -> None:
    with trajstore.Client(live.url, api_key=API_KEY) as client:
        with client.replay(n=2, gamma=0.99, priorities="learner") as replay:
            batch = replay.sample(32)
            replay.update(batch["index"], 5.0)
            first = replay.commit()
            replay.update(batch["index"][:4], 7.0)
        assert replay.version == first + 1  # close() committed the rest
        rows = trajstore.open(path).sql("SELECT max(priority) AS top, count(DISTINCT (episode_id, step)) AS items "
                                        "FROM priorities WHERE replay = 'learner'").to_pylist()[0]
        assert rows["top"] == 7.0 and rows["items"] == len(set(zip(batch["episode_id"], batch["start"])))
        with client.replay(n=2, gamma=0.99, priorities="learner", seed=1) as again:
            assert again.version == first + 1
            drawn = again.sample(4000)
            # items given 5 and not 7 weigh (5 + eps)^0.6; the others 7's: those given 7, and those never given
            # any (the largest priority given so far, read back from the table)
            five = np.isin(drawn["index"], batch["index"]) & ~np.isin(drawn["index"], batch["index"][:4])
            assert five.any() and (~five).any()
            top = drawn["probability"][~five]
            np.testing.assert_allclose(top, top[0], rtol=1e-9)
            np.testing.assert_allclose(drawn["probability"][five] / top[0], ((5 + 1e-6) / (7 + 1e-6)) ** 0.6,
                                       rtol=1e-9)


def test_learners_share_one_replay_by_its_id(live: Live) -> None:
    with trajstore.Client(live.url, api_key=API_KEY) as one, trajstore.Client(live.url, api_key=API_KEY) as two:
        with one.replay(priorities=None) as replay:
            shared = two.replay(replay_id=replay.replay_id)
            batch = shared.sample(8)
            shared.update(batch["index"], 0.0)
            assert replay.describe()["items"] == len(shared)


def post_update(live: Live, replay_id: str, table: pa.Table, key: str | None = API_KEY) -> httpx.Response:
    headers = {"Content-Type": ARROW_STREAM, **({"Authorization": f"Bearer {key}"} if key else {})}
    return httpx.post(f"{live.url}/replays/{replay_id}/update", content=ipc_bytes(table), headers=headers)


@pytest.mark.parametrize("table,field", [
    (pa.table({"index": [0, 1], "priority": [1.0, -1.0]}), "priority: must be finite and >= 0"),
    (pa.table({"index": [0, 1], "priority": [1.0, float("nan")]}), "priority: must be finite"),
    (pa.table({"index": [0, 10**9], "priority": [1.0, 2.0]}), "index: .* not a handle"),
    (pa.table({"index": [0.5], "priority": [1.0]}), "index: expected integers"),
    (pa.table({"index": [0], "priority": ["high"]}), "priority: expected numbers"),
    (pa.table({"index": [0, None], "priority": [1.0, 2.0]}), "index: expected integers .* without nulls"),
    (pa.table({"index": [0]}), "body: expected the columns index and priority"),
    (pa.table({"index": [0, 1], "priority": [1.0, 2.0, 3.0][:2], "x": [1, 2]}), "body: expected the columns"),
])
def test_a_bad_update_is_refused_by_name_and_changes_nothing(live: Live, path: Path, table: pa.Table,
                                                             field: str) -> None:
    with trajstore.Client(live.url, api_key=API_KEY) as client, client.replay(priorities="bad") as replay:
        answer = post_update(live, replay.replay_id, table)
        assert answer.status_code == 422 and answer.headers["content-type"] == "application/problem+json"
        assert re.search(field, answer.json()["detail"]), answer.json()["detail"]
        assert replay.describe()["pending"] == 0
        assert replay.commit() is None  # nothing to commit: the table was never written
    assert not trajstore.open(path).sql("SELECT * FROM priorities WHERE replay = 'bad'").num_rows


def test_a_body_that_is_not_arrow_is_refused(live: Live) -> None:
    with trajstore.Client(live.url, api_key=API_KEY) as client, client.replay(priorities=None) as replay:
        answer = httpx.post(f"{live.url}/replays/{replay.replay_id}/update", content=b"DROP TABLE steps",
                            headers={"Authorization": f"Bearer {API_KEY}"})
        assert answer.status_code == 422 and "body: not an Arrow IPC stream" in answer.json()["detail"]


@pytest.mark.parametrize("params,field", [
    ({"alpha": -1}, "alpha"), ({"eps": 0}, "eps"), ({"capacity": 0}, "capacity"), ({"priorities": "a b"}, "priorities"),
    ({"n": 2}, "gamma"), ({"n": 2, "gamma": 0.9, "length": 4}, "n"), ({"where": "1; DROP TABLE steps"}, "where"),
    ({"columns": "nope"}, "columns"), ({"draw_seed": -1}, "draw_seed"), ({"version": 1}, "version"),
    ({"run_id": "nope"}, "run_id"),
])
def test_bad_arguments_are_a_clear_4xx(live: Live, params: dict[str, Any], field: str) -> None:
    answer = httpx.post(f"{live.url}/replays", params=params, headers={"Authorization": f"Bearer {API_KEY}"})
    assert answer.status_code in (404, 422), answer.text
    assert field in answer.json()["detail"]
    assert len(live.app.state.replays) == 0


def test_every_route_needs_the_api_key(live: Live) -> None:
    with trajstore.Client(live.url, api_key=API_KEY) as client, client.replay(priorities=None) as replay:
        base = f"{live.url}/replays/{replay.replay_id}"
        for method, url in [("POST", f"{live.url}/replays"), ("GET", base), ("GET", f"{base}/sample"),
                            ("POST", f"{base}/commit"), ("DELETE", base)]:
            assert httpx.request(method, url).status_code == 401, url
            assert httpx.request(method, url, headers={"Authorization": "Bearer wrong"}).status_code == 401, url
        assert post_update(live, replay.replay_id, pa.table({"index": [0], "priority": [1.0]}), None).status_code \
            == 401
        assert len(replay) > 0  # still open


def test_an_unknown_or_closed_replay_is_404(live: Live) -> None:
    with trajstore.Client(live.url, api_key=API_KEY) as client:
        replay = client.replay(priorities=None)
        replay.close()
        for replay_id in (replay.replay_id, "0" * 32):
            with pytest.raises(RemoteError, match="404.*replay_id: no open replay"):
                client.replay(replay_id=replay_id)
        with pytest.raises(RemoteError, match="422"):
            client.replay(replay_id="not-an-id")


def test_open_replays_are_bounded_in_number_and_memory(path: Path) -> None:
    for live in served(path, replay_max_open=1):
        with trajstore.Client(live.url, api_key=API_KEY, retries=0) as client, client.replay(priorities=None):
            with pytest.raises(RemoteError, match="429.*REPLAY_MAX_OPEN"):
                client.replay(priorities=None)
    for live in served(path, replay_memory_bytes=1000):
        with trajstore.Client(live.url, api_key=API_KEY, retries=0) as client:
            with pytest.raises(RemoteError, match="413.*REPLAY_MEMORY_BYTES"):
                client.replay(priorities=None)
            assert len(live.app.state.replays) == 0
            with client.replay(priorities=None, capacity=10) as small:  # a capacity bounds its trees
                assert len(small) == 10


def test_an_idle_replay_is_closed_and_its_updates_committed(path: Path) -> None:
    for live in served(path, replay_idle_s=1.5):
        with trajstore.Client(live.url, api_key=API_KEY) as client:
            replay = client.replay(priorities="idle")
            batch = replay.sample(4)
            replay.update(batch["index"], 3.0)
            time.sleep(2.5)
            with pytest.raises(RemoteError, match="404.*closed after 1.5 s unused"):
                replay.sample(4)
    assert trajstore.open(path).sql("SELECT count(*) AS n FROM priorities WHERE replay = 'idle'").to_pylist() == \
        [{"n": len(set(batch["index"].tolist()))}]


def test_a_batch_over_the_limit_is_422(path: Path) -> None:
    for live in served(path, loader_batch_bytes=10_000):
        with trajstore.Client(live.url, api_key=API_KEY) as client, client.replay(priorities=None) as replay:
            with pytest.raises(RemoteError, match="422.*batch_size"):
                replay.sample(1000)
            assert len(replay.sample(10)["index"]) == 10


def test_every_request_takes_one_of_the_places(live: Live) -> None:
    gate = live.app.state.sql_gate
    with trajstore.Client(live.url, api_key=API_KEY, retries=0) as client, client.replay(priorities=None) as replay:
        slots = []
        try:
            while True:  # every place taken (as /sql queries and /sequences streams take them)
                try:
                    slots.append(gate.take("test"))
                except trajstore.errors.QueryBusyError:
                    break
            for call in (lambda: replay.sample(4), lambda: replay.update([0], 1.0), replay.commit,
                         lambda: client.replay(priorities=None)):
                with pytest.raises(RemoteError, match="429"):
                    call()
        finally:
            for slot in slots:
                slot.release()
        assert len(replay.sample(4)["index"]) == 4
