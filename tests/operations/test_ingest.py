"""Ingest on its own: rows already cut into episodes are checked field by field against the schema and the
stored types, must continue the episodes the store holds (also when requests race), and are committed once per
idempotency key, which no other request may reuse."""

from __future__ import annotations

import functools
import multiprocessing
import threading
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.storage.helpers import episode, rows
from trajstore.errors import ConflictError, InputError, SchemaMismatchError
from trajstore.operations.ingest import append_rows, validate_rows


@pytest.mark.parametrize("change, message", [
    ({"reward": None}, "reward: missing column"),
    ({"run_id": pa.array(["x"] * 4)}, "run_id: comes from the request"),
    ({"step": pa.array([0, None, 2, 3], pa.int32())}, "step: 1 null value"),
    ({"step": pa.array([0.0, 1, 2, 3])}, "step: expected integers"),
    ({"step": pa.array([-1, 0, 1, 2], pa.int32())}, "step: must be >= 0"),
    ({"terminated": pa.array([0, 0, 0, 1])}, "terminated: expected bool"),
    ({"reward": pa.array(["a"] * 4)}, "reward: expected float32 or float64"),
    ({"reward": pa.array([1.0, np.inf, 1.0, 1.0], pa.float32())}, "reward must be finite: got inf at row 1"),
    ({"step": pa.array([0, 1, 1, 2], pa.int32())}, "episode_id 7 has step 1 more than once"),
    ({"env_steps": pa.array([1.0, 2.0, 3.0, 4.0])}, "env_steps: expected integers, got double"),
])
def test_bad_rows_are_refused_naming_the_field(change: dict[str, Any], message: str) -> None:
    with pytest.raises(InputError, match=message.replace("(", r"\(")):
        validate_rows(rows(**change), None)


def test_rows_are_cast_to_the_stored_types_and_stamped() -> None:
    stored = pa.schema([("reward", pa.float64()), ("obs", pa.list_(pa.float32(), 2))])
    out = validate_rows(rows(step=pa.array(range(4), pa.int64())), stored)
    assert out["step"].type == pa.int32() and out["reward"].type == pa.float64()
    assert out["wall_time"].type == pa.timestamp("us", tz="UTC")
    with pytest.raises(SchemaMismatchError,
                       match=r"obs: the stored steps of this environment hold float32\[3\], got float32\[2\]"):
        validate_rows(rows(), pa.schema([("obs", pa.list_(pa.float32(), 3))]))


def test_env_steps_are_kept_as_int64() -> None:
    sent = pa.array([8, 16, 24, None], pa.int32())
    for stored in (None, pa.schema([("env_steps", pa.int64())])):
        out = validate_rows(rows(env_steps=sent), stored)
        assert out["env_steps"].type == pa.int64() and out["env_steps"].to_pylist() == [8, 16, 24, None]
    assert "env_steps" not in validate_rows(rows(), None).column_names  # not sent: null when read


def test_one_commit_per_idempotency_key(store: trajstore.Store) -> None:
    first = append_rows(store.table, rows(), run_id="r", env_id="E", idempotency_key="k1")
    again = append_rows(store.table, rows(), run_id="r", env_id="E", idempotency_key="k1")
    assert first[1] is False and again == (None, True)
    assert store.stats()["n_traj"][0].as_py() == 1 and len(store.files()) == 1


# --- what an ingest request may append: one request, its key, and what the store holds ------------------------


def held(store: trajstore.Store) -> list[tuple[int, int]]:
    """The stored (episode_id, step) pairs, in order."""
    return [(r["episode_id"], r["step"]) for r in store.sql("SELECT episode_id, step FROM steps ORDER BY 1, 2")
            .to_pylist()]


def test_a_key_reused_for_another_request_is_a_conflict(store: trajstore.Store) -> None:
    append_rows(store.table, episode([0, 1, 2]), run_id="r", env_id="E", idempotency_key="k")
    for other, where in ((episode([3, 4]), {}), (episode([0, 1, 2]), {"env_id": "F"}),
                         (episode([0, 1, 2]), {"run_id": "r2"})):
        with pytest.raises(ConflictError, match="idempotency_key: 'k' was already used for another request"):
            append_rows(store.table, other, **{"run_id": "r", "env_id": "E", **where}, idempotency_key="k")
    assert held(store) == [(7, 0), (7, 1), (7, 2)]
    again = trajstore.open(store.root)  # the digest is in the log, not in this process
    assert append_rows(again.table, episode([0, 1, 2]), run_id="r", env_id="E", idempotency_key="k") == (None, True)
    with pytest.raises(ConflictError):
        append_rows(again.table, episode([3, 4]), run_id="r", env_id="E", idempotency_key="k")
    assert append_rows(again.table, episode([3, 4]), run_id="r", env_id="E", idempotency_key="k2")[1] is False
    assert held(again)[-1] == (7, 4)


