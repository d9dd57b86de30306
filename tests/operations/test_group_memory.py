"""What the group committer keeps in memory. The episode ends (:class:`~trajstore.operations.continuity.EndsCache`):
the same answers as reading the log's files, its own files never read, another writer's files read as they appear, so
a request continuing an episode someone else continued is checked against what the log lists; retries recognised and
bad continuations refused (422 through the service) naming the episode and the step, as before. The idempotency keys:
those deltalake finds, another writer's recognised."""

from __future__ import annotations

import time
import uuid
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from deltalake import CommitProperties, DeltaTable, Transaction
from fastapi.testclient import TestClient

import trajstore
from tests.api.helpers import settings_for
from tests.api.test_ingest import post, steps_of
from tests.helpers import steps_table
from tests.storage.helpers import episode, rows
from trajstore.api.app import create_app
from trajstore.errors import ConflictError, InputError
from trajstore.operations import continuity, group_commit
from trajstore.operations.continuity import KEPT_IDLE_S, EndsCache, FileEnds, stored_ends
from trajstore.operations.group_commit import GroupCommitter
from trajstore.remote.wire import ipc_bytes
from trajstore.store import plumbing
from trajstore.write.episode_ids import COUNTER_BITS


def agents(episode_id: int, steps: list[int], names: list[str], *, end: bool = False) -> pa.Table:
    """Rows of a multi-agent episode: each of ``names`` at each of ``steps``, the last rows ended with ``end``."""
    n = len(steps) * len(names)
    return rows(n, episode_id, step=pa.array([s for s in steps for _ in names], pa.int64()),
                agent_id=pa.array(names * len(steps)),
                terminated=pa.array([False] * (n - len(names)) + [end] * len(names)))


def test_the_cache_answers_what_the_files_hold(store: trajstore.Store) -> None:
    """Against the plain reading (one DuckDB aggregate over the files), over files of two partitions, episodes
    running, ended and split over files, agents of a multi-agent one; learnt from rows or read from the files."""
    ingest = plumbing(store).ingest
    ingest(episode([0, 1, 2]), run_id="r", env_id="E")
    ingest(episode([3, 4], end=True), run_id="r", env_id="E")
    ingest(pa.concat_tables([rows(3, episode_id=i) for i in (20, 5, 11)]), run_id="r", env_id="E")
    ingest(episode([0, 1], episode_id=8), run_id="other", env_id="F")
    ingest(agents(9, [0, 2], ["a", "b"]), run_id="r", env_id="E")
    ingest(agents(9, [3], ["a"], end=True), run_id="r", env_id="E")
    table = steps_table(store)
    state = table.log.read()
    assert state is not None and len(state.files) == 6
    learnt = EndsCache()
    for f in state.files:
        learnt.learn(f.path, FileEnds.of(pq.read_table(f.path, filesystem=f.fs), run_id=f.run_id, env_id=f.env_id))
    read, small = EndsCache(), EndsCache(limit=3)  # small: lets files go and reads them again
    for ids in ([7], [8], [9], [5, 7, 8, 9, 11, 20], [1, 6, 100], [4, 5, 6, 7, 8, 9, 10, 11, 12, 20]):
        want = stored_ends(state.files, np.array(ids, np.int64))
        assert bool(want) == (ids != [1, 6, 100])
        for cache in (read, learnt, small):
            assert cache.ends(state.files, np.array(ids, np.int64)) == want, ids
    assert learnt.reads == 0 and read.reads == 6 and small.reads > 6
    ends = {(e.episode_id, e.agent_id): (e.last_step, e.end_step) for e in
            read.ends(state.files, np.array([7, 8, 9], np.int64))}
    assert ends == {(7, None): (4, 4), (8, None): (1, None), (9, "a"): (3, 3), (9, "b"): (2, None)}


