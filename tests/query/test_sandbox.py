"""The sandbox on its own: one SELECT only, over the two views and no file at all, cut at its row, byte, time
and memory limits, at most so many at once, and the trusted path (``Store.sql``) untouched by it. Queries run
in a worker process (``Limits.worker_bytes``) unless asked to run here: both ways are checked where they differ
(memory past the worker's limit, a worker killed or crashed, an expression that ignores DuckDB's interrupt)."""

from __future__ import annotations

import os
import signal
import threading
import time
from pathlib import Path
from typing import Iterator

import duckdb
import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.helpers import INSIDE_ESCAPES, PATH_REVEALING, make_batch, plant_uncommitted
from trajstore.errors import (
    QueryBusyError,
    QueryError,
    QueryMemoryError,
    QueryRefusedError,
    QueryTimeoutError,
    QueryWorkerDiedError,
    ResultTooLargeError,
)
from trajstore.query import sandbox, sql_worker
from trajstore.store import plumbing

MiB = 1 << 20
IN_PROCESS = [None, sandbox.WORKER_BYTES]  # worker_bytes: the query runs here, or in a worker


@pytest.fixture
def filled(store: trajstore.Store) -> trajstore.Store:
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(0), 50, 4))
    return store


@pytest.mark.parametrize("query, kind", [
    ("CREATE TABLE t (x INT)", "CREATE"), ("COPY (SELECT 1) TO 'x.csv'", "COPY"), ("PRAGMA version", "PRAGMA"),
    ("SET threads = 1", "SET"), ("ATTACH 'x.db'", "ATTACH")])
def test_only_select_statements(query: str, kind: str) -> None:
    with pytest.raises(QueryRefusedError, match=f"only SELECT statements are allowed, got {kind}"):
        sandbox.check_statement(duckdb.connect(), query)


def test_exactly_one_statement_and_syntax_errors() -> None:
    con = duckdb.connect()
    sandbox.check_statement(con, "SELECT 1")
    with pytest.raises(QueryRefusedError, match="exactly one SELECT statement is allowed, got 2 statements"):
        sandbox.check_statement(con, "SELECT 1; SELECT 2")
    with pytest.raises(QueryError, match="query: Parser Error"):
        sandbox.check_statement(con, "SELEC 1")


@pytest.mark.parametrize("worker_bytes", IN_PROCESS)
def test_rows_are_cut_at_the_limit_and_said_so(filled: trajstore.Store, worker_bytes: int | None) -> None:
    result = plumbing(filled).sandboxed_sql("SELECT step FROM steps",
                                            sandbox.Limits(max_rows=7, worker_bytes=worker_bytes))
    assert result.table.num_rows == 7 and result.truncated
    whole = plumbing(filled).sandboxed_sql("SELECT count(*) AS n FROM steps", sandbox.Limits(max_rows=7,
                                                                                  worker_bytes=worker_bytes))
    assert whole.table["n"][0].as_py() == 200 and not whole.truncated


@pytest.mark.parametrize("worker_bytes", IN_PROCESS)
def test_files_outside_the_store_are_refused(filled: trajstore.Store, worker_bytes: int | None) -> None:
    limits = sandbox.Limits(worker_bytes=worker_bytes)
    with pytest.raises(QueryRefusedError, match="reaches outside the store"):
        plumbing(filled).sandboxed_sql("SELECT * FROM read_csv('/etc/passwd')", limits)
    with pytest.raises(QueryError, match="getenv does not exist"):
        plumbing(filled).sandboxed_sql("SELECT getenv('HOME')", limits)


@pytest.mark.parametrize("worker_bytes", IN_PROCESS)
def test_no_extension_is_installed_or_loaded_for_a_query(filled: trajstore.Store, worker_bytes: int | None) -> None:
    """A function of a known extension is refused naming it; DuckDB does not try to install the extension (with
    autoinstall on it would: "An error occurred while trying to automatically install the required extension")."""
    limits = sandbox.Limits(worker_bytes=worker_bytes)
    settings = plumbing(filled).sandboxed_sql("SELECT name, value FROM duckdb_settings() WHERE name IN "
                                              "('autoinstall_known_extensions', 'autoload_known_extensions') "
                                              "ORDER BY name", limits)
    assert settings.table.to_pylist() == [{"name": "autoinstall_known_extensions", "value": "false"},
                                          {"name": "autoload_known_extensions", "value": "false"}]
    for query, function, extension in [("SELECT * FROM sqlite_scan('x.db', 't')", "sqlite_scan", "sqlite_scanner"),
                                       ("SELECT * FROM read_xlsx('a.xlsx')", "read_xlsx", "excel"),
                                       ("SELECT * FROM delta_scan('steps')", "delta_scan", "delta")]:
        with pytest.raises(QueryRefusedError, match=f"query: {function} is a function of DuckDB's {extension} "
                                                    "extension, which the sandbox neither installs nor loads"):
            plumbing(filled).sandboxed_sql(query, limits)


