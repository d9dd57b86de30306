"""Writing to a store through its REST service, for rollout workers without access to the store's disk.

:class:`RemoteWriter` is a :class:`~trajstore.write.writer.Writer` (same ``add_batch``, ``add_step``,
``flush``, ``close``, same checks, same episode cutting) whose commits go to
``POST /runs/{run_id}/batches`` instead of the local Delta log. Its requests carry the writer's
``Idempotency-Key`` and their number (``Idempotency-Sequence``, in the order they are sent), so a retried request
never stores rows twice and the store keeps one key per writer, not one per request (a service older than
``Idempotency-Sequence`` gets a key per request).

>>> with RemoteWriter("http://127.0.0.1:8321", api_key="…", run_id="r", env_id="CartPole-v1") as w:  # doctest: +SKIP
...     w.add_batch(batch)

Each request stays under the limits the service says (``GET /ingest``: its body's bytes, ``max_body_bytes``, and
what it decodes to, ``max_decoded_bytes``): the writer flushes before half of the smaller, and a flush still over
one (a single large ``add_batch``) goes as several requests, cut between episodes (inside an episode only when it
alone is over: its rows then sent whole, without the encoding that stores an observation once).

:class:`RemoteStore` is what the rollout workers need of a store (``writer``, ``run_ids``, ``sql``) over the same
service, so ``gym_rollout(RemoteStore(url, api_key=…), …)`` and ``trajstore rollout --url …`` run anywhere.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import (
    BodyTooLargeError,
    QueryError,
    RemoteError,
    RunNotFoundError,
    first_line,
    size_text,
)
from trajstore.remote.client import Client
from trajstore.remote.decoded_size import decoded_size
from trajstore.remote.wire import ipc_bytes
from trajstore.storage.encoding import FileEncoding, decode_table
from trajstore.storage.run_config import automatic
from trajstore.write.sink import CommitHook
from trajstore.write.writer import Writer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class IngestLimits:
    """What the service takes in one ingest request (``GET /ingest``): the bytes of its body and the bytes it
    decodes to (as :func:`~trajstore.remote.decoded_size.decoded_size` counts them); None where it does not say
    (a service of an older version)."""

    body: int | None = None
    decoded: int | None = None

    @classmethod
    def of(cls, access: Mapping[str, Any]) -> IngestLimits:
        return cls(access.get("max_body_bytes"), access.get("max_decoded_bytes"))

    @property
    def flush_bytes(self) -> int | None:
        """The most rows a writer buffers before it sends them: half the smaller limit."""
        known = [n for n in (self.body, self.decoded) if n is not None]
        return min(known) // 2 if known else None

    def excess(self, body: bytes) -> str | None:
        """Which limit ``body`` is over, and the service's setting of it; None when the service takes it."""
        if self.body is not None and len(body) > self.body:
            return f"its {len(body)} bytes are over the service's limit of {self.body} bytes " \
                   f"({size_text(self.body)}, TRAJSTORE_MAX_BODY_BYTES)"
        if self.decoded is not None:
            size = decoded_size(body, limit=self.decoded)
            if size.bytes > self.decoded:
                return f"it decodes to {size.describe()}, over the service's limit of {self.decoded} bytes " \
                       f"({size_text(self.decoded)}, TRAJSTORE_MAX_DECODED_BYTES)"
        return None


@dataclass
class EncodedRows:
    """Rows encoded for ingest requests (one, or several under the service's limits), each body with the key
    that makes its retries harmless, and, for a writer that numbers its requests, the number of the first (given
    when it is first sent, so that numbers rise in the order requests are sent; a retry sends the same)."""

    bodies: tuple[tuple[bytes, str], ...]
    run_id: str
    env_id: str
    first: int | None = None


