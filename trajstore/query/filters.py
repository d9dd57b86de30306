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
import functools
import inspect
import numbers
from dataclasses import dataclass, field
from typing import Any, Callable, Iterable, Mapping, Sequence, TypeVar, Union

import numpy as np
import pyarrow as pa

from trajstore import schema as sch
from trajstore.errors import InputError, RunNotFoundError, UnknownColumnError

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


# --- a selection of runs, environments and episodes given as keywords -----------------------------------------

Names = Union[str, Sequence[str], None]  # one name, several, or none (no condition)
Ids = Union[int, Sequence[int], None]


def names_of(value: Names) -> list[str]:
    """One name, several, or a comma-separated list of them (as the CLI and REST accept), as a list."""
    items = [value] if isinstance(value, str) else list(value or ())
    return [n.strip() for item in items for n in str(item).split(",") if n.strip()]


def selected(value: str, wanted: Names) -> bool:
    """Whether ``value`` is chosen by ``wanted`` (one name, several, or None for all)."""
    if wanted is None:
        return True
    return value == wanted if isinstance(wanted, str) else value in wanted


def both(a: Any, b: Any) -> Any:
    """The selection of two keywords: one if the other is absent, else their intersection."""
    if b in (None, []):
        return a
    if a is None:
        return b
    a_set = {a} if isinstance(a, (str, int, np.integer)) else set(np.atleast_1d(a).tolist())
    return [v for v in b if v in a_set]


def check_runs(selections: Iterable[Names], held: Iterable[str], store: str) -> None:
    """The one run-existence check (every reader, delete, compact, export and the service's routes): a
    :class:`~trajstore.errors.RunNotFoundError` naming each run of ``selections`` (each a run id, several, or
    None) that is not among ``held``, the runs the store at ``store`` holds."""
    wanted = list(dict.fromkeys(r for sel in selections if sel is not None
                                for r in ([sel] if isinstance(sel, str) else map(str, sel))))
    if not wanted:
        return
    known = sorted(set(held))
    missing = [r for r in wanted if r not in known]
    if missing:
        raise RunNotFoundError.naming(missing, store, known)


# --- the filter keywords on a reader method -------------------------------------------------------------------

F = TypeVar("F", bound=Callable[..., Any])


def filtered(method: F | None = None, *, expand: bool = False,
             around: Callable[[Any, Callable[..., Any], tuple[Any, ...], dict[str, Any]], Any] | None = None) -> Any:
    """The filter keywords of :func:`keywords` (``min_return=``, ``mode=``, …) on a reader method, the one
    decorator of the Store's readers and the Client's: each keyword the method does not name itself (a name it
    gives a meaning of its own, ``seed`` for a shuffle, keeps it: that filter goes in ``filter=``) is added to its
    signature, and what the caller gives of them is folded into one :class:`EpisodeFilter` with ``filter=``.

    The method then gets ``filter=`` (the Store's), or with ``expand`` the filter's own keywords (the Client's,
    which sends them as the REST service's query parameters of the same names; a keyword it does not know is a
    :class:`TypeError`). ``around(self, method, args, kwargs)``, when given, makes the call (the Store's checks
    the runs selected and names a failing ``where``)."""
    if method is None:
        return lambda m: filtered(m, expand=expand, around=around)
    own = inspect.signature(method)
    types = keywords()
    added = [name for name in types if name not in own.parameters]

    @functools.wraps(method)
    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        given = {name: kwargs.pop(name) for name in added if name in kwargs}
        flt = from_keywords(kwargs.pop("filter", None), given)
        if expand:
            unknown = [k for k in kwargs if k not in own.parameters]
            if unknown:
                raise TypeError(f"{method.__name__}() got an unexpected keyword argument {unknown[0]!r}; its filters "
                                f"are {', '.join(added)} and filter=")
            sent = flt.keywords() if flt is not None else {}
            clash = sorted(set(sent) & set(kwargs))
            if clash:  # a keyword the method has a meaning of its own for, given twice (`seed`: the shuffle's)
                raise TypeError(f"{method.__name__}() got multiple values for keyword argument {clash[0]!r}")
            kwargs.update(sent)
        elif flt is not None or "filter" in kwargs or "filter" in own.parameters:
            kwargs["filter"] = flt
        return method(self, *args, **kwargs) if around is None else around(self, method, args, kwargs)

    kept = [p for p in own.parameters.values() if p.kind is not inspect.Parameter.VAR_KEYWORD]
    extra = [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=types[name])
             for name in added]
    if "filter" not in own.parameters:
        extra.append(inspect.Parameter("filter", inspect.Parameter.KEYWORD_ONLY, default=None,
                                       annotation="EpisodeFilter | None"))
    call.__signature__ = own.replace(parameters=kept + extra)  # type: ignore[attr-defined]
    return call