@pytest.mark.parametrize("query", [
    "SELECT len(range(2000000000))",  # one list of 16 GB
    "SELECT count(*) FROM (SELECT i, md5(i::VARCHAR) AS h FROM range(20000000) t(i) ORDER BY h)",  # grows to it
])
def test_a_query_past_the_workers_memory_is_stopped_and_the_next_one_runs(filled: trajstore.Store,
                                                                          query: str) -> None:
    limits = sandbox.Limits(worker_bytes=256 * MiB, memory_limit="4GB")  # DuckDB's own limit out of the way
    with pytest.raises(QueryMemoryError, match=r"limit of 256 MiB of the worker process it runs in "
                                               r"\(sql_worker_bytes\)"):
        plumbing(filled).sandboxed_sql(query, limits)
    assert plumbing(filled).sandboxed_sql("SELECT count(*) AS n FROM steps", limits).table["n"].to_pylist() == [200]


def test_duckdbs_own_memory_limit_is_named(filled: trajstore.Store) -> None:
    with pytest.raises(QueryMemoryError, match=r"memory limit of 20MB \(sql_memory_limit"):
        plumbing(filled).sandboxed_sql("SELECT list(i) FROM range(100000000) t(i) GROUP BY i % 3",
                             sandbox.Limits(memory_limit="20MB"))


def workers_of_this_process() -> list[int]:
    """The SQL worker processes this process started (the processes whose parent it is, running the worker)."""
    found = []
    for name in os.listdir("/proc"):
        try:
            with open(f"/proc/{name}/stat") as f:
                parent = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"/proc/{name}/cmdline", "rb") as f:
                command = f.read()
        except (OSError, ValueError, IndexError):
            continue
        if parent == os.getpid() and b"trajstore.query.sql_worker" in command:
            found.append(int(name))
    return found


def cpu_seconds(pid: int) -> float:
    """The CPU time process ``pid`` has used (0 once it is gone)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except OSError:
        return 0.0
    return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")  # utime + stime


def _cpu_used(window_s: float = 0.3) -> dict[int, float]:
    """The CPU time each SQL worker of this process used in the next ``window_s`` seconds."""
    before = {pid: cpu_seconds(pid) for pid in workers_of_this_process()}
    time.sleep(window_s)
    return {pid: cpu_seconds(pid) - spent for pid, spent in before.items()}


def quiet_workers(timeout_s: float = 120.0) -> None:
    """Wait until no SQL worker of this process uses CPU (those starting or replaced have warmed up)."""
    deadline = time.monotonic() + timeout_s
    while max(_cpu_used().values(), default=0.0) > 0.02:
        assert time.monotonic() < deadline, "the SQL workers did not settle"


def busy_worker(timeout_s: float = 30.0) -> int:
    """The SQL worker of this process that is running a query (the one using CPU), once it is (call
    :func:`quiet_workers` before the query starts: a worker warming up uses CPU too)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        used = _cpu_used()
        if used and max(used.values()) > 0.1:
            return max(used, key=used.__getitem__)
    raise AssertionError("no SQL worker ran a query")


SLOW_SQL = "SELECT count(*) FROM range(1000000000000) a"  # busy until its time limit


