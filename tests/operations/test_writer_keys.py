"""A writer's numbered requests (issue 49): ``idempotency_key`` names the writer and ``idempotency_sequence``
numbers its requests, so the log keeps one app transaction per writer, not one per request (a service serving
~500 requests a second kept 300 million keys a week), while a retry is still stored once and a number reused for
other rows is still refused. Fast tier: one store per test, no server."""

from __future__ import annotations

from pathlib import Path

import pytest
from deltalake import DeltaTable

import trajstore
from tests.helpers import steps_table
from tests.operations.test_group_commit import held, wait_all
from tests.storage.helpers import episode
from trajstore.errors import ConflictError, InputError
from trajstore.operations.group_commit import GroupCommitter, Outcome
from trajstore.operations.ingest import IdempotencyKey
from trajstore.store import plumbing


@pytest.fixture
def committer(store: trajstore.Store) -> GroupCommitter:
    # requests sent together wait one group (as tests/operations/test_group_commit.py's), even on a loaded machine
    c = GroupCommitter(steps_table(store), interval_s=0.5)
    yield c
    c.close()


def keys(store: trajstore.Store) -> dict[str, int]:
    """The app transactions the store's log holds (id -> version), as any Delta reader sees them."""
    found = steps_table(store).log.app_transactions(store.version)
    assert found is not None
    return {app_id: version for app_id, (version, _) in found.items()}


def send(committer: GroupCommitter, steps: list[int], number: int, *, writer: str = "w1",
         episode_id: int = 7) -> Outcome:
    return committer.ingest(episode(steps, episode_id), run_id="r", env_id="E", idempotency_key=writer,
                            idempotency_sequence=number).result(60)


def test_a_writer_keeps_one_key_however_many_requests(store: trajstore.Store) -> None:
    committer = GroupCommitter(steps_table(store), interval_s=0)  # a commit per request, at once
    try:
        for n in range(6):
            assert not send(committer, [2 * n, 2 * n + 1], n).duplicate
        send(committer, [0, 1], 0, writer="w2", episode_id=8)
    finally:
        committer.close()
    assert [s for e, s in held(store) if e == 7] == list(range(12))
    found = keys(store)
    assert sorted(found) == ["trajstore-writer:w1", "trajstore-writer:w2"]  # not one key per request
    assert found["trajstore-writer:w1"] >> 31 == 5  # the writer's last number, as Delta's txn version: rising
    delta = DeltaTable(str(Path(store.root) / "steps"))  # what another engine reads of the writer's key
    assert delta.transaction_version("trajstore-writer:w1") == found["trajstore-writer:w1"]


def test_a_retry_of_any_stored_number_is_a_duplicate(store: trajstore.Store, committer: GroupCommitter) -> None:
    first = send(committer, [0, 1], 0)
    send(committer, [2, 3], 1)
    retry_last, retry_older = send(committer, [2, 3], 1), send(committer, [0, 1], 0)
    assert retry_last.duplicate and retry_older.duplicate and not first.duplicate
    assert [s for e, s in held(store) if e == 7] == [0, 1, 2, 3]


def test_a_number_reused_for_other_rows_is_a_conflict(store: trajstore.Store, committer: GroupCommitter) -> None:
    send(committer, [0, 1], 0)
    with pytest.raises(ConflictError, match="idempotency_sequence: number 0 of writer 'w1' was already used"):
        send(committer, [2, 3], 0)
    assert not send(committer, [2, 3], 1).duplicate  # the writer's next number is taken
    assert [s for e, s in held(store) if e == 7] == [0, 1, 2, 3]


def test_a_retry_waiting_with_its_first_try_is_answered_with_it(store: trajstore.Store,
                                                                committer: GroupCommitter) -> None:
    send(committer, [0], 0)  # the next group then waits its interval
    futures = [committer.ingest(episode([1, 2]), run_id="r", env_id="E", idempotency_key="w1",
                                idempotency_sequence=1) for _ in range(3)]
    outcomes = wait_all(futures)
    assert sorted(o.duplicate for o in outcomes) == [False, True, True]  # type: ignore[union-attr]
    assert len({o.version for o in outcomes}) == 1  # type: ignore[union-attr]
    assert [s for e, s in held(store) if e == 7] == [0, 1, 2]


