"""Typed episode filters rendered as SQL conditions over the ``episodes`` view (every value quoted).

Used by the REST service and the client, so that a filter given as query parameters never reaches
SQL as raw text.

>>> EpisodeFilter(run_id=["a"], min_return=10, lineage={"mode": ["eval"]}).conditions()
["run_id IN ('a')", 'episode_return >= 10.0', '"mode" IN (\\'eval\\')']
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from trajstore.query import quote_ident, quote_literal

LINEAGE_FILTERS = ("policy_version", "mode", "worker_id", "seed", "env_index")


def in_list(column: str, values: list[Any]) -> str:
    items = ", ".join(quote_literal(str(v)) for v in values)
    return f"{quote_ident(column) if column in LINEAGE_FILTERS else column} IN ({items})" if items else "false"


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

    def conditions(self) -> list[str]:
        conds = [in_list(name, values) for name, values in
                 (("run_id", self.run_id), ("env_id", self.env_id)) if values]
        if self.episode_id:
            conds.append(f"episode_id IN ({', '.join(str(int(i)) for i in self.episode_id)})")
        for name in ("complete", "terminated", "truncated"):
            value = getattr(self, name)
            if value is not None:
                conds.append(name if value else f"NOT {name}")
        bounds = (("episode_return", ">=", self.min_return), ("episode_return", "<=", self.max_return),
                  ("episode_length", ">=", self.min_length), ("episode_length", "<=", self.max_length))
        conds += [f"{col} {op} {float(v)!r}" for col, op, v in bounds if v is not None]
        conds += [in_list(name, values) for name, values in self.lineage.items() if values]
        return conds

    def where(self) -> str | None:
        """The conditions joined with AND, or ``None`` when there are none."""
        return " AND ".join(self.conditions()) or None
