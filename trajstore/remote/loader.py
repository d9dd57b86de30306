"""Training batches read from a service's ``/sequences`` or ``/transitions`` stream: the batches of the local
:class:`~trajstore.loaders.loader.Batches`, with the same ``state_dict()``.

The stream's schema carries the server's starting state (``trajstore.state``); the client adds the items of
each batch it hands over, so its state is where the training loop is, not where the network is.
"""

from __future__ import annotations

import contextlib
import json
from typing import Any, BinaryIO, ContextManager, Iterator

import pyarrow as pa

from trajstore.loaders.loader import convert, from_arrow

STATE_KEY = b"trajstore.state"


class RemoteBatches(Iterator[Any]):
    """Batches of an Arrow IPC body opened by ``body`` (entered now: a refused request raises here)."""

    def __init__(self, body: ContextManager[BinaryIO], format: str) -> None:  # noqa: A002
        self._stack = contextlib.ExitStack()
        try:
            self._reader = pa.ipc.open_stream(self._stack.enter_context(body))
        except BaseException:
            self._stack.close()
            raise
        self._state = json.loads((self._reader.schema.metadata or {}).get(STATE_KEY, b"{}"))
        self._format = format
        self.schema = self._reader.schema

    def state_dict(self) -> dict[str, Any]:
        return dict(self._state)

    def __next__(self) -> Any:
        try:
            batch = self._reader.read_next_batch()
        except StopIteration:
            self.close()
            raise
        self._state["position"] = self._state.get("position", 0) + batch.num_rows
        if self._format == "arrow":
            return batch.replace_schema_metadata(None)
        return convert(from_arrow(batch), self._format)

    def close(self) -> None:
        self._stack.close()

    def __enter__(self) -> RemoteBatches:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
