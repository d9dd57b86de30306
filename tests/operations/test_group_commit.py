"""Group commit (issue 49): requests checked each on its own, then committed together — one Delta commit holding every
request of a group, each idempotency key its own ``txn`` action — at most one commit per interval, a bad request
refused alone, a retry recognised before anything else, and what changed since a request was checked checked again."""

from __future__ import annotations

import json
import threading
import time
from concurrent.futures import Future
from pathlib import Path
from urllib.parse import unquote

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

import trajstore
from tests.helpers import make_batch, steps_table
from tests.storage.helpers import episode, rows
from trajstore.errors import ConflictError, InputError
from trajstore.operations.group_commit import GroupCommitter, Outcome
from trajstore.store import plumbing


def entry(store: trajstore.Store, version: int) -> list[dict]:
    path = Path(store.root) / "steps" / "_delta_log" / f"{version:020d}.json"
    return [json.loads(line) for line in path.read_text().splitlines()]


def appends(store: trajstore.Store) -> list[int]:
    """The versions that appended rows."""
    return [r["version"] for r in store.history().to_pylist() if r["operation"] == "append"]


def held(store: trajstore.Store) -> list[tuple[int, int]]:
    return [(r["episode_id"], r["step"]) for r in
            store.sql("SELECT episode_id, step FROM steps ORDER BY 1, 2").to_pylist()]


def wait_all(futures: list[Future[Outcome]]) -> list[Outcome | BaseException]:
    out: list[Outcome | BaseException] = []
    for f in futures:
        try:
            out.append(f.result(60))
        except Exception as exc:  # noqa: BLE001 - the test looks at each answer
            out.append(exc)
    return out


@pytest.fixture
def committer(store: trajstore.Store) -> GroupCommitter:
    c = GroupCommitter(steps_table(store), interval_s=0.5)
    yield c
    c.close()


def test_requests_that_arrive_together_are_one_commit_with_a_txn_each(store: trajstore.Store,
                                                                       committer: GroupCommitter) -> None:
    committer.ingest(rows(1, episode_id=1), run_id="r", env_id="E").result(60)  # then the next waits the interval
    futures = [committer.ingest(rows(5, episode_id=100 + i), run_id="r", env_id="E", idempotency_key=f"k{i}")
               for i in range(8)]
    futures.append(committer.ingest(rows(3, episode_id=999), run_id="other", env_id="E", idempotency_key="o"))
    outcomes = wait_all(futures)
    assert all(isinstance(o, Outcome) and not o.duplicate for o in outcomes)
    versions = {o.version for o in outcomes}  # type: ignore[union-attr]
    assert len(versions) == 1 and appends(store)[1:] == [versions.pop()]  # one commit for all nine
    actions = entry(store, store.version)
    assert sorted(a["txn"]["appId"] for a in actions if "txn" in a) == \
        sorted([f"trajstore-ingest:k{i}" for i in range(8)] + ["trajstore-ingest:o"])
    assert all(a["txn"]["lastUpdated"] > 0 for a in actions if "txn" in a)  # kept as long as the log's retention
    added = [a["add"] for a in actions if "add" in a]
    assert sorted(a["partitionValues"]["run_id"] for a in added) == ["other", "r"]  # one file per partition
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 1 + 8 * 5 + 3
    assert trajstore.check(store).ok


def test_a_bad_request_is_refused_alone_and_delays_no_one(store: trajstore.Store,
                                                          committer: GroupCommitter) -> None:
    committer.ingest(episode([0, 1, 2]), run_id="r", env_id="E").result(60)  # episode 7 runs to step 2
    good = [committer.ingest(rows(4, episode_id=200 + i), run_id="r", env_id="E") for i in range(3)]
    late = committer.ingest(episode([3, 4]), run_id="r", env_id="E")  # fits now...
    again = committer.ingest(episode([3, 4, 5]), run_id="r", env_id="E")  # ...and so does this: one of them
    outcomes = wait_all([*good, late, again])
    assert [isinstance(o, Outcome) for o in outcomes] == [True, True, True, True, False]
    assert isinstance(outcomes[4], InputError) and "episode_id 7 continues at step 3, but the store holds its " \
                                                  "steps up to 4" in str(outcomes[4])
    assert len({o.version for o in outcomes[:4]}) == 1  # type: ignore[union-attr]
    with pytest.raises(InputError, match=r"step: episode_id 7 goes from step 0 to step 2"):
        committer.ingest(episode([0, 2]), run_id="r", env_id="E")  # checked on the caller's thread
    assert [s for e, s in held(store) if e == 7] == [0, 1, 2, 3, 4]
    assert trajstore.check(store).ok


