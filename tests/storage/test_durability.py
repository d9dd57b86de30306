"""Durability: concurrent writer processes lose nothing and duplicate nothing; a writer killed with
SIGKILL at random moments of its commits never breaks the store or loses what it had committed.

Writers run as separate Python processes (``python -c``), as they would in a real rollout fleet.
"""

from __future__ import annotations

import glob
import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow.parquet as pq
import pytest
from deltalake import DeltaTable

import trajstore
from tests.helpers import engine_of, steps_table
from trajstore.operations.check import removable_orphans
from trajstore.store import check, remove_orphans

REPO = Path(__file__).resolve().parents[2]
TAG = 100_000  # reward of every step = process * TAG + the process's own episode counter (exact in float32)

CONCURRENT_WRITER = r"""
import json, os, sys, time
import numpy as np
import trajstore

path, proc, go, out = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
T, B, BATCHES, TAG = 16, 4, 30, 100_000
rng = np.random.default_rng(proc)
store = trajstore.open(path)
current, fresh = np.arange(B), B          # this process's own number for each env's open episode
lengths, ended = {}, {}
print("ready", flush=True)
while not os.path.exists(go):
    time.sleep(0.002)
with store.writer(run_id="conc", env_id=f"E{proc % 2}", worker_id=f"p{proc}", flush_bytes=6_000) as w:
    for _ in range(BATCHES):
        done = rng.random((T, B)) < 0.15
        reward = np.empty((T, B), np.float32)
        for t in range(T):
            reward[t] = proc * TAG + current
            for b in range(B):
                e = int(current[b])
                lengths[e] = lengths.get(e, 0) + 1
                ended[e] = bool(done[t, b])
                if done[t, b]:
                    current[b], fresh = fresh, fresh + 1
        w.add_batch({"obs": rng.random((T, B, 4), np.float32), "action": rng.integers(0, 2, (T, B)),
                     "reward": reward, "next_obs": rng.random((T, B, 4), np.float32),
                     "terminated": done, "truncated": np.zeros((T, B), bool)})
with open(out, "w") as f:
    json.dump({"lengths": lengths, "ended": ended, "commits": len(w.files_committed)}, f)
"""

KILLED_WRITER = r"""
import sys
import numpy as np
import trajstore

path, side, child, T = sys.argv[1], sys.argv[2], int(sys.argv[3]), int(sys.argv[4])
B = 4
rng = np.random.default_rng(child)
w = trajstore.open(path).writer(run_id="kill", env_id="E", worker_id=f"child{child}", flush_bytes=1 << 40)
rows = 0
with open(side, "a") as out:
    print("ready", flush=True)
    while True:
        rows += w.add_batch({"obs": rng.random((T, B, 4), np.float32), "action": rng.integers(0, 2, (T, B)),
                             "reward": rng.random((T, B), np.float32), "next_obs": rng.random((T, B, 4), np.float32),
                             "terminated": rng.random((T, B)) < 0.05, "truncated": np.zeros((T, B), bool)})
        w.flush()                      # returns once the commit is in the log
        out.write(f"{rows}\n")         # so every number written here is durably committed
        out.flush()
"""
KILL_B = 4


def _spawn(source: str, *args: Any, stderr: Path) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")]))}
    with stderr.open("w") as err:
        return subprocess.Popen([sys.executable, "-c", source, *map(str, args)], stdout=subprocess.PIPE,
                                stderr=err, text=True, env=env)


def _wait_ready(proc: subprocess.Popen[str], stderr: Path) -> None:
    """Wait until the process has imported everything and is about to write (it prints nothing else)."""
    assert proc.stdout is not None
    line = proc.stdout.readline()
    proc.stdout.close()
    assert line.strip() == "ready", f"writer process failed to start:\n{stderr.read_text()}"


def _seed(store: trajstore.Store) -> None:
    """One committed episode of 2 steps that must survive everything."""
    with store.writer(run_id="seed", env_id="E", worker_id="seed") as w:
        w.add_batch({"obs": np.zeros((2, 1, 4), np.float32), "action": np.zeros((2, 1), np.int64),
                     "reward": np.ones((2, 1), np.float32), "next_obs": np.zeros((2, 1, 4), np.float32),
                     "terminated": np.array([[False], [True]]), "truncated": np.zeros((2, 1), bool)})


# --- concurrent writers ----------------------------------------------------------------------------------

