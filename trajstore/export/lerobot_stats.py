"""LeRobot's feature statistics, per episode and over the whole dataset, computed a group of episodes at a time.

LeRobot v3.0 keeps, for every feature, ``min, max, mean, std, count, q01, q10, q50, q90, q99`` per episode (the
``stats/<feature>/<stat>`` columns of ``meta/episodes``) and over the dataset (``meta/stats.json``), with the
shapes of ``lerobot.datasets.compute_stats``: each statistic reduces the steps and every axis of a step but the
last (a scalar feature gives shape ``[1]``, a vector of ``k`` values ``[k]``), ``count`` is the episode's number
of frames. The dataset's statistics combine the episodes' as ``aggregate_stats`` does (count-weighted means and
quantiles, the parallel variance formula), streaming: :class:`Totals` holds sums, never the episodes.

Quantiles per episode are exact (numpy's linear interpolation), where LeRobot's recorder estimates them from a
5,000-bin histogram; both describe the same distribution.
"""

from __future__ import annotations

import numpy as np

QUANTILES = {"q01": 0.01, "q10": 0.10, "q50": 0.50, "q90": 0.90, "q99": 0.99}
STATS = ("min", "max", "mean", "std", "count", *QUANTILES)


def episode_stats(values: np.ndarray, lengths: np.ndarray, *, ordered: bool = False) -> dict[str, np.ndarray]:
    """The statistics of each episode of ``values`` (the steps of consecutive episodes of ``lengths`` steps,
    shaped ``(steps, *step_shape)``): each an ``(episodes, d)`` array (float64; ``count`` int64, ``(episodes,
    1)``), ``d`` the last axis of a step (1 for a scalar). ``ordered``: the values never decrease within an
    episode (frame indices, timestamps), so quantiles need no sort."""
    n = len(values)
    d = values.shape[-1] if values.ndim > 1 else 1
    rows = values.reshape(n, -1, d)
    per_step = rows.shape[1]  # rows of d values in one step
    x = rows.reshape(-1, d).astype(np.float64)
    size = lengths.astype(np.int64) * per_step
    starts = (np.cumsum(size) - size).astype(np.int64)
    mean = np.add.reduceat(x, starts, axis=0) / size[:, None]
    spread = np.add.reduceat((x - np.repeat(mean, size, axis=0)) ** 2, starts, axis=0) / size[:, None]
    out = {"min": np.minimum.reduceat(x, starts, axis=0), "max": np.maximum.reduceat(x, starts, axis=0),
           "mean": mean, "std": np.sqrt(spread), "count": lengths.astype(np.int64)[:, None]}
    if values.dtype == np.bool_:
        out.update(_flag_quantiles(x, starts, size))
    else:
        out.update(_quantiles(x, starts, size, ordered=ordered))
    return out


def _positions(starts: np.ndarray, size: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For each segment and quantile: the order statistic below it, the one above, and the weight of the
    one above (numpy's linear interpolation)."""
    q = np.array(list(QUANTILES.values()))
    position = starts[:, None] + q[None, :] * (size - 1)[:, None]  # (segments, quantiles)
    lo = np.floor(position).astype(np.int64)
    return lo, np.minimum(lo + 1, (starts + size - 1)[:, None]), position - lo


def _quantiles(x: np.ndarray, starts: np.ndarray, size: np.ndarray, *, ordered: bool) -> dict[str, np.ndarray]:
    """Each segment's quantiles of each column of ``x``, by linear interpolation between order statistics."""
    lo, hi, frac = _positions(starts, size)
    segment = np.repeat(np.arange(len(starts), dtype=np.float64), size)
    out = np.empty((lo.shape[1], len(starts), x.shape[1]))
    for j in range(x.shape[1]):
        ordered_values = x[:, j] if ordered else x[_segment_order(x[:, j], segment), j]
        out[:, :, j] = (ordered_values[lo] + frac * (ordered_values[hi] - ordered_values[lo])).T
    return {name: out[i] for i, name in enumerate(QUANTILES)}


def _segment_order(v: np.ndarray, segment: np.ndarray) -> np.ndarray:
    """The order that sorts ``v`` within each (consecutive) segment: one sort of ``v`` shifted by a
    multiple of its range per segment (segments cannot mix; equal-looking keys only swap values closer than
    the keys' rounding, which leaves the quantiles as they are to that precision), a two-key sort when ``v``
    is not all finite."""
    low, high = (float(v.min()), float(v.max())) if len(v) else (0.0, 0.0)
    if not (np.isfinite(low) and np.isfinite(high)):
        return np.lexsort((v, segment))
    return np.argsort((v - low) + segment * (2.0 * (high - low) + 1.0))


def _flag_quantiles(x: np.ndarray, starts: np.ndarray, size: np.ndarray) -> dict[str, np.ndarray]:
    """Quantiles of 0/1 flags without sorting: an episode's sorted flags are its zeros, then its ones."""
    lo, hi, frac = _positions(starts, size)
    out = np.empty((lo.shape[1], len(starts), x.shape[1]))
    for j in range(x.shape[1]):
        first_one = starts + size - np.add.reduceat(x[:, j], starts)  # position of the first 1 once sorted
        below, above = (lo >= first_one[:, None]), (hi >= first_one[:, None])
        out[:, :, j] = (below + frac * (above.astype(np.float64) - below)).T
    return {name: out[i] for i, name in enumerate(QUANTILES)}


class Totals:
    """The dataset's statistics of one feature, from its episodes' statistics added a group at a time."""

    def __init__(self) -> None:
        self.count = 0
        self._sums: dict[str, np.ndarray] = {}
        self._min: np.ndarray | None = None
        self._max: np.ndarray | None = None

    def add(self, stats: dict[str, np.ndarray]) -> None:
        c = stats["count"].astype(np.float64)  # (episodes, 1)
        terms = {"mean": stats["mean"] * c, "square": (stats["std"] ** 2 + stats["mean"] ** 2) * c,
                 **{k: stats[k] * c for k in QUANTILES}}
        for k, v in terms.items():
            self._sums[k] = self._sums.get(k, 0.0) + v.sum(axis=0)
        low, high = stats["min"].min(axis=0), stats["max"].max(axis=0)
        self._min = low if self._min is None else np.minimum(self._min, low)
        self._max = high if self._max is None else np.maximum(self._max, high)
        self.count += int(stats["count"].sum())

    def result(self) -> dict[str, list[float] | list[int]]:
        """``aggregate_feature_stats`` of every episode added, as JSON lists."""
        mean = self._sums["mean"] / self.count
        variance = np.maximum(self._sums["square"] / self.count - mean ** 2, 0.0)
        out = {"min": self._min, "max": self._max, "mean": mean, "std": np.sqrt(variance)}
        out.update({k: self._sums[k] / self.count for k in QUANTILES})
        return {k: [self.count] if k == "count" else np.asarray(out[k], np.float64).tolist() for k in STATS}
