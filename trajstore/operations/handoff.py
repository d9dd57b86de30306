"""Files handed over: writers that write their files themselves and leave the commit to one committer.

A writer's :class:`HandedFiles` sink writes each file straight into the table's folder (in parallel with every other
writer, local or ``s3://``) and hands it to a committer instead of committing it: a
:class:`~trajstore.operations.group_commit.GroupCommitter` in the same process, one in another process reached at its
address (:class:`CommitterServer` serves it, :class:`RemoteCommitter` reaches it), or a Ray actor holding one
(:mod:`trajstore.ray`). The committer commits what many writers handed in one commit per interval: N writers that
would make N commits per flush make about one. A writer's flush returns once its files are committed.

A writer killed after writing and before its files were committed leaves files no version lists: no reader sees them,
``trajstore check`` lists them as orphans, ``trajstore vacuum`` removes them. A committer killed between writing and
committing answers no one: each waiting writer's flush raises (the connection is gone), and the files are orphans alike.

The address is ``trajstore+committer://HOST:PORT/KEY``: a TCP listener (127.0.0.1 unless asked otherwise) that takes
only peers that prove they hold KEY (``multiprocessing.connection``'s HMAC handshake; what they send is unpickled,
so the key is as secret as write access to the store).
"""

from __future__ import annotations

import logging
import re
import secrets
import threading
from multiprocessing.connection import Client, Connection, Listener
from typing import Any, Mapping, Sequence

import pyarrow as pa

from trajstore.errors import CommitError, InputError, TrajstoreError
from trajstore.operations.group_commit import GroupCommitter
from trajstore.storage.log import WrittenFile
from trajstore.storage.table import StepsTable

log = logging.getLogger(__name__)

SCHEME = "trajstore+committer://"
ADDRESS = re.compile(r"^trajstore\+committer://([^:/]+):(\d+)/([0-9a-f]{32,})$")


class HandedFiles:
    """A writer's :class:`~trajstore.write.sink.Sink` that writes its files into ``table`` itself and hands them to
    ``committer`` (anything with ``commit_files(files)`` returning a future — a
    :class:`~trajstore.operations.group_commit.GroupCommitter` — or ``commit(files)`` returning once they are
    committed: a :class:`RemoteCommitter`, a Ray actor's proxy) instead of committing them."""

    def __init__(self, table: StepsTable, committer: Any) -> None:
        self.table, self.committer = table, committer

    def stored_schema(self, env_id: str | None = None) -> pa.Schema | None:
        return self.table.stored_schema(env_id)

    def column_names(self) -> list[str]:
        return self.table.column_names()

    def reserve(self, types: Mapping[str, pa.DataType], logical: Mapping[str, pa.DataType] | None = None,
                declared: Mapping[str, Mapping[str, Any] | None] | None = None) -> dict[str, str]:
        return self.table.reserve(types, logical, declared)

    def write(self, data: pa.Table, *, run_id: str, env_id: str) -> WrittenFile:
        return self.table.write(data, run_id=run_id, env_id=env_id)

    def commit(self, written: WrittenFile) -> str:
        """Hand ``written`` over and wait until its group has landed; the committer's error if it did not."""
        if hasattr(self.committer, "commit_files"):
            self.committer.commit_files([written]).result()
        else:
            self.committer.commit([written])
        return written.path


def handed_files(table: StepsTable, committer: Any) -> Any:
    """A writer's sink: ``table`` itself without a ``committer``, else a :class:`HandedFiles` handing its files to
    ``committer`` (a committer object, or the address of one in another process)."""
    if committer is None:
        return table
    if isinstance(committer, str):
        committer = RemoteCommitter(committer)
    elif not (hasattr(committer, "commit_files") or hasattr(committer, "commit")):
        raise InputError(f"committer: expected a trajstore.Committer or its address "
                         f"({SCHEME}HOST:PORT/KEY), got {type(committer).__name__}")
    return HandedFiles(table, committer)


class CommitterServer:
    """``committer`` served at :attr:`address` to writers of other processes (one thread per connection, each
    hand-over answered once committed, or with its error)."""

    def __init__(self, committer: GroupCommitter, *, host: str = "127.0.0.1", port: int = 0) -> None:
        self.committer = committer
        self._key = secrets.token_hex(16)
        self._listener = Listener((host, port), authkey=self._key.encode())
        host_, port_ = self._listener.address
        self.address = f"{SCHEME}{host_}:{port_}/{self._key}"
        self._closed = False
        self._thread = threading.Thread(target=self._accept, name="trajstore-committer-listener", daemon=True)
        self._thread.start()

    def close(self) -> None:
        """Take no more connections (those open end when their writers close them)."""
        self._closed = True
        try:
            self._listener.close()
        except OSError:
            pass

    def _accept(self) -> None:
        while not self._closed:
            try:
                conn = self._listener.accept()
            except Exception as exc:  # noqa: BLE001 - a peer without the key, or the listener closed
                if self._closed:
                    return
                log.warning("committer at %s refused a connection: %s", self.address.rsplit("/", 1)[0], exc)
                continue
            if self._closed:  # an accept() already waiting when the listener closed still takes one peer: ended
                conn.close()  # unanswered, so its writer is told its files may not be committed
                return
            threading.Thread(target=self._serve, args=(conn,), name="trajstore-committer-conn", daemon=True).start()

    def _serve(self, conn: Connection) -> None:
        with conn:
            while True:
                try:
                    files = conn.recv()
                except (EOFError, OSError):
                    return
                try:
                    outcome = self.committer.commit_files(files).result()
                    conn.send(("ok", outcome.version))
                except Exception as exc:  # noqa: BLE001 - the writer hears it
                    conn.send(("error", type(exc).__name__, str(exc)))


class RemoteCommitter:
    """The committer served at ``address`` (see :class:`CommitterServer`), for a writer of another process: one
    connection, hand-overs one at a time."""

    def __init__(self, address: str) -> None:
        m = ADDRESS.match(address)
        if m is None:
            raise InputError(f"committer: expected an address {SCHEME}HOST:PORT/KEY (a trajstore.Committer's "
                             f"address), got {address!r}")
        self._peer, self._key = (m.group(1), int(m.group(2))), m.group(3).encode()
        self._lock = threading.Lock()
        self._conn: Connection | None = None

    def commit(self, files: Sequence[WrittenFile]) -> None:
        """Hand ``files`` over; returns once they are committed. A committer that cannot be reached, or is gone
        before it answered, is a :class:`~trajstore.errors.CommitError` (its files are then committed or not:
        orphans, which vacuum removes)."""
        with self._lock:
            try:
                if self._conn is None:
                    self._conn = Client(self._peer, authkey=self._key)
                self._conn.send(list(files))
                answer = self._conn.recv()
            except (OSError, EOFError) as exc:
                self._conn = None
                raise CommitError(f"committer at {self._peer[0]}:{self._peer[1]}: {exc or type(exc).__name__}; "
                                  f"{len(files)} file(s) were written and may not be committed (if no version "
                                  "lists them, `trajstore vacuum` removes them)") from exc
        if answer[0] != "ok":
            raise _error(answer[1], answer[2])

    def close(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None


def _error(kind: str, message: str) -> TrajstoreError:
    """The committer's error again, as the trajstore error of that name where there is one."""
    import trajstore.errors as errors

    found = getattr(errors, kind, None)
    if isinstance(found, type) and issubclass(found, TrajstoreError):
        try:
            return found(message)
        except TypeError:
            pass
    return CommitError(f"{kind}: {message}")
