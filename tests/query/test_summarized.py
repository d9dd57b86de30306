"""The ``episodes`` rows combined from the files' summaries against the view itself, which aggregates every step:
the same rows, the same types, on stores whose episodes span files, with unfinished and multi-agent episodes,
after deletes, compactions, another tool's rewrites, and at old versions; summaries written with each file (by the
writer, ingest, compaction, delete and add_column) equal those readers compute from the file; and summaries that
are damaged, left by a killed write or of removed files are never read."""

from __future__ import annotations

import logging
import os
import time
from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest
from deltalake import DeltaTable

import trajstore
from tests.helpers import engine_of, make_batch, slice_batch, steps_table
from tests.storage.helpers import rows as ingest_rows
from trajstore.errors import StoreDamagedError
from trajstore.operations.ingest import append_rows
from trajstore.query import summarized
from trajstore.settings import Settings
from trajstore.storage.encoding import FileSchema
from trajstore.storage.summaries import FOLDER, Summaries, file_fragments
from trajstore.storage.table import StepsTable
from trajstore.write.agents import AgentWriter

KEYS = [("run_id", "ascending"), ("env_id", "ascending"), ("episode_id", "ascending")]


def reference(store: trajstore.Store) -> pa.Table:
    """The ``episodes`` view over the steps, as DuckDB aggregates it (no summary read)."""
    engine = engine_of(store)
    files = engine.files()
    with engine.snapshot(files, con=engine.cursor()) as snap:
        return snap.arrow("SELECT * FROM episodes").sort_by(KEYS)


def combined(store: trajstore.Store, caplog: pytest.LogCaptureFixture, **restrict: object) -> pa.Table:
    """The ``episodes`` rows a query reads, combined from the summaries (the fallback to the view is a failure)."""
    caplog.clear()
    with caplog.at_level(logging.WARNING, logger="trajstore"):
        with engine_of(store).query_snapshot(episodes="fill", **restrict) as snap:  # type: ignore[arg-type]
            assert snap.episodes_materialized
            rows = snap.arrow("SELECT * FROM episodes").sort_by(KEYS)
    assert not [r for r in caplog.records if "summar" in r.getMessage()], caplog.text
    return rows


def assert_same(store: trajstore.Store, caplog: pytest.LogCaptureFixture) -> pa.Table:
    """The combined rows equal the view's, in a process that has them (this store) and in a new one (from the
    kept summaries alone), the float sums up to the order they are added in."""
    expected = reference(store)
    assert expected.num_rows > 0
    for reader in (store, trajstore.open(store.root).at(version=store.version)):
        got = combined(reader, caplog)
        assert got.schema == expected.schema
        for name in expected.column_names:
            if name == "episode_return":
                np.testing.assert_allclose(got[name].to_numpy(), expected[name].to_numpy(), rtol=1e-12)
            else:
                assert got[name].to_pylist() == expected[name].to_pylist(), name
    return expected


