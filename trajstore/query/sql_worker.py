"""Untrusted SQL in worker processes that cannot take more than a set amount of memory.

DuckDB's ``memory_limit`` covers its buffers, not the lists and strings one expression builds
(``SELECT len(range(2000000000))`` grows past any limit until the kernel kills the process). So a sandboxed
query runs in a worker process of its own whose private memory is capped (``RLIMIT_DATA``) at its idle size
plus ``Limits.worker_bytes``: an allocation past the cap fails, DuckDB reports it as an out-of-memory error, and the
worker answers with a :class:`~trajstore.errors.QueryMemoryError` and is replaced. A worker that does not answer
within the time limit plus :data:`GRACE_S` (one long expression does not see DuckDB's interrupt) is killed and
replaced, and the query gets a :class:`~trajstore.errors.QueryTimeoutError`; one that dies before it answers (killed
from outside, or crashed; a query past the cap fails an allocation, which the worker itself answers) is replaced,
and the query gets a :class:`~trajstore.errors.QueryWorkerDiedError` saying so.
The caller's process never holds more than the rows of the answer.

A worker is a fresh interpreter (``python -c`` calling :func:`main`, never a fork: deltalake's runtime
does not survive one), started ahead (:func:`warm`) and reused, one query at a time. It gets the store's
location and the committed file list of one version and builds the same sandbox as in-process
(:func:`trajstore.query.sandbox.run`: a hardened connection with no file access over a registered dataset of
those files, local or on S3). Requests go to it pickled (the parent is trusted); answers come back as a JSON
header and an Arrow IPC stream, so nothing the worker sends is unpickled. Workers exit when the process that
started them goes away.
"""

from __future__ import annotations

import atexit
import importlib
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import threading
import time
from dataclasses import dataclass
from multiprocessing.connection import Connection
from typing import TYPE_CHECKING, Any, Sequence

import pyarrow as pa

from trajstore import errors
from trajstore.errors import (
    InputError,
    QueryMemoryError,
    QueryTimeoutError,
    QueryWorkerDiedError,
    StoreDamagedError,
    TrajstoreError,
    first_line,
)
from trajstore.query import budget, sandbox, sql
from trajstore.query.filters import Names
from trajstore.query.snapshot import Snapshot
from trajstore.storage import priorities_log
from trajstore.storage.encoding import FileSchema
from trajstore.storage.location import Location
from trajstore.storage.log import DataFile

if TYPE_CHECKING:
    from trajstore.query.engine import Engine

log = logging.getLogger(__name__)

GRACE_S = 2.0  # past its time limit, how long a query's worker may take to answer before it is killed
START_TIMEOUT_S = 120.0  # how long a new worker may take to import and warm up (two busy cores: seconds)
WATCH_PARENT_S = 1.0  # how often a worker looks whether the process that started it is still there
ENTRY = "import sys; from trajstore.query.sql_worker import main; main(sys.argv[1:])"


@dataclass(frozen=True)
class Task:
    """One query for a worker: the store's place, one version's committed files and their schemas."""

    query: str
    limits: sandbox.Limits
    uri: str
    storage_options: dict[str, str]
    files: list[tuple[Any, ...]]  # DataFile fields but the filesystem (the worker's own, from the location)
    kinds: list[int]  # per file, the index of its schema in ``schemas``
    schemas: list[bytes]  # the files' own Arrow schemas with their formats, serialized, each once
    runs: bytes  # the rows of the ``runs`` view, an Arrow IPC stream
    priorities: tuple[str, ...] = ()  # the files of the ``priorities`` table (paths in the location's filesystem)

    @classmethod
    def of(cls, query: str, limits: sandbox.Limits, location: Location, files: Sequence[DataFile],
           file_schemas: Sequence[FileSchema], runs: pa.Table, priorities: Sequence[str] = ()) -> Task:
        schemas: dict[bytes, int] = {}
        index = []
        for stored in file_schemas:
            body = stored.physical.with_metadata(stored.format.metadata()).serialize().to_pybytes()
            index.append(schemas.setdefault(body, len(schemas)))
        return cls(query, limits, location.uri, dict(location.storage_options),
                   [_fields(f) for f in files], index, list(schemas), _ipc(runs), tuple(priorities))

    @property
    def what(self) -> str:
        return "query"


