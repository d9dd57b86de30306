"""Writers keep the store compact: small files merged after commits (every step once, racing anything), the log
checkpointed, and the upkeep visible (check's file counts, history's compactions, /health's checkpoint lag)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests import seaweed
from tests.helpers import assert_same_stats, make_batch, steps_table, wait_for
from trajstore.operations import compact as compaction
from trajstore.operations import upkeep as upkeeps
from trajstore.operations.upkeep import CompactionPolicy, Upkeep, compact_small
from trajstore.settings import Settings
from trajstore.store import check, plumbing

REPO = Path(__file__).parents[2]
SMALL = 4  # small files a partition may hold before a writer merges them, in these tests


def opened(uri: Any, *, small_files: int = SMALL, checkpoint_interval: int = 100, **kw: Any) -> trajstore.Store:
    settings = Settings(compact_small_files=small_files, checkpoint_interval=checkpoint_interval)
    return trajstore.open(uri, create=True, settings=settings, **kw)


def write(store: trajstore.Store, commits: int, *, run: str = "a", env: str = "E", seed: int = 0,
          **options: Any) -> None:
    rng = np.random.default_rng(seed)
    with store.writer(run_id=run, env_id=env, flush_bytes=1, **options) as w:
        for _ in range(commits):
            w.add_batch(make_batch(rng, 6, 3))


def everything(store: trajstore.Store) -> pa.Table:
    """Every step, in an order two stores written alike share (episode ids are drawn at random per writer)."""
    return store.sql("SELECT * EXCLUDE (wall_time, episode_id), dense_rank() OVER (ORDER BY episode_id) AS nth "
                     "FROM steps ORDER BY env_steps, env_index")


def test_a_writer_merges_its_small_files_and_keeps_every_step(tmp_path: Path) -> None:
    reference = opened(tmp_path / "ref", small_files=0)  # no upkeep: one file per commit
    store = opened(tmp_path / "store")
    write(reference, 30)
    write(store, 30)
    assert len(reference.maintain.files()) == 30
    assert len(store.maintain.files()) <= SMALL + 1  # merged as it went, and once more on close
    assert everything(store).equals(everything(reference))
    assert_same_stats(store.stats(), reference.stats())
    report = check(store, deep=True)  # every merged file decodes, each episode contiguous and whole
    assert report.ok, report.format()
    history = store.history().to_pylist()
    compactions = [h for h in history if h["operation"] == "compact"]
    assert compactions and all(h["files_removed"] > SMALL and h["files_added"] == 1 and
                               h["rows_added"] == h["rows_removed"] for h in compactions)
    assert sum(h["rows_added"] for h in history if h["operation"] == "append") == everything(store).num_rows


def test_frame_stacks_and_next_obs_survive_merging(tmp_path: Path) -> None:
    rng = np.random.default_rng(3)
    stores = [opened(tmp_path / "ref", small_files=0), opened(tmp_path / "store")]
    frames = rng.integers(0, 255, (40, 2, 5, 5), dtype=np.uint8)
    for store in stores:
        with store.writer(run_id="px", env_id="Pix-v0", flush_bytes=1, frame_stack={"obs": 3}) as w:
            for t in range(2, 38, 3):  # stacks shifting by one frame, episodes crossing commits
                obs = np.stack([frames[t - 2 + i:t + 1 + i].transpose(1, 0, 2, 3) for i in range(3)])
                nxt = np.stack([frames[t - 1 + i:t + 2 + i].transpose(1, 0, 2, 3) for i in range(3)])
                w.add_batch({"obs": obs, "next_obs": nxt, "action": np.zeros((3, 2), int),
                             "reward": np.ones((3, 2), np.float32), "terminated": np.zeros((3, 2), bool),
                             "truncated": np.zeros((3, 2), bool)})
    ref, store = stores
    assert len(store.maintain.files()) < len(ref.maintain.files())
    columns = ["env_index", "step", "obs", "next_obs"]  # one episode per env (none ends)
    read = [pa.Table.from_batches(list(s.scan(columns))).sort_by([("env_index", "ascending"), ("step", "ascending")])
            for s in stores]
    assert read[0].num_rows == 12 * 3 * 2
    assert read[1].equals(read[0])
    assert check(store, deep=True).ok


def test_racing_compactions_one_wins_the_other_skips(store: trajstore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    write(store, 12, upkeep=None)  # no writer compacts: the test's compactions race
    before = everything(store)
    both_read = threading.Barrier(2)
    real = compaction.merged

    def merged_then_wait(files: Any) -> pa.Table:
        out = real(files)
        both_read.wait(timeout=30)  # each has read the same files before either commits
        return out

    monkeypatch.setattr(compaction, "merged", merged_then_wait)
    results: list[Any] = []
    policy = CompactionPolicy(small_files=SMALL)
    threads = [threading.Thread(target=lambda: results.append(compact_small(steps_table(store),
                                                                            "a", "E", policy))) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert sorted(r is None for r in results) == [False, True]  # exactly one committed
    assert len(store.maintain.files()) == 1 and everything(store).equals(before)
    on_disk = set(map(str, Path(store.maintain.files()[0].path).parent.glob("*.parquet")))
    assert len(on_disk) == 12 + 1  # the loser deleted the file it wrote
    assert [h["operation"] for h in store.history().to_pylist()].count("compact") == 1


@pytest.mark.parametrize("other", ["delete", "add_column"])
def test_a_change_during_compaction_wins_and_nothing_is_lost(store: trajstore.Store, monkeypatch: pytest.MonkeyPatch,
                                                            other: str) -> None:
    write(store, 12, upkeep=None)  # no writer compacts: the test's compactions race
    real = compaction.merged
    first = store.episodes(order_by="episode_id")["episode_id"][0].as_py()

    def merged_then_change(files: Any) -> pa.Table:
        out = real(files)
        if other == "delete":
            store.maintain.delete(steps_where=f"episode_id = {first}")
        else:
            store.maintain.add_column("double_reward", "reward * 2")
        return out

    monkeypatch.setattr(compaction, "merged", merged_then_change)
    kept = None
    if other == "delete":
        kept = store.sql(f"SELECT * FROM steps WHERE episode_id <> {first}").num_rows
    policy = CompactionPolicy(small_files=SMALL)
    assert compact_small(steps_table(store), "a", "E", policy) is None  # its files were gone
    if kept is not None:
        assert store.sql("SELECT * FROM steps").num_rows == kept
        assert store.sql(f"SELECT * FROM steps WHERE episode_id = {first}").num_rows == 0
    else:
        sums = store.sql("SELECT sum(double_reward) AS d, sum(reward) AS r, count(*) AS n FROM steps").to_pylist()[0]
        assert sums["d"] == pytest.approx(2 * sums["r"]) and sums["n"] == 12 * 6 * 3
    assert check(store).ok


KILLED_WRITER = r"""
import sys
import numpy as np
import trajstore
from trajstore.settings import Settings

