"""64-bit integers at the API's edge: sent exact over JSON, taken as decimal strings or numbers.

A JSON number is a double to most readers (JavaScript's ``JSON.parse``, jq): an integer past 2**53 - 1 comes back
as a neighbour, so two episode ids (63-bit, see ``trajstore.write.episode_ids``) read as one. So every JSON body the
service writes follows one rule (:func:`trajstore.remote.wire.json_rows` for rows of tables, :data:`EpisodeIdText`
and :data:`SafeInt` for the fields of response models):

- ``episode_id`` is always a decimal string;
- any other integer beyond ±(2**53 - 1) (``Number.MAX_SAFE_INTEGER``) is a decimal string too, every other
  integer a number.

Every input that takes a 64-bit integer (an episode id in a path, the ``episode_id``, ``seed`` and
``policy_version`` filters) takes it as a decimal string or a number (:data:`Int64`); in a URL the two are the
same characters, and the OpenAPI document says both. Arrow answers keep ``int64``.

>>> INT64_TEXT.match("9223372036854775807") is not None, INT64_TEXT.match("9223372036854775808") is None
(True, True)
"""

from __future__ import annotations

import re
from typing import Annotated, Any

from pydantic import PlainSerializer, WithJsonSchema

from trajstore.remote.wire import MAX_SAFE_INT, exact_int

INT64_MIN, INT64_MAX = -(2**63), 2**63 - 1
INT64 = {"ge": INT64_MIN, "le": INT64_MAX}  # the bounds a Path or Query of an int64 checks


def _at_most(limit: str) -> str:
    """A regex of the decimal numbers (no leading zeros) from 0 to ``limit``."""
    shorter = f"0|[1-9][0-9]{{0,{len(limit) - 2}}}" if len(limit) > 1 else ""
    same = [limit]
    for i, digit in enumerate(limit):
        low = "1" if i == 0 else "0"
        if int(digit) > int(low):
            same.append(f"{limit[:i]}[{low}-{int(digit) - 1}][0-9]{{{len(limit) - i - 1}}}")
    return "|".join(part for part in [shorter, *same] if part)


INT64_PATTERN = f"^(-({_at_most(str(-INT64_MIN))})|({_at_most(str(INT64_MAX))}))$"
INT64_TEXT = re.compile(INT64_PATTERN)

TEXT_SCHEMA: dict[str, Any] = {"type": "string", "pattern": INT64_PATTERN,
                               "description": "a 64-bit integer as a decimal string (exact in every JSON reader)"}
INPUT_SCHEMA: dict[str, Any] = {"anyOf": [{"type": "integer", "minimum": INT64_MIN, "maximum": INT64_MAX},
                                          TEXT_SCHEMA],
                                "description": "a 64-bit integer: a decimal string (exact in every language) or a "
                                               "number"}
SAFE_SCHEMA: dict[str, Any] = {"anyOf": [{"type": "integer", "minimum": -MAX_SAFE_INT, "maximum": MAX_SAFE_INT},
                                         TEXT_SCHEMA],
                               "description": "an integer: a number within ±(2**53 - 1), a decimal string beyond"}

# An input: a decimal string or a number (with Path(**INT64) or Query(**INT64) for its bounds).
Int64 = Annotated[int, WithJsonSchema(INPUT_SCHEMA)]

# An episode id in a response model: always a decimal string.
EpisodeIdText = Annotated[int, PlainSerializer(str, return_type=str, when_used="json"),
                          WithJsonSchema({**TEXT_SCHEMA, "description": "the episode's id, a decimal string (ids are "
                                                                        "63-bit: past what a double holds exactly)"})]

# Another int64 in a response model: a number where a double holds it exactly, else a decimal string.
SafeInt = Annotated[int, PlainSerializer(exact_int, when_used="json"), WithJsonSchema(SAFE_SCHEMA)]

ROW_DESCRIPTION = ("one object per row, its columns as keys: episode_id a decimal string, any other integer beyond "
                   "±(2**53 - 1) a decimal string too (every other integer a number), NaN and infinities null")
ROW_SCHEMA: dict[str, Any] = {"type": "object", "description": ROW_DESCRIPTION,
                              "properties": {"episode_id": {"anyOf": [TEXT_SCHEMA, {"type": "null"}]}},
                              "additionalProperties": True}
ROWS_SCHEMA: dict[str, Any] = {"type": "array", "items": ROW_SCHEMA}
