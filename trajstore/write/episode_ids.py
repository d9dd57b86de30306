"""Episode ids that are unique in a store without any coordination between writers.

An id is ``token << 24 | counter``: a random 39-bit token drawn by each writer (a new one every
2**24 episodes) and a counter. Ids stay positive int64. Two writers collide only if they draw the
same token: about ``n**2 / 2**40`` for ``n`` writers over the store's life; ``trajstore check``
reports a duplicate should it ever happen.
"""

from __future__ import annotations

import secrets

import numpy as np

TOKEN_BITS = 39
COUNTER_BITS = 24


class EpisodeIds:
    """Allocator of fresh episode ids for one writer."""

    def __init__(self, token: int | None = None) -> None:
        self._token = secrets.randbits(TOKEN_BITS) if token is None else token
        self._next = 0

    def __call__(self, count: int) -> np.ndarray:
        out = np.empty(count, np.int64)
        filled = 0
        while filled < count:
            room = (1 << COUNTER_BITS) - self._next
            if room == 0:
                self._token, self._next = secrets.randbits(TOKEN_BITS), 0
                continue
            k = min(room, count - filled)
            out[filled:filled + k] = (self._token << COUNTER_BITS) + np.arange(self._next, self._next + k)
            self._next += k
            filled += k
        return out