@pytest.mark.parametrize("request_rows, message", [
    (episode([0, 1, 3]), "step: episode_id 7 goes from step 1 to step 3; expected step 2"),
    (episode([2, 0, 3]), "step: episode_id 7 goes from step 0 to step 2; expected step 1"),
    (rows(3, 7, terminated=pa.array([False, True, False])),
     "terminated/truncated: episode_id 7 ends at step 1, but the rows go on to step 2"),
    (rows(3, 7, truncated=pa.array([True, False, False]), terminated=pa.array([False] * 3)),
     "episode_id 7 ends at step 0, but the rows go on to step 2"),
    (episode([1, 2]), "step: episode_id 7 starts at step 1, but the store holds none of its steps; expected step 0"),
    (episode([0, 2**31]), r"step: 2147483648 at row 1 \(episode_id 7\) is beyond int32; expected at most 2147483647"),
    (rows(2).set_column(0, "episode_id", pa.array([2**63] * 2, pa.uint64())),
     r"episode_id: 9223372036854775808 at row 0 \(step 0\) is beyond int64"),
])
def test_broken_episodes_are_refused_naming_episode_and_step(store: trajstore.Store, request_rows: pa.Table,
                                                            message: str) -> None:
    with pytest.raises(InputError, match=message):
        append_rows(store.table, request_rows, run_id="r", env_id="E")
    assert store.files() == [] and not list(store.table.path.rglob("*.parquet"))  # nothing left behind


@pytest.fixture
def running(store: trajstore.Store) -> trajstore.Store:
    """A store holding steps 0..4 of episode 7 (run r, env E, still running) and all of episode 8 (ended)."""
    append_rows(store.table, pa.concat_tables([episode([0, 1, 2, 3, 4]), episode([0, 1], 8, end=True)]),
                run_id="r", env_id="E")
    return store


@pytest.mark.parametrize("request_rows, where, message", [
    (episode([7, 8]), {}, "step: episode_id 7 continues at step 7, but the store holds its steps up to 4; "
                          "expected step 5"),
    (episode([4, 5]), {}, "episode_id 7 continues at step 4, but the store holds its steps up to 4"),
    (episode([0]), {}, "episode_id 7 continues at step 0, but the store holds its steps up to 4"),
    (episode([2], 8), {}, r"step: episode_id 8 ended at step 1 \(terminated or truncated\); step 2 cannot follow"),
    (episode([5]), {"env_id": "F"}, "episode_id: episode_id 7 \\(step 5 here\\) belongs to run_id 'r', env_id 'E', "
                                    "not to run_id 'r', env_id 'F'"),
    (episode([5]), {"run_id": "r2"}, "episode_id 7 .* belongs to run_id 'r', env_id 'E', not to run_id 'r2'"),
    (pa.concat_tables([episode([5, 6]), episode([3], 8)]), {}, "episode_id 8 ended at step 1"),
])
def test_rows_that_do_not_continue_the_stored_episode_are_refused(running: trajstore.Store, request_rows: pa.Table,
                                                                  where: dict[str, str], message: str) -> None:
    before = held(running)
    with pytest.raises(InputError, match=message):
        append_rows(running.table, request_rows, **{"run_id": "r", "env_id": "E", **where})
    assert held(running) == before and len(list(running.table.path.rglob("*.parquet"))) == 1
    assert trajstore.check(running).ok


def test_an_episode_continues_across_requests(running: trajstore.Store) -> None:
    append_rows(running.table, pa.concat_tables([episode([6, 5]), episode([0], 9)]), run_id="r", env_id="E")
    append_rows(running.table, episode([7], end=True), run_id="r", env_id="E", idempotency_key="end")
    assert [s for e, s in held(running) if e == 7] == list(range(8))
    assert running.episodes(complete=True)["episode_id"].to_pylist() == [7, 8]
    assert trajstore.check(running).ok


def _try_append(store: trajstore.Store, step: int, key: str) -> str:
    """Append step ``step`` of episode 7: "stored", or the refusal's first clause."""
    try:
        append_rows(store.table, episode([step]), run_id="r", env_id="E", idempotency_key=key)
    except InputError as exc:
        return str(exc).split(";")[0]
    return "stored"


def _at_once(*calls: Callable[[], str]) -> list[str]:
    """The results of ``calls``, run in threads released at the same moment, sorted."""
    barrier, results = threading.Barrier(len(calls)), []

    def run(call: Callable[[], str]) -> None:
        barrier.wait()
        results.append(call())

    threads = [threading.Thread(target=run, args=(call,)) for call in calls]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    return sorted(results)


def test_racing_threads_append_one_step_once(running: trajstore.Store) -> None:
    """Two requests race for the next step of one episode, round after round: one wins, the other is refused."""
    for step in range(5, 15):
        outcome = _at_once(*(functools.partial(_try_append, running, step, f"{step}-{w}") for w in range(2)))
        assert outcome == [f"step: episode_id 7 continues at step {step}, but the store holds its steps up to "
                           f"{step}", "stored"]
    assert [s for e, s in held(running) if e == 7] == list(range(15))
    assert trajstore.check(running).ok


def _race_in_process(root: str, steps: range, worker: int, barrier: Any, out: Any) -> None:
    store = trajstore.open(root)
    for step in steps:
        barrier.wait(60)
        out.put((step, "stored" if _try_append(store, step, f"{step}-{worker}") == "stored" else "refused"))


def test_racing_processes_append_one_step_once(running: trajstore.Store) -> None:
    """The same race between two processes (no lock in common): the log's version decides."""
    ctx = multiprocessing.get_context("spawn")  # deltalake's runtime does not survive a fork
    barrier, out, steps = ctx.Barrier(2), ctx.Queue(), range(5, 25)
    procs = [ctx.Process(target=_race_in_process, args=(str(running.root), steps, w, barrier, out)) for w in range(2)]
    for p in procs:
        p.start()
    results = sorted(out.get(timeout=120) for _ in range(2 * len(steps)))
    for p in procs:
        p.join(30)
    assert [p.exitcode for p in procs] == [0, 0]
    assert results == [(s, r) for s in steps for r in ("refused", "stored")]
    assert [s for e, s in held(running) if e == 7] == list(range(25))
    assert trajstore.check(running).ok