@pytest.mark.parametrize("merged_after", [2, 1000])
def test_the_merged_index_answers_what_the_files_hold(store: trajstore.Store, monkeypatch: pytest.MonkeyPatch,
                                                      merged_after: int) -> None:
    """A request is looked up in one index of every kept file's ends, not file by file (a store's files each may
    hold any id, so the check grew with the store). Against the plain reading, over 14 files of three partitions
    whose id ranges overlap, as files come, are let go (a bound, a compaction) and are merged again."""
    monkeypatch.setattr(continuity, "MERGED_AFTER", merged_after)
    ingest = plumbing(store).ingest
    rng = np.random.default_rng(5)
    drawn = rng.choice(np.arange(1000, 1400, dtype=np.int64), 36, replace=False)  # ranges that overlap
    for i in range(12):
        ingest(pa.concat_tables([rows(int(rng.integers(1, 4)), episode_id=int(e)) for e in drawn[3 * i:3 * i + 3]]),
               run_id=("a", "b", "c")[i % 3], env_id="E")
    ingest(agents(2000, [0, 2], ["x", "y"]), run_id="a", env_id="E")
    ingest(agents(2000, [3], ["x"], end=True), run_id="a", env_id="E")
    files = steps_table(store).log.read().files
    assert len(files) == 14
    learnt, read, small = EndsCache(), EndsCache(), EndsCache(limit=20)
    for f in files:
        learnt.learn(f.path, FileEnds.of(pq.read_table(f.path, filesystem=f.fs), run_id=f.run_id, env_id=f.env_id))
    stored = np.array(sorted({int(i) for f in files for i in pq.read_table(f.path, columns=["episode_id"])
                              ["episode_id"].to_pylist()}), np.int64)
    pool = np.unique(np.concatenate([stored, np.arange(990, 1010)]))  # ids stored and not
    asks = [np.sort(rng.choice(pool, k, replace=False)) for k in
            (1, 2, 5, 20, 40) for _ in range(4)] + [stored]
    for ask in asks:
        want = stored_ends(files, ask)
        for cache in (learnt, read, small):
            assert cache.ends(files, ask) == want, ask
    assert learnt.reads == 0 and read.reads == 14 and small.reads > 14
    kept = files[::2]  # a compaction took the others away: the next group lets their ends go
    lone = EndsCache()  # one file let go that no request of some ids needs: those ids are still one look-up
    for f in files:
        lone.learn(f.path, FileEnds.of(pq.read_table(f.path, filesystem=f.fs), run_id=f.run_id, env_id=f.env_id))
    far = max(files, key=lambda f: f.min_episode_id or 0)
    lone.retain([f for f in files if f is not far])
    first = stored[:1]  # the smallest id: in files whose range starts lower than the one let go
    assert far.min_episode_id is not None and far.min_episode_id > first[0]
    with monkeypatch.context() as m:
        m.setattr(continuity, "_combined", lambda *a: pytest.fail("asked file by file"))
        assert lone.ends(files, first) == stored_ends(files, first) != []
    for cache in (learnt, read, small):
        cache.retain(kept)
        for ask in asks[::3]:
            assert cache.ends(kept, ask) == stored_ends(kept, ask), ask


def writers(tokens: list[int], counters: list[int], *, open_last: bool = False) -> pa.Table:
    """Rows as a group commit writes them: for each writer's token, an episode of 2 steps at each of ``counters``
    (ids ``token << COUNTER_BITS | counter``, as :class:`~trajstore.write.episode_ids.EpisodeIds` draws them); the
    last counter's episode left running with ``open_last``."""
    parts = []
    for t in tokens:
        for c in counters:
            ended = not (open_last and c == counters[-1])
            parts.append(episode([0, 1], episode_id=t << COUNTER_BITS | c, end=ended))
    return pa.concat_tables(parts)


