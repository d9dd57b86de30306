"""Keyset cursors of the JSON pages: the last row's key, opaque to clients (base64url of a small JSON list).

>>> decode(encode([7, 3]), 2)
[7, 3]
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated

from fastapi import Query

from trajstore.errors import InputError

CursorQuery = Annotated[str | None, Query(max_length=200, description="JSON pages: the next_cursor of the page "
                                                                      "before (keyset paging: constant time at any "
                                                                      "depth; offset is then ignored)")]


def encode(key: list[int]) -> str:
    return base64.urlsafe_b64encode(json.dumps(key, separators=(",", ":")).encode()).decode().rstrip("=")


INT64 = range(-(2**63), 2**63)  # every key is an episode_id or a step


def decode(cursor: str, size: int) -> list[int]:
    """The key in ``cursor``: ``size`` 64-bit integers; an :class:`InputError` naming ``cursor`` for anything
    else (text that is not base64 or JSON, JSON nested past the decoder's recursion limit, other values)."""
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        key = None
    if not (isinstance(key, list) and len(key) == size and all(type(k) is int and k in INT64 for k in key)):
        raise InputError(f"cursor: not a cursor of this page ({cursor!r}); pass the next_cursor of the page before")
    return key
