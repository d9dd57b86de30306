"""Keyset cursors of the JSON pages: the last row's key, opaque to clients (base64url of a small JSON list whose
integers are decimal strings, exact in any JSON reader; a key of JSON numbers is taken too). A step's key is
``[episode_id, step]``, and ``[episode_id, step, agent_id]`` for an agent's row (the agents of one env step are rows
of their own, in ``agent_id`` order).

>>> decode(encode([2**62 + 1, 3]), 2)
[4611686018427387905, 3]
>>> decode(encode([7, 3, "agent_0"]), 2, agent=True)
[7, 3, 'agent_0']
"""

from __future__ import annotations

import base64
import binascii
import json
from typing import Annotated, Any

from fastapi import Query

from trajstore.api.ints import INT64_TEXT
from trajstore.errors import InputError

CursorQuery = Annotated[str | None, Query(max_length=1000, description="JSON pages: the next_cursor of the page "
                                                                      "before (keyset paging: constant time at any "
                                                                      "depth; offset is then ignored)")]


def encode(key: list[int | str]) -> str:
    text = json.dumps([str(k) for k in key], separators=(",", ":"))
    return base64.urlsafe_b64encode(text.encode()).decode().rstrip("=")


INT64 = range(-(2**63), 2**63)  # every key is an episode_id or a step


def decode(cursor: str, size: int, *, agent: bool = False) -> list[Any]:
    """The key in ``cursor``: ``size`` 64-bit integers, each a decimal string or a JSON number, then (with
    ``agent``, where the row was an agent's) a non-empty ``agent_id``; an :class:`InputError` naming ``cursor`` for
    anything else (text that is not base64 or JSON, JSON nested past the decoder's recursion limit, other
    values)."""
    try:
        key = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
    except (binascii.Error, ValueError, RecursionError):
        key = None
    values = [_integer(k) for k in key[:size]] if isinstance(key, list) and len(key) >= size else [None]
    tail = key[size:] if isinstance(key, list) else None
    if any(v is None or v not in INT64 for v in values) or not (
            tail == [] or (agent and tail is not None and len(tail) == 1 and isinstance(tail[0], str) and tail[0])):
        raise InputError(f"cursor: not a cursor of this page ({cursor!r}); pass the next_cursor of the page before")
    return values + tail  # type: ignore[operator]


def _integer(value: object) -> int | None:
    """A key's integer: a JSON integer, or a decimal string (``INT64_TEXT``'s form: no sign but ``-``, no
    spaces, no digit groups); None for anything else."""
    if type(value) is int:
        return value
    if isinstance(value, str) and len(value) <= 20 and INT64_TEXT.fullmatch(value):
        return int(value)
    return None
