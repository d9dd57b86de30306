"""The errors trajstore raises.

Every error derives from :class:`TrajstoreError`; the ones caused by what a caller passed
also derive from the matching built-in, so ``except ValueError`` keeps working.
"""

from __future__ import annotations

import re
from typing import Sequence

__all__ = [
    "TrajstoreError",
    "InputError",
    "SchemaMismatchError",
    "UnknownColumnError",
    "ConflictError",
    "BodyTooLargeError",
    "StoreNotFoundError",
    "StoreExistsError",
    "StoreAccessError",
    "QueryError",
    "QueryRefusedError",
    "QueryTimeoutError",
    "ResultTooLargeError",
    "QueryMemoryError",
    "QueryWorkerDiedError",
    "QueryBusyError",
    "IngestBusyError",
    "CommitError",
    "CommitUnknownError",
    "StoreDamagedError",
    "UnsupportedTableError",
    "AuthenticationError",
    "WriterClosedError",
    "ReplayClosedError",
    "EmptyReplayError",
    "ReplayNotFoundError",
    "RemoteError",
    "ReadOnlyError",
    "RunNotFoundError",
    "MissingExtraError",
]


class TrajstoreError(Exception):
    """Root of every error raised by trajstore: catch it to catch them all.

    Examples:
        >>> import trajstore
        >>> try:
        ...     trajstore.open("./no-store-here")
        ... except trajstore.TrajstoreError as exc:
        ...     print(type(exc).__name__)
        StoreNotFoundError
    """


class InputError(ValueError, TrajstoreError):
    """A value passed by the caller is invalid; the message names the field and what was expected.

    Also a ``ValueError``, so ``except ValueError`` keeps working. Over REST it is a 422.

    Examples:
        >>> store = trajstore.open("./trajdata", create=True)
        >>> try:
        ...     store.stats(gamma=1.5)
        ... except ValueError as exc:
        ...     print(exc)
        gamma must be in [0, 1], got 1.5
    """


class MissingExtraError(ImportError, InputError):
    """A feature asked for needs an extra of the package (``extra``) that is not installed; the message names the
    command that installs it (``pip install 'trajstore[serve]'``). An ``ImportError`` (a package is missing) and
    an :class:`InputError` (the call asked for what this installation cannot do).

    Args:
        message: What needs the extra and the command that installs it.
        extra: The extra's name in ``pip install 'trajstore[extra]'``; kept as ``extra``.
        name: The module that could not be imported, as for ``ImportError``.
    """

    def __init__(self, message: str, *, extra: str, name: str | None = None) -> None:
        super().__init__(message, name=name)
        self.extra = extra


class SchemaMismatchError(InputError):
    """Data does not match the shape or dtype the store's ``steps`` table holds for its environment, or holds a
    value the stored type cannot (an int out of range). An :class:`InputError`, so a ``ValueError`` too.

    Examples:
        >>> import numpy as np
        >>> store = trajstore.open("./trajdata", create=True)
        >>> def batch(obs_size):
        ...     return {"obs": np.zeros((2, 1, obs_size)), "action": np.zeros((2, 1), int), "reward": np.ones((2, 1)),
        ...             "next_obs": np.zeros((2, 1, obs_size)), "terminated": np.ones((2, 1), bool),
        ...             "truncated": np.zeros((2, 1), bool)}
        >>> with store.writer(run_id="a", env_id="Toy-v0") as w:
        ...     w.add_batch(batch(4))
        2
        >>> try:
        ...     with store.writer(run_id="b", env_id="Toy-v0") as w:
        ...         w.add_batch(batch(3))
        ... except trajstore.SchemaMismatchError as exc:
        ...     print("refused")
        refused
    """


class UnknownColumnError(InputError):
    """A column name that the view asked about does not have; the message lists the ones it has. An
    :class:`InputError`.

    Examples:
        >>> store = trajstore.open("./trajdata", create=True)
        >>> try:
        ...     store.episodes(order_by="nope")
        ... except trajstore.UnknownColumnError as exc:
        ...     print(str(exc)[:40])
        order_by: unknown column(s) ['nope'] of
    """


class ConflictError(InputError):
    """A request that conflicts with one the store already took: an idempotency key used before for other rows
    (409 over REST). An :class:`InputError`."""