def test_at_most_one_commit_per_interval(store: trajstore.Store) -> None:
    committer = GroupCommitter(steps_table(store), interval_s=0.4)
    try:
        committer.ingest(rows(2, episode_id=1), run_id="r", env_id="E").result(60)  # the table made
        started, futures = time.monotonic(), []
        while time.monotonic() - started < 2.0:  # a request every 20 ms for 2 s
            futures.append(committer.ingest(rows(2, episode_id=10 + len(futures)), run_id="r", env_id="E"))
            time.sleep(0.02)
        outcomes = wait_all(futures)
        elapsed = time.monotonic() - started
    finally:
        committer.close()
    versions = sorted({o.version for o in outcomes})  # type: ignore[union-attr]
    assert len(versions) <= elapsed / 0.4 + 1 and len(futures) >= 3 * len(versions)
    stamps = [r["timestamp"].timestamp() for r in store.history().to_pylist() if r["version"] in versions]
    assert min(b - a for a, b in zip(stamps, stamps[1:])) >= 0.4 * 0.9  # spaced by the interval
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 2 * (len(futures) + 1)


def test_a_full_group_commits_before_the_interval(store: trajstore.Store) -> None:
    committer = GroupCommitter(steps_table(store), interval_s=30, group_bytes=1)
    try:
        started = time.monotonic()
        first = committer.ingest(rows(3, episode_id=1), run_id="r", env_id="E").result(60)
        second = committer.ingest(rows(3, episode_id=2), run_id="r", env_id="E").result(60)
    finally:
        committer.close()
    assert time.monotonic() - started < 20 and second.version == first.version + 1  # type: ignore[operator]


def test_a_retry_is_recognised_before_its_rows_are_checked(store: trajstore.Store,
                                                           committer: GroupCommitter) -> None:
    """The issue's failure: a retry sent after the client's timeout while its first try had landed was refused as not
    continuing its episode (422); here it is the same request, answered as stored."""
    first = committer.ingest(episode([0, 1, 2, 3]), run_id="r", env_id="E", idempotency_key="a")
    retry = committer.ingest(episode([0, 1, 2, 3]), run_id="r", env_id="E", idempotency_key="a")  # waits with it
    assert not first.result(60).duplicate and retry.result(60).duplicate
    assert first.result().version == retry.result().version
    committer.ingest(episode([4, 5]), run_id="r", env_id="E", idempotency_key="b").result(60)
    late = committer.ingest(episode([0, 1, 2, 3]), run_id="r", env_id="E", idempotency_key="a")  # after landing
    assert late.result(60).duplicate
    with pytest.raises(ConflictError, match="idempotency_key: 'a' was already used for another request"):
        committer.ingest(episode([6]), run_id="r", env_id="E", idempotency_key="a")
    assert [s for e, s in held(store) if e == 7] == [0, 1, 2, 3, 4, 5]


def test_a_retry_sent_as_its_first_try_is_answered_is_answered_too(store: trajstore.Store,
                                                                    committer: GroupCommitter) -> None:
    """The retry arrives in the moment between the first try's answer and the committer forgetting its key (here,
    from the first answer's own callback): it is answered as a duplicate of that commit, not left waiting (CI saw
    a service request hang for 600 s)."""
    retries: list[Future[Outcome]] = []
    sent = threading.Event()

    def retry_at_once(done: Future[Outcome]) -> None:  # runs on the committer's thread, inside the answer
        retries.append(committer.ingest(episode([0, 1, 2]), run_id="r", env_id="E", idempotency_key="k"))
        sent.set()

    first = committer.ingest(episode([0, 1, 2]), run_id="r", env_id="E", idempotency_key="k")
    first.add_done_callback(retry_at_once)
    landed = first.result(60)
    assert sent.wait(60)
    retry = retries[0].result(10)
    assert not landed.duplicate and retry.duplicate and retry.version == landed.version
    assert [s for e, s in held(store) if e == 7] == [0, 1, 2]


def test_a_retry_checked_before_its_first_try_landed_is_answered_once(store: trajstore.Store) -> None:
    """Two committers (two service processes) over one store: the retry reaches the other while the first try waits;
    both are checked against a version that holds neither, and the key in the log decides at the commit."""
    one = GroupCommitter(steps_table(store), interval_s=0.3)
    two = GroupCommitter(steps_table(trajstore.open(store.root)), interval_s=0.3)
    try:
        one.ingest(rows(1, episode_id=1), run_id="r", env_id="E").result(60)
        futures = [one.ingest(episode([0, 1, 2]), run_id="r", env_id="E", idempotency_key="k"),
                   two.ingest(episode([0, 1, 2]), run_id="r", env_id="E", idempotency_key="k")]
        outcomes = wait_all(futures)
    finally:
        one.close()
        two.close()
    assert sorted(o.duplicate for o in outcomes) == [False, True]  # type: ignore[union-attr]
    assert [s for e, s in held(store) if e == 7] == [0, 1, 2]


