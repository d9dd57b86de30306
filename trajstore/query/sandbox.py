"""Untrusted SQL over a store: one read-only SELECT over the ``steps`` and ``episodes`` views and nothing else,
bounded in rows, bytes, memory, time and concurrency.

The views read the committed files through a registered pyarrow dataset
(:class:`~trajstore.query.snapshot.Snapshot` given a schema), so the connection itself needs no file access:
DuckDB's "Securing DuckDB" settings turn it off entirely (no allowed directories, no temporary files), clear
every setting that names a path and lock the configuration (:func:`~trajstore.query.sql.hardening`). Nothing
on disk is readable through SQL then, not even the store's own log or files it has not committed. That alone
would still let ``COPY … TO`` run, so only a single statement whose type is SELECT is run at all.

The limits (:class:`Limits`) cover the whole answer, not only the query: rows and bytes are counted while
batches are fetched (decoded sizes, see :func:`decoded_nbytes`) and again while the caller's encoder writes
the body; the time limit interrupts DuckDB from a timer and is checked between encoded pieces, and any error
after the timer fired (DuckDB reports an interrupt during fetching as an ``OSError``) is a
:class:`~trajstore.errors.QueryTimeoutError`. Memory has two limits: DuckDB's own (``memory_limit``, its
buffers) and, since that one does not bound the lists and strings one expression builds, the hard limit of the
worker process the query runs in (``worker_bytes``, see :mod:`~trajstore.query.sql_worker`); past either the
query is a :class:`~trajstore.errors.QueryMemoryError`. A :class:`Gate` bounds how many queries (and loader
streams) run at once, and so their memory; one more is refused at once, never queued.
"""

from __future__ import annotations

import re
import threading
import time
from dataclasses import dataclass
from typing import Callable, Iterable

import duckdb
import pyarrow as pa
import pyarrow.compute as pc

from trajstore.errors import (
    InputError,
    QueryBusyError,
    QueryError,
    QueryMemoryError,
    QueryRefusedError,
    QueryTimeoutError,
    ResultTooLargeError,
    TrajstoreError,
    first_line,
    size_text,
)
from trajstore.query import sql
from trajstore.query.snapshot import Snapshot

# DuckDB's word for a function of an extension not loaded (the sandbox never installs or loads one: sql.hardening)
EXTENSION_FUNCTION = re.compile(r'with name "([^"]+)" is not in the catalog, but it exists in the (\w+) extension')
FETCH_ROWS = 8192  # rows per fetched batch: the bytes limit is checked after each
WORKER_BYTES = 1536 * 1024 * 1024  # the memory a query's worker process may take above its idle size


@dataclass(frozen=True)
class Limits:
    """What one untrusted query may use; ``None`` means no limit (DuckDB's defaults for memory and threads).

    ``worker_bytes`` is the hard memory limit of the worker process the query runs in (above what the idle
    worker takes); with ``None`` the query runs in the calling process, bounded by DuckDB's limit alone."""

    max_rows: int | None = 100_000
    max_bytes: int | None = 32 * 1024 * 1024
    timeout_s: float | None = 10.0
    memory_limit: str | None = "1GB"
    threads: int | None = 2
    worker_bytes: int | None = WORKER_BYTES

    def __post_init__(self) -> None:
        if self.worker_bytes is not None and (isinstance(self.worker_bytes, bool) or
                                              not isinstance(self.worker_bytes, int) or self.worker_bytes < 1):
            raise InputError(f"sql_worker_bytes: must be a number of bytes >= 1, got {self.worker_bytes!r}")

    @classmethod
    def unbounded(cls, *, max_rows: int | None = None, worker_bytes: int | None = WORKER_BYTES) -> Limits:
        """Confinement and the worker's memory limit only (your own query on your own machine, as ``trajstore
        sql`` runs it: no row, size or time limit, but no query takes the machine's memory either)."""
        return cls(max_rows=max_rows, max_bytes=None, timeout_s=None, memory_limit=None, threads=None,
                   worker_bytes=worker_bytes)


@dataclass
class Result:
    """The rows of a query, cut at ``max_rows`` (``truncated`` says whether more existed), and the body an
    encoder wrote of them (``None`` without one)."""

    table: pa.Table
    truncated: bool
    body: bytes | None = None


Encoder = Callable[[Result], Iterable[bytes]]  # a result as the pieces of one body (JSON, Arrow IPC, …)


class Slot:
    """One place taken in a :class:`Gate`; :meth:`release` gives it back (once, however often it is called)."""

    def __init__(self, release: Callable[[], None]) -> None:
        self._release: Callable[[], None] | None = release
        self._lock = threading.Lock()

    def release(self) -> None:
        with self._lock:
            release, self._release = self._release, None
        if release is not None:
            release()

    def __enter__(self) -> Slot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.release()


