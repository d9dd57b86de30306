"""What a :class:`~trajstore.write.writer.Writer` commits to: a :class:`Sink`.

A sink takes a buffer of rows in two stages, so that the writer can encode one buffer while the previous
one is being made durable: :meth:`Sink.write` encodes the rows into something not yet visible to any
reader (a Parquet file no commit lists, an encoded request body), and :meth:`Sink.commit` makes it visible
in one step (a Delta commit, an ingest request). :class:`~trajstore.storage.table.StepsTable` is the sink
of a store; :class:`~trajstore.remote.writer.RemoteSink` the sink of a served store. A writer also tells a
:class:`CommitHook` of each commit (the store's compaction and checkpoints, which live above the writer).
"""

from __future__ import annotations

from typing import Any, Mapping, Protocol, TypeVar, runtime_checkable

import pyarrow as pa

Pending = TypeVar("Pending")


@runtime_checkable
class Sink(Protocol[Pending]):
    """Where a writer's rows go."""

    def stored_schema(self, env_id: str | None = None) -> pa.Schema | None:
        """The Arrow types already stored (of ``env_id``'s rows; logical names and decoded types), which new rows
        must match; None if none."""
        ...

    def column_names(self) -> list[str]:
        """Every column name the table holds (of every environment): what a new column's name must differ from in
        more than case."""
        ...

    def reserve(self, types: Mapping[str, pa.DataType], logical: Mapping[str, pa.DataType] | None = None,
                declared: Mapping[str, Mapping[str, Any] | None] | None = None) -> dict[str, str]:
        """The physical name each column (name -> stored type; ``logical``: the types readers return;
        ``declared``: what each must declare it holds) is stored under, reserved before the first file that uses
        it (see :mod:`trajstore.storage.names`)."""
        ...

    def write(self, data: pa.Table, *, run_id: str, env_id: str) -> Pending:
        """Encode ``data`` (rows without the partition columns) into something no reader sees yet."""
        ...

    def commit(self, pending: Pending) -> str:
        """Make ``pending`` visible to readers at once; returns where it went (a path, a URL)."""
        ...


@runtime_checkable
class CommitHook(Protocol):
    """What a writer tells of each commit it made, and closes with it (the store's upkeep,
    :class:`trajstore.operations.upkeep.Upkeep`, which compacts and checkpoints on a thread of its own)."""

    def wrote(self, run_id: str, env_id: str) -> None:
        """A commit added a file to ``run_id``/``env_id``; returns at once."""
        ...

    def close(self) -> None:
        """Finish what was marked; idempotent."""
        ...