def test_a_request_needs_the_ends_of_the_files_holding_its_writers_ids(store: trajstore.Store,
                                                                        monkeypatch: pytest.MonkeyPatch) -> None:
    """Files a group commit writes each hold many actors' episodes, whose ids start at far-apart random tokens: every
    file's logged range may hold any id, so every request needed every file's ends, read again and again once the
    store held more than the cache keeps. Each file's ranges by writer token tell which files may hold a request's
    ids: past the bound, a request reads only those; against the plain reading, ranges merged and not."""
    monkeypatch.setattr(continuity, "MERGED_AFTER", 3)
    ingest = plumbing(store).ingest
    tokens = [3, 90, 1 << 30, 7 << 33]
    for k in range(8):  # 8 files (upkeep merges more) of 4 writers, 3 episodes each: 12 ends a file
        ingest(writers(tokens, [3 * k, 3 * k + 1, 3 * k + 2]), run_id="r", env_id="E")
    files = steps_table(store).log.read().files
    assert len(files) == 8 and all((f.min_episode_id or 0) >> COUNTER_BITS == 3 and  # each one's range: any writer's
                                   (f.max_episode_id or 0) >> COUNTER_BITS == 7 << 33 for f in files)
    cache = EndsCache(limit=30)  # two files' ends
    stored = np.array(sorted({i for f in files for i in pq.read_table(f.path, columns=["episode_id"])
                              ["episode_id"].to_pylist()}), np.int64)
    first = np.array([90 << COUNTER_BITS], np.int64)  # in each file's logged range: every file is read, once
    assert cache.ends(files, first) == stored_ends(files, first) != [] and cache.reads == 8
    assert cache.ranged == 8 and cache.kept <= 30
    rng = np.random.default_rng(3)
    for _ in range(30):
        token, counter = int(rng.choice(tokens)), int(rng.integers(0, 24))
        ask = np.array([token << COUNTER_BITS | counter], np.int64)
        before = cache.reads
        assert cache.ends(files, ask) == stored_ends(files, ask) != []
        assert cache.reads - before <= 1  # the one file holding it, if its ends were let go; not the other seven
    unknown = np.array([5 << COUNTER_BITS, 90 << COUNTER_BITS | 25, (1 << 30) + 1 << COUNTER_BITS], np.int64)
    before = cache.reads
    assert cache.ends(files, unknown) == stored_ends(files, unknown) == [] and cache.reads == before  # none read
    for k in (1, 3, 40):
        ask = np.sort(rng.choice(np.concatenate([stored, unknown]), k, replace=False))
        assert cache.ends(files, ask) == stored_ends(files, ask)
    cache.retain(files[5:])  # a compaction took five files away: their ranges go with their ends
    assert cache.ranged == 3
    assert cache.ends(files[5:], stored) == stored_ends(files[5:], stored)


def test_an_ended_runs_files_are_let_go_though_their_ranges_span_the_new_runs(store: trajstore.Store) -> None:
    """The group committer's files of an ended run hold ids of many writers, so their logged ranges span the ids of
    every later run's writers: each request of a later run asked about them and their ends were never idle, held until
    the million-end bound (the service's memory grew wave after wave, docs/benchmarks.md). By their writers' ranges
    no request of a new run needs them: let go after KEPT_IDLE_S, and a request to the old run reads them again."""
    now = [0.0]
    committer = GroupCommitter(steps_table(store), interval_s=0)
    committer.ends = EndsCache(clock=lambda: now[0])
    try:
        committer.ingest(writers([10, 30], [0]), run_id="old", env_id="E").result(60)
        for k in range(3):  # two writers of the new run, whose ids lie within the old run's file's range
            now[0] += KEPT_IDLE_S / 2
            for token in (20, 25):
                committer.ingest(episode([2 * k, 2 * k + 1], episode_id=token << COUNTER_BITS), run_id="new",
                                 env_id="E").result(60)
        assert committer.ends.kept == 6 and committer.ends.reads == 0  # the old run's let go, the new run's learnt
        with pytest.raises(InputError, match=r"step: episode_id 167772160 ended at step 1"):
            committer.ingest(episode([2], episode_id=10 << COUNTER_BITS), run_id="old", env_id="E").result(60)
        assert committer.ends.reads == 1  # its file, read again
    finally:
        committer.close()
    assert trajstore.check(store).ok


