"""Typed episode filters: which episodes to keep, as values (rendered as SQL by :mod:`trajstore.query.sql`).

Used by the REST service and the client, so that a filter given as query parameters never reaches SQL as
raw text, and by :class:`~trajstore.store.Store` methods (``filter=``). :func:`keywords` lists the filter
keywords every reader takes, on the Store and the Client alike (``min_return=``, ``mode=``, …): the fields of
:class:`EpisodeFilter` with each lineage column of the ``episodes`` view under its own name, as the REST
service's query parameters name them.

>>> EpisodeFilter(run_id=["a"], min_return=10, lineage={"mode": ["eval"]}).per_episode()
EpisodeFilter(run_id=None, env_id=None, episode_id=None, complete=None, terminated=None, truncated=None, \
min_return=10, max_return=None, min_length=None, max_length=None, lineage={'mode': ['eval']})
"""

from __future__ import annotations

import dataclasses
import numbers
from dataclasses import dataclass, field
from typing import Any, Mapping

import pyarrow as pa

from trajstore import schema as sch
from trajstore.errors import InputError, UnknownColumnError

LISTS = ("run_id", "env_id", "episode_id")  # one value or several
FLAGS = ("complete", "terminated", "truncated")
BOUNDS = {"min_return": float, "max_return": float, "min_length": int, "max_length": int}


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

    @classmethod
    def of(cls, **values: Any) -> EpisodeFilter:
        """The filter of reader keywords (see :func:`keywords`): a run, env or episode id or a list of them, a
        flag, a bound, or a lineage column's value(s); ``None`` means no condition. Bad values raise
        :class:`InputError` naming the keyword."""
        unknown = sorted(set(values) - set(keywords()))
        if unknown:
            raise InputError(f"{unknown[0]}: not a filter; the filters are {', '.join(keywords())}")
        fields: dict[str, Any] = {}
        for name, value in values.items():
            if value is None:
                continue
            if name in FLAGS and not isinstance(value, bool):
                raise InputError(f"{name}: expected True, False or None, got {value!r}")
            if name in BOUNDS and (isinstance(value, bool) or not isinstance(value, numbers.Real)):
                raise InputError(f"{name}: expected a number, got {value!r}")
            fields[name] = _listed(value) if name in LISTS or name not in EPISODE_FIELDS else value
        lineage = {k: fields.pop(k) for k in list(fields) if k not in EPISODE_FIELDS}
        return cls(**fields, lineage=lineage)

    def merged(self, other: EpisodeFilter) -> EpisodeFilter:
        """Both filters' conditions; a condition both set to different values is an :class:`InputError`."""
        out = dataclasses.replace(self, lineage=dict(self.lineage))
        for name in EPISODE_FIELDS:
            mine, theirs = getattr(self, name), getattr(other, name)
            if theirs in (None, []):
                continue
            if mine not in (None, []) and mine != theirs:
                raise InputError(f"{name}: given both as a keyword ({theirs!r}) and in filter= ({mine!r})")
            setattr(out, name, theirs)
        for name, values in other.lineage.items():
            if out.lineage.get(name) and out.lineage[name] != values:
                raise InputError(f"{name}: given both as a keyword ({values!r}) and in filter= "
                                 f"({out.lineage[name]!r})")
            out.lineage[name] = values
        return out

    def keywords(self) -> dict[str, Any]:
        """The reader keywords of this filter (those with a condition), as :meth:`of` takes them and the REST
        service's query parameters name them."""
        out = {k: v for k, v in dataclasses.asdict(self).items() if k != "lineage" and v not in (None, [])}
        return {**out, **{k: v for k, v in self.lineage.items() if v}}


EPISODE_FIELDS = tuple(f.name for f in dataclasses.fields(EpisodeFilter) if f.name != "lineage")


def keywords() -> dict[str, str]:
    """Every filter keyword of the readers and the type it takes (as text, for signatures): the fields of
    :class:`EpisodeFilter`, then the lineage columns of the ``episodes`` view."""
    types = {"run_id": "str | Sequence[str] | None", "env_id": "str | Sequence[str] | None",
             "episode_id": "int | Sequence[int] | None", **{f: "bool | None" for f in FLAGS},
             **{b: f"{t.__name__} | None" for b, t in BOUNDS.items()}}
    lineage = sch.lineage_columns()
    for name in sch.episode_lineage():
        kind = "str" if pa.types.is_string(lineage[name]) else "int"
        types[name] = f"{kind} | Sequence[{kind}] | None"
    return types


def from_keywords(filter: EpisodeFilter | None, values: Mapping[str, Any]) -> EpisodeFilter | None:  # noqa: A002
    """``filter`` with the conditions of the keywords ``values`` added (None when there are none at all)."""
    given = {k: v for k, v in values.items() if v is not None}
    if not given:
        return filter
    extra = EpisodeFilter.of(**given)
    return extra if filter is None else filter.merged(extra)


def _listed(value: Any) -> list[Any]:
    """One value or several as a list (numpy integers as ints)."""
    items = [value] if isinstance(value, (str, bytes, numbers.Integral)) else list(value)
    return [int(v) if isinstance(v, numbers.Integral) and not isinstance(v, bool) else v for v in items]