class RemoteSink:
    """Where a :class:`Writer` sends its commits: the service's ingest endpoint.

    A :class:`~trajstore.write.sink.Sink` with the same two stages as the store's
    :class:`~trajstore.storage.table.StepsTable`: ``write`` encodes (on the writer's encoding thread),
    ``commit`` sends (on its commit thread).
    """

    def __init__(self, client: Client, *, encoded: bool = True, limits: IngestLimits = IngestLimits(),
                 sequenced: bool = False) -> None:
        self.client = client
        self.encoded = encoded  # False for a service that takes encoding-1 rows only (one older than encoding 2)
        self.limits = limits
        # One key for all of this sink's requests, numbered (a service that takes Idempotency-Sequence), or a key each
        self.key = uuid.uuid4().hex if sequenced else None
        self._next = 0  # the number of the next request sent

    def stored_schema(self, env_id: str | None = None) -> pa.Schema | None:
        schema = self.client.schema(env_id=env_id)
        return schema if len(schema) else None

    def column_names(self) -> list[str]:
        """The served table's columns (:meth:`stored_schema` of every environment, ``GET /schema``); the service
        checks the names of the rows it takes against its log again."""
        schema = self.stored_schema()
        return [] if schema is None else schema.names

    def reserve(self, types: Mapping[str, pa.DataType], logical: Mapping[str, pa.DataType] | None = None,
                declared: Mapping[str, Mapping[str, Any] | None] | None = None) -> dict[str, str]:
        """Names as they are: the service resolves the physical names of the rows it commits."""
        return {name: name for name in types}

    def write(self, data: pa.Table, *, run_id: str, env_id: str) -> EncodedRows:
        fmt = FileEncoding.of(data.schema.metadata)
        data = data.rename_columns([fmt.logical_names().get(n, n) for n in data.column_names])
        if not self.encoded:  # every row whole, as a service older than encoding 2 takes them
            data = decode_table(data, fmt.with_columns({})).replace_schema_metadata(None)
        else:  # rows under their logical names, encoded as encoding 2 says (what every service since takes)
            data = pa.Table.from_arrays(data.columns, names=data.column_names).replace_schema_metadata(
                FileEncoding(2, fmt.frame_stack, (), fmt.frames).metadata())
        bodies = request_bodies(data, self.limits, run_id=run_id)
        if self.key is not None:
            return EncodedRows(tuple((body, self.key) for body in bodies), run_id, env_id)
        key = uuid.uuid4().hex
        return EncodedRows(tuple((body, f"{key}-{i}" if len(bodies) > 1 else key) for i, body in enumerate(bodies)),
                           run_id, env_id)

    def commit(self, encoded: EncodedRows) -> str:
        """Send each request in order (a retry after a failure sends again those that landed: answered as
        duplicates, stored once). Called on one thread, in the order the writer's buffers are committed."""
        if self.key is not None and encoded.first is None:
            encoded.first, self._next = self._next, self._next + len(encoded.bodies)
        names = []
        for i, (body, key) in enumerate(encoded.bodies):
            number = None if encoded.first is None else encoded.first + i
            self.client.post_body(encoded.run_id, encoded.env_id, body, idempotency_key=key,
                                  idempotency_sequence=number)
            names.append(key if number is None else f"{key}/{number}")
        return f"{self.client.url}/runs/{encoded.run_id}/batches#{','.join(names)}"


def request_bodies(rows: pa.Table, limits: IngestLimits, *, run_id: str) -> list[bytes]:
    """``rows`` as the Arrow IPC bodies of requests the service takes, in order: one, or consecutive pieces cut
    between episodes; an episode over a limit by itself is decoded (every row whole) and cut between rows.
    :class:`BodyTooLargeError` for a single row over a limit."""
    body = ipc_bytes(rows)
    excess = limits.excess(body)
    if excess is None:
        return [body]
    if rows.num_rows <= 1:
        raise BodyTooLargeError(f"rows of run {run_id!r}: one row is more than the service takes in a request: "
                                f"{excess}; raise that setting of the service")
    cut = _episode_cut(rows)
    if cut is None:  # one episode: its rows whole, so that any row may begin a request
        rows = decode_table(rows, FileEncoding.of(rows.schema.metadata)).replace_schema_metadata(None)
        cut = rows.num_rows // 2
    return request_bodies(rows.slice(0, cut), limits, run_id=run_id) + \
        request_bodies(rows.slice(cut), limits, run_id=run_id)


