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
import pyarrow.compute as pc
import pytest

import trajstore
from tests.helpers import steps_table
from tests.storage.helpers import episode, rows
from trajstore.errors import ConflictError, InputError, SchemaMismatchError
from trajstore.operations import ingest
from trajstore.operations.ingest import append_rows, validate_rows
from trajstore.store import plumbing


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
    first = append_rows(steps_table(store), rows(), run_id="r", env_id="E", idempotency_key="k1")
    again = append_rows(steps_table(store), rows(), run_id="r", env_id="E", idempotency_key="k1")
    assert first[1] is False and again == (None, True)
    assert store.stats()["n_traj"][0].as_py() == 1 and len(store.maintain.files()) == 1


# --- what an ingest request may append: one request, its key, and what the store holds ------------------------


def held(store: trajstore.Store) -> list[tuple[int, int]]:
    """The stored (episode_id, step) pairs, in order."""
    return [(r["episode_id"], r["step"]) for r in store.sql("SELECT episode_id, step FROM steps ORDER BY 1, 2")
            .to_pylist()]


def test_a_key_reused_for_another_request_is_a_conflict(store: trajstore.Store) -> None:
    append_rows(steps_table(store), episode([0, 1, 2]), run_id="r", env_id="E", idempotency_key="k")
    for other, where in ((episode([3, 4]), {}), (episode([0, 1, 2]), {"env_id": "F"}),
                         (episode([0, 1, 2]), {"run_id": "r2"})):
        with pytest.raises(ConflictError, match="idempotency_key: 'k' was already used for another request"):
            append_rows(steps_table(store), other, **{"run_id": "r", "env_id": "E", **where}, idempotency_key="k")
    assert held(store) == [(7, 0), (7, 1), (7, 2)]
    again = trajstore.open(store.root)  # the digest is in the log, not in this process
    table = steps_table(again)
    assert append_rows(table, episode([0, 1, 2]), run_id="r", env_id="E", idempotency_key="k") == (None, True)
    with pytest.raises(ConflictError):
        append_rows(steps_table(again), episode([3, 4]), run_id="r", env_id="E", idempotency_key="k")
    assert append_rows(steps_table(again), episode([3, 4]), run_id="r", env_id="E", idempotency_key="k2")[1] is False
    assert held(again)[-1] == (7, 4)


@pytest.mark.parametrize("held_up_to", [1 << 30, -1])
def test_a_requests_digest_is_what_the_log_already_holds(monkeypatch: pytest.MonkeyPatch, held_up_to: int) -> None:
    """The log keeps each request's digest under its key, so a retry after an upgrade must hash as before: the rows
    serialized whole (a request of up to DIGEST_HELD bytes) or hashed as they are written give the digest that
    trajstore recorded since keys held digests (pinned), chunks or not; other rows, run or env give another."""
    monkeypatch.setattr(ingest, "DIGEST_HELD", held_up_to)
    chunked = pa.concat_tables([rows(3, 5), rows(4, 9)])
    assert chunked["step"].num_chunks == 2
    digest = ingest.request_digest(chunked, run_id="r", env_id="E")
    assert digest == 7934600025283971256 == ingest.request_digest(chunked.combine_chunks(), run_id="r", env_id="E")
    assert len({digest, ingest.request_digest(chunked, run_id="r2", env_id="E"),
                ingest.request_digest(chunked, run_id="r", env_id="F"),
                ingest.request_digest(chunked.slice(1), run_id="r", env_id="E")}) == 4


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
        append_rows(steps_table(store), request_rows, run_id="r", env_id="E")
    assert store.maintain.files() == [] and not list(steps_table(store).path.rglob("*.parquet"))  # nothing left behind


