"""Typed episode filters: which episodes to keep, as values (rendered as SQL by :mod:`trajstore.query.sql`).

Used by the REST service and the client, so that a filter given as query parameters never reaches SQL as
raw text, and by :class:`~trajstore.store.Store` methods (``filter=``).

>>> EpisodeFilter(run_id=["a"], min_return=10, lineage={"mode": ["eval"]}).per_episode()
EpisodeFilter(run_id=None, env_id=None, episode_id=None, complete=None, terminated=None, truncated=None, \
min_return=10, max_return=None, min_length=None, max_length=None, lineage={'mode': ['eval']})
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any

from trajstore import schema as sch
import pyarrow as pa

from trajstore.errors import InputError, UnknownColumnError


@dataclass
class EpisodeFilter:
    """Which episodes to keep; ``None`` (or empty) means no condition."""

    run_id: list[str] | None = None
    env_id: list[str] | None = None
    episode_id: list[int] | None = None
    complete: bool | None = None
    terminated: bool | None = None
    truncated: bool | None = None
    min_return: float | None = None
    max_return: float | None = None
    min_length: int | None = None
    max_length: int | None = None
    lineage: dict[str, list[Any]] = field(default_factory=dict)

    def __post_init__(self) -> None:
        known = sch.episode_lineage()
        unknown = [k for k in self.lineage if k not in known]
        if unknown:
            raise UnknownColumnError(f"lineage: unknown column(s) {unknown} of episodes; expected some of {known}")
        types = sch.lineage_columns()
        for name, values in self.lineage.items():
            want = str if pa.types.is_string(types[name]) else int
            bad = [v for v in values if not isinstance(v, want) or isinstance(v, bool)]
            if bad:
                raise InputError(f"lineage[{name!r}]: expected {want.__name__} values, got {bad}")

    def per_episode(self) -> EpisodeFilter:
        """The conditions that need the ``episodes`` view (run, env and episode ids select steps directly)."""
        return dataclasses.replace(self, run_id=None, env_id=None, episode_id=None)

    def is_empty(self) -> bool:
        return not any(v not in (None, [], {}) for v in dataclasses.asdict(self).values())
