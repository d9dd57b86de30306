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
from trajstore.settings import Settings
from trajstore.store import Store, check, compact, open, remove_orphans  # noqa: A004 - trajstore.open
from trajstore.write.writer import Writer

if TYPE_CHECKING:
    from trajstore.remote.client import Client
    from trajstore.remote.writer import RemoteStore, RemoteWriter

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

# the client's names, imported when first used: they need httpx, the [client] extra (MissingExtraError without it)
_CLIENT = {"Client": "trajstore.remote.client", "RemoteStore": "trajstore.remote.writer",
           "RemoteWriter": "trajstore.remote.writer"}


def __getattr__(name: str) -> Any:
    if name in _CLIENT:
        import importlib

        return getattr(importlib.import_module(_CLIENT[name]), name)
    raise AttributeError(f"module 'trajstore' has no attribute {name!r}")