class Gate:
    """At most ``size`` sandboxed queries (and, in the service, loader streams) at once: :meth:`take` refuses
    one more at once with a :class:`~trajstore.errors.QueryBusyError` (a service answers 429 with
    ``Retry-After``), never queues it."""

    def __init__(self, size: int, *, retry_after_s: int = 1, holds: str = "SQL queries or loader streams",
                 setting: str = "sql_max_concurrent") -> None:
        if isinstance(size, bool) or not isinstance(size, int) or size < 1:
            raise InputError(f"{setting}: must be a whole number >= 1, got {size!r}")
        self.size = size
        self.retry_after_s = retry_after_s
        self.holds, self.setting = holds, setting
        self._free = threading.BoundedSemaphore(size)

    def take(self, what: str = "query") -> Slot:
        """A slot, or a :class:`~trajstore.errors.QueryBusyError` whose message starts with ``what``."""
        if not self._free.acquire(blocking=False):
            raise QueryBusyError(f"{what}: {self.size} {self.holds} are running, the most allowed at once "
                                 f"({self.setting}); retry in {self.retry_after_s} s",
                                 retry_after_s=self.retry_after_s)
        return Slot(self._free.release)


def check_statement(con: duckdb.DuckDBPyConnection, query: str) -> None:
    """Refuse anything but exactly one SELECT statement."""
    try:
        statements = con.extract_statements(query)
    except duckdb.Error as exc:
        raise QueryError(f"query: {first_line(exc)}") from None
    if len(statements) != 1:
        raise QueryRefusedError(f"query: exactly one SELECT statement is allowed, got {len(statements)} statements")
    kind = statements[0].type
    if kind != duckdb.StatementType.SELECT:
        raise QueryRefusedError(f"query: only SELECT statements are allowed, got {kind.name}")


def harden(con: duckdb.DuckDBPyConnection, limits: Limits) -> None:
    """Take every file access from ``con`` and lock it (its views must already be defined)."""
    for statement in sql.hardening(memory_limit=limits.memory_limit, threads=limits.threads):
        con.execute(statement)


class Deadline:
    """Interrupts ``con`` (if given) at ``timeout_s`` after ``started`` (now by default; none without a
    time limit) and remembers that the time is up."""

    def __init__(self, con: duckdb.DuckDBPyConnection | None, timeout_s: float | None, *,
                 started: float | None = None) -> None:
        self.timeout_s = timeout_s
        self._at = None if timeout_s is None else (started or time.monotonic()) + timeout_s
        self._fired = threading.Event()
        self._con = con
        self._timer = None if self._at is None or con is None else \
            threading.Timer(max(0.0, self._at - time.monotonic()), self._fire)

    def _fire(self) -> None:
        self._fired.set()
        try:
            if self._con is not None:
                self._con.interrupt()
        except duckdb.Error:  # the query ended and its connection closed as the timer fired: nothing to stop
            pass

    def passed(self) -> bool:
        return self._fired.is_set() or (self._at is not None and time.monotonic() >= self._at)

    def error(self) -> QueryTimeoutError:
        return QueryTimeoutError(f"query: interrupted at the time limit of {self.timeout_s:g} s")

    def __enter__(self) -> Deadline:
        if self._timer is not None:
            self._timer.start()
        return self

    def __exit__(self, *exc: object) -> None:
        if self._timer is not None:
            self._timer.cancel()


def run(snapshot: Snapshot, query: str, limits: Limits, *, encode: Encoder | None = None) -> Result:
    """Run one untrusted SELECT over ``snapshot``'s views and, with ``encode``, write its body, all within
    ``limits``; ``snapshot`` (on a connection of its own) is hardened first and closed at the end."""
    with snapshot:
        con = snapshot.con
        check_statement(con, query)
        harden(con, limits)
        with Deadline(con, limits.timeout_s) as deadline:
            try:
                result = _fetch(con, query, limits)
            except TrajstoreError:
                raise
            except (duckdb.Error, OSError, pa.ArrowException, MemoryError) as exc:
                raise _failure(exc, snapshot, limits, deadline) from None
            if encode is not None:
                result.body = _encoded(encode(result), limits, deadline)
            return result


def encoded(result: Result, limits: Limits, encode: Encoder | None, *, started: float) -> Result:
    """``result`` with the body ``encode`` writes of it (nothing without one), within the byte limit and what
    is left of the time limit counted from ``started`` (a :func:`time.monotonic` reading): for rows that came
    from a worker process."""
    if encode is not None:
        result.body = _encoded(encode(result), limits, Deadline(None, limits.timeout_s, started=started))
    return result


def _failure(exc: BaseException, snapshot: Snapshot, limits: Limits, deadline: Deadline) -> TrajstoreError:
    """The error to raise for a failed query: a damaged file or a store that failed (whenever it failed: a
    read that waits on a silent store outlasts the time limit); after the timer fired, the time limit."""
    damaged = snapshot.damage(exc)
    if damaged is not None:
        return damaged
    if deadline.passed():
        return deadline.error()
    if isinstance(exc, duckdb.PermissionException):
        return QueryRefusedError("query: reaches outside the store: only the steps, episodes, runs and priorities "
                                 "views can be read, no file")
    extension = EXTENSION_FUNCTION.search(str(exc)) if isinstance(exc, duckdb.CatalogException) else None
    if extension is not None:
        return QueryRefusedError(f"query: {extension[1]} is a function of DuckDB's {extension[2]} extension, which "
                                 "the sandbox neither installs nor loads: only built-in functions over the steps, "
                                 "episodes, runs and priorities views")
    if isinstance(exc, MemoryError) or "bad allocation" in str(exc) or "std::bad_alloc" in str(exc):
        return QueryMemoryError(worker_memory_message(limits))  # an allocation the process could not make
    if isinstance(exc, duckdb.OutOfMemoryException) or "Out of Memory Error" in str(exc):
        return QueryMemoryError(f"query: exceeded the memory limit of {limits.memory_limit} (sql_memory_limit, "
                                "DuckDB's own); aggregate, or select fewer rows or smaller values")
    return QueryError(f"query: {first_line(exc)}")