def _episode_cut(rows: pa.Table) -> int | None:
    """The row nearest the middle of ``rows`` that begins another episode than the row before it (None: rows of
    one episode). An encoded row refers only to rows of its own episode in its own request, so requests cut there
    keep their encoding."""
    ids = rows["episode_id"].to_numpy()
    starts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    if not len(starts):
        return None
    return int(starts[np.argmin(np.abs(starts - len(ids) // 2))])


class RemoteWriter(Writer):
    """A :class:`Writer` over HTTP: ``RemoteWriter(url, api_key=…, run_id=…, env_id=…, **writer_options)``.

    It asks the service first whether its key may write (:meth:`Client.check_ingest`), so that a wrong key,
    a server that takes no writes or one that is down fails here, before any rollout, not at the first commit.
    """

    def __init__(self, url: str | Client, *, api_key: str | None = None, run_id: str, env_id: str,
                 flush_bytes: int = 16 * 1024 * 1024, **options: Any) -> None:
        self.client = url if isinstance(url, Client) else Client(url, api_key=api_key)
        access = _check_access(self.client)
        limits = IngestLimits.of(access)
        sink = RemoteSink(self.client, encoded=2 in (access.get("encodings") or [1]), limits=limits,
                          sequenced=bool(access.get("idempotency_sequence")))
        super().__init__(sink, run_id=run_id, env_id=env_id,
                         flush_bytes=min(flush_bytes, limits.flush_bytes or flush_bytes), **options)


def _check_access(client: Client) -> Mapping[str, Any]:
    """What the service says of ingest (``GET /ingest``): the row encodings it takes (none said: encoding 1 only)
    and its limits."""
    try:
        return client.check_ingest()
    except RemoteError as exc:
        if exc.status != 404:  # a server older than GET /ingest: its first commit will tell
            raise
        log.debug("%s has no GET /ingest; its first commit will tell whether the key may write", client.url)
        return {}


class RemoteStore:
    """The side of a served store that rollout workers use: :meth:`writer` (a :class:`RemoteWriter`),
    :meth:`runs`, :meth:`run_ids` and :meth:`sql` (read-only, through ``POST /sql``). ``root`` is the service's
    URL."""

    def __init__(self, url: str, *, api_key: str | None = None) -> None:
        self.client = Client(url, api_key=api_key)
        self.root = self.client.url

    def __repr__(self) -> str:
        return f"RemoteStore({self.root!r})"

    def writer(self, *, run_id: str, env_id: str, config: Mapping[str, Any] | None = None,
               tags: Sequence[str] | None = None, notes: str | None = None, **options: Any) -> RemoteWriter:
        """A :class:`RemoteWriter`; ``config``, ``tags``, ``notes`` and this program's version, git commit and host
        describe the run, as :meth:`Store.writer <trajstore.store.Store.writer>` does: first, for a run the service
        holds (a config other than its own is refused here); a new run right after the writer's first commit made
        it, as the service describes only runs it holds (:class:`DescribedOnCommit`)."""
        description: dict[str, Any] = {"config": config, "tags": tags, "notes": notes, "provenance": automatic()}
        later = DescribedOnCommit(self.client, run_id, description, options.pop("upkeep", None))
        writer = RemoteWriter(self.client, run_id=run_id, env_id=env_id, upkeep=later, **options)
        try:
            self.client.set_run(run_id, replace=False, **description)
            later.description = None
        except RunNotFoundError:
            pass
        except BaseException:
            writer.close()  # nothing written: nothing sent
            raise
        return writer

    def runs(self) -> pa.Table:
        """One row per run and environment of the served store (:meth:`Client.runs
        <trajstore.remote.client.Client.runs>`)."""
        return self.client.runs()

    def run_ids(self) -> list[str]:
        """The runs the served store holds (``GET /runs``: one request, which counts each run's episodes)."""
        return sorted(set(self.runs()["run_id"].to_pylist()))

    def sql(self, query: str) -> pa.Table:
        table = self.client.sql(query)
        if not isinstance(table, pa.Table):
            raise QueryError(f"{self.root}: POST /sql did not answer with an Arrow table")
        return table

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class DescribedOnCommit:
    """A writer's :class:`~trajstore.write.sink.CommitHook` that describes its new run (``description``: the keywords
    of :meth:`Client.set_run <trajstore.remote.client.Client.set_run>` as a writer opening it) after the first commit
    made the run, then tells ``then`` (the writer's own hook, if any) of each commit. A description refused then is
    said, not raised: the rows are stored."""

    def __init__(self, client: Client, run_id: str, description: dict[str, Any] | None,
                 then: CommitHook | None = None) -> None:
        self.client, self.run_id, self.description, self.then = client, run_id, description, then

    def wrote(self, run_id: str, env_id: str) -> None:
        description, self.description = self.description, None
        if description is not None:
            try:
                self.client.set_run(self.run_id, replace=False, **description)
            except Exception as exc:  # noqa: BLE001 - the rows are committed: the writer goes on
                log.warning("run %r: its rows are stored but its description was not: %s; describe it with "
                            "Client.set_run", self.run_id, first_line(exc))
        if self.then is not None:
            self.then.wrote(run_id, env_id)

    def close(self) -> None:
        if self.then is not None:
            self.then.close()