# What a worker computes besides SQL: the CPU-bound part of a request (a comparison's bootstrap) whose memory and
# time the service bounds like a query's. Each name is a function of the worker's own trajstore, taking the
# arguments pickled by the caller (trusted, as a query is) and returning an Arrow table.
COMPUTATIONS = {
    "compare": "trajstore.query.compare:compare",
    "improvement": "trajstore.query.compare:improvement_table",
    "profile": "trajstore.query.compare:performance_profile",
    "group_curves": "trajstore.query.compare:curves_of_points",
}


@dataclass(frozen=True)
class Computation:
    """One computation for a worker: a function of :data:`COMPUTATIONS`, its arguments and its budget."""

    function: str
    args: tuple[Any, ...]
    kwargs: dict[str, Any]
    budget: budget.Budget
    limits: sandbox.Limits

    @property
    def what(self) -> str:
        return self.budget.what


# --- the caller's side ---------------------------------------------------------------------------------------


class WorkerStopped(Exception):
    """The worker went away while it had a query (killed or crashed)."""


class Worker:
    """One worker process and the two pipes to it."""

    def __init__(self, worker_bytes: int) -> None:
        self.worker_bytes = worker_bytes
        child_reads, parent_writes = os.pipe()
        parent_reads, child_writes = os.pipe()
        try:
            self.proc = subprocess.Popen(
                [sys.executable, "-c", ENTRY, str(child_reads), str(child_writes), str(worker_bytes)],
                pass_fds=(child_reads, child_writes), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                env=_worker_env(), start_new_session=True)  # a Ctrl-C of the caller's terminal is the caller's
        except BaseException:
            os.close(parent_writes)
            os.close(parent_reads)
            raise
        finally:
            os.close(child_reads)
            os.close(child_writes)
        self._send = Connection(parent_writes, readable=False)
        self._recv = Connection(parent_reads, writable=False)
        try:
            header, _ = self._answer(START_TIMEOUT_S)
        except (TimeoutError, WorkerStopped) as exc:
            self.kill()
            raise TrajstoreError(f"query: the SQL worker process did not start ({exc}); see the log for why") \
                from None
        if not header.get("limited"):
            log.warning("SQL workers run without a memory limit here: %s", header.get("message"))

    def call(self, task: Task | Computation, wait_s: float | None) -> tuple[dict[str, Any], bytes | None]:
        """Hand ``task`` over and wait up to ``wait_s`` (forever with None) for its answer."""
        self._send.send_bytes(pickle.dumps(task, protocol=pickle.HIGHEST_PROTOCOL))
        return self._answer(wait_s)

    def _answer(self, wait_s: float | None) -> tuple[dict[str, Any], bytes | None]:
        """The next answer (a JSON header, then the data it announces); :class:`TimeoutError` when none begins
        within ``wait_s``, :class:`WorkerStopped` when the process is gone."""
        try:
            ready = self._recv.poll(wait_s)
        except (EOFError, OSError):
            raise WorkerStopped(self._stopped()) from None
        if not ready:
            raise TimeoutError(f"no answer within {wait_s:g} s")
        try:
            header = json.loads(self._recv.recv_bytes())
            data = self._recv.recv_bytes() if header.get("data") else None
        except (EOFError, OSError, ValueError):
            raise WorkerStopped(self._stopped()) from None
        return header, data

    def _stopped(self) -> str:
        """How the process ended (it has, or is about to)."""
        try:
            code = self.proc.wait(5)
        except subprocess.TimeoutExpired:
            self.kill()
            return "it stopped answering"
        return f"it was killed by signal {-code} ({_signal_name(-code)})" if code < 0 else \
            f"it exited with status {code}"

    def alive(self) -> bool:
        return self.proc.poll() is None

    def kill(self) -> None:
        """Stop the process now (SIGKILL: it may be deep in one expression) and close the pipes."""
        if self.proc.poll() is None:
            self.proc.kill()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:  # pragma: no cover - the kernel has not reaped it yet
            log.warning("SQL worker %d did not exit after SIGKILL", self.proc.pid)
        self._send.close()
        self._recv.close()