def write_runs(store: trajstore.Store, *, seed: int = 0) -> None:
    """Episodes cut across many small files (a flush every few steps, upkeep off so the files stay), some left
    unfinished, lineage that changes along an episode (policy_version) and per run (seed, mode)."""
    for r, (run, env) in enumerate([("a", "CartPole-v1"), ("b", "CartPole-v1"), ("c", "Other-v0")]):
        rng = np.random.default_rng(seed + r)
        T, B = 40, 3
        batch = make_batch(rng, T, B, p_terminated=0.06, p_truncated=0.02,
                           extras={"policy_version": np.repeat(np.arange(T // 5), 5)[:, None].repeat(B, 1)})
        batch["valid"] = rng.random((T, B)) < 0.9
        with store.writer(run_id=run, env_id=env, seed=seed + r, mode="eval" if run == "c" else "train",
                          upkeep=None) as w:
            for start in range(0, T, 7):
                w.add_batch(slice_batch(batch, start, min(start + 7, T)))
                w.flush()


def write_agents(store: trajstore.Store) -> None:
    """Multi-agent episodes: agents ending at different steps, an episode cut between files by a flush, one left
    unfinished, agents of two kinds (two writers)."""
    spaces = {"a_0": 2, "a_1": 2, "b_0": 3}

    def row(agent: str, reward: float, terminated: bool = False, truncated: bool = False) -> tuple[object, ...]:
        obs = np.zeros(spaces[agent], np.float32)
        return obs, 0, reward, obs, terminated, truncated

    import gymnasium as gym

    obs_spaces = {a: gym.spaces.Box(-1, 1, (n,), np.float32) for a, n in spaces.items()}
    act_spaces = {a: gym.spaces.Discrete(2) for a in spaces}
    with AgentWriter(store, run_id="m", env_id="Spread-v0", agents=list(spaces), observation_spaces=obs_spaces,
                     action_spaces=act_spaces, upkeep=None) as w:
        for step in range(6):  # every agent ends, a_0 early, one by a time limit
            rows = {a: row(a, 0.5 * step) for a in spaces if not (a == "a_0" and step > 2)}
            if step == 2:
                rows["a_0"] = row("a_0", 1.0, terminated=True)
            if step == 5:
                rows = {"a_1": row("a_1", 1.0, terminated=True), "b_0": row("b_0", 2.0, truncated=True)}
            w.add(step, rows)
            if step == 3:
                w.flush()
        w.end_episode()
        for step in range(3):  # every agent terminates
            w.add(step, {a: row(a, 1.0, terminated=step == 2) for a in spaces})
        w.end_episode()
        for step in range(2):  # left running: unfinished
            w.add(step, {a: row(a, -1.0) for a in spaces})
        w.flush()


@pytest.fixture
def store(tmp_path: Path) -> trajstore.Store:
    store = trajstore.open(tmp_path / "store", create=True)
    write_runs(store)
    return store


def test_the_combined_rows_are_the_view_s_with_episodes_across_files(store: trajstore.Store,
                                                                     caplog: pytest.LogCaptureFixture) -> None:
    rows = assert_same(store, caplog)
    assert not all(rows["complete"].to_pylist())  # unfinished episodes are there
    files = store.maintain.files()
    assert len(files) > 10 and len(list((store.root / FOLDER).glob("*.arrow"))) == len(files)
    kept = Summaries(store.root / FOLDER)
    for f in files:  # each file's own fragments
        fragments = kept.read(steps_table(store).location.relative(f.path), f.size,  # type: ignore[union-attr]
                              os.stat(f.path).st_mtime_ns).fragments
        assert pa.compute.sum(fragments["rows"]).as_py() == f.rows
        assert all(f.min_episode_id <= i <= f.max_episode_id for i in fragments["episode_id"].to_pylist())
    spans = {f.path: (f.min_episode_id, f.max_episode_id) for f in files}
    ids = rows["episode_id"].to_pylist()
    assert any(sum(lo <= i <= hi for lo, hi in spans.values()) > 1 for i in ids)  # some span files


def test_a_selection_of_runs_combines_its_own_files(store: trajstore.Store,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    expected = reference(store).filter(pa.compute.equal(reference(store)["run_id"], "b"))
    got = combined(store, caplog, run_id="b")
    assert got.to_pylist() == expected.to_pylist()


def test_multi_agent_episodes_combine_as_the_view_counts_them(tmp_path: Path,
                                                              caplog: pytest.LogCaptureFixture) -> None:
    store = trajstore.open(tmp_path / "store", create=True)
    write_agents(store)
    write_runs(store)  # single-agent rows beside them
    rows = assert_same(store, caplog)
    multi = rows.filter(pa.compute.equal(rows["run_id"], "m"))
    assert multi["n_agents"].to_pylist() == [3, 3, 3]
    assert sorted(multi["complete"].to_pylist()) == [False, True, True]


def test_after_commits_deletes_and_compactions(store: trajstore.Store, caplog: pytest.LogCaptureFixture) -> None:
    assert_same(store, caplog)
    write_runs(store, seed=10)  # a commit: the new files are summarized, the others read back
    assert_same(store, caplog)
    first = reference(store)["episode_id"][3].as_py()
    store.maintain.delete(steps_where=f"episode_id = {first}")
    assert first not in assert_same(store, caplog)["episode_id"].to_pylist()
    trajstore.compact(store, progress=False)
    assert_same(store, caplog)


def test_after_another_tool_s_rewrite(store: trajstore.Store, caplog: pytest.LogCaptureFixture) -> None:
    assert_same(store, caplog)
    DeltaTable(str(store.root / "steps")).optimize.compact()  # files without trajstore's footer
    assert_same(store, caplog)


def test_time_travel_reads_the_summaries_of_that_version_s_files(store: trajstore.Store,
                                                                 caplog: pytest.LogCaptureFixture) -> None:
    before = assert_same(store, caplog)
    version = store.version
    write_runs(store, seed=20)
    trajstore.compact(store, progress=False)
    old = trajstore.open(store.root, version=version)
    assert combined(old, caplog).to_pylist() == reference(old).to_pylist() == before.to_pylist()


def test_a_damaged_or_foreign_summary_is_not_read(store: trajstore.Store, caplog: pytest.LogCaptureFixture) -> None:
    expected = assert_same(store, caplog)
    kept = sorted((store.root / FOLDER).glob("*.arrow"))
    kept[0].write_bytes(kept[0].read_bytes()[:100])  # cut short
    kept[1].write_bytes(kept[2].read_bytes())  # another file's summary under this file's name
    fresh = trajstore.open(store.root)
    with caplog.at_level(logging.WARNING, logger="trajstore"):
        with engine_of(fresh).query_snapshot(episodes="fill") as snap:
            got = snap.arrow("SELECT * FROM episodes").sort_by(KEYS)
    assert got.to_pylist() == expected.to_pylist()
    again = trajstore.open(store.root)  # both summarized again, whole
    assert combined(again, caplog).to_pylist() == expected.to_pylist()


def test_a_killed_write_leaves_nothing_that_is_read_and_vacuum_removes_it(store: trajstore.Store,
                                                                          caplog: pytest.LogCaptureFixture) -> None:
    assert_same(store, caplog)
    folder = store.root / FOLDER
    partial = folder / ".tmp-killed"
    partial.write_bytes(b"ARROW1 half a summary")
    old = time.time() - 2 * 3600
    os.utime(partial, (old, old))
    assert_same(trajstore.open(store.root), caplog)
    removed = Summaries(folder).prune(lambda rel: True)
    assert removed == [] and not partial.exists()


def test_vacuum_removes_the_summaries_of_removed_files(store: trajstore.Store,
                                                       caplog: pytest.LogCaptureFixture) -> None:
    assert_same(store, caplog)
    before = {f.path for f in store.maintain.files()}
    trajstore.compact(store, progress=False)
    assert_same(store, caplog)
    store.maintain.vacuum(older_than=0)
    kept = Summaries(store.root / FOLDER)
    after = store.maintain.files()
    assert len(list((store.root / FOLDER).glob("*.arrow"))) == len(after)
    for f in after:
        assert kept.read(steps_table(store).location.relative(f.path), f.size, os.stat(f.path).st_mtime_ns) is not None
    assert before - {f.path for f in after}


@pytest.mark.parametrize("damage", ["delete", "garble"])
def test_a_damaged_file_is_damage_not_answered_from_its_summary(store: trajstore.Store,
                                                                caplog: pytest.LogCaptureFixture, damage: str) -> None:
    assert_same(store, caplog)
    victim = Path(store.maintain.files()[-1].path)
    if damage == "delete":
        victim.unlink()
    else:  # the same size, not Parquet any more: its summary no longer describes it
        victim.write_bytes(b"\0" * victim.stat().st_size)
    with pytest.raises(StoreDamagedError, match="missing" if damage == "delete" else "cannot be read"):
        trajstore.open(store.root).episodes()


def test_without_summaries_the_view_aggregates_the_steps(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "store", create=True, settings=Settings(episode_summaries=False))
    write_runs(store)
    assert store.episodes().sort_by(KEYS).to_pylist() == reference(store).to_pylist()
    assert not (store.root / FOLDER).exists()


# --- summaries written with the files ------------------------------------------------------------------------------

def written_summaries(store: trajstore.Store) -> dict[str, pa.Table]:
    """The fragments kept for each committed file, as they are on disk (nothing read or summarized first)."""
    kept = Summaries(store.root / FOLDER)
    out = {}
    for f in store.maintain.files():
        found = kept.read(steps_table(store).location.relative(f.path), f.size, os.stat(f.path).st_mtime_ns)
        assert found is not None, f"no summary written with {f.path}"
        out[f.path] = found.fragments
    return out


def assert_written_as_read(store: trajstore.Store) -> None:
    """Every committed file has a summary written with it, equal to the one a reader computes from the file (the
    reward sums up to the order they are added in)."""
    written = written_summaries(store)
    engine = engine_of(store)
    files = engine.files()
    reader = StepsTable(store.root / "steps")  # keeps nothing: the summaries on disk stay the written ones
    with engine.snapshot(files, con=engine.cursor()) as snap:
        computed = summarized.summarize(snap, reader, files, steps_table(store).schemas(files))
    for f in files:
        got, expected = written[f.path], computed[f.path]
        assert got.schema == expected.schema, f.path
        for name in expected.column_names:
            if name == "reward":
                np.testing.assert_allclose(got[name].to_numpy(), expected[name].to_numpy(), rtol=1e-12)
            else:
                assert got[name].to_pylist() == expected[name].to_pylist(), (f.path, name)


def sent(n: int, episode_id: int, **change: object) -> pa.Table:
    """Rows of one episode as a remote writer sends them, shaped as :func:`write_runs`' (obs of 3 floats)."""
    obs = pa.array([[0.0, 1.0, 2.0]] * n, pa.list_(pa.float32(), 3))
    return ingest_rows(n, episode_id, obs=obs, next_obs=obs, **change)


def test_summaries_written_with_the_writer_s_files_are_the_readers(store: trajstore.Store) -> None:
    assert_written_as_read(store)


def test_summaries_written_with_multi_agent_files_are_the_readers(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "store", create=True)
    write_agents(store)
    assert_written_as_read(store)


def test_summaries_written_by_ingest_compaction_delete_and_add_column_are_the_readers(
        store: trajstore.Store, caplog: pytest.LogCaptureFixture) -> None:
    append_rows(steps_table(store), sent(6, 11), run_id="a", env_id="CartPole-v1")
    assert_written_as_read(store)
    first = reference(store)["episode_id"][3].as_py()
    store.maintain.delete(steps_where=f"episode_id = {first}")  # the files holding it rewritten without it
    assert_written_as_read(store)
    trajstore.compact(store, progress=False)
    assert_written_as_read(store)
    store.maintain.add_column("shaped", "reward * 0.5")
    assert_written_as_read(store)
    assert_same(store, caplog)


def test_the_first_read_of_a_store_trajstore_wrote_summarizes_nothing(store: trajstore.Store,
                                                                      caplog: pytest.LogCaptureFixture,
                                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    expected = reference(store)

    def refused(*args: object, **kwargs: object) -> None:
        raise AssertionError("a file was summarized by a reader")

    monkeypatch.setattr(summarized, "summarize", refused)
    monkeypatch.setattr("trajstore.storage.table.read_footer", refused)  # nor its footer read
    fresh = trajstore.open(store.root)
    got = combined(fresh, caplog)
    assert got.schema == expected.schema and got.num_rows == expected.num_rows
    assert got["episode_id"].to_pylist() == expected["episode_id"].to_pylist()


def test_a_file_whose_commit_failed_leaves_no_summary(store: trajstore.Store) -> None:
    folder = store.root / FOLDER
    before = set(folder.glob("*.arrow"))
    written = steps_table(store).write(sent(3, 99), run_id="a", env_id="CartPole-v1")
    assert len(set(folder.glob("*.arrow")) - before) == 1  # written with the file
    steps_table(store).discard([written.path], RuntimeError("the commit did not land"))
    assert set(folder.glob("*.arrow")) == before


def test_a_killed_writer_s_file_and_summary_are_never_read_and_go_with_the_orphan(
        store: trajstore.Store, caplog: pytest.LogCaptureFixture) -> None:
    """A file written with its summary, the writer killed before the commit: readers see neither (they read the
    summaries of committed files only); removing the orphan removes its summary."""
    expected = assert_same(store, caplog)
    folder = store.root / FOLDER
    before = set(folder.glob("*.arrow"))
    steps_table(store).write(sent(3, 98), run_id="a", env_id="CartPole-v1")  # never committed
    assert len(set(folder.glob("*.arrow")) - before) == 1
    assert combined(trajstore.open(store.root), caplog).to_pylist() == expected.to_pylist()
    assert len(trajstore.remove_orphans(store, older_than_s=0)) == 1
    assert set(folder.glob("*.arrow")) == before


def test_rows_with_null_env_steps_get_the_readers_summary(store: trajstore.Store) -> None:
    """Ingested rows with a null env-step count (an older client): the greatest of the others, as the view's max."""
    append_rows(steps_table(store), sent(4, 12, env_steps=pa.array([1, 2, None, None], pa.int64())), run_id="b",
                env_id="CartPole-v1")
    append_rows(steps_table(store), sent(3, 13, env_steps=pa.array([None] * 3, pa.int64())), run_id="b",
                env_id="CartPole-v1")
    assert_written_as_read(store)
    trajstore.compact(store, progress=False)  # with the writer's rows in one file
    assert_written_as_read(store)


def test_rows_a_summary_cannot_tell_get_none() -> None:
    """A step twice in one episode: which row's lineage the view takes is DuckDB's to say, so readers summarize."""
    rows = ingest_rows(3, 5, step=pa.array([0, 1, 1], pa.int32())).append_column(
        "policy_version", pa.array([1, 2, 3], pa.int64()))
    stored = FileSchema.of(rows.schema.with_metadata({"trajstore": '{"encoding": 1}'}))
    assert file_fragments(rows, stored, run_id="r", env_id="E") is None
    ordered = rows.set_column(1, "step", pa.array([0, 1, 2], pa.int32()))
    apart = ordered.take([2, 0, 1])  # rows out of step order: the value at the first step all the same
    for made in (file_fragments(ordered, stored, run_id="r", env_id="E"),
                 file_fragments(apart, stored, run_id="r", env_id="E")):
        assert made is not None and made["policy_version"].to_pylist() == [1]
        assert made["first_step"].to_pylist() == [0] and made["last_step"].to_pylist() == [2]
