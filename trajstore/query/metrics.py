"""Episode metrics: what a comparison (and every reader that takes ``metric=``) measures of each episode — a column
of the ``episodes`` view (``episode_return``, ``episode_length``, …), or ``agg(column)`` of a step column over the
episode's steps, with ``agg`` one of ``last``, ``first`` (by step), ``sum``, ``mean``, ``min``, ``max``:
``metric="last(is_success)"`` is 1 for an episode that ended in success, a success rate when averaged."""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Sequence

from trajstore.errors import InputError
from trajstore.query import sql
from trajstore.query.sql import STEP_AGGREGATES

FORM = re.compile(r"^\s*(\w+)\s*\(\s*([^()]+?)\s*\)\s*$")
COLUMN = "__metric"  # the column a metric is computed into


@dataclass(frozen=True)
class Metric:
    """``column`` of the ``episodes`` view (``agg`` None), or ``agg`` of the step column ``column``."""

    text: str
    column: str
    agg: str | None
    name: str = COLUMN

    @classmethod
    def parse(cls, text: str, episode_columns: Sequence[str], step_columns: Sequence[str], *,
              name: str = COLUMN) -> Metric:
        """The metric ``text`` names (computed into the column ``name``), checked against the views' columns; an
        :class:`InputError` naming ``metric`` and what it may be otherwise."""
        if not isinstance(text, str):
            raise InputError(f"metric: expected a column name or agg(column), got {type(text).__name__}")
        if text in episode_columns:
            return cls(text, text, None, name)
        found = FORM.match(text)
        aggs = ", ".join(STEP_AGGREGATES)
        if found is None:
            raise InputError(f"metric: {text!r} is not a column of episodes ({', '.join(episode_columns)}) nor "
                             f"agg(column) with agg one of {aggs}")
        agg, column = found.group(1).lower(), found.group(2)
        if agg not in STEP_AGGREGATES:
            raise InputError(f"metric: unknown aggregate {agg!r} in {text!r}; expected one of {aggs}")
        if column not in step_columns:
            raise InputError(f"metric: {column!r} in {text!r} is not a column of steps; expected one of "
                             f"{', '.join(step_columns)}")
        return cls(text, column, agg, name)

    def source(self, source: str) -> str:
        """``source`` (rows of the ``episodes`` view) with this metric as the column :attr:`name`."""
        return sql.with_metric(source, self.name, self.column, self.agg)