def test_an_episode_another_writer_continued_is_checked_against_the_log(store: trajstore.Store) -> None:
    """The committer knows what its own commits stored; steps another writer appended since are read from the file
    the log lists: a request that continues what the committer stored, not what the log holds now, is refused naming
    the episode and the step, and one continuing the other writer's steps is stored. A retry is still recognised."""
    committer = GroupCommitter(steps_table(store), interval_s=0.05)
    try:
        first = committer.ingest(episode([0, 1]), run_id="r", env_id="E", idempotency_key="a").result(60)
        assert committer.ends.reads == 0  # its own file: known, not read
        plumbing(trajstore.open(store.root)).ingest(episode([2, 3]), run_id="r", env_id="E")  # not through it
        with pytest.raises(InputError, match=r"step: episode_id 7 continues at step 2, but the store holds its steps "
                                             r"up to 3; expected step 4"):
            committer.ingest(episode([2, 3]), run_id="r", env_id="E", idempotency_key="b").result(60)
        assert committer.ends.reads == 1  # the other writer's file, read once
        later = committer.ingest(episode([4, 5], end=True), run_id="r", env_id="E").result(60)
        retry = committer.ingest(episode([0, 1]), run_id="r", env_id="E", idempotency_key="a").result(60)
        with pytest.raises(InputError, match=r"step: episode_id 7 ended at step 5 \(terminated or truncated\); "
                                             r"step 6 cannot follow it"):
            committer.ingest(episode([6]), run_id="r", env_id="E").result(60)
        assert committer.ends.reads == 1
    finally:
        committer.close()
    assert not first.duplicate and later.version > first.version and retry.duplicate  # type: ignore[operator]
    assert store.episode_steps(7)["step"].to_pylist() == [0, 1, 2, 3, 4, 5]
    assert trajstore.check(store).ok


def test_through_the_service_a_bad_continuation_is_422_and_a_retry_200(tmp_path: Path) -> None:
    path = tmp_path / "store"
    trajstore.open(path, create=True)
    body = ipc_bytes(steps_of(3, [0, 1, 2]))
    with TestClient(create_app(settings_for(path, commit_interval=0.05))) as c:
        assert post(c, body, idem="first").status_code == 201
        assert post(c, ipc_bytes(steps_of(3, [3, 4])), idem=uuid.uuid4().hex).status_code == 201
        plumbing(trajstore.open(path)).ingest(steps_of(3, [5]), run_id="r1", env_id="Toy-v0")  # another writer
        late = post(c, ipc_bytes(steps_of(3, [5, 6])), idem=uuid.uuid4().hex)
        retry = post(c, body, idem="first")
        fits = post(c, ipc_bytes(steps_of(3, [6], end=True)), idem=uuid.uuid4().hex)
    assert late.status_code == 422 and "episode_id 3 continues at step 5, but the store holds its steps up to 5; " \
        "expected step 6" in late.json()["detail"]
    assert retry.status_code == 200 and retry.json()["duplicate"]
    assert fits.status_code == 201, fits.text
    assert trajstore.open(path).episode_steps(3)["step"].to_pylist() == list(range(7))


def test_the_keys_read_from_the_log_are_deltalakes(store: trajstore.Store) -> None:
    """The idempotency keys read whole from the log (a checkpoint's and the entries since), then kept by the committer,
    are those deltalake's ``transaction_version`` finds, an expired key left out as Delta leaves it out."""
    ingest = plumbing(store).ingest
    for i in range(30):
        ingest(rows(2, episode_id=100 + i), run_id="r", env_id="E", idempotency_key=f"k{i}")
    table = steps_table(store)
    path = str(Path(store.root) / "steps")
    DeltaTable(path).create_checkpoint()
    delta = DeltaTable(path)  # another engine's commit of a key older than the keys' 7-day retention
    delta.create_write_transaction([], mode="append", schema=pa.schema(delta.schema().to_arrow()),
                                   partition_by=["run_id", "env_id"], commit_properties=CommitProperties(
                                       app_transactions=[Transaction("trajstore-ingest:old", 5,
                                                                     int(time.time() * 1000) - 8 * 86400 * 1000)]))
    for i in range(30, 33):
        ingest(rows(2, episode_id=100 + i), run_id="r", env_id="E", idempotency_key=f"k{i}")
    state = table.log.read()
    assert state is not None
    read = table.log.app_transactions(state.number)
    assert read is not None and table.log.last_checkpoint() is not None
    committer = GroupCommitter(table, interval_s=0.05)
    try:
        held = committer._apps.lookup(state)
        assert read["trajstore-ingest:old"][0] == 5  # in the log, expired
        for app_id in [f"trajstore-ingest:k{i}" for i in range(33)] + ["trajstore-ingest:none", "trajstore-ingest:old"]:
            assert held(app_id) == state.app_version(app_id), app_id
        assert held("trajstore-ingest:old") is None and held("trajstore-ingest:k31") is not None
    finally:
        committer.close()