def _worker_env() -> dict[str, str]:
    """The caller's environment, with this very trajstore first on the path, and allocators that reserve
    little memory ahead: Arrow's system pool (mimalloc reserves 1 GiB at once) and few malloc arenas (each
    reserves 64 MiB). Memory reserved while idle is outside the cap, which counts from the idle size."""
    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([root, *filter(None, env.get("PYTHONPATH", "").split(os.pathsep))])
    env.setdefault("ARROW_DEFAULT_MEMORY_POOL", "system")
    env.setdefault("MALLOC_ARENA_MAX", "2")
    return env


class Pool:
    """Idle workers of one memory cap, kept warm: a query takes an idle one (or waits for one being started, or
    starts one), gives it back when it answered, and a worker that was killed or retired is replaced in the
    background, up to :attr:`size` workers (the most queries run at once: the service's
    ``sql_max_concurrent``)."""

    def __init__(self, worker_bytes: int) -> None:
        self.worker_bytes = worker_bytes
        self.size = 0
        self._idle: list[Worker] = []
        self._starting = 0
        self._changed = threading.Condition()
        self._closed = False

    def warm(self, size: int) -> None:
        """Keep ``size`` workers (at least) started, starting the missing ones in the background."""
        with self._changed:
            self.size = max(self.size, size)
        self._refill()

    def run(self, task: Task | Computation, wait_s: float | None) -> tuple[dict[str, Any], bytes | None]:
        """``task``'s answer from an idle worker; a worker that fails to answer in time is killed."""
        worker = self._take()
        try:
            header, data = worker.call(task, wait_s)
        except BaseException:
            worker.kill()
            self._refill()
            raise
        if header.get("retire"):
            worker.kill()  # it exits by itself; this reaps it and closes the pipes
            self._refill()
        else:
            self._give_back(worker)
        return header, data

    def _take(self) -> Worker:
        with self._changed:
            while True:
                while self._idle:
                    worker = self._idle.pop()
                    if worker.alive():
                        return worker
                    worker.kill()
                if not self._starting:
                    break
                self._changed.wait(1.0)  # one is being started: it will be ready sooner than a new one
        return Worker(self.worker_bytes)

    def _give_back(self, worker: Worker) -> None:
        with self._changed:
            if not self._closed and len(self._idle) < max(self.size, 1):
                self._idle.append(worker)
                self._changed.notify()
                return
        worker.kill()

    def _refill(self) -> None:
        with self._changed:
            missing = self.size - len(self._idle) - self._starting
            if self._closed or missing <= 0:
                return
            self._starting += missing
        for _ in range(missing):
            threading.Thread(target=self._start_one, name="trajstore-sql-worker-start", daemon=True).start()

    def _start_one(self) -> None:
        try:
            worker: Worker | None = Worker(self.worker_bytes)
        except Exception as exc:  # noqa: BLE001 - a query that needs a worker starts one and reports why
            log.warning("could not start an SQL worker: %s", exc)
            worker = None
        with self._changed:
            self._starting -= 1
            self._changed.notify_all()
        if worker is not None:
            self._give_back(worker)

    def close(self) -> None:
        """Stop every idle worker (busy ones are stopped when their query ends)."""
        with self._changed:
            self._closed = True
            idle, self._idle = self._idle, []
        for worker in idle:
            worker.kill()


_pools: dict[tuple[int, int], Pool] = {}
_pools_lock = threading.Lock()


def pool(worker_bytes: int) -> Pool:
    """This process's pool of workers capped at ``worker_bytes`` (a forked child gets pools of its own)."""
    key = (os.getpid(), int(worker_bytes))
    with _pools_lock:
        if key not in _pools:
            _pools[key] = Pool(int(worker_bytes))
        return _pools[key]