def worker_memory_message(limits: Limits) -> str:
    """The message of a query that needed more memory than its process may take."""
    if limits.worker_bytes is None:
        return "query: needs more memory than this process can take; aggregate, or select fewer rows or " \
               "smaller values"
    return (f"query: needs more memory than the limit of {size_text(limits.worker_bytes)} of the worker process "
            "it runs in (sql_worker_bytes); aggregate, or select fewer rows or smaller values")


def _fetch(con: duckdb.DuckDBPyConnection, query: str, limits: Limits) -> Result:
    """The rows of ``query``, at most ``max_rows`` (one more is read to know whether more exist)."""
    max_rows = limits.max_rows
    reader = variants_as_json(con.sql(query)).to_arrow_reader(FETCH_ROWS if max_rows is None else
                                                              min(max_rows + 1, FETCH_ROWS))
    batches, rows, size, truncated = [], 0, 0, False
    for batch in reader:
        kept = batch if max_rows is None else batch.slice(0, max_rows - rows)
        size = _counted(size + decoded_nbytes(kept), limits)
        batches.append(kept)
        rows += kept.num_rows
        if kept.num_rows < batch.num_rows:
            truncated = True
            break
    return Result(pa.Table.from_batches(batches, schema=reader.schema), truncated)


def variants_as_json(answer: duckdb.DuckDBPyRelation) -> duckdb.DuckDBPyRelation:
    """``answer`` with each VARIANT column (a column environments type differently, where the query mixed them) as
    its values' JSON text, which every Arrow reader decodes, instead of opaque ``{metadata, value}`` structs. The
    sandbox streams its answer (read once, bounded as it comes): select one environment's rows with ``env_id``
    to get its own types (the trusted :meth:`Store.sql <trajstore.store.Store.sql>` does it per query)."""
    if all(str(t) != "VARIANT" for t in answer.types):
        return answer
    names = [(sql.ident(c), str(t) == "VARIANT") for c, t in zip(answer.columns, answer.types)]
    columns = [f"{sql.as_json_text(c)} AS {c}" if variant else c for c, variant in names]
    return answer.project(", ".join(columns))


def _counted(size: int, limits: Limits) -> int:
    if limits.max_bytes is not None and size > limits.max_bytes:
        raise ResultTooLargeError(f"query: the result is larger than the limit of {size_text(limits.max_bytes)} "
                                  "(sql_max_bytes); select fewer rows or columns, or aggregate")
    return size


def _encoded(pieces: Iterable[bytes], limits: Limits, deadline: Deadline) -> bytes:
    """The pieces joined, each counted against ``max_bytes`` and followed by a look at the clock."""
    parts, size = [], 0
    for piece in pieces:
        size = _counted(size + len(piece), limits)
        parts.append(piece)
        if deadline.passed():
            raise deadline.error()
    return b"".join(parts)


def decoded_nbytes(data: pa.Array | pa.ChunkedArray | pa.RecordBatch | pa.Table) -> int:
    """The bytes ``data`` takes once every dictionary is decoded, as a JSON writer or a client decoding it sees
    it (``nbytes`` counts a dictionary's values once, however many rows repeat them)."""
    if isinstance(data, (pa.RecordBatch, pa.Table)):
        return sum(decoded_nbytes(c) for c in data.columns)
    if isinstance(data, pa.ChunkedArray):
        return sum(decoded_nbytes(c) for c in data.chunks)
    kind = data.type
    if pa.types.is_dictionary(kind):
        values = data.dictionary
        if pa.types.is_string(values.type) or pa.types.is_binary(values.type) or \
                pa.types.is_large_string(values.type) or pa.types.is_large_binary(values.type):
            taken = pc.sum(pc.take(pc.binary_length(values), data.indices)).as_py() or 0
        else:
            taken = len(data) * -(-decoded_nbytes(values) // max(1, len(values)))
        return data.indices.nbytes + taken
    if pa.types.is_fixed_size_list(kind):
        return decoded_nbytes(data.flatten())
    if pa.types.is_list(kind) or pa.types.is_large_list(kind) or pa.types.is_map(kind):
        if not len(data):
            return 0
        first, last = data.offsets[0].as_py(), data.offsets[-1].as_py()
        return data.offsets.nbytes + decoded_nbytes(data.values.slice(first, last - first))
    if pa.types.is_struct(kind):
        return sum(decoded_nbytes(child) for child in data.flatten())
    return data.nbytes