class BodyTooLargeError(InputError):
    """A request body larger than the service takes on its route; it was refused before it was read (the message
    names the limit in bytes and its setting)."""


class StoreNotFoundError(FileNotFoundError, TrajstoreError):
    """No store at the given location (open it with ``create=True`` to make one). Also a ``FileNotFoundError``.

    Examples:
        >>> try:
        ...     trajstore.open("./no-store-here")
        ... except FileNotFoundError as exc:
        ...     print(str(exc).split(";")[1].strip())
        make one with trajstore.open(uri, create=True) or by writing to it (trajstore rollout --store URI …)
    """


class StoreExistsError(FileExistsError, TrajstoreError):
    """Something that is not a trajstore store already exists at the given location (a file, or a folder of other
    things). Also a ``FileExistsError``.

    Examples:
        >>> import os
        >>> os.makedirs("./photos", exist_ok=True)
        >>> open("./photos/cat.jpg", "wb").close()
        >>> try:
        ...     trajstore.open("./photos", create=True)
        ... except FileExistsError:
        ...     print("not a store")
        not a store
    """


class StoreAccessError(TrajstoreError, ConnectionError):
    """The store cannot be reached, or refuses us: an object store that does not answer in time or at all, wrong
    keys, a missing bucket, a full disk. The message names the store, the cause and what to do."""


class QueryError(TrajstoreError):
    """A query could not be run: bad SQL, a refused statement, or a limit reached. Its subclasses say which.

    Examples:
        >>> store = trajstore.open("./trajdata", create=True)
        >>> try:
        ...     store.sql("SELECT nope FROM steps")
        ... except trajstore.QueryError as exc:
        ...     print(str(exc).split(":")[1].strip())
        Binder Error
    """


class QueryRefusedError(QueryError, PermissionError):
    """A statement that is not a single read-only SELECT over the store, or that reaches outside it (403 over
    REST). Also a ``PermissionError``.

    Examples:
        >>> store = trajstore.open("./trajdata", create=True)
        >>> try:
        ...     trajstore.store.plumbing(store).sandboxed_sql("COPY (SELECT 42) TO 'out.csv'")
        ... except trajstore.QueryRefusedError:
        ...     print("refused")
        refused
    """


class QueryTimeoutError(QueryError, TimeoutError):
    """A query ran past its time limit and was interrupted."""


class ResultTooLargeError(QueryError):
    """A query's result is larger than one answer may be (the sandbox's ``max_bytes``); nothing of it is sent."""


class QueryMemoryError(QueryError):
    """A query needed more memory than it may take (DuckDB's limit, or its worker process's); it was stopped,
    and nothing else was affected."""


class QueryWorkerDiedError(QueryError):
    """The worker process running a sandboxed query died before it answered: it was killed (by someone, or by the
    kernel when the machine ran out of memory) or it crashed. A query past the worker's memory limit is not this:
    its allocation fails and the worker answers :class:`QueryMemoryError`. A fresh worker takes the next query, so
    running it again may well succeed (a service answers 503 with ``Retry-After``)."""


class QueryBusyError(QueryError):
    """As many sandboxed queries as allowed are already running; try again after ``retry_after_s`` seconds (429
    with ``Retry-After`` over REST, which the Client waits for and retries).

    Args:
        message: What was busy.
        retry_after_s: Seconds to wait before trying again.
    """

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class IngestBusyError(TrajstoreError):
    """The service holds as many bytes of ingest requests waiting for their commit as it may
    (``TRAJSTORE_INGEST_PENDING_BYTES``); send the request again after ``retry_after_s`` seconds (429 with
    ``Retry-After`` over REST, which a ``RemoteWriter`` waits for and retries).

    Args:
        message: What was full.
        retry_after_s: Seconds to wait before trying again.
    """

    def __init__(self, message: str, *, retry_after_s: int = 1) -> None:
        super().__init__(message)
        self.retry_after_s = retry_after_s


class AuthenticationError(TrajstoreError, PermissionError):
    """A missing or wrong API key."""


class CommitError(TrajstoreError):
    """Writing or committing files to the store's log failed; nothing of that commit is visible."""


