"""Untrusted SQL over a store: one read-only SELECT over the ``steps`` and ``episodes`` views and nothing else,
bounded in rows, memory and time.

The views read the committed files through a registered pyarrow dataset
(:class:`~trajstore.query.snapshot.Snapshot` given a schema), so the connection itself needs no file access:
DuckDB's "Securing DuckDB" settings turn it off entirely (no allowed directories, no temporary files), clear
every setting that names a path and lock the configuration (:func:`~trajstore.query.sql.hardening`). Nothing
on disk is readable through SQL then, not even the store's own log or files it has not committed. That alone
would still let ``COPY … TO`` run, so only a single statement whose type is SELECT is run at all. A timer
interrupts the query at its time limit.
"""

from __future__ import annotations

import threading
from dataclasses import dataclass

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


def harden(con: duckdb.DuckDBPyConnection, limits: Limits) -> None:
    """Take every file access from ``con`` and lock it (its views must already be defined)."""
    for statement in sql.hardening(memory_limit=limits.memory_limit, threads=limits.threads):
        con.execute(statement)


def run(snapshot: Snapshot, query: str, limits: Limits) -> Result:
    """Run one untrusted SELECT over ``snapshot``'s views; ``snapshot`` is hardened first and then closed."""
    with snapshot:
        con = snapshot.con
        check_statement(con, query)
        harden(con, limits)
        timer = threading.Timer(limits.timeout_s, con.interrupt)
        timer.start()
        try:
            return _fetch(con, query, limits.max_rows)
        except duckdb.InterruptException:
            raise QueryTimeoutError(f"query: interrupted at the time limit of {limits.timeout_s:g} s") from None
        except duckdb.PermissionException:
            raise QueryRefusedError("query: reaches outside the store: only the steps and episodes views can be "
                                    "read, no file") from None
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