def test_a_writers_requests_in_one_group_are_committed_in_order(store: trajstore.Store,
                                                                committer: GroupCommitter) -> None:
    """Numbers rising within one group: both committed by one commit, which records the writer's later number; a
    number below one its group already holds was sent out of order and is refused alone."""
    send(committer, [0], 0)
    futures = [committer.ingest(episode([0], eid), run_id="r", env_id="E", idempotency_key="w1",
                                idempotency_sequence=number) for eid, number in ((20, 1), (21, 2))]
    futures.append(committer.ingest(episode([0]), run_id="r", env_id="E", idempotency_key="w1",
                                    idempotency_sequence=0))  # a late retry of number 0
    outcomes = wait_all(futures)
    assert [isinstance(o, Outcome) and not o.duplicate for o in outcomes[:2]] == [True, True]
    assert outcomes[0].version == outcomes[1].version  # type: ignore[union-attr]
    assert isinstance(outcomes[2], Outcome) and outcomes[2].duplicate  # number 0 was stored before the group
    assert keys(store)["trajstore-writer:w1"] >> 31 == 2
    assert held(store) == [(7, 0), (20, 0), (21, 0)]


def test_a_retry_after_its_writers_next_request_in_one_group_is_answered_with_it(
        store: trajstore.Store, committer: GroupCommitter) -> None:
    send(committer, [0], 0)
    futures = [committer.ingest(episode([0], eid), run_id="r", env_id="E", idempotency_key="w1",
                                idempotency_sequence=number) for eid, number in ((20, 1), (21, 2), (20, 1))]
    first, second, retry = wait_all(futures)
    assert isinstance(retry, Outcome) and retry.duplicate and retry.version == first.version  # type: ignore[union-attr]
    assert not first.duplicate and not second.duplicate  # type: ignore[union-attr]
    assert held(store) == [(7, 0), (20, 0), (21, 0)]


def test_a_lower_number_after_a_higher_one_in_one_group_is_refused(store: trajstore.Store,
                                                                   committer: GroupCommitter) -> None:
    send(committer, [0], 0)
    futures = [committer.ingest(episode([0], eid), run_id="r", env_id="E", idempotency_key="w1",
                                idempotency_sequence=number) for eid, number in ((20, 3), (21, 2))]
    later, earlier = wait_all(futures)
    assert isinstance(later, Outcome) and not later.duplicate
    assert isinstance(earlier, ConflictError) and "number 2 of writer 'w1' came after its number 3" in str(earlier)
    assert [e for e, _ in held(store)] == [7, 20]


def test_plain_and_numbered_keys_of_one_name_are_apart(store: trajstore.Store, committer: GroupCommitter) -> None:
    send(committer, [0], 0, writer="k")
    assert not committer.ingest(episode([1]), run_id="r", env_id="E", idempotency_key="k").result(60).duplicate
    assert sorted(keys(store)) == ["trajstore-ingest:k", "trajstore-writer:k"]


def test_the_local_path_takes_numbered_keys_too(store: trajstore.Store) -> None:
    ingest = plumbing(store).ingest
    assert ingest(episode([0, 1]), run_id="r", env_id="E", idempotency_key="w", idempotency_sequence=0)
    ingest(episode([2]), run_id="r", env_id="E", idempotency_key="w", idempotency_sequence=1)
    ingest(episode([0, 1]), run_id="r", env_id="E", idempotency_key="w", idempotency_sequence=0)  # a retry
    assert [s for e, s in held(store) if e == 7] == [0, 1, 2]
    assert list(keys(store)) == ["trajstore-writer:w"]


@pytest.mark.parametrize("key, number, match", [
    (None, 0, "idempotency_sequence: numbers a writer's requests, so it needs the idempotency_key"),
    ("w", -1, "idempotency_sequence: expected an integer from 0 to 4294967295, got -1"),
    ("w", 2 ** 32, "idempotency_sequence: expected an integer from 0 to 4294967295, got 4294967296"),
])
def test_a_bad_number_is_refused_naming_the_field(store: trajstore.Store, committer: GroupCommitter,
                                                  key: str | None, number: int, match: str) -> None:
    with pytest.raises(InputError, match=match):
        committer.ingest(episode([0]), run_id="r", env_id="E", idempotency_key=key, idempotency_sequence=number)
    assert store.version == -1  # nothing stored


def test_holds_against_a_plain_reference() -> None:
    """:meth:`IdempotencyKey.holds` against the rule written out: another writer's number is never looked at; of its
    own, a lower one holds nothing of this request, a higher one holds it, the same one holds it only with the same
    rows."""
    rows_a, rows_b = episode([0]), episode([1])
    for stored_number in range(4):
        for stored_rows in (rows_a, rows_b):
            stored = IdempotencyKey.of("w", stored_rows, run_id="r", env_id="E", sequence=stored_number).version
            for number in range(4):
                key = IdempotencyKey.of("w", rows_a, run_id="r", env_id="E", sequence=number)
                if stored_number < number:
                    assert key.holds(stored) is False
                elif stored_number > number or stored_rows is rows_a:
                    assert key.holds(stored) is True
                else:
                    with pytest.raises(ConflictError):
                        key.holds(stored)
    assert IdempotencyKey.of("w", rows_a, run_id="r", env_id="E", sequence=3).holds(None) is False
