"""Keyset cursors of the JSON pages: the last row's key, opaque to clients (base64url of a small JSON list of
decimal strings, exact in any JSON reader; a key of JSON numbers is taken too).

>>> decode(encode([2**62 + 1, 3]), 2)
[4611686018427387905, 3]
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated

from fastapi import Query

from trajstore.api.ints import INT64_TEXT
from trajstore.errors import InputError

CursorQuery = Annotated[str | None, Query(max_length=200, description="JSON pages: the next_cursor of the page "
                                                                      "before (keyset paging: constant time at any "
                                                                      "depth; offset is then ignored)")]


def encode(key: list[int]) -> str:
    text = json.dumps([str(k) for k in key], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


INT64 = range(-(2**63), 2**63)  # every key is an episode_id or a step


def decode(cursor: str, size: int) -> list[int]:
    """The key in ``cursor``: ``size`` 64-bit integers, each a decimal string or a JSON number; an
    :class:`InputError` naming ``cursor`` for anything else (text that is not base64 or JSON, JSON nested past
    the decoder's recursion limit, other values)."""
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        key = None
    values = [_integer(k) for k in key] if isinstance(key, list) and len(key) == size else [None]
    if any(v is None or v not in INT64 for v in values):
        raise InputError(f"cursor: not a cursor of this page ({cursor!r}); pass the next_cursor of the page before")
    return values  # type: ignore[return-value]


def _integer(value: object) -> int | None:
    """A key's integer: a JSON integer, or a decimal string (``INT64_TEXT``'s form: no sign but ``-``, no
    spaces, no digit groups); None for anything else."""
    if type(value) is int:
        return value
    if isinstance(value, str) and len(value) <= 20 and INT64_TEXT.fullmatch(value):
        return int(value)
    return None