def test_a_key_another_writer_stored_is_recognised(store: trajstore.Store) -> None:
    """Keys are kept from the committer's first look at the log on; a key another writer stored after that (read from
    its log entry) is a retry's (a duplicate) or refused for other rows (409)."""
    committer = GroupCommitter(steps_table(store), interval_s=0.05)
    try:
        committer.ingest(rows(2, episode_id=1), run_id="r", env_id="E", idempotency_key="mine").result(60)
        plumbing(trajstore.open(store.root)).ingest(rows(3, episode_id=2), run_id="r", env_id="E",
                                                    idempotency_key="theirs")
        again = committer.ingest(rows(3, episode_id=2), run_id="r", env_id="E", idempotency_key="theirs").result(60)
        with pytest.raises(ConflictError, match="idempotency_key: 'theirs' was already used for another request"):
            committer.ingest(rows(3, episode_id=3), run_id="r", env_id="E", idempotency_key="theirs")
        mine = committer.ingest(rows(2, episode_id=1), run_id="r", env_id="E", idempotency_key="mine").result(60)
    finally:
        committer.close()
    assert again.duplicate and mine.duplicate
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 5


def test_the_changes_of_versions_no_request_waits_on_are_let_go(store: trajstore.Store,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The committer remembers what each of its versions changed (every episode end it made) only while a waiting
    request or a key look-up may ask: a service serving for hours kept 4,096 versions of them, its memory growing with
    every request. What it let go still answers: a retry of a request many versions back is a duplicate, its episode
    continues where it stopped, and a repeat of a step stored versions ago is refused naming it."""
    monkeypatch.setattr(group_commit, "RECENT_VERSIONS", 2)
    committer = GroupCommitter(steps_table(store), interval_s=0)
    try:
        first = committer.ingest(episode([0, 1]), run_id="r", env_id="E", idempotency_key="first").result(60)
        for i in range(12):
            committer.ingest(rows(2, episode_id=100 + i), run_id="r", env_id="E", idempotency_key=f"k{i}").result(60)
        remembered = sorted(committer._changes)
        retry = committer.ingest(episode([0, 1]), run_id="r", env_id="E", idempotency_key="first").result(60)
        goes_on = committer.ingest(episode([2, 3]), run_id="r", env_id="E").result(60)
        with pytest.raises(InputError, match=r"step: episode_id 7 continues at step 1, but the store holds its steps "
                                             r"up to 3"):
            committer.ingest(episode([1]), run_id="r", env_id="E").result(60)
    finally:
        committer.close()
    assert first.version is not None and len(remembered) <= 3 and min(remembered) > first.version + 8, remembered
    assert retry.duplicate and not goes_on.duplicate
    assert store.episode_steps(7)["step"].to_pylist() == [0, 1, 2, 3]
    assert trajstore.check(store).ok


def test_the_ends_of_files_compacted_away_are_let_go(store: trajstore.Store) -> None:
    """The committer keeps what each file it wrote holds of its episodes; once a compaction replaced the files, the next
    group lets their ends go (a service kept them until a million ends had filled its cache), and the merged file's
    are read when a request asks: the same answers."""
    committer = GroupCommitter(steps_table(store), interval_s=0)
    try:
        for i in range(4):
            committer.ingest(rows(2, episode_id=100 + i), run_id="r", env_id="E").result(60)
        assert committer.ends.kept == 4 and committer.ends.reads == 0  # learnt, one end per episode
        trajstore.compact(trajstore.open(store.root), progress=False)  # another writer merges the 4 files into 1
        assert len(store.maintain.files()) == 1
        committer.ingest(episode([0, 1]), run_id="r", env_id="E").result(60)  # a group meets the merged version
        assert committer.ends.kept == 1 and committer.ends.reads == 0  # episode 7's: the replaced files' are gone
        with pytest.raises(InputError, match=r"step: episode_id 101 ended at step 1 \(terminated or truncated\); "
                                             r"step 2 cannot follow it"):
            committer.ingest(episode([2], episode_id=101), run_id="r", env_id="E").result(60)
        assert committer.ends.reads == 1 and committer.ends.kept == 5  # the merged file, read once
    finally:
        committer.close()
    assert trajstore.check(store).ok


def test_the_ends_of_a_run_nobody_asks_about_are_let_go(store: trajstore.Store) -> None:
    """A service's store gains a partition per run and environment for as long as it runs: the committer kept the ends
    of every ended run's files until its million-end bound (docs/benchmarks.md, wave after wave). Ends nobody asked
    about for KEPT_IDLE_S are let go; a run that comes back is checked against its files, read once."""
    now = [0.0]
    committer = GroupCommitter(steps_table(store), interval_s=0)
    committer.ends = EndsCache(clock=lambda: now[0])
    try:
        committer.ingest(rows(2, episode_id=100), run_id="old", env_id="E").result(60)
        now[0] += KEPT_IDLE_S - 1
        committer.ingest(rows(2, episode_id=200), run_id="new", env_id="E").result(60)
        assert committer.ends.kept == 2  # the old run's not idle long enough yet
        now[0] += 2
        committer.ingest(rows(2, episode_id=300), run_id="new", env_id="E").result(60)
        assert committer.ends.kept == 2 and committer.ends.reads == 0  # the new run's two; the old run's let go
        with pytest.raises(InputError, match=r"step: episode_id 100 ended at step 1 \(terminated or truncated\); "
                                             r"step 2 cannot follow it"):
            committer.ingest(episode([2], episode_id=100), run_id="old", env_id="E").result(60)
        assert committer.ends.reads == 1  # its file, read again
    finally:
        committer.close()
    assert trajstore.check(store).ok


def test_keys_past_the_transaction_retention_are_let_go(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Every ingest request adds an idempotency key, and the committer kept every key it had seen for as long as it ran
    (~1,000 more per 1,024 requests, docs/benchmarks.md). A key past the table's transaction retention answers nothing,
    as in Delta, and is now let go; a retry within the retention is still a duplicate."""
    monkeypatch.setattr(group_commit, "KEYS_PRUNED_FROM", 8)
    store = trajstore.open(tmp_path / "store", create=True)
    committer = GroupCommitter(steps_table(store), interval_s=0)
    try:
        for i in range(8):
            committer.ingest(rows(2, episode_id=100 + i), run_id="r", env_id="E", idempotency_key=f"old{i}").result(60)
        early = committer.ingest(rows(2, episode_id=107), run_id="r", env_id="E", idempotency_key="old7").result(60)
        DeltaTable(str(tmp_path / "store" / "steps")).alter.set_table_properties(  # as another engine may, under
            {"delta.setTransactionRetentionDuration": "interval 1 second"})      # trajstore's minimum of a minute
        time.sleep(1.1)  # the keys' retention passing, which is what lets them go
        for i in range(8):
            committer.ingest(rows(2, episode_id=200 + i), run_id="r", env_id="E", idempotency_key=f"new{i}").result(60)
        retry = committer.ingest(rows(2, episode_id=207), run_id="r", env_id="E", idempotency_key="new7").result(60)
        kept = set(committer._apps._apps or {})
    finally:
        committer.close()
    assert early.duplicate and retry.duplicate
    assert "trajstore-ingest:new7" in kept and not {k for k in kept if k.startswith("trajstore-ingest:old")}, kept
    assert trajstore.open(store.root).sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 32


def test_a_writers_numbered_requests_keep_one_key_in_memory(store: trajstore.Store) -> None:
    """A writer that numbers its requests (what a RemoteWriter does) holds one key in the committer, whatever the
    number of requests it sent: the keys a service keeps grow with its writers, not with its requests."""
    committer = GroupCommitter(steps_table(store), interval_s=0)
    try:
        for n in range(8):
            committer.ingest(rows(2, episode_id=100 + n), run_id="r", env_id="E", idempotency_key=f"w{n % 2}",
                             idempotency_sequence=n // 2).result(60)
        committer.ingest(rows(2, episode_id=101), run_id="r", env_id="E", idempotency_key="w1",
                         idempotency_sequence=0).result(60)  # the state of the keys brought forward to the latest
        kept = dict(committer._apps._apps or {})
    finally:
        committer.close()
    assert sorted(kept) == ["trajstore-writer:w0", "trajstore-writer:w1"]
    assert [version >> 31 for version, _ in (kept["trajstore-writer:w0"], kept["trajstore-writer:w1"])] == [3, 3]