@pytest.mark.slow
@pytest.mark.parametrize("sig", [signal.SIGKILL, signal.SIGSEGV], ids=["killed", "crashed"])
def test_a_worker_that_dies_mid_query_is_said_to_have_died_not_memory_and_is_replaced(
        filled: trajstore.Store, sig: signal.Signals) -> None:
    limits = sandbox.Limits(timeout_s=60, worker_bytes=300 * MiB)
    plumbing(filled).sandboxed_sql("SELECT 1", limits)  # the pool of this size has started
    quiet_workers()
    errors: list[BaseException] = []

    def run() -> None:
        try:
            plumbing(filled).sandboxed_sql(SLOW_SQL, limits)
        except BaseException as exc:  # noqa: BLE001 - handed to the test
            errors.append(exc)

    thread = threading.Thread(target=run)
    thread.start()
    os.kill(busy_worker(), sig)
    thread.join(30)
    assert len(errors) == 1 and isinstance(errors[0], QueryWorkerDiedError), errors
    assert not isinstance(errors[0], QueryMemoryError)
    message = str(errors[0])
    assert f"the SQL worker process running it died before it answered (it was killed by signal {sig.value} " \
           f"({sig.name})): it was killed" in message and "or it crashed" in message, message
    assert "run it again" in message and "sql_worker_bytes" not in message
    assert plumbing(filled).sandboxed_sql("SELECT count(*) AS n FROM steps", limits).table["n"].to_pylist() == [200]