class CommitUnknownError(StoreAccessError):
    """A commit was sent, its answer did not come, and the log could not be read to tell whether it landed: the
    change may have been applied (none of its files were deleted); ``trajstore history`` shows it once the store
    answers."""


class StoreDamagedError(TrajstoreError):
    """A file the commit log lists is missing or cannot be read: the store needs ``trajstore check`` (503 over
    REST).

    Args:
        message: What is wrong, naming the file.
        path: The file (or the log) that failed; kept as ``path``.
    """

    def __init__(self, message: str, *, path: str | None = None) -> None:
        super().__init__(message)
        self.path = path

    @classmethod
    def of_file(cls, path: str, problem: str, store: str | None) -> StoreDamagedError:
        """The error for committed file ``path`` and what is wrong with it."""
        return cls(f"committed file {path} {problem}; the store is damaged: run `trajstore check --store "
                   f"{store or 'STORE'}` to list every damaged file", path=path)


class UnsupportedTableError(TrajstoreError):
    """The store's Delta table, at the version read, needs what trajstore's readers do not implement: a reader feature
    of the Delta protocol (its ``minReaderVersion`` and ``readerFeatures``: column mapping, type widening, …) or rows
    another engine deleted through a deletion vector. trajstore reads the committed Parquet files as they are, so it
    refuses such a version rather than serve other rows than the table holds. Not the caller's error and not damage:
    the message names the feature and the version, and what to do (rewrite the files without it with the engine that
    added it, or read an earlier version). 409 over REST.

    Args:
        message: What is refused and what to do.
        features: The features refused; kept as ``features``.
        version: The version read; kept as ``version``.
    """

    def __init__(self, message: str, *, features: Sequence[str] = (), version: int | None = None) -> None:
        super().__init__(message)
        self.features = tuple(features)
        self.version = version


class WriterClosedError(TrajstoreError):
    """Data was given to a writer after ``close()``.

    Examples:
        >>> store = trajstore.open("./trajdata", create=True)
        >>> with store.writer(run_id="demo", env_id="Toy-v0") as w:
        ...     pass
        >>> try:
        ...     w.add_step([[0.0]], [0], [1.0], [[0.0]], [True], [False])
        ... except trajstore.WriterClosedError as exc:
        ...     print(exc)
        writer for run 'demo' is closed
    """


class ReplayClosedError(TrajstoreError):
    """A replay was sampled, updated or committed after ``close()``.

    Examples:
        >>> import numpy as np
        >>> store = trajstore.open("./trajdata", create=True)
        >>> steps = {"obs": np.zeros((3, 1, 2)), "action": np.zeros((3, 1), int), "reward": np.ones((3, 1)),
        ...          "next_obs": np.zeros((3, 1, 2)), "terminated": np.array([[False], [False], [True]]),
        ...          "truncated": np.zeros((3, 1), bool)}
        >>> with store.writer(run_id="a", env_id="Toy-v0") as w:
        ...     w.add_batch(steps)
        3
        >>> replay = store.replay(priorities=None)
        >>> replay.close()
        >>> try:
        ...     replay.sample(2)
        ... except trajstore.errors.ReplayClosedError:
        ...     print("closed")
        closed
    """


class EmptyReplayError(TrajstoreError, LookupError):
    """A replay holding no items was sampled (its selection has no steps, or none long enough, yet).

    Examples:
        >>> import numpy as np
        >>> store = trajstore.open("./trajdata", create=True)
        >>> steps = {"obs": np.zeros((3, 1, 2)), "action": np.zeros((3, 1), int), "reward": np.ones((3, 1)),
        ...          "next_obs": np.zeros((3, 1, 2)), "terminated": np.array([[False], [False], [True]]),
        ...          "truncated": np.zeros((3, 1), bool)}
        >>> with store.writer(run_id="a", env_id="Toy-v0") as w:
        ...     w.add_batch(steps)
        3
        >>> replay = store.replay(where="episode_return > 100", follow=True, priorities=None)  # none yet
        >>> try:
        ...     replay.sample(2)
        ... except trajstore.errors.EmptyReplayError:
        ...     print("empty")
        empty
        >>> replay.close()
    """