sys.path.insert(0, sys.argv[3])
from tests.helpers import make_batch

store = trajstore.open(sys.argv[1], settings=Settings(compact_small_files=2))
rng = np.random.default_rng(0)
rows = 0
with open(sys.argv[2], "a") as side, store.writer(run_id="k", env_id="E", flush_bytes=1) as w:
    print("ready", flush=True)
    while True:  # a compaction every few commits, on the writer's upkeep thread: the kill lands in some
        rows += w.add_batch(make_batch(rng, 64, 4))
        w.flush()
        side.write(f"{rows}\n")  # committed before it is written here
        side.flush()
"""


def _lines(path: Path) -> int:
    return len(path.read_text().split()) if path.exists() else 0


@pytest.mark.slow
def test_a_killed_compaction_leaves_a_readable_store(tmp_path: Path) -> None:
    store = opened(tmp_path / "store")
    side = tmp_path / "committed"
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", KILLED_WRITER, str(store.root), str(side), str(REPO)],
                                stdout=subprocess.PIPE, text=True)
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and _lines(side) < 6 * (attempt + 1):  # compactions under way
            time.sleep(0.02)
        time.sleep(0.05 * attempt)
        os.kill(proc.pid, signal.SIGKILL)
        proc.wait(30)
    report = check(store, deep=True)
    assert report.ok, report.format()
    counts = [int(x) for x in side.read_text().split()]
    assert any(h["operation"] == "compact" for h in store.history().to_pylist())
    n = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
    # each killed process committed what its side file says, and at most one more batch
    ends = [c for i, c in enumerate(counts) if i + 1 == len(counts) or counts[i + 1] <= c]
    assert sum(ends) <= n <= sum(ends) + 3 * 64 * 4
    dupes = store.sql("SELECT episode_id, step, count(*) AS c FROM steps GROUP BY ALL HAVING c > 1")
    assert dupes.num_rows == 0  # every step once


def test_an_upkeep_remembers_only_its_latest_compactions(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """A service's upkeep runs for days: what it did is kept for a look, the latest KEPT only."""
    monkeypatch.setattr(upkeeps, "KEPT", 2)
    store = opened(tmp_path / "store", small_files=0)
    upkeep = Upkeep(steps_table(store), CompactionPolicy(small_files=2, checkpoint_interval=0))
    for seed in range(4):  # each round: three small files, then the upkeep's round merges them
        write(store, 3, seed=seed)
        upkeep._round([("a", "E")])
    merged = [r["version"] for r in store.history().to_pylist() if r["operation"] == "compact"]
    assert len(merged) == 4 and not upkeep.errors
    assert [c.version for c in upkeep.compactions] == merged[-2:]