def test_an_expression_that_ignores_the_interrupt_is_stopped_at_the_time_limit(
        filled: trajstore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    # one list of 20M items takes seconds, unaware of DuckDB's interrupt
    monkeypatch.setattr(sql_worker, "GRACE_S", 0.2)
    limits = sandbox.Limits(timeout_s=0.3)
    plumbing(filled).sandboxed_sql("SELECT 1", limits)
    started = time.monotonic()
    with pytest.raises(QueryTimeoutError, match="time limit of 0.3 s"):
        plumbing(filled).sandboxed_sql("SELECT len(range(20000000))", limits)
    assert time.monotonic() - started < 2.0  # the worker was killed, not waited for
    assert plumbing(filled).sandboxed_sql("SELECT count(*) AS n FROM steps", limits).table["n"].to_pylist() == [200]


def test_a_bad_worker_memory_is_refused_naming_the_setting() -> None:
    with pytest.raises(trajstore.InputError, match="sql_worker_bytes: must be a number of bytes >= 1, got 0"):
        sandbox.Limits(worker_bytes=0)


def test_time_limit(filled: trajstore.Store) -> None:
    with pytest.raises(QueryTimeoutError, match="time limit of 0.3 s"):
        plumbing(filled).sandboxed_sql("SELECT count(*) FROM range(1000000000000) a, range(100) b",
                             sandbox.Limits(timeout_s=0.3))


def test_the_trusted_path_is_not_sandboxed(filled: trajstore.Store) -> None:
    # Store.sql is the caller's own process: their files, their rules (the CLI opts into the sandbox)
    assert filled.sql("SELECT 1 AS x FROM range(1)")["x"].to_pylist() == [1]


@pytest.mark.parametrize("query", INSIDE_ESCAPES)
def test_the_stores_own_log_and_uncommitted_files_are_refused(filled: trajstore.Store, query: str) -> None:
    plant_uncommitted(filled.root)
    with pytest.raises(QueryRefusedError, match="outside the store"):
        plumbing(filled).sandboxed_sql(query.format(root=filled.root))


@pytest.mark.parametrize("query", PATH_REVEALING)
def test_settings_and_views_name_no_path_of_the_store(filled: trajstore.Store, query: str) -> None:
    text = str(plumbing(filled).sandboxed_sql(query).table.to_pylist())
    assert str(filled.root) not in text and str(filled.root.resolve()) not in text
    assert str(Path.cwd()) not in text  # nor of the process (DuckDB's temporary directory is relative to it)


def test_the_views_read_the_committed_steps(filled: trajstore.Store) -> None:
    plant_uncommitted(filled.root)
    q = "SELECT * FROM steps ORDER BY episode_id, step"
    assert plumbing(filled).sandboxed_sql(q, sandbox.Limits(max_rows=None)).table.equals(filled.sql(q))


def test_an_interrupt_while_batches_are_fetched_is_the_time_limit(filled: trajstore.Store) -> None:
    # a result that streams for longer than the limit: DuckDB's interrupt arrives as an OSError from the reader
    limits = sandbox.Limits(max_rows=None, max_bytes=None, timeout_s=0.3)
    with pytest.raises(QueryTimeoutError, match="time limit of 0.3 s"):
        plumbing(filled).sandboxed_sql("SELECT i, md5(i::VARCHAR) AS h FROM range(1000000000000) t(i)", limits)


def test_the_time_limit_covers_encoding(filled: trajstore.Store) -> None:
    def slow(result: sandbox.Result) -> Iterator[bytes]:
        for _ in range(20):
            time.sleep(0.05)
            yield b"x"

    with pytest.raises(QueryTimeoutError, match="time limit of 0.3 s"):
        plumbing(filled).sandboxed_sql("SELECT 1 AS x", sandbox.Limits(timeout_s=0.3), encode=slow)
    body = plumbing(filled).sandboxed_sql("SELECT 1 AS x", sandbox.Limits(timeout_s=30), encode=slow).body
    assert body == b"x" * 20


@pytest.mark.parametrize("query", [
    "SELECT repeat('z', 20000) AS s",  # one large value
    "SELECT i FROM range(5000) t(i)",  # many small ones
    "SELECT 'abcdefghij'::ENUM('abcdefghij') AS e FROM range(3000)",  # a dictionary: small, but not decoded
    "SELECT list('{w}'::ENUM('{w}')) AS l FROM range(300)".format(w="z" * 100),  # the same, inside a list
])
def test_the_result_is_cut_at_its_size_while_it_is_fetched(filled: trajstore.Store, query: str) -> None:
    with pytest.raises(ResultTooLargeError, match="larger than the limit of 9.766 KiB"):
        plumbing(filled).sandboxed_sql(query, sandbox.Limits(max_bytes=10_000))
    assert plumbing(filled).sandboxed_sql(query, sandbox.Limits(max_bytes=100_000)).table.num_rows >= 1


def test_the_body_is_cut_at_its_size_while_it_is_encoded(filled: trajstore.Store) -> None:
    def wide(result: sandbox.Result) -> Iterator[bytes]:
        yield from (b"y" * 1000 for _ in range(result.table.num_rows))

    with pytest.raises(ResultTooLargeError, match="sql_max_bytes"):
        plumbing(filled).sandboxed_sql("SELECT 1 FROM range(20)", sandbox.Limits(max_bytes=10_000), encode=wide)
    assert len(plumbing(filled).sandboxed_sql("SELECT 1 FROM range(5)", sandbox.Limits(max_bytes=10_000),
                                    encode=wide).body or b"") == 5000


def test_decoded_sizes_count_every_row_of_a_dictionary() -> None:
    words = pa.array(["a" * 1000, "b"]).dictionary_encode()
    repeated = words.take(pa.array([0] * 50 + [1] * 50))
    assert repeated.nbytes < 2000 < 50_000 < sandbox.decoded_nbytes(repeated) <= repeated.dictionary_decode().nbytes
    nested = pa.ListArray.from_arrays(pa.array([0, 60, 100], pa.int32()), repeated)
    assert sandbox.decoded_nbytes(nested.slice(1)) == sandbox.decoded_nbytes(repeated.slice(60)) + 8
    plain = pa.table({"x": np.arange(10), "s": ["word"] * 10})
    assert sandbox.decoded_nbytes(plain) == plain.nbytes


def test_the_gate_refuses_at_once_and_a_slot_is_given_back_once() -> None:
    gate = sandbox.Gate(2)
    first, second = gate.take(), gate.take()
    started = time.monotonic()
    with pytest.raises(QueryBusyError, match="2 SQL queries or loader streams are running") as refused:
        gate.take()
    assert refused.value.retry_after_s == 1 and time.monotonic() - started < 5  # refused, not queued
    first.release()
    first.release()  # a second release gives nothing back twice
    with gate.take():
        with pytest.raises(QueryBusyError):
            gate.take()
    second.release()
    with gate.take(), gate.take():
        pass
    with pytest.raises(trajstore.InputError, match="sql_max_concurrent: must be a whole number >= 1, got 0"):
        sandbox.Gate(0)


def test_a_committed_file_gone_after_the_schema_was_read_is_damage(filled: trajstore.Store) -> None:
    plumbing(filled).sandboxed_sql("SELECT count(*) FROM steps")  # the steps view's schema is now known
    victim = filled.maintain.files()[0].path
    Path(victim).unlink()
    with pytest.raises(trajstore.errors.StoreDamagedError, match="is missing; the store is damaged"):
        plumbing(filled).sandboxed_sql("SELECT count(*) FROM steps")
