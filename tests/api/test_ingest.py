"""POST /runs/{run_id}/batches and RemoteWriter: authenticated, idempotent, size-limited, all or nothing; rows
continue their episodes or are refused (422), a key serves one request (409); GET /ingest tells a worker early
whether it may write."""

from __future__ import annotations

import threading
import time
import uuid
from pathlib import Path
from typing import Any, Iterator

import httpx
import numpy as np
import pyarrow as pa
import pytest
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import API_KEY, Live, serve, settings_for, steps_batch
from tests.helpers import steps_table
from trajstore.api.app import create_app
from trajstore.remote.client import Client
from trajstore.remote.wire import ipc_bytes
from trajstore.remote.writer import RemoteWriter

ARROW = "application/vnd.apache.arrow.stream"


@pytest.fixture
def empty(tmp_path: Path) -> Path:
    trajstore.open(tmp_path / "store", create=True)
    return tmp_path / "store"


@pytest.fixture
def app_client(empty: Path) -> Iterator[TestClient]:
    with TestClient(create_app(settings_for(empty, max_body_bytes=200_000))) as c:
        yield c


def rows(n_episodes: int = 3, length: int = 5, *, first_id: int = 1) -> pa.Table:
    ids = np.repeat(np.arange(first_id, first_id + n_episodes), length)
    steps = np.tile(np.arange(length), n_episodes)
    return pa.table({
        "episode_id": pa.array(ids, pa.int64()), "step": pa.array(steps, pa.int32()),
        "obs": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(len(ids) * 4, np.float32)), 4),
        "action": pa.array(np.zeros(len(ids), np.int64)), "reward": pa.array(np.ones(len(ids), np.float32)),
        "next_obs": pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(len(ids) * 4, np.float32)), 4),
        "terminated": pa.array(steps == length - 1), "truncated": pa.array(np.zeros(len(ids), bool)),
    })


def steps_of(episode_id: int, steps: list[int], *, end: bool = False) -> pa.Table:
    """Rows of one episode at ``steps``, shaped like :func:`rows`; the last one terminated with ``end``."""
    one = rows(n_episodes=1, length=len(steps))
    return one.set_column(0, "episode_id", pa.array([episode_id] * len(steps), pa.int64())) \
        .set_column(1, "step", pa.array(steps, pa.int64())) \
        .set_column(one.schema.get_field_index("terminated"), "terminated",
                    pa.array([False] * (len(steps) - 1) + [end]))


def post(c: TestClient | httpx.Client, body: bytes, *, key: str | None = API_KEY, idem: str | None = None,
         content_type: str = ARROW, run_id: str = "r1", env_id: str = "Toy-v0", number: int | None = None) -> Any:
    headers = {"Content-Type": content_type}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    if idem is not None:
        headers["Idempotency-Key"] = idem
    if number is not None:
        headers["Idempotency-Sequence"] = str(number)
    return c.post(f"/runs/{run_id}/batches", params={"env_id": env_id}, content=body, headers=headers)


def count(path: Path) -> int:
    return trajstore.open(path).sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py()


def app_keys(path: Path) -> list[str]:
    """The ids of the app transactions (idempotency keys) the store's log holds."""
    store = trajstore.open(path)
    found = steps_table(store).log.app_transactions(store.version)
    assert found is not None
    return sorted(found)


def test_without_a_key_is_401_with_a_challenge(app_client: TestClient, empty: Path) -> None:
    for key in (None, "wrong"):
        response = post(app_client, ipc_bytes(rows()), key=key)
        assert response.status_code == 401 and response.headers["www-authenticate"] == "Bearer"
        assert response.headers["content-type"] == "application/problem+json"
    assert count(empty) == 0


def test_ingest_is_disabled_without_a_configured_key(empty: Path) -> None:
    with TestClient(create_app(settings_for(empty, api_key=None))) as c:
        response = post(c, ipc_bytes(rows()))
    assert response.status_code == 403 and "TRAJSTORE_API_KEY" in response.json()["detail"]


