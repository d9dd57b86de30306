"""trajstore: store every RL rollout and ask questions of it.

>>> import trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> store.stats().column("n_traj").to_pylist()
[0]

The package follows the data: :mod:`trajstore.rollout` (workers) → :mod:`trajstore.storage` (writer,
segmentation, the Delta table, ingest, compaction, checks) → :mod:`trajstore.query` (SQL, snapshots,
scans, returns, the sandbox) → :class:`Store` (both sides of one store) → :mod:`trajstore.remote`
(client, remote writer, wire formats) → ``trajstore.api`` (the FastAPI service) and :mod:`trajstore.cli`.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from trajstore.__about__ import __version__

if TYPE_CHECKING:  # every name below is imported when first used: see __getattr__
    from trajstore.committer import Committer
    from trajstore.errors import (
        AuthenticationError,
        CommitError,
        CommitUnknownError,
        ConflictError,
        InputError,
        QueryBusyError,
        QueryError,
        QueryRefusedError,
        QueryTimeoutError,
        ReadOnlyError,
        RemoteError,
        ResultTooLargeError,
        RunNotFoundError,
        SchemaMismatchError,
        StoreExistsError,
        StoreNotFoundError,
        TrajstoreError,
        UnknownColumnError,
        WriterClosedError,
    )
    from trajstore.export.lerobot import export_lerobot
    from trajstore.export.minari import export_minari
    from trajstore.operations.check import CheckReport
    from trajstore.operations.compact import CompactReport
    from trajstore.query.filters import EpisodeFilter
    from trajstore.query.follow import Commit
    from trajstore.query.returns import discounted_sum
    from trajstore.remote.client import Client
    from trajstore.remote.writer import RemoteStore, RemoteWriter
    from trajstore.settings import Settings
    from trajstore.store import Store, check, compact, open, remove_orphans  # noqa: A004 - trajstore.open
    from trajstore.write.writer import Writer

__all__ = [
    "AuthenticationError",
    "CheckReport",
    "Client",
    "Commit",
    "CommitError",
    "Committer",
    "CommitUnknownError",
    "CompactReport",
    "ConflictError",
    "EpisodeFilter",
    "InputError",
    "QueryBusyError",
    "QueryError",
    "QueryRefusedError",
    "QueryTimeoutError",
    "ReadOnlyError",
    "RemoteError",
    "RemoteStore",
    "RemoteWriter",
    "ResultTooLargeError",
    "RunNotFoundError",
    "SchemaMismatchError",
    "Settings",
    "Store",
    "StoreExistsError",
    "StoreNotFoundError",
    "TrajstoreError",
    "UnknownColumnError",
    "Writer",
    "WriterClosedError",
    "__version__",
    "check",
    "compact",
    "discounted_sum",
    "export_lerobot",
    "export_minari",
    "open",
    "remove_orphans",
]

# Where each public name lives. They are imported when first used (PEP 562), so that a process that needs one
# module of the package (a SQL worker, the CLI's parser, a DataLoader worker) does not import every one: the store
# and its writer bring numba, DuckDB and deltalake. The client's names need httpx, the [client] extra
# (MissingExtraError without it).
_ERRORS = ("AuthenticationError", "CommitError", "CommitUnknownError", "ConflictError", "InputError", "QueryBusyError",
           "QueryError", "QueryRefusedError", "QueryTimeoutError", "ReadOnlyError", "RemoteError",
           "ResultTooLargeError", "RunNotFoundError", "SchemaMismatchError", "StoreExistsError", "StoreNotFoundError",
           "TrajstoreError", "UnknownColumnError", "WriterClosedError")
_HOMES = {**dict.fromkeys(_ERRORS, "trajstore.errors"),
          **dict.fromkeys(("Store", "check", "compact", "open", "remove_orphans"), "trajstore.store"),
          "Committer": "trajstore.committer", "export_lerobot": "trajstore.export.lerobot",
          "export_minari": "trajstore.export.minari", "CheckReport": "trajstore.operations.check",
          "CompactReport": "trajstore.operations.compact", "EpisodeFilter": "trajstore.query.filters",
          "Commit": "trajstore.query.follow", "discounted_sum": "trajstore.query.returns",
          "Settings": "trajstore.settings", "Writer": "trajstore.write.writer",
          "Client": "trajstore.remote.client", "RemoteStore": "trajstore.remote.writer",
          "RemoteWriter": "trajstore.remote.writer"}


def __getattr__(name: str) -> Any:
    if name in _HOMES:
        import importlib

        value = getattr(importlib.import_module(_HOMES[name]), name)
        globals()[name] = value  # found here from now on, without this call
        return value
    raise AttributeError(f"module 'trajstore' has no attribute {name!r}")


def __dir__() -> list[str]:
    return sorted({*globals(), *__all__})
