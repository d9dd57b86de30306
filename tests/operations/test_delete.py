"""store.maintain.delete: whole episodes in one commit, checked against a plain filter of the rows read before; partial
episodes refused; unknown runs named; appends made meanwhile kept; a killed delete leaves a readable store."""

from __future__ import annotations

import subprocess
import sys
import threading
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.errors import InputError, ReadOnlyError, RunNotFoundError
from trajstore.store import check, plumbing


def fill(store: trajstore.Store, seed: int = 0) -> None:
    """Two runs of many small files (episodes cross files), two policy versions in run a."""
    rng = np.random.default_rng(seed)
    for run in ("a", "b"):
        for version in (1, 2):
            with store.writer(run_id=run, env_id="E", flush_bytes=1, policy_version=version) as w:
                for _ in range(4):
                    w.add_batch(make_batch(rng, 8, 3))


def all_steps(store: trajstore.Store) -> pa.Table:
    return store.sql("SELECT * FROM steps ORDER BY episode_id, step")


def test_deleting_a_run_removes_exactly_its_episodes(store: trajstore.Store) -> None:
    fill(store)
    before, version = all_steps(store), store.version
    report = store.maintain.delete(run_id="a")
    expected = before.filter(pc.not_equal(before["run_id"], "a"))
    assert all_steps(store).equals(expected)
    gone = before.filter(pc.equal(before["run_id"], "a"))
    assert (report.steps, report.episodes, report.runs) == \
        (gone.num_rows, len(set(gone["episode_id"].to_pylist())), ["a"])
    assert report.version == store.version == version + 1  # one commit
    assert plumbing(store).run_ids() == ["b"] and check(store).ok


def test_a_where_over_steps_deletes_whole_episodes_and_rewrites_mixed_files(store: trajstore.Store) -> None:
    rng = np.random.default_rng(1)
    with store.writer(run_id="a", env_id="E", flush_bytes=1, seed=0) as w:  # one file per batch: files mix
        for _ in range(6):  # episodes that end and episodes that go on
            w.add_batch(make_batch(rng, 6, 4, p_terminated=0.3))
    before = all_steps(store)
    ends = store.episodes().filter(pc.field("episode_length") > 3)["episode_id"].to_pylist()[:3]
    where = f"episode_id IN ({', '.join(map(str, ends))})"
    report = store.maintain.delete(steps_where=where)
    keep = pc.invert(pc.is_in(before["episode_id"], pa.array(ends, pa.int64())))
    assert all_steps(store).equals(before.filter(keep))
    assert report.episodes == 3 and report.files_rewritten > 0
    assert pa.types.is_fixed_size_list(store.schema().field("obs").type)  # rewritten files keep stored types
    assert check(store).ok


def test_a_where_over_episodes_deletes_the_episodes_it_selects(store: trajstore.Store) -> None:
    fill(store)
    before = store.episodes()
    report = store.maintain.delete(where="episode_return < 0")
    expected = before.filter(pc.field("episode_return") >= 0)
    assert store.episodes()["episode_id"].to_pylist() == expected["episode_id"].to_pylist()
    assert report.episodes == before.num_rows - expected.num_rows


def test_a_where_that_cuts_episodes_is_refused_and_nothing_changes(store: trajstore.Store) -> None:
    fill(store)
    version = store.version
    first = store.episodes(where="episode_length >= 3", limit=1).to_pylist()[0]
    with pytest.raises(InputError, match=rf"where: .*selects part of .*episode {first['episode_id']} "
                                         rf"\(run_id='{first['run_id']}'\): 2 of its {first['episode_length']} steps"):
        store.maintain.delete(steps_where=f"episode_id = {first['episode_id']} AND step < 2")
    assert store.version == version


def test_bad_arguments_are_named(store: trajstore.Store) -> None:
    fill(store)
    with pytest.raises(RunNotFoundError, match=r"run_id: no run 'nope' in .*; its runs: a, b"):
        store.maintain.delete(run_id="nope")
    with pytest.raises(LookupError):
        store.maintain.delete(run_id="nope")
    with pytest.raises(InputError, match="give run_id= .*, where= .* and/or steps_where="):
        store.maintain.delete()
    with pytest.raises(InputError, match="^steps_where: .*no_such_column"):
        store.maintain.delete(steps_where="no_such_column = 1")
    with pytest.raises(InputError, match=r"^where: .*\"step\".*where= is a condition over the episodes view \(for a "
                                         r"condition over steps give steps_where=\)"):
        store.maintain.delete(where="step < 2")
    with pytest.raises(ReadOnlyError, match="read-only at version 0"):
        trajstore.open(store.uri, version=0).maintain.delete(run_id="a")


def test_dry_run_changes_nothing(store: trajstore.Store) -> None:
    fill(store)
    version, before = store.version, all_steps(store)
    report = store.maintain.delete(run_id="b", steps_where="policy_version = 2", dry_run=True)
    assert report.dry_run and report.episodes > 0 and report.version is None
    assert store.version == version and all_steps(store).equals(before)
    assert "would delete" in report.format()


def test_appends_while_deleting_are_all_kept(store: trajstore.Store) -> None:
    fill(store)
    appended: list[int] = []
    stop = threading.Event()

    def append() -> None:
        rng = np.random.default_rng(7)
        with store.writer(run_id="new", env_id="E", flush_bytes=1) as w:
            while not stop.is_set():
                w.add_batch(make_batch(rng, 5, 2, p_terminated=1.0))  # every step ends an episode
                appended.append(10)

    thread = threading.Thread(target=append)
    thread.start()
    try:
        while len(appended) < 2:
            time.sleep(0.01)
        store.maintain.delete(run_id="a")
        store.maintain.delete(steps_where="policy_version = 2")
        time.sleep(0.1)
    finally:
        stop.set()
        thread.join()
    assert store.sql("SELECT count(*) AS n FROM steps WHERE run_id = 'new'")["n"][0].as_py() == sum(appended)
    assert set(plumbing(store).run_ids()) == {"b", "new"} and check(store).ok


KILLED = """
import sys, trajstore
store = trajstore.open(sys.argv[1])
print("ready", flush=True)
while True:  # one episode at a time: each delete rewrites the files its episode shares with others
    store.maintain.delete(steps_where="episode_id = (SELECT min(episode_id) FROM episodes)")
"""


@pytest.mark.slow
def test_a_killed_delete_leaves_a_readable_store(store: trajstore.Store, tmp_path: Path) -> None:
    fill(store)
    episodes = check(store).episodes
    for attempt in range(3):
        proc = subprocess.Popen([sys.executable, "-c", KILLED, str(store.root)], stdout=subprocess.PIPE, text=True,
                                cwd=Path(__file__).parents[2])
        assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
        time.sleep(0.2 + 0.15 * attempt)
        proc.kill()
        proc.wait()
    report = check(store)
    assert report.ok, report.format()
    assert 0 < report.episodes < episodes  # the killed processes did delete, and the store reads
    assert trajstore.open(store.root).stats()["n_traj"][0].as_py() >= 0
