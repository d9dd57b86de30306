"""Writing to a store through its REST service, for rollout workers without access to the store's disk.

:class:`RemoteWriter` is a :class:`~trajstore.write.writer.Writer` (same ``add_batch``, ``add_step``,
``flush``, ``close``, same checks, same episode cutting) whose commits go to
``POST /runs/{run_id}/batches`` instead of the local Delta log. Each commit carries its own
``Idempotency-Key``, so a retried request never stores rows twice.

>>> with RemoteWriter("http://127.0.0.1:8321", api_key="…", run_id="r", env_id="CartPole-v1") as w:  # doctest: +SKIP
...     w.add_batch(batch)

:class:`RemoteStore` is what the rollout workers need of a store (``writer``, ``run_ids``, ``sql``) over the same
service, so ``gym_rollout(RemoteStore(url, api_key=…), …)`` and ``trajstore rollout --url …`` run anywhere.
"""

from __future__ import annotations

import logging
import uuid
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import pyarrow as pa

from trajstore.errors import QueryError, RemoteError
from trajstore.remote.client import Client
from trajstore.remote.wire import ipc_bytes
from trajstore.storage.encoding import Format, decode_table
from trajstore.write.writer import Writer

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class EncodedRows:
    """Rows encoded for one ingest request, with the key that makes its retries harmless."""

    body: bytes
    run_id: str
    env_id: str
    key: str


class RemoteSink:
    """Where a :class:`Writer` sends its commits: the service's ingest endpoint.

    A :class:`~trajstore.write.sink.Sink` with the same two stages as the store's
    :class:`~trajstore.storage.table.StepsTable`: ``write`` encodes (on the writer's encoding thread),
    ``commit`` sends (on its commit thread).
    """

    def __init__(self, client: Client, *, encoded: bool = True) -> None:
        self.client = client
        self.encoded = encoded  # False for a service that takes encoding-1 rows only (one older than encoding 2)

    def stored_schema(self, env_id: str | None = None) -> pa.Schema | None:
        schema = self.client.schema(env_id=env_id)
        return schema if len(schema) else None

    def reserve(self, types: Mapping[str, pa.DataType], logical: Mapping[str, pa.DataType] | None = None,
                declared: Mapping[str, Mapping[str, Any] | None] | None = None) -> dict[str, str]:
        """Names as they are: the service resolves the physical names of the rows it commits."""
        return {name: name for name in types}

    def write(self, data: pa.Table, *, run_id: str, env_id: str) -> EncodedRows:
        fmt = Format.of(data.schema.metadata)
        data = data.rename_columns([fmt.logical_names().get(n, n) for n in data.column_names])
        if not self.encoded:  # every row whole, as a service older than encoding 2 takes them
            data = decode_table(data, fmt.with_columns({})).replace_schema_metadata(None)
        else:  # rows under their logical names, encoded as encoding 2 says (what every service since takes)
            data = pa.Table.from_arrays(data.columns, names=data.column_names).replace_schema_metadata(
                Format(2, fmt.frame_stack, (), fmt.frames).metadata())
        return EncodedRows(ipc_bytes(data), run_id, env_id, uuid.uuid4().hex)

    def commit(self, encoded: EncodedRows) -> str:
        self.client.post_body(encoded.run_id, encoded.env_id, encoded.body, idempotency_key=encoded.key)
        return f"{self.client.url}/runs/{encoded.run_id}/batches#{encoded.key}"


class RemoteWriter(Writer):
    """A :class:`Writer` over HTTP: ``RemoteWriter(url, api_key=…, run_id=…, env_id=…, **writer_options)``.

    It asks the service first whether its key may write (:meth:`Client.check_ingest`), so that a wrong key,
    a server that takes no writes or one that is down fails here, before any rollout, not at the first commit.
    """

    def __init__(self, url: str | Client, *, api_key: str | None = None, run_id: str, env_id: str,
                 flush_bytes: int = 16 * 1024 * 1024, **options: Any) -> None:
        self.client = url if isinstance(url, Client) else Client(url, api_key=api_key)
        encodings = _check_access(self.client)
        super().__init__(RemoteSink(self.client, encoded=2 in encodings), run_id=run_id, env_id=env_id,
                         flush_bytes=flush_bytes, **options)


def _check_access(client: Client) -> list[int]:
    """The row encodings the service takes (a service that does not say takes encoding 1 only)."""
    try:
        return list(client.check_ingest().get("encodings") or [1])
    except RemoteError as exc:
        if exc.status != 404:  # a server older than GET /ingest: its first commit will tell
            raise
        log.debug("%s has no GET /ingest; its first commit will tell whether the key may write", client.url)
        return [1]


class RemoteStore:
    """The side of a served store that rollout workers use: :meth:`writer` (a :class:`RemoteWriter`),
    :meth:`run_ids` and :meth:`sql` (read-only, through ``POST /sql``). ``root`` is the service's URL."""

    def __init__(self, url: str, *, api_key: str | None = None) -> None:
        self.client = Client(url, api_key=api_key)
        self.root = self.client.url

    def __repr__(self) -> str:
        return f"RemoteStore({self.root!r})"

    def writer(self, *, run_id: str, env_id: str, config: Mapping[str, Any] | None = None,
               tags: Sequence[str] | None = None, notes: str | None = None, **options: Any) -> RemoteWriter:
        """A :class:`RemoteWriter`; ``config``, ``tags``, ``notes`` describe the run first, as
        :meth:`Store.writer <trajstore.store.Store.writer>` does."""
        writer = RemoteWriter(self.client, run_id=run_id, env_id=env_id, **options)
        if config is not None or tags is not None or notes is not None:
            try:
                self.client.set_run(run_id, config=config, tags=tags, notes=notes, replace=False)
            except BaseException:
                writer.close()  # nothing written: nothing sent
                raise
        return writer

    def run_ids(self) -> list[str]:
        """The runs the served store holds (``GET /runs``: one request, which counts each run's episodes)."""
        return sorted({run["run_id"] for run in self.client.runs()})

    def sql(self, query: str) -> pa.Table:
        table = self.client.sql(query, as_="arrow")
        if not isinstance(table, pa.Table):
            raise QueryError(f"{self.root}: POST /sql did not answer with an Arrow table")
        return table

    def close(self) -> None:
        self.client.close()

    def __enter__(self) -> RemoteStore:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