class RemoteError(TrajstoreError):
    """A trajstore server answered with an error; ``status`` and ``detail`` come from its problem document.

    Args:
        status: The HTTP status; 0 when no server answered.
        title: The problem's title.
        detail: The problem's detail: what was wrong, naming the parameter at fault.

    Examples:
        >>> client = trajstore.Client("http://127.0.0.1:9", retries=0, timeout=1)
        >>> try:
        ...     client.stats()
        ... except trajstore.RemoteError as exc:
        ...     print(exc.status)
        0
    """

    def __init__(self, status: int, title: str, detail: str | None = None) -> None:
        self.status = status
        self.title = title
        self.detail = detail
        head = title if status == 0 else f"{status} {title}"  # 0: no server answered
        super().__init__(head + (f": {detail}" if detail else ""))


_ANSI = re.compile(r"\x1b\[[0-9;?]*[ -/]*[@-~]")  # terminal colour and cursor codes (deltalake's error chains)


def plain(text: str) -> str:
    """``text`` without terminal escape codes."""
    return _ANSI.sub("", text)


def one_line(exc: BaseException | None) -> str:
    """An exception's whole message on one line, without terminal escape codes (deltalake's errors are a chain of
    indented ``↳`` lines whose last one is the cause)."""
    text = " ".join(plain(str(exc)).replace("\u21b3", " ").split())
    return text or type(exc).__name__


def first_line(exc: BaseException) -> str:
    """The first line of an exception's message (a library's error without the context lines it appends), without
    terminal escape codes."""
    text = plain(str(exc)).strip()
    return text.splitlines()[0] if text else type(exc).__name__


def size_text(n: int) -> str:
    """``n`` bytes as a message says them: ``1.5 GiB``, ``32 MiB``, ``100 bytes``."""
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= size:
            return f"{n / size:.4g} {unit}"
    return f"{n} bytes"


class ReadOnlyError(TrajstoreError, PermissionError):
    """A change asked of a store opened read-only at an old version (``trajstore.open(uri, version=N)``). Also a
    ``PermissionError``.

    Examples:
        >>> from trajstore.rollout import gym_rollout
        >>> store = trajstore.open("./trajdata", create=True)
        >>> result = gym_rollout(store, "CartPole-v1", run_id="demo", episodes=2, progress=False)
        >>> old = trajstore.open("./trajdata", version=0)
        >>> try:
        ...     old.writer(run_id="more", env_id="CartPole-v1")
        ... except trajstore.ReadOnlyError as exc:
        ...     print(str(exc).split(";")[0])
        writer: this store is opened read-only at version 0
    """


class RunNotFoundError(InputError, LookupError):
    """A run the store does not hold (the message names it and lists the runs it has). An :class:`InputError` and a
    ``LookupError``; over REST a 404, which the Client raises again as this error.

    Examples:
        >>> store = trajstore.open("./trajdata", create=True)
        >>> try:
        ...     store.stats(run_id="nope")
        ... except LookupError as exc:
        ...     print(str(exc).split(" in ")[0])
        run_id: no run 'nope'
    """

    @classmethod
    def naming(cls, missing: Sequence[str], store: str, runs: Sequence[str]) -> RunNotFoundError:
        """The error for the runs ``missing`` from the store at ``store``, which holds ``runs``: one message
        wherever it is raised (the Store's readers, delete, export; 404 over REST)."""
        return cls(f"run_id: no run {', '.join(map(repr, missing))} in {store}; its runs: "
                   f"{', '.join(runs) or 'none yet'}")


class VersionNotFoundError(InputError, LookupError):
    """A version the store's log does not have, or whose files a vacuum removed (the message names the versions it
    has). An :class:`InputError` and a ``LookupError``; over REST a 404."""


class ReplayNotFoundError(InputError, LookupError):
    """A replay the service does not hold open (never opened, closed, or closed for being idle)."""


def caller_sql_error(exc: QueryError, field: str, context: str) -> InputError:
    """The :class:`InputError` for a query that failed on the caller's own SQL (a ``where``, an ``expression``):
    DuckDB's words without the SQL trajstore built around them, naming ``field`` and, in parentheses, ``context``
    (what the caller gave). The one wording of every reader, ``delete`` and ``add_column``."""
    return InputError(f"{field}: {str(exc).removeprefix('query failed: ')} ({context})")