def warm(worker_bytes: int, size: int) -> None:
    """Start ``size`` workers capped at ``worker_bytes`` in the background (a service does at its start)."""
    pool(worker_bytes).warm(size)


@atexit.register
def _close_pools() -> None:
    with _pools_lock:
        pools = [p for (pid, _), p in _pools.items() if pid == os.getpid()]
    for p in pools:
        p.close()


def run(task: Task | Computation, *, keep: int = 1) -> sandbox.Result:
    """``task``'s rows (at most its limits allow) from a worker of the pool for ``task.limits.worker_bytes``,
    which keeps at least ``keep`` workers warm."""
    limits = task.limits
    if limits.worker_bytes is None:
        raise InputError("worker_bytes: a query runs in a worker only with a memory limit; run it with "
                         "sandbox.run for none")
    workers = pool(limits.worker_bytes)
    if workers.size < keep:
        workers.warm(keep)
    wait_s = None if limits.timeout_s is None else limits.timeout_s + GRACE_S
    try:
        header, data = workers.run(task, wait_s)
    except TimeoutError:
        if isinstance(task, Computation):
            raise task.budget.timeout() from None
        raise QueryTimeoutError(f"query: stopped at the time limit of {limits.timeout_s:g} s") from None
    except WorkerStopped as stopped:
        log.warning("the worker running a %s died before it answered (%s); a fresh one replaces it", task.what,
                    stopped)
        query = isinstance(task, Task)
        worker, again = ("SQL worker", "query: run it again") if query else ("worker", "one: ask again")
        raise QueryWorkerDiedError(f"{task.what}: the {worker} process running it died before it answered ({stopped}): "
                                   "it was killed (by someone, or by the kernel when the machine ran out of memory) "
                                   f"or it crashed. A fresh worker takes the next {again}, and see the log if it "
                                   "happens again") from None
    if not header.get("ok"):
        raise _error(header)
    table = pa.ipc.open_stream(pa.py_buffer(data or b"")).read_all()
    return sandbox.Result(table, bool(header.get("truncated")))


def _signal_name(number: int) -> str:
    try:
        return signal.Signals(number).name
    except ValueError:
        return "unknown signal"


def _error(header: dict[str, Any]) -> TrajstoreError:
    """The error a worker named (one of :mod:`trajstore.errors`, nothing else)."""
    kind = getattr(errors, str(header.get("error")), None)
    message = str(header.get("message"))
    if not (isinstance(kind, type) and issubclass(kind, TrajstoreError)) or kind is errors.RemoteError:
        return errors.QueryError(message)
    if issubclass(kind, errors.StoreDamagedError):
        return kind(message, path=header.get("path"))
    return kind(message)


# --- the worker's side ---------------------------------------------------------------------------------------


def _serve(requests: Connection, answers: Connection, worker_bytes: int) -> None:
    """Warm up, cap the private memory, say so, then answer one task after another until the caller is gone."""
    _watch_parent()
    _warm_up()
    limited, message = _cap(worker_bytes)
    _answer(answers, {"ready": True, "limited": limited, "message": message, "pid": os.getpid()})
    while True:
        try:
            task = pickle.loads(requests.recv_bytes())
        except EOFError:
            return
        header, data = _handle(task)
        _answer(answers, header, data)
        if header.get("retire"):
            return


def _fields(f: DataFile) -> tuple[Any, ...]:
    """A committed file's fields a worker rebuilds it from (its filesystem is the task's)."""
    return (f.path, f.run_id, f.env_id, f.rows, f.size, f.modified_ms, f.min_episode_id, f.max_episode_id)


