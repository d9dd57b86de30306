"""What the benchmarks measure with: repeated timings of one method (wall clock and the process's CPU time),
the targets checked against them, and a process's memory as ``/proc`` tells it."""

from __future__ import annotations

import gc
import statistics
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable


@dataclass
class Timing:
    """Repeated wall-clock (and process CPU, all threads) timings of one method over ``steps`` steps."""

    name: str
    steps: int
    note: str = ""
    seconds: list[float] = field(default_factory=list)
    cpu: list[float] = field(default_factory=list)

    @property
    def median(self) -> float:
        return statistics.median(self.seconds)

    @property
    def rate(self) -> float:
        return self.steps / self.median

    @property
    def cpu_median(self) -> float:
        return statistics.median(self.cpu)

    @property
    def cores(self) -> float:
        """The median of CPU seconds per wall-clock second: how many cores the method kept busy."""
        return statistics.median(c / s for c, s in zip(self.cpu, self.seconds))

    def add(self, fn: Callable[[], Any]) -> Any:
        """Time one run of ``fn`` (after a garbage collection, so that none falls inside) and return its result."""
        gc.collect()
        c0, t0 = time.process_time(), time.perf_counter()
        out = fn()
        self.seconds.append(time.perf_counter() - t0)
        self.cpu.append(time.process_time() - c0)
        return out


@dataclass
class Check:
    """A target: ``measured`` must be at least (``higher_is_better``) or at most ``required``."""

    what: str
    measured: float
    required: float
    higher_is_better: bool = True

    @property
    def passed(self) -> bool:
        return self.measured >= self.required if self.higher_is_better else self.measured <= self.required


def status_kib(field: str, pid: int | str = "self") -> int:
    """A ``/proc/<pid>/status`` memory field in KiB (``VmRSS``, ``VmHWM``, ``RssAnon``, ``RssFile``); 0 where
    the kernel has none."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith(field + ":"):
            return int(line.split()[1])
    return 0