def test_a_retried_request_stores_once(app_client: TestClient, empty: Path) -> None:
    body, key = ipc_bytes(rows()), uuid.uuid4().hex
    first, second = post(app_client, body, idem=key), post(app_client, body, idem=key)
    assert first.status_code == 201 and not first.json()["duplicate"]
    assert second.status_code == 200 and second.json()["duplicate"]
    assert count(empty) == 15
    assert post(app_client, ipc_bytes(rows(first_id=10)), idem=uuid.uuid4().hex).status_code == 201
    assert count(empty) == 30
    assert trajstore.open(empty).stats().column("n_traj")[0].as_py() == 6


def test_a_key_reused_for_another_request_is_409(app_client: TestClient, empty: Path) -> None:
    body = ipc_bytes(rows())
    assert post(app_client, body, idem="k").status_code == 201
    for other in (post(app_client, ipc_bytes(rows(first_id=10)), idem="k"),  # the new rows were dropped before
                  post(app_client, body, idem="k", run_id="r2"), post(app_client, body, idem="k", env_id="Other-v0")):
        assert other.status_code == 409, other.text
        assert other.headers["content-type"] == "application/problem+json"
        assert "'k' was already used for another request" in other.json()["detail"]
    retry = post(app_client, body, idem="k")
    assert retry.status_code == 200 and retry.json() == {"run_id": "r1", "env_id": "Toy-v0", "rows": 15,
                                                         "duplicate": True}
    assert count(empty) == 15


@pytest.mark.parametrize("episode_id, steps, where, detail", [
    (20, [5, 7], {}, "episode_id 20 goes from step 5 to step 7; expected step 6"),
    (20, [6, 7], {}, "episode_id 20 continues at step 6, but the store holds its steps up to 4; expected step 5"),
    (20, [4, 5], {}, "episode_id 20 continues at step 4, but the store holds its steps up to 4; expected step 5"),
    (1, [5, 6], {}, "episode_id 1 ended at step 4 (terminated or truncated); step 5 cannot follow it"),
    (99, [3, 4], {}, "episode_id 99 starts at step 3, but the store holds none of its steps; expected step 0"),
    (20, [5], {"run_id": "r2"}, "episode_id 20 (step 5 here) belongs to run_id 'r1', env_id 'Toy-v0', not to run_id "
                                "'r2'"),
    (20, [5], {"env_id": "Other-v0"}, "episode_id 20 (step 5 here) belongs to run_id 'r1', env_id 'Toy-v0'"),
    (20, [5, 2**31], {}, "step: 2147483648 at row 1 (episode_id 20) is beyond int32"),
])
def test_rows_that_do_not_continue_their_episode_are_422(app_client: TestClient, empty: Path, episode_id: int,
                                                         steps: list[int], where: dict[str, str], detail: str) -> None:
    assert post(app_client, ipc_bytes(rows())).status_code == 201  # episodes 1-3, ended at step 4
    assert post(app_client, ipc_bytes(steps_of(20, [0, 1, 2, 3, 4]))).status_code == 201  # still running
    response = post(app_client, ipc_bytes(steps_of(episode_id, steps)), idem=uuid.uuid4().hex, **where)
    assert response.status_code == 422, response.text
    assert response.headers["content-type"] == "application/problem+json"
    assert detail in response.json()["detail"]
    assert count(empty) == 20 and trajstore.check(trajstore.open(empty)).ok


def test_steps_after_the_end_within_a_request_are_422(app_client: TestClient, empty: Path) -> None:
    broken = steps_of(5, [0, 1, 2]).set_column(6, "terminated", pa.array([False, True, False]))
    response = post(app_client, ipc_bytes(broken))
    assert response.status_code == 422
    assert "episode_id 5 ends at step 1, but the rows go on to step 2" in response.json()["detail"]
    assert count(empty) == 0