def _handle(task: Task | Computation) -> tuple[dict[str, Any], bytes | None]:
    """Run ``task``: the header of the answer and the rows as an Arrow IPC stream."""
    if isinstance(task, Computation):
        return _compute(task)
    try:
        location = _location(task.uri, task.storage_options)
        files = [DataFile(*fields, fs=location.fs) for fields in task.files]  # type: ignore[misc]  # 8 fields, no fs
        kinds = [FileSchema.of(pa.ipc.read_schema(pa.py_buffer(body))) for body in task.schemas]
        snapshot = Snapshot(files, store=task.uri, schemas=[kinds[i] for i in task.kinds], registered=True,
                            location=location, runs=pa.ipc.open_stream(task.runs).read_all(),
                            priorities=priorities_log.dataset(location.child(priorities_log.FOLDER),
                                                              task.priorities))
        result = sandbox.run(snapshot, task.query, task.limits)
        data = _ipc(result.table)
    except TrajstoreError as exc:
        memory = isinstance(exc, QueryMemoryError)
        return {"ok": False, "error": type(exc).__name__, "message": str(exc), "retire": memory,
                "path": getattr(exc, "path", None)}, None
    except MemoryError:  # past the cap outside DuckDB (pyarrow, Python): the same limit
        return {"ok": False, "error": "QueryMemoryError", "message": sandbox.worker_memory_message(task.limits),
                "retire": True}, None
    except Exception as exc:
        log.exception("SQL worker: the query failed unexpectedly")
        return {"ok": False, "error": "QueryError", "message": f"query: {first_line(exc)}", "retire": True}, None
    finally:
        pa.default_memory_pool().release_unused()
    return {"ok": True, "truncated": result.truncated, "data": True, "retire": _grown()}, data


def _compute(task: Computation) -> tuple[dict[str, Any], bytes | None]:
    """Run a computation within its budget: the header of the answer and its table as an Arrow IPC stream."""
    module, name = COMPUTATIONS[task.function].split(":")
    try:
        with budget.bounded(task.budget):
            table = getattr(importlib.import_module(module), name)(*task.args, **task.kwargs)
        data = _ipc(table)
    except TrajstoreError as exc:
        return {"ok": False, "error": type(exc).__name__, "message": str(exc),
                "retire": isinstance(exc, QueryMemoryError)}, None
    except MemoryError:  # past the worker's cap
        message = sandbox.worker_memory_message(task.limits).replace("query:", f"{task.what}:", 1)
        return {"ok": False, "error": "QueryMemoryError", "message": message, "retire": True}, None
    except Exception as exc:
        log.exception("worker: the %s failed unexpectedly", task.what)
        return {"ok": False, "error": "QueryError", "message": f"{task.what}: {first_line(exc)}", "retire": True}, None
    return {"ok": True, "truncated": False, "data": True, "retire": _grown()}, data


def compute(function: str, args: tuple[Any, ...], kwargs: dict[str, Any], limits: budget.Budget) -> pa.Table:
    """``function`` (a name of :data:`COMPUTATIONS`) of ``args`` in a worker process capped at
    ``limits.worker_bytes``, within ``limits``' time (the worker killed if it outlasts it) and memory bound."""
    if limits.worker_bytes is None:
        raise InputError("worker_bytes: a computation runs in a worker only with a memory limit")
    limits.check_time()
    task = Computation(function, args, kwargs, limits,
                       sandbox.Limits(timeout_s=limits.remaining(), worker_bytes=limits.worker_bytes))
    return run(task).table


def _ipc(table: pa.Table) -> bytes:
    sink = pa.BufferOutputStream()
    with pa.ipc.new_stream(sink, table.schema) as writer:
        writer.write_table(table)
    return sink.getvalue().to_pybytes()


_locations: dict[tuple[str, str], Location] = {}


def _location(uri: str, storage_options: dict[str, str]) -> Location:
    """The store's location (its filesystem made once per store and options, as the caller has it)."""
    from trajstore.storage.location import locate

    key = (uri, json.dumps(storage_options, sort_keys=True))
    if key not in _locations:
        _locations[key] = locate(uri, storage_options or None)
    return _locations[key]


_base_size = 0


