"""Trying again after losing a race in the store (another writer committed first, changed the schema first, removed
a file first): the one back-off of every such loop (the log's commits, ingest, delete). The Client's retries of an
HTTP request wait as the server asks instead (``Retry-After``)."""

from __future__ import annotations

import random
import time
from typing import Iterator


def backoff(attempt: int) -> float:
    """Seconds to wait before try ``attempt + 1``: doubling from 2 ms up to 0.2 s, jittered so that racing writers
    spread out."""
    return min(0.2, 0.002 * 2 ** attempt) * random.uniform(0.5, 1.5)


def tries(n: int) -> Iterator[int]:
    """``0, 1, …, n - 1``, waiting :func:`backoff` before each try after the first: ``for attempt in tries(n):``,
    ``return`` on success, ``continue`` after a lost race, and after the loop raise the error naming ``n``."""
    for attempt in range(n):
        if attempt:
            time.sleep(backoff(attempt - 1))
        yield attempt