def test_checkpoints_every_interval_and_health_reports_the_lag(tmp_path: Path) -> None:
    store = opened(tmp_path / "store", small_files=0, checkpoint_interval=5)
    write(store, 12)
    assert steps_table(store).log.last_checkpoint() is not None
    assert store.version - steps_table(store).log.last_checkpoint() < 5  # type: ignore[operator]
    version, behind = plumbing(store).log_lag()
    assert version == store.version and 0 <= behind < 5
    plain = opened(tmp_path / "plain", small_files=0, checkpoint_interval=0)
    write(plain, 12)
    assert steps_table(plain).log.last_checkpoint() is None and plumbing(plain).log_lag()[1] == plain.version + 1
    assert steps_table(plain).log.checkpoint_if_due(5) == plain.version  # what a writer's upkeep does
    assert plumbing(plain).log_lag()[1] == 0 and everything(trajstore.open(plain.root)).num_rows == 12 * 6 * 3

    from fastapi.testclient import TestClient

    from trajstore.api.app import create_app
    from trajstore.api.settings import ServiceSettings
    with TestClient(create_app(ServiceSettings(store=str(store.root)))) as client:
        answers: list[dict[str, object]] = []  # the first check of the store runs as the app starts
        wait_for(lambda: answers.append(client.get("/health").json()) or answers[-1]["status"] != "checking",
                 "the service's first check of the store")
        health = answers[-1]
    assert health == {"status": "ok", "version": store.version, "versions_since_checkpoint": behind}


def test_check_and_history_show_the_upkeep_from_the_shell(tmp_path: Path,
                                                        capsys: pytest.CaptureFixture[str]) -> None:
    from trajstore import cli

    store = opened(tmp_path / "store", small_files=0)
    write(store, 6, run="a")
    write(store, 2, run="b")
    report = check(store)
    assert [(p.run_id, p.files, p.small_files) for p in report.partitions] == [("a", 6, 6), ("b", 2, 2)]
    assert report.small_files == 8
    env = {"TRAJSTORE_COMPACT_SMALL_FILES": "4"}
    os.environ.update(env)
    try:
        assert cli.main(["check", "--store", str(store.root)]) == 0
        out = capsys.readouterr().out
        assert "files: 2 partition(s), 8 files, 8 small (below 16 MiB)" in out
        assert "run_id=a/env_id=E: 6 files, 6 small" in out and "more than 4 small files" in out
        write(trajstore.open(store.root), 1, run="a", seed=1)  # the next writer there merges them
        assert cli.main(["check", "--store", str(store.root)]) == 0
        out = capsys.readouterr().out
        assert "run_id=a/env_id=E: 1 files, 0 small" in out and "more than 4" not in out  # nothing to merge
        assert cli.main(["history", "--store", str(store.root), "--format", "csv"]) == 0
        last = capsys.readouterr().out.strip().splitlines()[-1]
        assert ",compact," in last and ",1,7," in last  # files added, files removed
    finally:
        for key in env:
            os.environ.pop(key)


@pytest.mark.s3
def test_writers_compact_on_s3(s3: seaweed.SeaweedFS) -> None:
    store = opened(f"s3://{s3.bucket()}/upkeep", storage_options=s3.storage_options)
    write(store, 14, seed=4)
    assert len(store.maintain.files()) <= SMALL + 1
    assert any(h["operation"] == "compact" for h in store.history().to_pylist())
    assert store.sql("SELECT count(*) AS n, count(DISTINCT (episode_id, step)) AS d FROM steps").to_pylist() == [
        {"n": 14 * 6 * 3, "d": 14 * 6 * 3}]
    assert check(store, deep=True).ok


def test_the_service_compacts_what_remote_writers_send(tmp_path: Path) -> None:
    from tests.storage.helpers import rows

    store = opened(tmp_path / "store")
    for i in range(12):  # what POST /runs/{run_id}/batches hands to Store.ingest: one commit each
        plumbing(store).ingest(rows(5, episode_id=100 + i), run_id="remote", env_id="E")
    deadline = time.monotonic() + 60
    while len(store.maintain.files()) > SMALL + 1 and time.monotonic() < deadline:  # on the ingest upkeep's thread
        time.sleep(0.05)
    assert len(store.maintain.files()) <= SMALL + 1
    assert any(h["operation"] == "compact" for h in store.history().to_pylist())
    got = store.sql("SELECT episode_id, count(*) AS n FROM steps GROUP BY ALL ORDER BY episode_id").to_pylist()
    assert got == [{"episode_id": 100 + i, "n": 5} for i in range(12)]
    assert check(store, deep=True).ok