def _cap(worker_bytes: int) -> tuple[bool, str]:
    """Cap this process's private memory (``RLIMIT_DATA``: heap and private mappings, not the code of its
    libraries) at what it holds now plus ``worker_bytes``."""
    import resource  # POSIX only, as the workers' limits are

    global _base_size
    _base_size = _data_size()
    limit = _base_size + worker_bytes
    try:
        resource.setrlimit(resource.RLIMIT_DATA, (limit, limit))
    except (ValueError, OSError) as exc:
        return False, f"RLIMIT_DATA cannot be set ({exc})"
    return True, f"private memory capped at {limit} bytes"


def _grown() -> bool:
    """Whether this worker kept more than a quarter of its allowance after a query (then it is replaced, so the
    next query gets the whole allowance)."""
    import resource

    limit = resource.getrlimit(resource.RLIMIT_DATA)[0]
    return limit != resource.RLIM_INFINITY and _data_size() - _base_size > (limit - _base_size) // 4


def _data_size() -> int:
    """The private memory this process has mapped (``VmData``), resident or not."""
    with open("/proc/self/status") as status:
        for line in status:
            if line.startswith("VmData:"):
                return int(line.split()[1]) * 1024
    return 0  # pragma: no cover - every Linux has it


def _warm_up() -> None:
    """Scan a registered dataset of one small Parquet file on a hardened connection, so that what the first
    real query loads (DuckDB's Arrow scan, pyarrow's Parquet reader, their thread pools) is loaded."""
    import tempfile

    import duckdb
    import pyarrow.dataset as ds
    import pyarrow.parquet as pq

    with tempfile.TemporaryDirectory(prefix="trajstore-sql-worker-") as folder:
        path = os.path.join(folder, "warm.parquet")
        pq.write_table(pa.table({"episode_id": pa.array(range(100), pa.int64())}), path)
        with duckdb.connect() as con:
            con.register("warm", ds.dataset(path))
            sandbox.harden(con, sandbox.Limits())
            con.sql(sql.select_all("warm")).to_arrow_table()


def _watch_parent() -> None:
    """Exit as soon as the process that started this one is gone (even in the middle of a query)."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(WATCH_PARENT_S)
        os._exit(0)

    threading.Thread(target=watch, name="trajstore-sql-worker-watch", daemon=True).start()


def _answer(answers: Connection, header: dict[str, Any], data: bytes | None = None) -> None:
    answers.send_bytes(json.dumps(header).encode())
    if data is not None:
        answers.send_bytes(data)


def main(argv: Sequence[str]) -> None:
    requests, answers, worker_bytes = int(argv[0]), int(argv[1]), int(argv[2])
    try:
        _serve(Connection(requests, writable=False), Connection(answers, readable=False), worker_bytes)
    except (BrokenPipeError, KeyboardInterrupt):  # the caller went away
        pass


def sandboxed_sql(engine: Engine, query: str, limits: sandbox.Limits | None = None, *,
                  encode: sandbox.Encoder | None = None, run_id: Names = None, env_id: Names = None) -> sandbox.Result:
    """Run one untrusted, read-only SELECT over the views of one committed version (of ``run_id``/``env_id``
    only), bounded by ``limits``, and with ``encode`` write the body of its answer within them too. The views read
    the committed files through registered pyarrow datasets: the connection the query runs on can read no file at
    all. With ``limits.worker_bytes`` (the default) the query runs in a worker process that cannot take more memory
    than that; the body is encoded here."""
    limits = limits or sandbox.Limits()
    started = time.monotonic()
    files = engine.selected_files(run_id, env_id)
    schemas = engine.file_schemas(files)
    runs = engine.runs_table(files)
    if limits.worker_bytes is None:
        snap = Snapshot(files, store=engine.uri, schemas=schemas, registered=True, judge=engine.judged,
                        location=engine.location, runs=runs, priorities=engine.priority_rows())
        return sandbox.run(snap, query, limits, encode=encode)
    task = Task.of(query, limits, engine.location, files, schemas, runs, engine.priorities.file_paths())
    try:
        result = run(task)  # a service starts sql_max_concurrent workers ahead (warm)
    except StoreDamagedError as exc:  # judged here, where the log is: a vacuumed version is not damage
        raise engine.judged(exc) from None
    return sandbox.encoded(result, limits, encode, started=started)