@pytest.mark.server
def test_racing_requests_append_the_next_step_once(live_empty: Live, empty: Path) -> None:
    """Requests race for step 5 of one episode (then 6, …), on a real server: one is stored, the other is 422."""
    headers = {"Authorization": f"Bearer {API_KEY}"}
    with httpx.Client(base_url=live_empty.url, headers=headers, timeout=30) as c:
        assert post(c, ipc_bytes(steps_of(20, [0, 1, 2, 3, 4]))).status_code == 201
    for step in range(5, 10):
        barrier, statuses = threading.Barrier(2), []

        def race(step: int = step, barrier: threading.Barrier = barrier, statuses: list[Any] = statuses) -> None:
            with httpx.Client(base_url=live_empty.url, headers=headers, timeout=30) as c:
                barrier.wait()
                response = post(c, ipc_bytes(steps_of(20, [step])), idem=uuid.uuid4().hex)
                statuses.append((response.status_code, response.json().get("detail")))

        threads = [threading.Thread(target=race) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert sorted(code for code, _ in statuses) == [201, 422], statuses
        refused = next(detail for code, detail in statuses if code == 422)
        assert f"episode_id 20 continues at step {step}, but the store holds its steps up to {step}" in refused
    store = trajstore.open(empty)
    assert store.episode_steps(20)["step"].to_pylist() == list(range(10))
    assert trajstore.check(store).ok


def test_a_body_over_the_limit_is_413(app_client: TestClient, empty: Path) -> None:
    response = post(app_client, ipc_bytes(rows(n_episodes=2000)))
    assert response.status_code == 413 and "limit" in response.json()["detail"]
    assert count(empty) == 0


@pytest.mark.parametrize("change, field", [
    (lambda t: t.set_column(t.schema.get_field_index("reward"), "reward",
                            pa.array(np.r_[np.ones(len(t) - 1), np.nan].astype(np.float32))), "reward"),
    (lambda t: t.drop_columns(["terminated"]), "terminated"),
    (lambda t: t.set_column(t.schema.get_field_index("step"), "step", pa.array(np.zeros(len(t), np.int32))),
     "step"),
    (lambda t: t.append_column("run_id", pa.array(["x"] * len(t))), "run_id"),
    (lambda t: t.set_column(t.schema.get_field_index("terminated"), "terminated",
                            pa.array(np.zeros(len(t), np.int64))), "terminated"),
])
def test_invalid_rows_are_422_naming_the_field(app_client: TestClient, empty: Path, change: Any,
                                               field: str) -> None:
    assert post(app_client, ipc_bytes(rows()), idem="first").status_code == 201
    response = post(app_client, ipc_bytes(change(rows(first_id=50))))
    assert response.status_code == 422, response.text
    assert field in response.json()["detail"], response.text
    assert count(empty) == 15


def test_rows_that_do_not_fit_the_stored_schema_are_422(app_client: TestClient, empty: Path) -> None:
    assert post(app_client, ipc_bytes(rows())).status_code == 201
    bad = rows(first_id=9)
    obs = pa.FixedSizeListArray.from_arrays(pa.array(np.zeros(len(bad) * 3, np.float32)), 3)
    response = post(app_client, ipc_bytes(bad.set_column(bad.schema.get_field_index("obs"), "obs", obs)))
    assert response.status_code == 422 and response.json()["detail"].startswith("obs")
    assert count(empty) == 15


def test_garbage_and_wrong_content_type(app_client: TestClient) -> None:
    assert post(app_client, b"not arrow").status_code == 422
    assert post(app_client, ipc_bytes(rows()), content_type="application/json").status_code == 415


@pytest.mark.server
def test_remote_writer_matches_a_local_writer(empty: Path, tmp_path: Path) -> None:
    rng = np.random.default_rng(5)
    batches = [steps_batch(rng, 25, 3) for _ in range(6)]
    local = trajstore.open(tmp_path / "local", create=True)
    with local.writer(run_id="r", env_id="Toy-v0") as w:
        for b in batches:
            w.add_batch(b)
    for live in serve(create_app(settings_for(empty))):
        with RemoteWriter(live.url, api_key=API_KEY, run_id="r", env_id="Toy-v0", flush_bytes=2_000) as w:
            for b in batches:
                w.add_batch(b)
        assert len(trajstore.open(empty).maintain.files()) > 1  # committed in several requests
    q = ("SELECT episode_length, episode_return, terminated, complete, env_steps FROM episodes "
         "ORDER BY episode_return, episode_length")
    assert trajstore.open(empty).sql(q).to_pylist() == local.sql(q).to_pylist()
    positions = "SELECT env_steps, count(*) AS n FROM steps GROUP BY ALL ORDER BY ALL"
    assert trajstore.open(empty).sql(positions).to_pylist() == [{"env_steps": 3 * (t + 1), "n": 3}
                                                                 for t in range(6 * 25)]
    assert trajstore.check(trajstore.open(empty)).ok


@pytest.mark.server
def test_remote_writer_refuses_bad_input_before_sending(live_empty: Live) -> None:
    rng = np.random.default_rng(0)
    with RemoteWriter(live_empty.url, api_key=API_KEY, run_id="r", env_id="Toy-v0") as w:
        w.add_batch(steps_batch(rng, 5, 2))
        bad = steps_batch(rng, 5, 2)
        bad["reward"][3, 1] = np.inf
        with pytest.raises(trajstore.InputError, match=r"reward must be finite.*got inf at env 1, t=3"):
            w.add_batch(bad)


@pytest.fixture
def live_empty(empty: Path) -> Iterator[Live]:
    yield from serve(create_app(settings_for(empty)))


@pytest.mark.server
def test_two_remote_writers_at_once_lose_nothing(live_empty: Live, empty: Path) -> None:
    def work(worker: int) -> None:
        rng = np.random.default_rng(worker)
        with RemoteWriter(live_empty.url, api_key=API_KEY, run_id=f"w{worker}", env_id="Toy-v0",
                          flush_bytes=3_000) as w:
            for _ in range(8):
                w.add_batch(steps_batch(rng, 20, 4, p_done=0.2))

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    store = trajstore.open(empty)
    counts = store.sql("SELECT run_id, count(*) AS n FROM steps GROUP BY run_id ORDER BY run_id").to_pylist()
    assert counts == [{"run_id": "w0", "n": 8 * 20 * 4}, {"run_id": "w1", "n": 8 * 20 * 4}]
    assert trajstore.check(store).ok


@pytest.mark.server
def test_client_retries_idempotent_calls(live_empty: Live, empty: Path) -> None:
    import httpx

    failures = {"left": 2}
    real = httpx.HTTPTransport()

    def flaky(request: httpx.Request) -> httpx.Response:
        if failures["left"]:
            failures["left"] -= 1
            if request.method == "POST":  # the request reached the server, the answer was lost
                real.handle_request(request).read()
            return httpx.Response(503)
        return real.handle_request(request)

    client = Client(live_empty.url, api_key=API_KEY, backoff=0.01, transport=httpx.MockTransport(flaky))
    client.post_rows("r", "Toy-v0", rows(), idempotency_key="k1")
    assert count(empty) == 15  # sent twice, stored once
    failures["left"] = 2
    assert client.stats().column("n_traj")[0].as_py() == 3
    failures["left"] = 9
    with pytest.raises(trajstore.RemoteError, match="503"):
        client.runs()


@pytest.mark.server
def test_a_remote_writer_numbers_its_requests_under_one_key(live_empty: Live, empty: Path) -> None:
    """The store keeps one key per writer (Idempotency-Sequence), not one per request, and an answer lost on the way
    back is still a retry stored once."""
    real, lost = httpx.HTTPTransport(), {"left": 0, "posts": 0}

    def losing(request: httpx.Request) -> httpx.Response:
        if request.method == "POST":
            lost["posts"] += 1
            if lost["left"]:
                lost["left"] -= 1
                real.handle_request(request).read()  # the request landed; its answer did not
                return httpx.Response(503)
        return real.handle_request(request)

    rng = np.random.default_rng(3)
    batches = [steps_batch(rng, 10, 2, p_done=0.3) for _ in range(6)]
    client = Client(live_empty.url, api_key=API_KEY, backoff=0.01, transport=httpx.MockTransport(losing))
    with RemoteWriter(client, run_id="r", env_id="Toy-v0", flush_bytes=500) as w:
        for i, b in enumerate(batches):
            lost["left"] = 1 if i in (2, 4) else 0
            w.add_batch(b)
    assert lost["posts"] >= 8  # six requests or more, two of them sent twice
    assert count(empty) == 6 * 10 * 2
    assert len(app_keys(empty)) == 1 and app_keys(empty)[0].startswith("trajstore-writer:")
    assert trajstore.check(trajstore.open(empty)).ok


@pytest.mark.parametrize("headers, detail", [
    ({"Idempotency-Sequence": "0"}, "Idempotency-Sequence: numbers a writer's requests, so it needs the "
                                    "Idempotency-Key"),
    ({"Idempotency-Key": "w", "Idempotency-Sequence": "-1"}, "idempotency-sequence"),
    ({"Idempotency-Key": "w", "Idempotency-Sequence": "4294967296"}, "idempotency-sequence"),
    ({"Idempotency-Key": "w", "Idempotency-Sequence": "one"}, "idempotency-sequence"),
])
def test_a_bad_idempotency_sequence_is_422_naming_it(app_client: TestClient, empty: Path, headers: dict[str, str],
                                                     detail: str) -> None:
    answer = app_client.post("/runs/r1/batches", params={"env_id": "Toy-v0"}, content=ipc_bytes(rows()),
                             headers={"Authorization": f"Bearer {API_KEY}", "Content-Type": ARROW, **headers})
    assert answer.status_code == 422 and detail in answer.json()["detail"], answer.text
    assert count(empty) == 0


def test_numbered_requests_over_http_are_stored_once_each(app_client: TestClient, empty: Path) -> None:
    def send(first_id: int, number: int) -> Any:
        headers = {"Authorization": f"Bearer {API_KEY}", "Content-Type": ARROW, "Idempotency-Key": "writer-1",
                   "Idempotency-Sequence": str(number)}
        return app_client.post("/runs/r1/batches", params={"env_id": "Toy-v0"},
                               content=ipc_bytes(rows(first_id=first_id)), headers=headers)

    assert [send(1, 0).status_code, send(10, 1).status_code, send(10, 1).status_code, send(1, 0).status_code] == \
        [201, 201, 200, 200]
    conflict = send(20, 1)
    assert conflict.status_code == 409 and "number 1 of writer 'writer-1' was already used" in \
        conflict.json()["detail"]
    assert count(empty) == 30 and app_keys(empty) == ["trajstore-writer:writer-1"]
    assert app_client.get("/ingest", headers={"Authorization": f"Bearer {API_KEY}"}).json()["idempotency_sequence"]


@pytest.mark.server
def test_cli_rollouts_to_a_service(live_empty: Live, empty: Path, capsys: pytest.CaptureFixture[str]) -> None:
    from trajstore import cli

    common = ["--url", live_empty.url, "--api-key", API_KEY, "--num-envs", "2", "--seed", "3"]
    assert cli.main(["rollout", "--env", "CartPole-v1", "--run", "remote-gym", "--episodes", "6", *common]) == 0
    assert cli.main(["rollout", "--backend", "jax", "--env", "cartpole", "--run", "remote-jax", "--episodes", "4",
                     "--rollout-length", "64", "--no-progress", *common]) == 0
    out, err = capsys.readouterr()
    assert f"in {live_empty.url}" in out
    assert "steps/s" not in err  # no progress bar redrawn into a stderr that is no terminal (see tests/cli)
    stats = trajstore.open(empty).stats(by="run_id").to_pylist()
    assert [(s["run_id"], s["n_traj"] >= n) for s, n in zip(stats, (6, 4))] == [("remote-gym", True),
                                                                             ("remote-jax", True)]
    # a remote JAX worker asks the service what the run holds, as it asks a local store
    from trajstore.remote.writer import RemoteStore
    from trajstore.rollout import jax_rollout

    with RemoteStore(live_empty.url, api_key=API_KEY) as remote, \
            pytest.raises(trajstore.InputError, match="'remote-jax' already holds training"):
        jax_rollout(remote, "cartpole", run_id="remote-jax", mode="eval", episodes=2, progress=False)
    # a run the service holds is refused without --append (asked of the service), added to with it
    again = ["rollout", "--env", "CartPole-v1", "--run", "remote-gym", "--episodes", "2", "--no-progress", *common]
    capsys.readouterr()
    assert cli.main(again) == 2
    assert capsys.readouterr().err == (f"trajstore: error: --run: run 'remote-gym' already holds steps in "
                                       f"{live_empty.url}; add to it with --append, or store these episodes under "
                                       "a new run id\n")
    before = trajstore.open(empty).stats(run_id="remote-gym")["n_traj"][0].as_py()
    assert cli.main([*again, "--append"]) == 0
    assert trajstore.open(empty).stats(run_id="remote-gym")["n_traj"][0].as_py() >= before + 2
    assert cli.main(["rollout", "--env", "CartPole-v1", "--run", "r", "--episodes", "1", "--url", live_empty.url,
                     "--api-key", "wrong", "--no-progress"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("trajstore: error: 401") and "Traceback" not in err


def test_get_ingest_tells_whether_the_key_may_write(empty: Path) -> None:
    with TestClient(create_app(settings_for(empty))) as c:
        assert c.get("/ingest", headers={"Authorization": f"Bearer {API_KEY}"}).json()["accepted"] is True
        for headers in ({}, {"Authorization": "Bearer wrong"}):
            refused = c.get("/ingest", headers=headers)
            assert refused.status_code == 401 and refused.headers["content-type"] == "application/problem+json"
    with TestClient(create_app(settings_for(empty, api_key=None))) as c:
        refused = c.get("/ingest", headers={"Authorization": f"Bearer {API_KEY}"})
        assert refused.status_code == 403 and "ingest is disabled" in refused.json()["detail"]


@pytest.mark.server
@pytest.mark.parametrize("server_key, worker_key, line", [
    (API_KEY, "wrong", "trajstore: error: 401 Unauthorized: wrong API key"),
    (None, API_KEY, "trajstore: error: 403 Forbidden: ingest is disabled"),
])
def test_a_remote_rollout_refused_by_the_server_stops_before_rolling_out(
        empty: Path, capsys: pytest.CaptureFixture[str], server_key: str | None, worker_key: str, line: str) -> None:
    from trajstore import cli

    app, seen = create_app(settings_for(empty, api_key=server_key)), []

    @app.middleware("http")
    async def record(request: Any, call_next: Any) -> Any:
        seen.append(f"{request.method} {request.url.path}")
        return await call_next(request)

    for live in serve(app):
        started = time.monotonic()
        code = cli.main(["rollout", "--env", "CartPole-v1", "--run", "r", "--steps", "10000000", "--num-envs", "4",
                         "--url", live.url, "--api-key", worker_key, "--no-progress"])
        elapsed = time.monotonic() - started
    err = capsys.readouterr().err
    assert code == 2 and err.startswith(line) and len(err.splitlines()) == 1, err
    assert elapsed < 5, f"took {elapsed:.1f} s to fail"
    assert "GET /ingest" in seen and not [s for s in seen if s.startswith("POST")], seen  # no step was sent
    assert count(empty) == 0


@pytest.mark.server
def test_a_remote_writer_still_writes_to_a_server_without_get_ingest(empty: Path) -> None:
    from fastapi.responses import JSONResponse

    app = create_app(settings_for(empty))

    @app.middleware("http")
    async def as_before_get_ingest(request: Any, call_next: Any) -> Any:  # what a server of an older version says
        if request.url.path == "/ingest":
            return JSONResponse({"detail": "Not Found"}, status_code=404)
        return await call_next(request)

    for live in serve(app):
        with pytest.raises(trajstore.RemoteError, match="404"):
            Client(live.url, api_key=API_KEY).check_ingest()
        with RemoteWriter(live.url, api_key=API_KEY, run_id="r", env_id="Toy-v0", flush_bytes=500) as w:
            for _ in range(2):
                w.add_batch(steps_batch(np.random.default_rng(1), 10, 2))
    assert count(empty) == 40
    keys = app_keys(empty)  # a service that does not say it takes Idempotency-Sequence gets a key per request
    assert len(keys) > 1 and all(k.startswith("trajstore-ingest:") for k in keys)


def zstd_body(table: pa.Table) -> bytes:
    """``table`` as a client may send it: an IPC stream compressed with zstd."""
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema, options=pa.ipc.IpcWriteOptions(compression="zstd")) as w:
        w.write_table(table)
    return sink.getvalue().to_pybytes()


def test_a_body_that_would_decode_past_the_limit_is_413_before_it_is_decoded(empty: Path) -> None:
    with TestClient(create_app(settings_for(empty, max_decoded_bytes=2**20))) as c:
        access = c.get("/ingest", headers={"Authorization": f"Bearer {API_KEY}"}).json()
        assert access["max_decoded_bytes"] == 2**20 and access["max_body_bytes"] == 256 * 2**20
        big = zstd_body(rows(n_episodes=4000))  # 20,000 rows of 57 bytes: 1.1 MiB of buffers in 30 KB of zstd
        assert len(big) < 64 * 1024
        refused = post(c, big)
        assert refused.status_code == 413 and refused.headers["content-type"] == "application/problem+json"
        assert refused.json()["detail"].startswith("body: decodes to ")
        assert "over the limit of 1048576 bytes (1 MiB) of POST /runs/r1/batches (TRAJSTORE_MAX_DECODED_BYTES); " \
               "nothing of it was decoded or stored" in refused.json()["detail"]
        assert count(empty) == 0
        assert post(c, zstd_body(rows(n_episodes=1000))).status_code == 201  # the same rows, fewer at a time
    assert count(empty) == 5000


def stored_alike(served: trajstore.Store, local: trajstore.Store, run_id: str) -> None:
    """The run's episodes and each step's observations the same in both stores."""
    q = f"SELECT episode_length, episode_return, terminated FROM episodes WHERE run_id = '{run_id}' ORDER BY ALL"
    assert served.sql(q).to_pylist() == local.sql(q).to_pylist()
    order = [("env_index", "ascending"), ("t", "ascending")]
    columns = ["env_index", "t", "obs", "next_obs", "reward"]
    assert served.scan(columns, run_id=run_id).read_all().sort_by(order).equals(
        local.scan(columns, run_id=run_id).read_all().sort_by(order))


@pytest.mark.server
@pytest.mark.parametrize("B, p_end", [(3, 0.05), (1, 0.0)])  # many episodes; one episode, over the limits alone
def test_a_remote_writer_keeps_each_request_under_the_service_limits(empty: Path, tmp_path: Path, B: int,
                                                                     p_end: float) -> None:
    from tests.helpers import stacked_stream
    from trajstore.remote.decoded_size import decoded_size

    batch = stacked_stream(np.random.default_rng(0), 200, B, noise=True, p_end=p_end, shape=(24, 32))
    local = trajstore.open(tmp_path / "local", create=True)
    with local.writer(run_id="r", env_id="Pixels-v0", frame_stack={"obs": 4}) as w:
        w.add_batch(batch)
    app, bodies = create_app(settings_for(empty, max_body_bytes=100_000, max_decoded_bytes=200_000)), []

    @app.middleware("http")
    async def record(request: Any, call_next: Any) -> Any:
        if request.method == "POST":
            bodies.append(await request.body())
        response = await call_next(request)
        assert request.method != "POST" or response.status_code == 201
        return response

    for live in serve(app):  # one add_batch of 200 x B steps of 3 KiB: one flush of 600 KiB
        with RemoteWriter(live.url, api_key=API_KEY, run_id="r", env_id="Pixels-v0", frame_stack={"obs": 4},
                          flush_bytes=2**30) as w:
            assert w.flush_bytes == 50_000  # half the smaller limit
            w.add_batch(batch)
    assert len(bodies) > 5
    assert max(len(b) for b in bodies) <= 100_000 and max(decoded_size(b).bytes for b in bodies) <= 200_000
    stored_alike(trajstore.open(empty), local, "r")
    assert trajstore.check(trajstore.open(empty)).ok


@pytest.mark.server
def test_a_row_over_the_service_limit_is_refused_naming_the_setting(empty: Path) -> None:
    from trajstore.errors import BodyTooLargeError

    batch = steps_batch(np.random.default_rng(0), 4, 1)
    batch["obs"] = batch["next_obs"] = np.zeros((4, 1, 3000), np.float32)  # 24 KB a row
    for live in serve(create_app(settings_for(empty, max_decoded_bytes=20_000))):
        w = RemoteWriter(live.url, api_key=API_KEY, run_id="r", env_id="Wide-v0")
        w.add_batch(batch)
        with pytest.raises(BodyTooLargeError, match=r"rows of run 'r': one row is more than the service takes in a "
                                                    r"request: it decodes to (at least )?\d+ bytes .* over the "
                                                    r"service's limit of 20000 bytes \(19.5\d* KiB, "
                                                    r"TRAJSTORE_MAX_DECODED_BYTES\); raise that setting of the "
                                                    "service"):
            w.flush()
        with pytest.raises(BodyTooLargeError):
            w.close()  # kept, and refused again
    assert count(empty) == 0


def test_ingest_requests_are_checked_on_threads_of_their_own(empty: Path) -> None:
    """Ingest requests are read and checked on ``ingest_threads`` threads, apart from the pool of the other routes
    (on the pool's 40, 256 actors on 2 cores stored a fifth fewer steps/s: docs/benchmarks.md): while they are all
    taken, a request waits for one and ``/stats`` still answers; once one is free, the request is stored."""
    with TestClient(create_app(settings_for(empty, ingest_threads=1))) as client:
        assert post(client, ipc_bytes(steps_of(1, [0]))).status_code == 201
        threads = client.app.state.ingest_threads  # type: ignore[attr-defined]
        assert threads.total_tokens == 1
        holder = object()
        client.portal.call(threads.acquire_on_behalf_of, holder)  # the one ingest thread taken
        answers: list[Any] = []
        sender = threading.Thread(target=lambda: answers.append(post(client, ipc_bytes(steps_of(1, [1], end=True)))))
        sender.start()
        deadline = time.monotonic() + 30
        while client.portal.call(threads.statistics).tasks_waiting < 1:  # the request waits for the thread
            assert time.monotonic() < deadline and sender.is_alive(), answers
            time.sleep(0.01)
        assert client.get("/stats", headers={"Authorization": f"Bearer {API_KEY}"}).status_code == 200
        assert not answers
        client.portal.call(threads.release_on_behalf_of, holder)
        sender.join(30)
    assert [a.status_code for a in answers] == [201]
    assert trajstore.open(empty).episode_steps(1)["step"].to_pylist() == [0, 1]
