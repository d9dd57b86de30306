"""Writing to a store through its REST service, for rollout workers without access to the store's disk.

:class:`RemoteWriter` is a :class:`~trajstore.writer.Writer` (same ``add_batch``, ``add_step``,
``flush``, ``close``, same checks, same episode cutting) whose commits go to
``POST /runs/{run_id}/batches`` instead of the local Delta log. Each commit carries its own
``Idempotency-Key``, so a retried request never stores rows twice.

>>> with RemoteWriter("http://127.0.0.1:8321", api_key="…", run_id="r", env_id="CartPole-v1") as w:  # doctest: +SKIP
...     w.add_batch(batch)
"""

from __future__ import annotations

import uuid
from typing import Any

import pyarrow as pa

from trajstore.client import Client
from trajstore.writer import Writer


class RemoteSink:
    """Where a :class:`Writer` sends its commits: the service's ingest endpoint."""

    def __init__(self, client: Client) -> None:
        self.client = client

    def file_schema(self, env_id: str | None = None) -> pa.Schema | None:
        schema = self.client.schema(env_id=env_id)
        return schema if len(schema) else None

    def append(self, data: pa.Table, *, run_id: str, env_id: str) -> str:
        key = uuid.uuid4().hex
        self.client.post_rows(run_id, env_id, data, idempotency_key=key)
        return f"{self.client.url}/runs/{run_id}/batches#{key}"


class RemoteWriter(Writer):
    """A :class:`Writer` over HTTP: ``RemoteWriter(url, api_key=…, run_id=…, env_id=…, **writer_options)``."""

    def __init__(self, url: str | Client, *, api_key: str | None = None, run_id: str, env_id: str,
                 flush_bytes: int = 16 * 1024 * 1024, **options: Any) -> None:
        self.client = url if isinstance(url, Client) else Client(url, api_key=api_key)
        super().__init__(RemoteSink(self.client), run_id=run_id, env_id=env_id,  # type: ignore[arg-type]
                         flush_bytes=flush_bytes, **options)
