"""A progress bar for rollouts: steps/s, episodes done and the mean return of the latest episodes; or, for a
rollout that is one of many (a Ray worker), a report of its counts to whoever draws the bar."""

from __future__ import annotations

import time
from typing import Any, Callable, Union

from trajstore.progress_bar import bar
from trajstore.rollout.sampling import RecentReturns

Report = Callable[[int, int], None]
"""``report(steps, episodes)``: told a rollout's counts so far (at most every ``min_interval`` s, and at its end)."""
Progress = Union[bool, Report]


class RolloutProgress:
    """A progress bar (:mod:`trajstore.progress_bar`) counting episodes (when an episode target is given) or steps;
    a no-op when disabled; with a :data:`Report` instead of a bool, no bar: the counts go to it."""

    def __init__(self, *, episodes: int | None, steps: int | None, enabled: Progress = True,
                 min_interval: float = 0.25, desc: str = "rollout") -> None:
        self.by_episodes = episodes is not None
        self.total = episodes if self.by_episodes else steps
        self.report: Report | None = enabled if callable(enabled) else None
        self.enabled = bool(enabled) and self.report is None
        self.min_interval = min_interval
        self.desc = desc
        self.recent = RecentReturns()
        self._bar: Any = None
        self._shown = 0
        self._last = 0.0
        self._start = 0.0

    def __enter__(self) -> RolloutProgress:
        self._start = time.perf_counter()
        if self.enabled:
            self._bar = bar(total=self.total, unit="ep" if self.by_episodes else "step", desc=self.desc,
                            unit_scale=not self.by_episodes)
        return self

    def update(self, *, steps: int, episodes: int, returns: list[float] | None = None) -> None:
        if returns:
            self.recent.extend(returns)
        if self.report is not None:
            now = time.perf_counter()
            if now - self._last >= self.min_interval:
                self._last = now
                self.report(steps, episodes)
            return
        if self._bar is None:
            return
        now = time.perf_counter()
        if now - self._last < self.min_interval:
            return
        self._refresh(now, steps, episodes)

    def _refresh(self, now: float, steps: int, episodes: int) -> None:
        self._last = now
        rate = steps / max(now - self._start, 1e-9)
        postfix = {"steps/s": f"{rate:,.0f}", "episodes": episodes}
        if self.recent.mean is not None:
            postfix["return(last100)"] = f"{self.recent.mean:.2f}"
        self._bar.set_postfix(postfix, refresh=False)
        done = episodes if self.by_episodes else steps
        self._bar.update(done - self._shown)
        self._shown = done

    def finish(self, *, steps: int, episodes: int) -> None:
        if self.report is not None:
            self.report(steps, episodes)
        if self._bar is not None:
            self._refresh(time.perf_counter(), steps, episodes)

    def __exit__(self, *exc: object) -> None:
        if self._bar is not None:
            self._bar.close()