@pytest.fixture
def running(store: trajstore.Store) -> trajstore.Store:
    """A store holding steps 0..4 of episode 7 (run r, env E, still running) and all of episode 8 (ended)."""
    append_rows(steps_table(store), pa.concat_tables([episode([0, 1, 2, 3, 4]), episode([0, 1], 8, end=True)]),
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
        append_rows(steps_table(running), request_rows, **{"run_id": "r", "env_id": "E", **where})
    assert held(running) == before and len(list(steps_table(running).path.rglob("*.parquet"))) == 1
    assert trajstore.check(running).ok


def test_an_episode_continues_across_requests(running: trajstore.Store) -> None:
    append_rows(steps_table(running), pa.concat_tables([episode([6, 5]), episode([0], 9)]), run_id="r", env_id="E")
    append_rows(steps_table(running), episode([7], end=True), run_id="r", env_id="E", idempotency_key="end")
    assert [s for e, s in held(running) if e == 7] == list(range(8))
    assert running.episodes(complete=True)["episode_id"].to_pylist() == [7, 8]
    assert trajstore.check(running).ok


def _try_append(store: trajstore.Store, step: int, key: str) -> str:
    """Append step ``step`` of episode 7: "stored", or the refusal's first clause."""
    try:
        append_rows(steps_table(store), episode([step]), run_id="r", env_id="E", idempotency_key=key)
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


@pytest.mark.slow
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


# --- the rows of agents: each agent's env steps strictly increase (they may skip), as AgentWriter writes them ------


def agent_rows(*given: tuple[Any, ...], episode_id: int = 7) -> pa.Table:
    """Rows of agents of one episode in the order given, each ``(agent, step)`` or ``(agent, step, ended)``."""
    ended = [len(r) > 2 and r[2] for r in given]
    return rows(len(given), episode_id, step=pa.array([r[1] for r in given], pa.int64()),
                terminated=pa.array(ended), agent_id=pa.array([r[0] for r in given], pa.string()))


def held_by_agent(store: trajstore.Store) -> list[tuple[int, str | None, int]]:
    """The stored (episode_id, agent_id, step) triples, in order."""
    return [(r["episode_id"], r["agent_id"], r["step"]) for r in
            store.sql("SELECT episode_id, agent_id, step FROM steps ORDER BY 1, 2, 3").to_pylist()]


@pytest.mark.parametrize("request_rows, message", [
    (agent_rows(("a", 1), ("b", 0), ("a", 0)),
     "step: agent 'a' of episode_id 7 goes from step 1 back to step 0; expected strictly increasing env steps for "
     r"one agent in one episode \(it may skip steps\)"),
    (agent_rows(("a", 0), ("b", 0), ("a", 0)), "step: agent 'a' of episode_id 7 has step 0 more than once"),
    (agent_rows(("b", 0), ("b", 2), ("a", 0), ("a", 2), ("b", 2)), "agent 'b' of episode_id 7 has step 2 more than"),
    (agent_rows(("a", 0, True), ("b", 1), ("a", 1)),
     "terminated/truncated: agent 'a' of episode_id 7 ends at step 0, but its rows go on to step 1"),
    (pa.concat_tables([agent_rows(("a", 0)), episode([1]).append_column("agent_id", pa.nulls(1, pa.string()))]),
     "agent_id: episode_id 7 has rows with and without an agent_id"),
    (rows(2, agent_id=pa.array([1, 2])), "agent_id: expected strings"),
    (rows(2, agent_id=pa.array(["a", ""])), "agent_id: expected non-empty agent names"),
])
def test_agent_rows_that_go_back_or_repeat_are_refused_naming_the_agent(store: trajstore.Store,
                                                                         request_rows: pa.Table, message: str) -> None:
    with pytest.raises(InputError, match=message):
        append_rows(steps_table(store), request_rows, run_id="r", env_id="E")
    assert store.maintain.files() == [] and not list(steps_table(store).path.rglob("*.parquet"))


def test_agents_share_env_steps_skip_some_and_join_late(store: trajstore.Store) -> None:
    """As knights_archers_zombies' agents do (one leaves when killed) or turn-based games (one agent per step)."""
    append_rows(steps_table(store), pa.concat_tables([
        agent_rows(("a", 0), ("a", 2), ("a", 3, True), ("b", 0), ("b", 5, True)),
        agent_rows(("c", 4), ("d", 5), ("c", 6, True), episode_id=9)]), run_id="r", env_id="E")
    assert held_by_agent(store) == [(7, "a", 0), (7, "a", 2), (7, "a", 3), (7, "b", 0), (7, "b", 5),
                                    (9, "c", 4), (9, "c", 6), (9, "d", 5)]
    assert store.sql("SELECT n_agents, complete FROM episodes ORDER BY episode_id").to_pylist() == [
        {"n_agents": 2, "complete": True}, {"n_agents": 2, "complete": False}]
    assert trajstore.check(store).ok


@pytest.fixture
def agents_running(store: trajstore.Store) -> trajstore.Store:
    """A store holding episode 7 of agents ``a`` (steps 0, 1, 2, running) and ``b`` (steps 0, 2; ended), and the
    single-agent episode 8 (steps 0, 1, running)."""
    append_rows(steps_table(store), agent_rows(("a", 0), ("a", 1), ("a", 2), ("b", 0), ("b", 2, True)), run_id="r",
                env_id="E")
    append_rows(steps_table(store), episode([0, 1], 8), run_id="r", env_id="E")
    return store


@pytest.mark.parametrize("request_rows, where, message", [
    (agent_rows(("a", 2), ("a", 3)), {}, "step: agent 'a' of episode_id 7 continues at step 2, but the store holds "
                                         "its steps up to 2; expected strictly increasing env steps for one agent"),
    (agent_rows(("c", 3), ("a", 1)), {}, "agent 'a' of episode_id 7 continues at step 1, but the store holds its "
                                         "steps up to 2"),
    (agent_rows(("b", 3)), {}, r"step: agent 'b' of episode_id 7 ended at step 2 \(terminated or truncated\); its "
                               "step 3 cannot follow it"),
    (episode([3]), {}, "agent_id: the store holds agents' rows of episode_id 7; single-agent rows cannot continue"),
    (agent_rows(("a", 2), episode_id=8), {}, "agent_id: the store holds single-agent rows of episode_id 8; rows of "
                                             "agent 'a' cannot continue it"),
    (agent_rows(("a", 5)), {"env_id": "F"}, "episode_id 7 .* belongs to run_id 'r', env_id 'E', not to run_id 'r', "
                                            "env_id 'F'"),
])
def test_agent_rows_that_do_not_continue_the_stored_agent_are_refused(agents_running: trajstore.Store,
                                                                      request_rows: pa.Table, where: dict[str, str],
                                                                      message: str) -> None:
    before = held_by_agent(agents_running)
    with pytest.raises(InputError, match=message):
        append_rows(steps_table(agents_running), request_rows, **{"run_id": "r", "env_id": "E", **where})
    assert held_by_agent(agents_running) == before and len(agents_running.maintain.files()) == 2
    assert trajstore.check(agents_running).ok


def test_each_agent_continues_after_its_own_last_stored_step(agents_running: trajstore.Store) -> None:
    """An agent goes on after its own last step (skipping is fine); another agent joins the episode at any step;
    a retry of the same request under its key stores nothing again."""
    more = agent_rows(("c", 1), ("a", 4), ("a", 6, True))
    assert append_rows(steps_table(agents_running), more, run_id="r", env_id="E", idempotency_key="k")[1] is False
    assert append_rows(steps_table(agents_running), more, run_id="r", env_id="E", idempotency_key="k") == (None, True)
    assert [(a, s) for e, a, s in held_by_agent(agents_running) if e == 7] == [
        ("a", 0), ("a", 1), ("a", 2), ("a", 4), ("a", 6), ("b", 0), ("b", 2), ("c", 1)]
    assert trajstore.check(agents_running).ok


# --- names (issue 47): the rows' column names and the run's id checked as every writer checks them -------------

@pytest.mark.parametrize(("change", "message"), [
    ({"": pa.array([1.0] * 4)}, r"columns: '' cannot be a column name: it is empty"),
    ({"Reward": pa.array([1.0] * 4)}, r"columns: 'Reward' cannot be a column name: it differs only in case from "
                                      r"'reward'"),
    ({"Run_Id": pa.array(["x"] * 4)}, r"columns: 'Run_Id' cannot be a column name: it differs only in case from "
                                      r"'run_id'"),
    ({"a\nb": pa.array([1.0] * 4)}, r"columns: 'a\\nb' cannot be a column name: it holds '\\n'"),
    ({"next_obs_sparse": pa.array([1.0] * 4)}, r"columns: 'next_obs_sparse' cannot be a column name"),
    ({"gain": pa.array([1.0] * 4), "GAIN": pa.array([1.0] * 4)}, r"columns: 'GAIN' and 'gain' \(given beside it\)"),
    ({"info": pa.array([{"a": 1, "A": 2}] * 4)}, r"info: 'A' and 'a' \(given beside it\) differ only in case"),
    ({"info": pa.array([{"": 1}] * 4)}, r"info\.: '' cannot be a field name: it is empty"),
])
def test_names_no_engine_holds_are_refused_and_nothing_is_stored(store: trajstore.Store, change: dict[str, Any],
                                                                message: str) -> None:
    append_rows(steps_table(store), rows(episode_id=1), run_id="r", env_id="E")
    version = store.version
    with pytest.raises(InputError, match=message):
        plumbing(store).ingest(rows(episode_id=2, **change), run_id="r", env_id="E")
    assert trajstore.open(store.root).version == version  # no column reserved, nothing committed
    assert trajstore.open(store.root).stats()["n_traj"].to_pylist() == [1]


def test_a_name_that_differs_only_in_case_from_a_stored_column_is_refused(store: trajstore.Store) -> None:
    """The table has one schema: a column another environment stored counts."""
    plumbing(store).ingest(rows(episode_id=1, score=pa.array([1.0] * 4)), run_id="r", env_id="Other")
    with pytest.raises(InputError, match=r"columns: 'Score' and 'score' \(a column already there\) differ only"):
        plumbing(store).ingest(rows(episode_id=2, Score=pa.array([1.0] * 4)), run_id="r", env_id="E")
    plumbing(store).ingest(rows(episode_id=2, score=pa.array([2.0] * 4)), run_id="r", env_id="E")
    scores = trajstore.open(store.root).sql("SELECT score FROM steps")["score"].to_pylist()
    assert sorted(scores) == [1.0] * 4 + [2.0] * 4


@pytest.mark.parametrize(("run_id", "env_id", "message"), [
    (" ", "E", r"run_id must be a non-empty string .*got ' ': whitespace at either end"),
    ("a\nb", "E", r"run_id must be a non-empty string .*got 'a\\nb': it holds '\\n'"),
    ("r", "__HIVE_DEFAULT_PARTITION__", r"env_id must .*Hive partitioning reads back as null"),
])
def test_run_ids_every_writer_refuses_are_refused(store: trajstore.Store, run_id: str, env_id: str,
                                                  message: str) -> None:
    with pytest.raises(InputError, match=message):
        plumbing(store).ingest(rows(), run_id=run_id, env_id=env_id)
    assert store.maintain.files() == [] and plumbing(store).run_ids() == []


def test_agent_ids_every_writer_refuses_are_refused(store: trajstore.Store) -> None:
    """The ids of a multi-agent episode's agents, checked as the multi-agent writer checks them."""
    agents = pa.array(["a_0", "a_0", "a\n1", "a\n1"])
    with pytest.raises(InputError, match=r"agent_id must be a non-empty string .*got 'a\\n1': it holds '\\n'"):
        plumbing(store).ingest(rows(agent_id=agents, step=pa.array([0, 1, 0, 1], pa.int32())), run_id="r", env_id="E")
    assert store.maintain.files() == []


# --- encoded rows: checked by decoding them, a piece at a time -------------------------------------------------


def encoded_stacks(T: int, B: int) -> pa.Table:
    """The rows a RemoteWriter sends for ``T x B`` steps of (4, 84, 84) uint8 frame stacks of random bytes:
    encoded (each frame once), one request."""
    from tests.helpers import stacked_stream
    from trajstore.remote.writer import EncodedRows, RemoteSink
    from trajstore.write.writer import Writer

    class Kept(RemoteSink):
        """A RemoteWriter's sink that keeps its requests' rows instead of sending them."""

        def __init__(self) -> None:
            super().__init__(None)  # type: ignore[arg-type]
            self.tables: list[pa.Table] = []

        def stored_schema(self, env_id: str | None = None) -> pa.Schema | None:
            return None

        def commit(self, encoded: EncodedRows) -> str:
            self.tables += [pa.ipc.open_stream(body).read_all() for body, _ in encoded.bodies]
            return "kept"

    sink = Kept()
    with Writer(sink, run_id="r", env_id="Pixels-v0", frame_stack={"obs": 4}, flush_bytes=2**31) as w:
        w.add_batch(stacked_stream(np.random.default_rng(0), T, B, noise=True, p_end=0.02, shape=(84, 84)))
    (table,) = sink.tables
    return table


def test_encoded_rows_are_checked_a_piece_of_decoded_frames_at_a_time() -> None:
    import tracemalloc

    from trajstore.operations.ingest import CHECK_BYTES

    rows = encoded_stacks(1000, 4)  # 30 MB as sent; its obs and next_obs decoded: 4000 x 2 x 28 KB = 226 MB
    tracemalloc.start()  # numpy's memory, where the decoder builds its frames
    try:
        validate_rows(rows, None)
        peak = tracemalloc.get_traced_memory()[1]
    finally:
        tracemalloc.stop()
    assert peak < 4 * CHECK_BYTES, f"{peak / 2**20:.0f} MiB"  # 220 MiB when decoded whole
    nxt = rows["next_obs"].combine_chunks()
    last = np.arange(len(rows)) == len(rows) - 1  # the last row's next_obs null: "the next step's obs", none
    broken = rows.set_column(rows.schema.get_field_index("next_obs"), "next_obs",
                             pc.if_else(pa.array(last), pa.scalar(None, nxt.type), nxt))
    with pytest.raises(InputError, match=r"next_obs/obs: rows: row 3999 \(episode \d+, step \d+\): next_obs is "
                                         "null, but the next row is not the same episode's next step"):
        validate_rows(broken.replace_schema_metadata(rows.schema.metadata), None)


def test_a_writers_schema_is_resolved_once_and_a_new_column_still_reaches_the_log(
        store: trajstore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    """A writer's requests share one schema, and resolving its physical names and declarations cost more than the
    rest of a small request's check: it is resolved once per (rows' schema, log's schema). The kept answer is the
    one the log gives (the reference: resolved again), and rows bringing a column the log lacks still reserve it."""
    monkeypatch.setattr(ingest, "_physical_schemas", {})
    resolved: list[int] = []
    real = ingest._resolved
    monkeypatch.setattr(ingest, "_resolved", lambda *a: resolved.append(1) or real(*a))
    table = steps_table(store)
    append_rows(table, rows(2, episode_id=1), run_id="r", env_id="E")
    state = table.log.read()
    stored = table.stored_schema(env_id="E", files=state.files, state=state)
    for extra in ({}, {"extras.x": pa.array([1.5, 2.5])}):
        checked, _ = ingest._checked(rows(2, episode_id=2, **extra), stored)
        before = len(resolved)
        first, again = ingest._physical(table, checked, state), ingest._physical(table, checked, state)
        reference = real(table, checked, state)
        assert first.equals(reference) and again.equals(reference)
        assert again.schema.equals(reference.schema, check_metadata=True)
        assert len(resolved) - before == (1 if not extra else 2)  # the new column: state lacks it, so not kept
    assert "extras.x" in {f.name for f in table.log.read().schema}
    append_rows(table, rows(2, episode_id=3, **{"extras.x": pa.array([0.5, 1.0])}), run_id="r", env_id="E")
    got = store.sql('SELECT episode_id, "extras.x" AS x FROM steps ORDER BY episode_id, step').to_pylist()
    assert got == [{"episode_id": 1, "x": None}, {"episode_id": 1, "x": None},
                   {"episode_id": 3, "x": 0.5}, {"episode_id": 3, "x": 1.0}]
    assert trajstore.check(store).ok
