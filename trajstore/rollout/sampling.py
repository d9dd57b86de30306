"""When a rollout stops, and what it reports.

:func:`sample_until` follows ``imitation.data.rollout.make_sample_until``: with both limits given,
both must be reached. One difference is deliberate: imitation drops unfinished trajectories, so it
counts only their steps; trajstore stores every step (unfinished episodes are kept and marked
incomplete), so ``min_timesteps`` counts every stored step.

>>> until = sample_until(min_episodes=2)
>>> until(episodes=1, timesteps=50), until(episodes=2, timesteps=60)
(False, True)
"""

from __future__ import annotations

from collections import deque
from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np

from trajstore.errors import InputError

SampleUntil = Callable[..., bool]
"""``until(episodes=complete_episodes, timesteps=stored_steps) -> bool``: stop when True."""


def sample_until(min_timesteps: int | None = None, min_episodes: int | None = None) -> SampleUntil:
    """A stop rule: at least ``min_timesteps`` stored steps and at least ``min_episodes`` complete episodes."""
    if min_timesteps is None and min_episodes is None:
        raise InputError("sample_until: give min_timesteps (steps) or min_episodes (episodes), or both")
    for name, value in (("min_timesteps", min_timesteps), ("min_episodes", min_episodes)):
        if value is not None and (not isinstance(value, int) or isinstance(value, bool) or value < 1):
            raise InputError(f"{name} must be a positive integer, got {value!r}")

    def until(*, episodes: int, timesteps: int) -> bool:
        if min_episodes is not None and episodes < min_episodes:
            return False
        return min_timesteps is None or timesteps >= min_timesteps

    return until


@dataclass
class RolloutResult:
    """What a rollout stored: steps, complete episodes, their returns and lengths, and how long it took."""

    run_id: str
    env_id: str
    steps: int = 0
    episodes: int = 0
    seconds: float = 0.0
    episode_returns: list[float] = field(default_factory=list)
    episode_lengths: list[int] = field(default_factory=list)

    @property
    def steps_per_second(self) -> float:
        return self.steps / self.seconds if self.seconds > 0 else 0.0

    def __repr__(self) -> str:  # a summary: the per-episode lists can hold millions of entries
        returns, lengths = np.asarray(self.episode_returns), np.asarray(self.episode_lengths)
        means = (f", return_mean={returns.mean():.4g}, length_mean={lengths.mean():.4g}"
                 if len(returns) and len(lengths) else "")
        return (f"RolloutResult(run_id={self.run_id!r}, env_id={self.env_id!r}, steps={self.steps}, "
                f"episodes={self.episodes}, seconds={self.seconds:.3g}{means})")


class RecentReturns:
    """Mean return of the last ``window`` complete episodes, for progress bars."""

    def __init__(self, window: int = 100) -> None:
        self._last: deque[float] = deque(maxlen=window)

    def extend(self, returns: list[float]) -> None:
        self._last.extend(returns)

    @property
    def mean(self) -> float | None:
        return sum(self._last) / len(self._last) if self._last else None


def check_seed(seed: Any) -> int:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise InputError(f"seed: must be an integer, got {seed!r}")
    return int(seed)


def check_positive(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise InputError(f"{name}: must be a positive integer, got {value!r}")
    return int(value)
