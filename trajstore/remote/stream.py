"""An HTTP body read as a file while it arrives (the client's streams of record batches)."""

from __future__ import annotations

import io
from typing import Iterable


class HttpByteStream(io.RawIOBase):
    """A readable file over an iterator of byte chunks (an HTTP body as it arrives)."""

    def __init__(self, chunks: Iterable[bytes]) -> None:
        self._chunks = iter(chunks)
        self._pending = memoryview(b"")

    def readable(self) -> bool:
        return True

    def readinto(self, buffer: bytearray | memoryview) -> int:  # type: ignore[override]
        while not self._pending:
            chunk = next(self._chunks, None)
            if chunk is None:
                return 0
            self._pending = memoryview(chunk)
        n = min(len(buffer), len(self._pending))
        buffer[:n] = self._pending[:n]
        self._pending = self._pending[n:]
        return n
