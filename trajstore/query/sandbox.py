"""Untrusted SQL over a store: one read-only SELECT, no way out of the store, bounded in rows, memory and time.

The connection follows DuckDB's "Securing DuckDB": file access is limited to the store's ``steps``
folder (``allowed_directories``), external access (other files, ``getenv``, extensions) is turned
off and the configuration is locked. That alone still lets ``COPY … TO`` write into the store, so
only a single statement whose type is SELECT is run at all. A timer interrupts the query at its
time limit.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass
from pathlib import Path

import duckdb
import pyarrow as pa

from trajstore.errors import QueryError, QueryRefusedError, QueryTimeoutError, first_line
from trajstore.query import sql
from trajstore.query.snapshot import Snapshot


@dataclass(frozen=True)
class Limits:
    """What one untrusted query may use."""

    max_rows: int = 100_000
    timeout_s: float = 10.0
    memory_limit: str = "1GB"
    threads: int = 2


@dataclass
class Result:
    """The rows of a query, cut at ``max_rows`` (``truncated`` says whether more existed)."""

    table: pa.Table
    truncated: bool


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


def harden(con: duckdb.DuckDBPyConnection, allowed: Path, limits: Limits) -> None:
    """Lock ``con`` down to reading files under ``allowed`` (views must already be defined)."""
    for statement in sql.hardening(str(allowed), memory_limit=limits.memory_limit, threads=limits.threads):
        con.execute(statement)


def run(snapshot: Snapshot, allowed: Path, query: str, limits: Limits) -> Result:
    """Run one untrusted SELECT over ``snapshot``'s views; ``snapshot`` is hardened first and then closed."""
    with snapshot:
        con = snapshot.con
        check_statement(con, query)
        harden(con, allowed, limits)
        timer = threading.Timer(limits.timeout_s, con.interrupt)
        timer.start()
        try:
            return _fetch(con, query, limits.max_rows)
        except duckdb.InterruptException:
            raise QueryTimeoutError(f"query: interrupted at the time limit of {limits.timeout_s:g} s") from None
        except duckdb.PermissionException as exc:
            raise QueryRefusedError(f"query: reaches outside the store: {first_line(exc)}") from None
        except duckdb.OutOfMemoryException:
            raise QueryError(f"query: exceeded the memory limit of {limits.memory_limit}") from None
        except duckdb.Error as exc:
            raise QueryError(f"query: {first_line(exc)}") from None
        finally:
            timer.cancel()


def _fetch(con: duckdb.DuckDBPyConnection, query: str, max_rows: int) -> Result:
    reader = con.sql(query).to_arrow_reader(min(max_rows + 1, 65_536))
    batches, rows = [], 0
    for batch in reader:
        batches.append(batch)
        rows += batch.num_rows
        if rows > max_rows:
            break
    table = pa.Table.from_batches(batches, schema=reader.schema)
    return Result(table.slice(0, max_rows), rows > max_rows)
