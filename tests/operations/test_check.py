"""``check``: a healthy store passes; damaged files and broken episodes are reported by name; stray files are not."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import pytest

import trajstore
from tests import delta_protocol
from tests.helpers import steps_table
from trajstore.operations.check import CheckReport
from trajstore.store import check, remove_orphans

T, B = 12, 3


def _batch(rng: np.random.Generator) -> dict[str, Any]:
    return {"obs": rng.standard_normal((T, B, 2)).astype(np.float32), "action": rng.integers(0, 3, (T, B)),
            "reward": rng.uniform(-1, 1, (T, B)).astype(np.float32),
            "next_obs": rng.standard_normal((T, B, 2)).astype(np.float32),
            "terminated": rng.random((T, B)) < 0.2, "truncated": rng.random((T, B)) < 0.05}


@pytest.fixture
def healthy(tmp_path: Path) -> trajstore.Store:
    """A store of 4 commits in one partition and 1 in another; episodes cross commits."""
    store = trajstore.open(tmp_path / "store", create=True)
    rng = np.random.default_rng(7)
    with store.writer(run_id="r", env_id="A", flush_bytes=1) as w:
        for _ in range(4):
            w.add_batch(_batch(rng))
    with store.writer(run_id="r", env_id="B") as w:
        w.add_batch(_batch(rng))
    return store


def _template(store: trajstore.Store) -> pa.Table:
    """The rows of one committed file: a table with exactly the stored column types."""
    return pq.read_table(store.maintain.files()[0].path)


def _episode(template: pa.Table, episode_id: int, steps: list[int], end_at: int | None = None) -> pa.Table:
    """Rows of one hand-made episode with the given ``step`` values; terminated at step ``end_at``."""
    rows = template.slice(0, 1).take(pa.array(np.zeros(len(steps), np.int64)))
    rows = rows.set_column(rows.schema.get_field_index("episode_id"), "episode_id",
                           pa.array([episode_id] * len(steps), pa.int64()))
    rows = rows.set_column(rows.schema.get_field_index("step"), "step", pa.array(steps, pa.int32()))
    ended = [s == end_at for s in steps]
    rows = rows.set_column(rows.schema.get_field_index("terminated"), "terminated", pa.array(ended))
    return rows.set_column(rows.schema.get_field_index("truncated"), "truncated", pa.array([False] * len(steps)))


def _problem(report: CheckReport, *needles: str) -> str:
    """The one problem line containing every needle."""
    hits = [p for p in report.problems if all(n in p for n in needles)]
    assert len(hits) == 1, f"expected one problem with {needles}, got:\n{report.format()}"
    return hits[0]


def test_healthy_store_passes(healthy: trajstore.Store) -> None:
    report = check(healthy)
    assert report.ok, report.format()
    assert report.problems == [] and report.orphans == []
    assert report.files == len(healthy.maintain.files()) == 5
    assert report.steps == healthy.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 5 * T * B
    assert report.episodes == healthy.sql("SELECT count(*) AS n FROM episodes")["n"][0].as_py()
    assert str(report).startswith(f"ok: 5 committed files, {report.episodes} episodes, {5 * T * B} steps")


def test_empty_store_passes(tmp_path: Path) -> None:
    report = check(trajstore.open(tmp_path / "empty", create=True))
    assert report.ok and (report.files, report.episodes, report.steps) == (0, 0, 0)


def test_truncated_file_is_reported_by_path_and_the_rest_still_checked(healthy: trajstore.Store) -> None:
    files = healthy.maintain.files()
    victim = files[1]
    survivors = pa.concat_tables([pq.read_table(f.path) for f in files if f.path != victim.path])
    data = Path(victim.path).read_bytes()
    Path(victim.path).write_bytes(data[: len(data) // 2])

    report = check(healthy)

    assert not report.ok
    line = _problem(report, victim.path)
    assert "not a readable Parquet file" in line and f"the log says {victim.size}" in line
    assert report.files == len(files)
    assert report.steps == survivors.num_rows  # the episode checks ran over the readable files
    assert victim.path in report.format()


def test_missing_file_is_reported(healthy: trajstore.Store) -> None:
    victim = healthy.maintain.files()[0]
    Path(victim.path).unlink()
    report = check(healthy)
    assert "committed file is missing" in _problem(report, victim.path)


def test_file_whose_row_count_differs_from_the_log_is_reported(healthy: trajstore.Store) -> None:
    victim = healthy.maintain.files()[0]
    table = pq.read_table(victim.path)
    pq.write_table(table.slice(0, 5), victim.path)
    report = check(healthy)
    assert f"holds 5 rows, the log says {victim.rows}" in _problem(report, victim.path)


def test_unreadable_log_is_reported(healthy: trajstore.Store) -> None:
    log_dir = steps_table(healthy).path / "_delta_log"
    latest = log_dir / f"{steps_table(healthy).log.latest_number():020d}.json"
    latest.write_bytes(latest.read_bytes()[:40])
    report = check(healthy)
    assert not report.ok and report.files == 0
    assert f"the commit log {log_dir} cannot be read" in _problem(report, "commit log")


def test_rows_deleted_through_a_deletion_vector_are_a_problem_named(healthy: trajstore.Store,
                                                                   capsys: pytest.CaptureFixture[str]) -> None:
    """Another engine deleted an episode through a deletion vector (Delta's reader feature ``deletionVectors``, which
    trajstore does not apply): ``check`` reports that version as one it cannot read, naming the feature and the
    version (its files' rows are not the table's), and the CLI exits 1."""
    from trajstore import cli

    done = healthy.episodes().filter(pc.field("complete"))
    version = delta_protocol.delete_episode(steps_table(healthy).path, done["episode_id"][0].as_py())
    report = check(healthy)
    assert len(report.problems) == 1, report.format()
    assert f"at version {version}: rows of it were deleted through deletion vectors (the Delta reader feature " \
           "deletionVectors" in report.problems[0]
    assert cli.main(["check", "--store", str(healthy.root)]) == 1
    assert capsys.readouterr().out.startswith("1 problem(s)")


def test_gap_in_steps_is_reported(healthy: trajstore.Store) -> None:
    steps_table(healthy).append(_episode(_template(healthy), 111, [0, 1, 4, 5, 6], end_at=6), run_id="r", env_id="A")
    report = check(healthy)
    line = _problem(report, "episode 111 ")
    assert "not contiguous" in line and "missing steps 2..3" in line
    assert "run_id='r', env_id='A'" in line


def test_episode_not_starting_at_zero_is_reported(healthy: trajstore.Store) -> None:
    steps_table(healthy).append(_episode(_template(healthy), 112, [3, 4, 5]), run_id="r", env_id="A")
    assert "missing steps 0..2" in _problem(check(healthy), "episode 112 ")


def test_duplicate_step_is_reported(healthy: trajstore.Store) -> None:
    steps_table(healthy).append(_episode(_template(healthy), 222, [0, 1, 2, 2, 3], end_at=3), run_id="r", env_id="A")
    line = _problem(check(healthy), "episode 222 ")
    assert "1 duplicate step rows (steps 2)" in line
    assert "not contiguous" not in line


def test_duplicate_across_commits_is_reported(healthy: trajstore.Store) -> None:
    """The same step written by two commits (e.g. a retried append) is a duplicate too."""
    template = _template(healthy)
    steps_table(healthy).append(_episode(template, 223, [0, 1, 2]), run_id="r", env_id="A")
    steps_table(healthy).append(_episode(template, 223, [2, 3, 4], end_at=4), run_id="r", env_id="A")
    assert "duplicate step rows (steps 2)" in _problem(check(healthy), "episode 223 ")


def test_episode_id_in_two_partitions_is_reported(healthy: trajstore.Store) -> None:
    episode = healthy.episodes(env_id="A", complete=True, limit=1)
    eid = episode["episode_id"][0].as_py()
    length = episode["episode_length"][0].as_py()
    steps_table(healthy).append(_episode(_template(healthy), eid, list(range(length)), end_at=length - 1),
                         run_id="r2", env_id="A")
    line = _problem(check(healthy), f"episode {eid} appears in 2 partitions")
    assert "r/A" in line and "r2/A" in line


def test_episode_id_used_twice_in_one_partition_is_reported(healthy: trajstore.Store) -> None:
    """Two separate episodes under one id: step 0 (and others) occur twice."""
    template = _template(healthy)
    steps_table(healthy).append(_episode(template, 333, [0, 1, 2], end_at=2), run_id="r", env_id="B")
    steps_table(healthy).append(_episode(template, 333, [0, 1], end_at=1), run_id="r", env_id="B")
    line = _problem(check(healthy), "episode 333 ")
    assert "step 0 occurs 2 times" in line and "duplicate step rows (steps 0..1)" in line


def test_steps_after_the_end_are_reported(healthy: trajstore.Store) -> None:
    steps_table(healthy).append(_episode(_template(healthy), 444, [0, 1, 2, 3], end_at=1), run_id="r", env_id="A")
    line = _problem(check(healthy), "episode 444 ")
    assert "steps up to 3 follow its end (terminated/truncated) at step 1" in line


def test_many_broken_episodes_are_summarised(healthy: trajstore.Store) -> None:
    template = _template(healthy)
    broken = pa.concat_tables([_episode(template, 1000 + i, [0, 2]) for i in range(30)])
    steps_table(healthy).append(broken, run_id="r", env_id="A")
    report = check(healthy)
    assert len(report.problems) == 21
    assert report.problems[-1] == "... and 10 more episodes with step defects"
    assert "episode 1000 " in report.problems[0]


def _zero_column_chunks(path: str, columns: list[str]) -> None:
    """Overwrite the pages of ``columns`` with zeros, keeping the footer and the file size."""
    meta = pq.read_metadata(path)
    data = bytearray(Path(path).read_bytes())
    for i in range(meta.num_columns):
        col = meta.row_group(0).column(i)
        if col.path_in_schema.split(".")[0] in columns:
            start = col.dictionary_page_offset or col.data_page_offset
            data[start:start + col.total_compressed_size] = bytes(col.total_compressed_size)
    Path(path).write_bytes(bytes(data))


def test_corrupt_key_column_pages_are_found(healthy: trajstore.Store) -> None:
    """The footer is intact but the episode_id/step pages are zeroed: the scan falls back to file by file."""
    victim = healthy.maintain.files()[2]
    _zero_column_chunks(victim.path, ["episode_id", "step"])
    report = check(healthy)
    assert "data pages cannot be decoded" in _problem(report, victim.path)
    assert report.steps == sum(f.rows for f in healthy.maintain.files() if f.path != victim.path)


def test_deep_check_decodes_every_column(healthy: trajstore.Store) -> None:
    victim = healthy.maintain.files()[1]
    _zero_column_chunks(victim.path, ["reward"])
    assert check(healthy).ok  # the quick check reads footers, the key and the observation columns only
    report = check(healthy, deep=True)
    assert "data pages cannot be decoded" in _problem(report, victim.path)


def test_orphan_half_written_file_is_information_not_a_problem(healthy: trajstore.Store) -> None:
    """A killed writer's file that never reached the log: readers and check ignore it."""
    committed = healthy.maintain.files()[0]
    before = healthy.stats()
    data = Path(committed.path).read_bytes()
    orphan = Path(committed.path).with_name("part-0000deadbeef.parquet")
    orphan.write_bytes(data[: len(data) // 3])  # no footer, like a writer killed mid-file

    report = check(healthy)
    assert report.ok, report.format()
    assert report.orphans == [str(orphan)]
    assert "1 file(s) on disk not listed by the latest version" in report.format()
    after = healthy.stats().to_pylist()[0]
    assert after == pytest.approx(before.to_pylist()[0], rel=1e-12)
    assert healthy.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 5 * T * B
    assert pc.sum(healthy.episodes()["episode_length"]).as_py() == 5 * T * B


def test_remove_orphans_deletes_only_old_files_no_commit_lists(healthy: trajstore.Store,
                                                               capsys: pytest.CaptureFixture[str]) -> None:
    from trajstore import cli

    committed = [f.path for f in healthy.maintain.files()]
    before = healthy.stats().to_pylist()
    part = Path(committed[0]).parent
    old, fresh = part / "part-00000000old.parquet", part / "part-0000000fresh.parquet"
    staging = steps_table(healthy).path / "_delta_log" / "_commit_0123.json.tmp"  # a killed log write's temp file
    for path in (old, fresh, staging):
        path.write_bytes(b"PAR1 cut short")
    an_hour_ago = time.time() - 3600
    for path in (old, staging):
        os.utime(path, (an_hour_ago, an_hour_ago))

    assert cli.main(["check", "--store", str(healthy.root), "--remove-orphans", "--older-than", "30m"]) == 0
    out = capsys.readouterr().out
    assert "removed 2 orphan file(s) older than 30m; kept 1 newer one(s)" in out
    assert not old.exists() and not staging.exists() and fresh.exists()
    assert all(Path(p).exists() for p in committed)
    assert check(healthy).orphans == [str(fresh)]
    assert healthy.stats().to_pylist()[0] == pytest.approx(before[0], rel=1e-12)  # summation order may vary
    with pytest.raises(trajstore.InputError, match="older_than_s"):
        remove_orphans(healthy, older_than_s=-1)


CHECK_UNDER_LIMIT = """
import resource, sys
limit = 3 * 2**30  # address space: a process that tried to hold one value per possible step would die here
resource.setrlimit(resource.RLIMIT_AS, (limit, limit))
import trajstore
report = trajstore.check(trajstore.open(sys.argv[1]))
print(report.format())
"""


def test_check_runs_in_bounded_memory_whatever_the_step_values(healthy: trajstore.Store) -> None:
    import subprocess
    import sys

    top = 2**31 - 1  # one stored row this far out: its gap spans the whole int32 range
    steps_table(healthy).append(_episode(_template(healthy), 333, [0, 1, 5, top, top], end_at=top), run_id="r",
                         env_id="A")
    done = subprocess.run([sys.executable, "-c", CHECK_UNDER_LIMIT, str(healthy.root)], capture_output=True,
                          text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-2000:]
    line = next(p for p in done.stdout.splitlines() if "episode 333 " in p)
    assert f"missing steps 2..4, 6..{top - 1}" in line and f"duplicate step rows (steps {top})" in line


def test_a_file_is_small_only_where_compaction_would_merge_it(tmp_path: Path) -> None:
    """Three small files in one partition are small; after compaction, the partition's one file is not (however
    few its bytes), and a partition written in one file never was."""
    from trajstore.settings import Settings
    from trajstore.store import compact

    store = trajstore.open(tmp_path / "s", create=True, settings=Settings(compact_small_files=0))
    rng = np.random.default_rng(0)
    for _ in range(3):
        with store.writer(run_id="many", env_id="E") as w:
            w.add_batch(_batch(rng))
    with store.writer(run_id="one", env_id="E") as w:
        w.add_batch(_batch(rng))
    report = check(store)
    assert {(p.run_id, p.files, p.small_files) for p in report.partitions} == {("many", 3, 3), ("one", 1, 0)}
    assert "3 small" in str(report)
    compact(store, progress=False)
    report = check(trajstore.open(tmp_path / "s"))
    assert {(p.run_id, p.files, p.small_files) for p in report.partitions} == {("many", 1, 0), ("one", 1, 0)}
    assert "0 small" in str(report)


# --- multi-agent episodes: a row's key is (episode_id, step, agent_id); each agent's env steps may skip ----------

SPREAD = "simple_spread_v3"


@pytest.fixture
def spread(tmp_path: Path) -> trajstore.Store:
    """A clean ``parallel_rollout`` of mpe2's simple_spread (3 agents acting together at every env step, so each
    step number occurs 3 times in an episode), beside a single-agent run."""
    pytest.importorskip("mpe2")
    from mpe2 import simple_spread_v3

    from trajstore.rollout import parallel_rollout

    store = trajstore.open(tmp_path / "spread", create=True)
    parallel_rollout(store, simple_spread_v3.parallel_env(N=3), run_id="spread", episodes=2, seed=0, progress=False)
    with store.writer(run_id="solo", env_id="A") as w:
        w.add_batch(_batch(np.random.default_rng(3)))
    return store


def _agent_rows(store: trajstore.Store, where: pa.compute.Expression) -> tuple[pa.Table, int]:
    """The rows of the first episode of run ``spread`` that ``where`` selects, as its committed file holds them
    (its types and format), and that episode's id."""
    held = pq.read_table(next(f.path for f in store.maintain.files() if f.run_id == "spread"))
    first = pc.min(held["episode_id"]).as_py()
    return held.filter((pc.field("episode_id") == first) & where), first


def test_a_clean_multi_agent_rollout_passes(spread: trajstore.Store, capsys: pytest.CaptureFixture[str]) -> None:
    from trajstore.cli import main

    report = check(spread)
    assert report.ok, report.format()
    assert report.episodes == spread.sql("SELECT count(*) AS n FROM episodes")["n"][0].as_py() == 2 + len(
        spread.episodes(run_id="solo"))
    assert report.steps == spread.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 2 * 25 * 3 + T * B
    assert main(["check", "--store", str(spread.root)]) == 0
    assert capsys.readouterr().out.startswith("ok: ")


def test_an_episode_of_agents_committed_twice_is_named_agent_by_agent(spread: trajstore.Store) -> None:
    rows, eid = _agent_rows(spread, pc.scalar(True))
    steps_table(spread).append(rows, run_id="spread", env_id=SPREAD)
    report = check(spread)
    assert len(report.problems) == 3, report.format()
    for agent in ("agent_0", "agent_1", "agent_2"):
        line = _problem(report, f"episode {eid} (run_id='spread', env_id='{SPREAD}'), agent '{agent}'")
        assert "25 duplicate step rows of this agent (steps 0..24; its rows were committed twice" in line


def test_one_agents_step_committed_twice_is_named(spread: trajstore.Store) -> None:
    rows, eid = _agent_rows(spread, (pc.field("agent_id") == "agent_1") & (pc.field("step") == 7))
    steps_table(spread).append(rows, run_id="spread", env_id=SPREAD)
    report = check(spread)
    assert report.problems == [f"episode {eid} (run_id='spread', env_id='{SPREAD}'), agent 'agent_1': 1 duplicate "
                               "step rows of this agent (steps 7; its rows were committed twice, or two episodes "
                               "share this id)"]


def test_an_agents_rows_after_its_end_are_reported(spread: trajstore.Store) -> None:
    rows, eid = _agent_rows(spread, (pc.field("agent_id") == "agent_2") & (pc.field("step") == 10))
    steps_table(spread).append(rows.set_column(rows.schema.get_field_index("step"), "step", pa.array([30], pa.int32())),
                        run_id="spread", env_id=SPREAD)
    line = _problem(check(spread), f"episode {eid} ", "agent 'agent_2'")
    assert "its steps up to 30 follow its end (terminated/truncated) at step 24" in line


def test_single_agent_rows_in_an_episode_of_agents_are_reported(spread: trajstore.Store) -> None:
    rows, eid = _agent_rows(spread, (pc.field("agent_id") == "agent_0") & (pc.field("step") == 0))
    steps_table(spread).append(rows.set_column(rows.schema.get_field_index("agent_id"), "agent_id",
                                        pa.nulls(1, pa.string())), run_id="spread", env_id=SPREAD)
    line = _problem(check(spread), f"episode {eid} ", "single-agent rows")
    assert "holds single-agent rows (agent_id null) beside the rows of agents" in line


def test_a_column_no_engine_can_hold_is_named_and_its_runs_can_be_deleted(tmp_path: Path) -> None:
    """Issue 47's store: a writer before names were checked committed an extra named ``""``, after which stats, SQL,
    check and even delete failed with DuckDB's "zero-length delimited identifier". Readers leave the column out,
    check names it, its runs and what to do, and deleting those runs (library or CLI) repairs the store."""
    from tests.helpers import make_batch
    from tests.storage.helpers import plant_column
    from trajstore import cli

    store = trajstore.open(tmp_path / "store", create=True)
    with store.writer(run_id="ok", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(0), 6, 2))
    every = "SELECT * EXCLUDE (wall_time) FROM steps ORDER BY episode_id, step"
    kept = store.sql(every)
    planted = plant_column(store, "", run_id="old") + plant_column(store, "", run_id="older", seed=1)
    store = trajstore.open(store.root)
    assert "" in steps_table(store).log.read().schema.names  # what the probe left: the table's schema holds it
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == kept.num_rows + planted
    columns = store.sql("SELECT * FROM steps").column_names
    assert set(columns) == {*kept.column_names, "wall_time"}  # every column but the one DuckDB cannot hold
    assert sorted(store.stats(by="run_id")["run_id"].to_pylist()) == ["ok", "old", "older"]
    assert store.scan(["episode_id", "reward"]).read_all().num_rows == kept.num_rows + planted
    report = check(store)
    (line,) = report.problems
    assert line.startswith("column '' of run(s) old, older has a name no write path takes any more: it is empty; "
                           "readers leave it out of the steps view, as DuckDB cannot hold an empty name")
    assert "then delete those runs (`trajstore delete --run old --yes`, or store.maintain.delete(run_id='old'))" in line
    assert store.maintain.delete(run_id="old").episodes > 0
    assert cli.main(["delete", "--store", str(store.root), "--run", "older", "--yes"]) == 0
    repaired = trajstore.open(store.root)
    assert check(repaired).ok and repaired.sql(every).equals(kept)
