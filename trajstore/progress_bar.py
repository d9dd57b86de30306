"""Progress bars: tqdm's where tqdm is installed (it comes with the ``gym`` and ``jax`` extras), else a plain
counter on one line of stderr, so that a core installation still shows a long compaction or export moving.

>>> with bar(total=3, desc="compact", unit="partition", enabled=False) as b:
...     b.update(1)
"""

from __future__ import annotations

import sys
import time
from typing import Any, Mapping, Protocol, TextIO


class Bar(Protocol):
    """What trajstore asks of a bar (tqdm's names): a count ``n``, ``update``, a postfix, ``close``."""

    n: int

    def update(self, n: int = 1) -> Any: ...

    def set_postfix(self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True) -> None: ...

    def close(self) -> None: ...

    def __enter__(self) -> Bar: ...

    def __exit__(self, *exc: object) -> None: ...


def bar(*, total: int | None, desc: str, unit: str, enabled: bool = True, unit_scale: bool = False) -> Bar:
    """A bar counting ``unit`` s up to ``total`` (None: no total); drawing nothing when not ``enabled``."""
    try:
        from tqdm.auto import tqdm
    except ImportError:
        return PlainBar(total=total, desc=desc, unit=unit, enabled=enabled)
    return tqdm(total=total, desc=desc, unit=unit, disable=not enabled, dynamic_ncols=True, unit_scale=unit_scale)


class PlainBar:
    """``desc: n/total unit, postfix`` on one line of ``stream`` (stderr), redrawn at most every ``min_interval``
    seconds and once more when closed, then ended with a newline."""

    def __init__(self, *, total: int | None, desc: str, unit: str, enabled: bool = True, min_interval: float = 0.5,
                 stream: TextIO | None = None) -> None:
        self.n, self.total, self.desc, self.unit = 0, total, desc, unit
        self.enabled, self.min_interval = enabled, min_interval
        self.stream = stream or sys.stderr
        self._postfix, self._drawn, self._width = "", float("-inf"), 0

    def update(self, n: int = 1) -> None:
        self.n += n
        self._draw()

    def set_postfix(self, ordered_dict: Mapping[str, Any] | None = None, refresh: bool = True) -> None:
        self._postfix = ", ".join(f"{k}={v}" for k, v in (ordered_dict or {}).items())
        if refresh:
            self._draw()

    def close(self) -> None:
        if self.enabled and self._width:
            self._draw(force=True)
            self.stream.write("\n")
            self.stream.flush()
        self.enabled = False

    def __enter__(self) -> PlainBar:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _draw(self, force: bool = False) -> None:
        now = time.monotonic()
        if not self.enabled or (not force and now - self._drawn < self.min_interval):
            return
        self._drawn = now
        count = f"{self.n}/{self.total}" if self.total is not None else f"{self.n}"
        line = f"{self.desc}: {count} {self.unit}" + (f", {self._postfix}" if self._postfix else "")
        self.stream.write("\r" + line.ljust(self._width))
        self.stream.flush()
        self._width = len(line)
