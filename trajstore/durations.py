"""Durations, in one grammar for every flag, setting and option that takes one: a number and its unit —
``500ms``, ``90s``, ``30m``, ``12h``, ``7d``, ``2w`` (``sec`` and ``min`` too), ``0s`` for none — or a number
(a Python number, a timedelta) of seconds. Text needs its unit (``--older-than 60`` was minutes once, and a
deletion must not guess), except where the name says it: a ``TRAJSTORE_*_S`` setting's ``10``, and an object store
``timeout``'s ``"5"``, are seconds.
``trajstore vacuum --older-than``, ``check --remove-orphans --older-than``, ``vacuum(older_than=)``, the
``TRAJSTORE_*_S`` settings and the object store's ``timeout``/``connect_timeout``/``retry_timeout`` options all read
it with :func:`seconds`.

>>> seconds("7d"), seconds("500ms"), seconds(90), seconds("1.5 h"), seconds("10", bare_seconds=True)
(604800.0, 0.5, 90.0, 5400.0, 10.0)
>>> text(604800.0), text(5400.0), text(0.5)
('7d', '90m', '0.5s')
"""

from __future__ import annotations

import re
from datetime import timedelta
from typing import Any

from trajstore.errors import InputError

UNITS = {"ms": 0.001, "s": 1.0, "sec": 1.0, "m": 60.0, "min": 60.0, "h": 3600.0, "d": 86400.0, "w": 7 * 86400.0}
GRAMMAR = re.compile(r"^\s*(\d+(?:\.\d*)?|\.\d+)\s*(ms|sec|s|min|m|h|d|w)?\s*$")
EXAMPLES = "7d, 12h, 30m, 90s or 500ms"


def seconds(value: Any, field: str = "duration", *, minimum: float = 0.0, inclusive: bool = True,
            bare_seconds: bool = False) -> float:
    """``value`` (a number of seconds, a :class:`~datetime.timedelta`, or text of the grammar) in seconds; an
    :class:`InputError` naming ``field`` when it is not a duration, or below ``minimum`` (``inclusive``: equal is
    allowed). ``bare_seconds``: text without a unit is seconds (a setting whose name says so)."""
    if isinstance(value, timedelta):
        out = value.total_seconds()
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        out = float(value)
    elif isinstance(value, str) and (m := GRAMMAR.match(value)) and (m.group(2) or bare_seconds):
        out = float(m.group(1)) * UNITS[m.group(2) or "s"]
    else:
        raise InputError(f"{field}: expected a duration such as {EXAMPLES}, got {value!r}")
    if out < minimum or (out == minimum and not inclusive) or out != out:
        bound = f">= {text(minimum)}" if inclusive else f"> {text(minimum)}"
        raise InputError(f"{field}: must be a duration {bound} such as {EXAMPLES}, got {value!r}")
    return out


def text(value: float) -> str:
    """``value`` seconds as :func:`seconds` reads it back, in the largest whole unit of days, hours, minutes or
    seconds (7d, not 1w), else in seconds."""
    for unit in ("d", "h", "m"):
        if value >= UNITS[unit] and value % UNITS[unit] == 0:
            return f"{int(value // UNITS[unit])}{unit}"
    return f"{value:g}s"
