"""trajstore: store every RL rollout and ask questions of it.

>>> import trajstore
>>> store = trajstore.open("./trajdata", create=True)  # doctest: +SKIP
"""

from __future__ import annotations

from trajstore.check import CheckReport, check, remove_orphans
from trajstore.client import Client
from trajstore.compact import CompactReport, compact
from trajstore.errors import (
    AuthenticationError,
    QueryRefusedError,
    QueryTimeoutError,
    CommitError,
    InputError,
    QueryError,
    RemoteError,
    SchemaMismatchError,
    StoreExistsError,
    StoreNotFoundError,
    TrajstoreError,
    WriterClosedError,
)
from trajstore.returns import discounted_sum
from trajstore.settings import Settings
from trajstore.store import Store, open
from trajstore.remote import RemoteStore, RemoteWriter
from trajstore.writer import Writer

__version__ = "0.1.0"

__all__ = [
    "AuthenticationError",
    "CheckReport",
    "Client",
    "CompactReport",
    "RemoteStore",
    "RemoteWriter",
    "QueryRefusedError",
    "QueryTimeoutError",
    "CommitError",
    "InputError",
    "QueryError",
    "RemoteError",
    "SchemaMismatchError",
    "Settings",
    "Store",
    "StoreExistsError",
    "StoreNotFoundError",
    "TrajstoreError",
    "Writer",
    "WriterClosedError",
    "check",
    "compact",
    "discounted_sum",
    "open",
    "remove_orphans",
]