@pytest.mark.slow
def test_four_processes_append_at_once_and_every_episode_is_there_once(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = trajstore.open(path, create=True)
    go = tmp_path / "go"
    procs = [_spawn(CONCURRENT_WRITER, path, p, go, tmp_path / f"expected{p}.json", stderr=tmp_path / f"err{p}")
             for p in range(4)]
    for p, proc in enumerate(procs):
        _wait_ready(proc, tmp_path / f"err{p}")
    go.touch()  # all four start writing at the same moment
    for p, proc in enumerate(procs):
        assert proc.wait(timeout=120) == 0, (tmp_path / f"err{p}").read_text()

    expected: dict[tuple[int, int], tuple[int, bool]] = {}
    for p in range(4):
        out = json.loads((tmp_path / f"expected{p}.json").read_text())
        assert out["commits"] >= 10  # each writer committed many times, racing the others
        expected.update({(p, int(e)): (n, out["ended"][e]) for e, n in out["lengths"].items()})

    rows = store.sql("SELECT episode_id, any_value(worker_id) AS worker, count(*) AS n, "
                     "count(DISTINCT step) AS distinct_steps, min(step) AS first, max(step) AS last, "
                     "min(reward) AS lo, max(reward) AS hi, bool_or(terminated) AS ended, "
                     "count(DISTINCT env_id) AS partitions FROM steps GROUP BY episode_id").to_pylist()
    found: dict[tuple[int, int], list[tuple[int, bool]]] = {}
    for r in rows:
        assert r["lo"] == r["hi"], f"episode {r['episode_id']} mixes steps of two episodes"
        assert (r["first"], r["last"], r["distinct_steps"], r["partitions"]) == (0, r["n"] - 1, r["n"], 1)
        proc, own = divmod(int(r["lo"]), TAG)
        assert r["worker"] == f"p{proc}"
        found.setdefault((proc, own), []).append((r["n"], r["ended"]))
    assert found == {k: [v] for k, v in expected.items()}
    assert len(rows) == len(expected) > 4 * 100

    report = check(store)
    assert report.ok, report.format()
    assert report.episodes == len(expected)
    # the writers merged their small files as they went: the only files left unlisted are those a commit removed
    assert sorted(report.orphans) == sorted(removable_orphans(engine_of(store), removed_before_s=0,
                                                                   written_before_s=1e9))
    assert _episodes_continued_across_commits(store, path) > 0  # episodes crossed commits and were stitched


def _episodes_continued_across_commits(store: trajstore.Store, path: Path) -> int:
    """How many episodes an earlier version held in part (committed, then continued by a later commit). Read from the
    versions, not the files: the writers' upkeep may have merged every episode into one file by the end."""
    count = "SELECT episode_id, count(*) AS n FROM steps GROUP BY episode_id"
    final = {r["episode_id"]: r["n"] for r in store.sql(count).to_pylist()}
    for version in store.history()["version"].to_pylist()[1:]:
        earlier = trajstore.open(path, version=version).sql(count).to_pylist()
        partial = sum(1 for r in earlier if r["n"] < final[r["episode_id"]])
        if partial:
            return partial
    return 0


# --- SIGKILL in the middle of commits ---------------------------------------------------------------------

KILL_MODES = (  # (steps per env per commit, when to kill)
    (8, "random"),        # any moment: building a batch, Parquet write, fsync, Delta commit, checkpoint
    (2048, "file"),       # within 10 ms of a new data file appearing: mid-write, fsync or in the commit
    (8, "log"),           # just after a new file in the log: mid log write, checkpoint, or the next file
)


def _kill_at_random_moment(proc: subprocess.Popen[str], path: Path, when: str, rng: random.Random) -> None:
    if when == "random":
        time.sleep(rng.uniform(0.0, 0.3))
    else:
        pattern = str(path / "steps" / ("run_id=kill/env_id=E/*.parquet" if when == "file" else "_delta_log/*"))
        before, seen, wanted = set(glob.glob(pattern)), 0, rng.randint(1, 3)
        deadline = time.monotonic() + 20
        while seen < wanted and proc.poll() is None and time.monotonic() < deadline:
            now = set(glob.glob(pattern))
            seen, before = seen + bool(now - before), now
            time.sleep(0.0003)
        time.sleep(rng.uniform(0.0, 0.01 if when == "file" else 0.006))
    assert proc.poll() is None, "the writer process ended by itself"
    proc.send_signal(signal.SIGKILL)
    proc.wait(timeout=30)


def _committed_rows(side: Path) -> int:
    lines = side.read_text().split() if side.exists() else []
    return int(lines[-1]) if lines else 0


def _rows_per_worker(store: trajstore.Store) -> dict[str, int]:
    table = store.sql("SELECT worker_id, count(*) AS n FROM steps GROUP BY worker_id")
    return dict(zip(table["worker_id"].to_pylist(), table["n"].to_pylist()))


def _has_footer(path: str) -> bool:
    try:
        pq.read_metadata(path)
        return True
    except Exception:  # noqa: BLE001
        return False


@pytest.mark.slow
def test_writer_killed_mid_commit_many_times_loses_nothing_committed(tmp_path: Path) -> None:
    path = tmp_path / "store"
    store = trajstore.open(path, create=True)
    _seed(store)
    # a checkpoint every 3 commits, so kills also land while delta-rs writes checkpoints
    DeltaTable(str(path / "steps")).alter.set_table_properties({"delta.checkpointInterval": "3"})
    rng = random.Random(2024)
    iterations = 15
    steps_per_env = [KILL_MODES[c % len(KILL_MODES)][0] for c in range(iterations)]
    for child in range(iterations):
        err = tmp_path / f"err{child}"
        proc = _spawn(KILLED_WRITER, path, tmp_path / f"side{child}", child, steps_per_env[child], stderr=err)
        _wait_ready(proc, err)
        _kill_at_random_moment(proc, path, KILL_MODES[child % len(KILL_MODES)][1], rng)
        assert proc.returncode == -signal.SIGKILL, err.read_text()

        store = trajstore.open(path)
        assert store.stats()["n_traj"][0].as_py() >= 1
        total = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
        report = check(store)
        assert report.ok, f"after kill {child}:\n{report.format()}"
        assert report.steps == total
        stored = _rows_per_worker(store)
        assert stored["seed"] == 2
        for earlier in range(child + 1):
            committed = _committed_rows(tmp_path / f"side{earlier}")
            have = stored.get(f"child{earlier}", 0)
            # everything reported as committed is there, plus at most the one commit in flight at the kill
            assert committed <= have <= committed + steps_per_env[earlier] * KILL_B, (child, earlier, committed, have)

    committed_total = sum(_committed_rows(tmp_path / f"side{c}") for c in range(iterations))
    assert committed_total >= 10 * 8 * KILL_B  # the children did commit between kills
    complete = [_has_footer(o) for o in report.orphans if o.endswith(".parquet")]
    # some kills landed after a file was started and before its commit made it visible
    assert len(complete) >= 1, f"no kill landed inside a commit; orphans: {report.orphans}"
    with store.writer(run_id="after", env_id="E") as w:  # the store still takes writes
        w.add_batch({"obs": np.zeros((1, 1, 4), np.float32), "action": np.zeros((1, 1), np.int64),
                     "reward": np.ones((1, 1), np.float32), "next_obs": np.zeros((1, 1, 4), np.float32),
                     "terminated": np.ones((1, 1), bool), "truncated": np.zeros((1, 1), bool)})
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == total + 1
    assert check(store).ok
    removed = remove_orphans(store, older_than_s=0)  # nothing writes now: every orphan is abandoned
    assert sorted(removed) == sorted(report.orphans)
    after = check(store)
    assert after.ok and after.orphans == [] and after.steps == total + 1
    print(f"kills: {iterations}, rows committed before kills: {committed_total}, orphans: "
          f"{sum(complete)} whole files killed before/in their commit, {complete.count(False)} cut mid-write")


def test_partial_temporary_files_in_the_log_are_ignored(tmp_path: Path) -> None:
    """What a writer killed inside a log write could leave in ``_delta_log``: delta-rs writes each entry to
    ``<name>#<n>`` and then links (commits) or renames (checkpoints) it into place; other stores use
    ``_commit_<uuid>.json.tmp``. Readers, the next commit and check ignore such files."""
    store = trajstore.open(tmp_path / "store", create=True)
    _seed(store)
    log_dir = tmp_path / "store" / "steps" / "_delta_log"
    version = steps_table(store).log.latest_number()
    strays = {f"_commit_{'ab' * 16}.json.tmp": b'{"add":{"path":"run_id=x/e', f"{version + 1:020d}.json#1": b'{"comm',
              f"{version + 1:020d}.checkpoint.parquet#2": b"PAR1\x00\x00", "_last_checkpoint#3": b'{"vers'}
    for name, data in strays.items():
        (log_dir / name).write_bytes(data)

    reopened = trajstore.open(tmp_path / "store")
    assert steps_table(reopened).log.latest_number() == version
    assert reopened.stats()["n_traj"][0].as_py() == 1
    _seed(reopened)
    assert steps_table(reopened).log.latest_number() == version + 1
    assert reopened.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 4
    report = check(reopened)
    assert report.ok, report.format()
    assert report.orphans == sorted(str(log_dir / name) for name in strays)