def test_what_changed_since_a_request_was_checked_is_checked_again(store: trajstore.Store) -> None:
    """Another process stores the same steps while a request waits: the request no longer continues its episode and
    is refused at its commit, alone."""
    committer = GroupCommitter(steps_table(store), interval_s=0.5)
    other = trajstore.open(store.root)
    try:
        committer.ingest(episode([0, 1]), run_id="r", env_id="E").result(60)
        waiting = committer.ingest(episode([2, 3]), run_id="r", env_id="E")  # checked now, commits in ~0.5 s
        fine = committer.ingest(rows(2, episode_id=50), run_id="r", env_id="E")
        plumbing(other).ingest(episode([2]), run_id="r", env_id="E")  # lands first
        outcomes = wait_all([waiting, fine])
    finally:
        committer.close()
    assert isinstance(outcomes[0], InputError) and "continues at step 2, but the store holds its steps up to 2" \
        in str(outcomes[0])
    assert isinstance(outcomes[1], Outcome)
    assert [s for e, s in held(store) if e == 7] == [0, 1, 2]
    assert trajstore.check(store).ok


def test_a_group_that_loses_the_race_to_another_writer_is_committed_after_it(store: trajstore.Store) -> None:
    """A local writer commits files to the same table all along: every group that loses the version to it is
    planned again on the new one, and every step is stored once."""
    committer = GroupCommitter(steps_table(store), interval_s=0.05)
    stop = threading.Event()

    def write() -> None:
        rng = np.random.default_rng(1)
        with trajstore.open(store.root).writer(run_id="local", env_id="L", flush_bytes=1) as w:
            while not stop.is_set():
                w.add_batch(make_batch(rng, 4, 2))

    writer = threading.Thread(target=write)
    writer.start()
    try:
        futures = [committer.ingest(rows(3, episode_id=1000 + i), run_id="r", env_id="E", idempotency_key=str(i))
                   for i in range(40) if time.sleep(0.01) is None]
        outcomes = wait_all(futures)
    finally:
        stop.set()
        writer.join()
        committer.close()
    assert [o for o in outcomes if not isinstance(o, Outcome) or o.duplicate] == []
    counts = store.sql("SELECT count(*) AS n, count(DISTINCT (episode_id, step)) AS d FROM steps WHERE run_id = 'r'")
    assert counts.to_pylist() == [{"n": 120, "d": 120}]
    assert trajstore.check(store).ok


def test_handed_files_are_committed_together(store: trajstore.Store) -> None:
    """Writers that write their files themselves and hand them to one committer: one commit for a round of flushes."""
    with trajstore.Committer(store, interval="300ms", host=None) as committer:
        barrier = threading.Barrier(6)

        def write(i: int) -> None:
            rng = np.random.default_rng(i)
            with store.writer(run_id="r", env_id="E", committer=committer, worker_id=f"w{i}") as w:
                for _ in range(3):
                    w.add_batch(make_batch(rng, 8, 2))
                    barrier.wait(30)
                    w.flush()

        threads = [threading.Thread(target=write, args=(i,)) for i in range(6)]
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        assert committer.commits <= 6 and sum(committer.groups) == 18  # 18 flushes, about one commit per round
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 6 * 3 * 16
    assert trajstore.check(store).ok


def test_a_group_is_written_as_one_file_per_partition_in_the_order_requests_came(store: trajstore.Store,
                                                                                 committer: GroupCommitter) -> None:
    committer.ingest(rows(1, episode_id=1), run_id="r", env_id="E").result(60)
    futures = [committer.ingest(rows(4, episode_id=10 - i), run_id="r", env_id="E") for i in range(5)]
    wait_all(futures)
    (added,) = [a["add"]["path"] for a in entry(store, store.version) if "add" in a]
    ids = pq.read_table(Path(store.root) / "steps" / unquote(added), columns=["episode_id"])["episode_id"]
    assert ids.to_pylist() == [e for e in (10, 9, 8, 7, 6) for _ in range(4)]
    assert store.episodes()["episode_length"].to_pylist() == [1] + [4] * 5


def test_rows_whose_types_differ_go_to_files_of_their_own(store: trajstore.Store, committer: GroupCommitter) -> None:
    committer.ingest(rows(1, episode_id=9), run_id="r", env_id="E").result(60)
    plain = rows(3, episode_id=1)
    extra = rows(3, episode_id=2).append_column("value", pa.array([0.5, 0.25, 0.125], pa.float32()))
    wait_all([committer.ingest(plain, run_id="r", env_id="E"), committer.ingest(extra, run_id="r", env_id="E")])
    assert len([a for a in entry(store, store.version) if "add" in a]) == 2 and len(appends(store)) == 2
    assert store.sql("SELECT value FROM steps WHERE episode_id = 2 ORDER BY step")["value"].to_pylist() == \
        [0.5, 0.25, 0.125]
