"""A replay's priorities in the store: committed in batches, resumed by a new process, never lost beyond what was not
committed when a learner is SIGKILLed, landing from two learners at once (the later commit winning per item), read as
they were at a version, removed with a deleted run, kept by compaction and vacuum, and queried in SQL (the sandbox's
too) joined with episodes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import numpy as np
import pytest

import trajstore
from tests.helpers import engine_of, make_batch
from trajstore.errors import ReadOnlyError, VersionNotFoundError
from trajstore.query import sandbox
from trajstore.store import plumbing

pytestmark = pytest.mark.slow  # learners in processes of their own, killed

ROOT = Path(__file__).resolve().parents[2]


def write(store: trajstore.Store, seed: int, *, run_id: str = "a", T: int = 40, B: int = 4,
          flushes: int = 1) -> None:
    rng = np.random.default_rng(seed)
    with store.writer(run_id=run_id, env_id="E") as w:
        for _ in range(flushes):
            w.add_batch(make_batch(rng, T, B, obs_dim=4, p_terminated=0.06, p_truncated=0.03))
            w.flush()


@pytest.fixture
def filled(store: trajstore.Store) -> trajstore.Store:
    write(store, 0)
    return store


def learner(*args: Any) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, "-m", "tests.loaders.replay_learner", *map(str, args)], cwd=ROOT,
                            env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)


def stored(store: trajstore.Store, name: str) -> dict[tuple[int, int], float]:
    rows = store.sql(f"SELECT episode_id, step, priority FROM priorities WHERE replay = '{name}'").to_pylist()
    return {(r["episode_id"], r["step"]): r["priority"] for r in rows}


def probabilities(priority: dict[tuple[int, int], float], keys: list[tuple[int, int]], *, alpha: float = 0.6,
                  eps: float = 1e-6) -> dict[tuple[int, int], float]:
    """P of every item of ``keys``: its priority, or the largest stored for one without."""
    default = max(priority.values(), default=1.0)
    weight = {k: (priority.get(k, default) + eps) ** alpha for k in keys}
    total = sum(weight.values())
    return {k: w / total for k, w in weight.items()}


def item_keys(store: trajstore.Store) -> list[tuple[int, int]]:
    return [(r["episode_id"], r["step"]) for r in store.sql("SELECT episode_id, step FROM steps").to_pylist()]


@pytest.mark.slow  # processes of their own
def test_a_new_process_resumes_from_the_committed_priorities(filled: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    with filled.replay(n=2, gamma=0.9, priorities="learner", commit_interval=None) as replay:
        batch = replay.sample(200)
        replay.update(batch["index"], rng.exponential(1.0, 200))
        version = replay.commit()
        replay.update(batch["index"][:10], np.full(10, 99.0))  # given after the commit, committed on close
    assert version is not None and engine_of(filled).priorities.latest_version() > version
    given = stored(filled, "learner")
    assert max(given.values()) == 99.0
    out = subprocess.run([sys.executable, "-m", "tests.loaders.replay_learner", "resume", filled.uri, "."],
                         cwd=ROOT, capture_output=True, text=True, check=True,
                         env={**os.environ, "PYTHONPATH": str(ROOT)}).stdout
    want = probabilities(given, item_keys(filled))
    drawn = json.loads(out)
    assert len(drawn) == 4096
    for e, s, p in drawn:
        assert p == pytest.approx(want[(e, s)], rel=1e-9)


@pytest.mark.slow  # processes of their own
def test_a_learner_killed_mid_update_loses_only_what_it_had_not_committed(filled: trajstore.Store,
                                                                         tmp_path: Path) -> None:
    proc = learner("journal", filled.uri, tmp_path)
    assert proc.stdout is not None
    seen = 0
    deadline = time.monotonic() + 120
    while seen < 15 and time.monotonic() < deadline:
        line = proc.stdout.readline()
        if not line:
            break
        seen = int(line.split()[1])
    time.sleep(np.random.default_rng().uniform(0.0, 0.05))  # somewhere in an update or a commit
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    assert seen >= 15, proc.stderr.read() if proc.stderr else ""
    journals = sorted((int(p.stem.split("-")[1]), p) for p in tmp_path.glob("journal-*.npz"))
    last = journals[-1][0]
    assert last >= seen
    table = stored(filled, "learner")  # the table loads
    states = []
    for k in (last, last - 1):
        j = np.load(tmp_path / f"journal-{k}.npz")
        states.append({(int(e), int(s)): float(p) for e, s, p in zip(j["episode"], j["step"], j["priority"])})
    # what was committed before the kill is there, and nothing else: the journal of the last commit that landed
    assert table in states
    # and a new replay resumes from it
    with filled.replay(n=2, gamma=0.9, priorities="learner") as again:
        batch = again.sample(1000)
    want = probabilities(table, item_keys(filled))
    for e, s, p in zip(batch["episode_id"], batch["start"], batch["probability"]):
        assert p == pytest.approx(want[(int(e), int(s))], rel=1e-9)


@pytest.mark.slow  # processes of their own
def test_two_learners_updating_one_table_both_land(filled: trajstore.Store, tmp_path: Path) -> None:
    rounds = 15
    procs = [learner("shared", filled.uri, tmp_path, i, rounds) for i in (1, 2)]
    deadline = time.monotonic() + 120
    while not all((tmp_path / f"opened-{i}").exists() for i in (1, 2)):  # both opened their replay
        assert time.monotonic() < deadline and all(p.poll() is None for p in procs), \
            [p.communicate()[1] for p in procs if p.poll() is not None]
        time.sleep(0.02)
    (tmp_path / "go").write_text("")
    outs = [p.communicate(timeout=300) for p in procs]
    for p, (_, err) in zip(procs, outs):
        assert p.returncode == 0, err
    versions = [[int(line.split()[1]) for line in out.splitlines()] for out, _ in outs]
    assert all(len(v) == rounds for v in versions)
    assert len(set(versions[0]) | set(versions[1])) == 2 * rounds  # every commit its own version: none lost
    table = engine_of(filled).priorities
    rows = trajstore.open(filled.uri).sql("SELECT episode_id, step, priority, version FROM priorities").to_pylist()
    with filled.replay(priorities=None) as replay:  # the handles' keys: the same replay, the same order
        batch = replay.sample(4000)
    keys = {int(h): (int(e), int(s)) for h, e, s in zip(batch["index"], batch["episode_id"], batch["start"])}
    got = {(r["episode_id"], r["step"]): (r["priority"], r["version"]) for r in rows}
    for learner_no in (1, 2):
        for h in np.arange(1, 11) + 10 * learner_no:
            if int(h) in keys:
                assert got[keys[int(h)]][0] == 1000.0 * learner_no + rounds - 1
    last = max(versions[0][-1], versions[1][-1])
    winner = 1 if versions[0][-1] == last else 2
    assert got[keys[0]] == (1000.0 * winner + rounds - 1, last)  # the later commit's value
    assert table.latest_version() >= 2 * rounds


def test_version_reads_the_priorities_as_they_were(filled: trajstore.Store) -> None:
    with filled.replay(priorities="v", commit_interval=None, alpha=1.0, eps=1e-9) as replay:
        n = len(replay)
        replay.update(np.arange(n), np.full(n, 2.0))
        first = replay.commit()
        replay.update([0], [50.0])
        second = replay.commit()
    assert first is not None and second is not None and second > first
    with filled.replay(priorities="v", version=first, alpha=1.0, eps=1e-9) as old:
        assert np.allclose(old.sample(500)["probability"], 1.0 / n)
    with filled.replay(priorities="v", alpha=1.0, eps=1e-9) as now:
        top = now.sample(5000)
        assert top["probability"].max() == pytest.approx(50.0 / (50.0 + 2.0 * (n - 1)), rel=1e-9)
    with pytest.raises(VersionNotFoundError, match="^version: the priorities table .* has no version 999"):
        filled.replay(priorities="v", version=999)


def test_commits_come_on_their_own_by_time_and_by_count(filled: trajstore.Store) -> None:
    with filled.replay(priorities="auto", commit_interval="0.2s", commit_updates=None) as replay:
        replay.update([0, 1], [3.0, 4.0])
        deadline = time.monotonic() + 20
        while replay.pending and time.monotonic() < deadline:
            time.sleep(0.05)
        assert replay.pending == 0 and len(stored(filled, "auto")) == 2
    with filled.replay(priorities="counted", commit_interval=None, commit_updates=10) as replay:
        replay.update(np.arange(5), np.ones(5))
        time.sleep(0.5)
        assert replay.pending == 5 and not stored(filled, "counted")
        replay.update(np.arange(5, 10), np.ones(5))
        deadline = time.monotonic() + 20
        while replay.pending and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(stored(filled, "counted")) == 10


def test_deleting_a_run_removes_its_priorities(store: trajstore.Store) -> None:
    write(store, 0, run_id="a")
    write(store, 1, run_id="b")
    with store.replay(priorities="p") as replay:
        n = len(replay)
        replay.update(np.arange(n), np.arange(n, dtype=np.float64))
    b_episodes = {r["episode_id"] for r in store.sql("SELECT episode_id FROM episodes WHERE run_id = 'b'")
                  .to_pylist()}
    assert {e for e, _ in stored(store, "p")} > b_episodes
    store.maintain.delete(run_id="a")
    assert {e for e, _ in stored(store, "p")} == b_episodes
    with store.replay(priorities="p") as again:
        assert len(again) == sum(1 for e, _ in item_keys(store) if e in b_episodes)


def test_compaction_and_vacuum_keep_them(store: trajstore.Store) -> None:
    write(store, 0, flushes=6, T=10)
    with store.replay(priorities="kept", commit_interval=None) as replay:
        n = len(replay)
        replay.update(np.arange(n), np.random.default_rng(0).exponential(1.0, n))
        for _ in range(40):  # enough commits to merge the table's files too
            replay.update([0], [float(np.random.default_rng().integers(1, 9))])
            replay.commit()
    before = stored(store, "kept")
    assert len(store.maintain.files()) >= 6
    trajstore.compact(store, progress=False)
    assert len(store.maintain.files()) == 1
    store.maintain.vacuum(older_than=0)
    assert stored(store, "kept") == before
    assert len(engine_of(store).priorities.file_paths()) < 10
    with store.replay(priorities="kept") as again:
        batch = again.sample(2000)
    want = probabilities(before, item_keys(store))
    for e, s, p in zip(batch["episode_id"], batch["start"], batch["probability"]):
        assert p == pytest.approx(want[(int(e), int(s))], rel=1e-9)


@pytest.mark.parametrize("worker", [True, False])
def test_the_priorities_view_joins_episodes_in_the_sandbox_too(filled: trajstore.Store, worker: bool) -> None:
    with filled.replay(priorities="sql") as replay:
        replay.update([0, 1, 2], [5.0, 1.0, 3.0])
    query = ("SELECT e.episode_id, max(p.priority) AS top FROM priorities p JOIN episodes e USING (episode_id) "
             "WHERE p.replay = 'sql' GROUP BY ALL ORDER BY top DESC")
    limits = sandbox.Limits(worker_bytes=sandbox.WORKER_BYTES if worker else None)
    got = plumbing(filled).sandboxed_sql(query, limits).table
    assert got == filled.sql(query) and got["top"].to_pylist()[0] == 5.0
    steps = filled.sql("SELECT p.priority, s.reward FROM priorities p JOIN steps s USING (episode_id, step) "
                       "WHERE p.replay = 'sql'")
    assert steps.num_rows == 3


def test_a_store_read_at_a_version_takes_no_commits(filled: trajstore.Store) -> None:
    pinned = trajstore.open(filled.uri, version=filled.version)
    with pinned.replay(priorities="pinned", commit_interval=None) as replay:
        replay.update([0], [2.0])
        with pytest.raises(ReadOnlyError, match="read-only"):
            replay.commit()
    assert not stored(filled, "pinned")
