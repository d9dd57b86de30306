"""Every SQL string trajstore runs is built here, and only here (:mod:`trajstore.query.condition` renders its trees
with the quoting functions of this module).

Identifiers are always double-quoted and literals single-quoted (quotes doubled), whatever they hold;
numbers are formatted from ``int``/``float`` values, never pasted as text. The only SQL text that reaches
a query from outside is a caller's own ``where`` condition in their own process (the Python ``where=``
argument, the CLI's ``--where``), which is theirs to write and is always wrapped in parentheses. Nothing a
request to the service sends is ever pasted: its ``where=`` is parsed into a tree
(:mod:`trajstore.query.condition`) and typed filters (:class:`~trajstore.query.filters.EpisodeFilter`, the REST
parameters) are rendered here with every name and value quoted.

>>> ident('x") OR (1=1')
'"x"") OR (1=1"'
>>> in_list("run_id", ["a'b", "c"])
'"run_id" IN (\\'a\\'\\'b\\', \\'c\\')'
"""

from __future__ import annotations

import math
from typing import Any, Callable, Iterable, Mapping, Protocol, Sequence, Union

import numpy as np
import pyarrow as pa

from trajstore import schema as sch
from trajstore.errors import InputError
from trajstore.query.filters import EpisodeFilter
from trajstore.storage import decoding, summaries
from trajstore.storage.log import DataFile

STAT_KEYS = ("n_traj", "return_min", "return_mean", "return_std", "return_max",
             "len_min", "len_mean", "len_std", "len_max")

# --- quoting -------------------------------------------------------------------------------------------------


def ident(name: str) -> str:
    """``name`` as a double-quoted identifier (any text, quotes doubled)."""
    if not isinstance(name, str):
        raise InputError(f"column name: expected a string, got {type(name).__name__}")
    return '"' + name.replace('"', '""') + '"'


def literal(value: Any) -> str:
    """A Python value as a SQL literal: strings quoted, numbers formatted, ``None`` as NULL."""
    if value is None:
        return "NULL"
    if isinstance(value, (bool, np.bool_)):
        return "true" if value else "false"
    if isinstance(value, (int, np.integer)):
        return str(int(value))
    if isinstance(value, (float, np.floating)):
        if not math.isfinite(value):
            raise InputError(f"expected a finite number, got {value}")
        return f"{float(value)!r}::DOUBLE"
    if isinstance(value, str):
        return "'" + value.replace("'", "''") + "'"
    raise InputError(f"cannot use a {type(value).__name__} as a SQL value: {value!r}")


def in_list(column: str, values: Any) -> str:
    """``"column" IN (v, …)``; one value or many; no values select nothing."""
    if isinstance(values, (str, int, np.integer)):
        values = [values]
    items = ", ".join(literal(v) for v in values)
    return f"{ident(column)} IN ({items})" if items else "false"


# --- a condition parsed from text (trajstore.query.condition renders its trees with these) --------------------


def operation(op: str, left: str | None, right: str) -> str:
    """``(left op right)``, or ``(op right)`` for a unary ``NOT`` or minus; ``op`` one the parser knows."""
    return f"({op} {right})" if left is None else f"({left} {op} {right})"


def call(function: str, args: Sequence[str]) -> str:
    """``function(a, b)``: a function of the parser's list of pure ones, over rendered arguments."""
    return f"{function}({', '.join(args)})"


def predicate(kind: str, operand: str, args: Sequence[str], negated: bool) -> str:
    """``operand [NOT] IN (…)``, ``[NOT] BETWEEN a AND b``, ``IS [NOT] NULL``, ``[NOT] LIKE|ILIKE p`` over rendered
    parts."""
    no = "NOT " if negated else ""
    if kind == "in":
        return f"({operand} {no}IN ({', '.join(args)}))"
    if kind == "between":
        return f"({operand} {no}BETWEEN {args[0]} AND {args[1]})"
    if kind == "null":
        return f"({operand} IS {no}NULL)"
    return f"({operand} {no}{kind.upper()} {args[0]})"


def where(conds: Sequence[str]) -> str:
    """`` WHERE a AND b`` (empty for no conditions)."""
    return f" WHERE {' AND '.join(conds)}" if conds else ""


class Rendered(Protocol):
    """A condition trajstore parsed and renders itself (:class:`~trajstore.query.condition.Condition`: the REST
    service's ``where=``)."""

    @property
    def sql(self) -> str: ...

    @property
    def columns(self) -> tuple[str, ...]: ...


Where = Union[str, Rendered]  # a condition over episodes: a caller's own SQL text, or one trajstore rendered


def user_condition(where: Where) -> str:
    """A caller's own SQL condition, parenthesised so that it cannot change the conditions around it; a parsed
    condition as trajstore renders it (every name and value quoted)."""
    return f"({where})" if isinstance(where, str) else where.sql


def order(keys: Sequence[tuple[str, bool]], *, tie: str | None = "episode_id") -> str:
    """`` ORDER BY "a" ASC|DESC, "b" ASC|DESC[, tie]`` for the ``(column, descending)`` keys."""
    out = " ORDER BY " + ", ".join(f"{ident(column)} {'DESC' if descending else 'ASC'}" for column, descending in keys)
    return out + (f", {ident(tie)}" if tie and tie not in [column for column, _ in keys] else "")


def page(limit: int | None, offset: int = 0) -> str:
    """`` LIMIT n OFFSET m`` (nothing without a limit); both must be whole numbers >= 0."""
    for name, value in (("limit", limit), ("offset", offset)):
        if value is not None and (not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 0):
            raise InputError(f"{name}: must be a whole number >= 0, got {value!r}")
    if limit is None:
        return f" OFFSET {int(offset)}" if offset else ""
    return f" LIMIT {int(limit)} OFFSET {int(offset)}"


def select_list(columns: Sequence[str]) -> str:
    """Quoted column names, or ``*`` for none."""
    return ", ".join(ident(c) for c in dict.fromkeys(columns)) if columns else "*"


# --- conditions ----------------------------------------------------------------------------------------------


def conditions(*, run_id: Any = None, env_id: Any = None, episode_id: Any = None, where: Where | None = None,
               filter: EpisodeFilter | None = None) -> list[str]:  # noqa: A002 - the public keyword
    """The conditions of the common filter keywords (each ``None`` for no condition)."""
    conds = []
    if run_id is not None:
        conds.append(in_list("run_id", run_id))
    if env_id is not None:
        conds.append(in_list("env_id", env_id))
    if episode_id is not None:
        conds.append(in_list("episode_id", np.atleast_1d(np.asarray(episode_id, np.int64)).tolist()))
    if filter is not None:
        conds += filter_conditions(filter)
    if where:
        conds.append(user_condition(where))
    return conds


def filter_conditions(flt: EpisodeFilter) -> list[str]:
    """The conditions of a typed episode filter over the ``episodes`` view (every name and value quoted)."""
    conds = [in_list(name, values) for name, values in
             (("run_id", flt.run_id), ("env_id", flt.env_id), ("episode_id", flt.episode_id)) if values]
    for name in ("complete", "terminated", "truncated"):
        value = getattr(flt, name)
        if value is not None:
            conds.append(ident(name) if value else f"NOT {ident(name)}")
    bounds = (("episode_return", ">=", flt.min_return), ("episode_return", "<=", flt.max_return),
              ("episode_length", ">=", flt.min_length), ("episode_length", "<=", flt.max_length))
    conds += [f"{ident(col)} {op} {literal(float(v))}" for col, op, v in bounds if v is not None]
    conds += [in_list(name, values) for name, values in flt.lineage.items() if values]
    return conds


def after_key(columns: Sequence[str], values: Sequence[Any], *, descending: bool = False) -> str:
    """Rows after ``values`` in the order of ``columns`` (a keyset cursor): ``a > x OR (a = x AND b > y)`` for
    ``(a, b) > (x, y)``, ``<`` when ``descending``; every value a quoted literal."""
    op = "<" if descending else ">"
    equal: list[str]
    ors, equal = [], []
    for column, value in zip(columns, values):
        ors.append(" AND ".join([*equal, f"{ident(column)} {op} {literal(value)}"]))
        equal.append(f"{ident(column)} = {literal(value)}")
    return "(" + " OR ".join(f"({c})" for c in ors) + ")"


def episodes_selected(conds: Sequence[str]) -> str:
    """A condition on ``steps`` keeping the episodes that ``conds`` (over ``episodes``) select."""
    return f"episode_id IN (SELECT episode_id FROM episodes{where(conds)})"


def step_conditions(filter: EpisodeFilter | None, where: Where | None) -> list[str]:  # noqa: A002
    """Conditions on ``steps`` for an episode filter and a ``where`` over ``episodes``: ids, runs and envs
    directly, the rest through ``episodes``."""
    if filter is None:
        return [episodes_selected([user_condition(where)])] if where else []
    direct = conditions(run_id=filter.run_id or None, env_id=filter.env_id or None,
                        episode_id=filter.episode_id or None)
    rest = conditions(filter=filter.per_episode(), where=where)
    return direct + ([episodes_selected(rest)] if rest else [])


# --- the views -----------------------------------------------------------------------------------------------

_DUCKDB = {pa.string(): "VARCHAR", pa.int32(): "INTEGER", pa.int64(): "BIGINT", pa.float32(): "FLOAT",
           pa.float64(): "DOUBLE", pa.bool_(): "BOOLEAN", pa.timestamp("us", tz="UTC"): "TIMESTAMPTZ"}
EMPTY_SPACE_TYPES = {"observation": "FLOAT[]", "action": "BIGINT"}  # an empty store's obs/action columns


def duckdb_type(name: str) -> str:
    """The DuckDB type of a type name of the schema files."""
    return _DUCKDB[sch.arrow_type(name)]


def _typed_null(column: dict[str, Any]) -> str:
    kind = EMPTY_SPACE_TYPES[column["space"]] if column["type"] == "space" else duckdb_type(column["type"])
    return f"NULL::{kind} AS {ident(column['name'])}"


def steps_view(files: Sequence[DataFile], *, uniform: bool = False, file_index: bool = False) -> str:
    """The SELECT behind the stored steps of a committed file list (never a glob), as stored. With ``uniform``
    (every file has the same columns and types), DuckDB binds the first file's schema for all instead of reading
    every footer; with ``file_index``, a column ``file_index`` holds each row's file (its index in ``files``)."""
    if not files:
        return f"SELECT {', '.join(_typed_null(c) for c in sch.step_columns())} WHERE false"
    paths = ", ".join(literal(f.path) for f in files)
    index = ", file_index" if file_index else ""
    return (f"SELECT run_id, env_id{index}, * EXCLUDE (run_id, env_id) FROM read_parquet("
            f"[{paths}], hive_partitioning = true, union_by_name = {'false' if uniform else 'true'}, "
            "hive_types = {'run_id': VARCHAR, 'env_id': VARCHAR})")


_WINDOW = "PARTITION BY episode_id ORDER BY step"
_FUNCTION = __import__("re").compile(r"^[a-z][a-z0-9_]*$")


def decoded_steps(source: str, columns: Sequence[tuple[str, str]], *, obs: str | None = None,
                  next_obs: str | None = None, plan: decoding.Plan | None = None, images: dict[str, str] | None = None,
                  variant: Sequence[str] = ()) -> str:
    """One group of files (``source``: their SELECT) as logical columns, by the rules of
    :mod:`~trajstore.storage.decoding`: each ``(physical, logical)`` of ``columns`` renamed, those of ``variant`` as
    VARIANT (their types differ between groups), and, for an encoding-2 group, ``obs`` (its physical name) and
    ``next_obs`` decoded as ``plan`` says, with windows over each episode's steps; image frames (``images``: leaf path
    -> the function that makes values of their bytes) become nested lists last."""
    images = images or {}
    select, decoded = source, {}
    if obs is not None and plan is not None:
        stacked = plan.obs(obs)
        if stacked is not None:
            select = f"SELECT * REPLACE ({render(stacked, images)} AS {ident(obs)}) FROM ({select})"
        if next_obs is not None:
            expr = render(plan.next(next_obs, obs), images)
            select = f"SELECT * REPLACE ({expr} AS {ident(next_obs)}) FROM ({select})"
        decoded = {p: plan.values(p) for p in (obs, next_obs) if p is not None}
    names = []
    for p, lg in columns:
        value = decoded.get(p) or decoding.Column(p)
        if lg in variant:
            value = decoding.AnyType(value)
        names.append(f"{render(value, images)} AS {ident(lg)}")
    return f"SELECT {', '.join(names)} FROM ({select})"


def render(expr: decoding.Expr, images: Mapping[str, str]) -> str:
    """A decoding expression (:mod:`~trajstore.storage.decoding`) in DuckDB's SQL (``images``: image leaf path -> the
    function that makes values of its frames' bytes)."""
    return _RENDER[type(expr)](expr, images)


def _values(e: decoding.Values, images: Mapping[str, str]) -> str:
    if not _FUNCTION.match(images[e.path]):
        raise InputError(f"not a function name: {images[e.path]!r}")
    return f"{images[e.path]}({render(e.of, images)})"


_Render = Callable[[Any, Mapping[str, str]], str]
_RENDER: dict[type, _Render] = {
    decoding.Column: lambda e, i: ident(e.name),
    decoding.Field: lambda e, i: f"struct_extract({render(e.of, i)}, {literal(e.name)})",
    decoding.Struct: lambda e, i: f"struct_pack({', '.join(f'{ident(n)} := {render(v, i)}' for n, v in e.fields)})",
    decoding.Window: lambda e, i: f"list({render(e.of, i)}) OVER ({_WINDOW} ROWS BETWEEN {int(e.rows) - 1} PRECEDING "
                                  "AND CURRENT ROW)",
    decoding.Lead: lambda e, i: f"lead({render(e.of, i)}) OVER ({_WINDOW})",
    decoding.Flatten: lambda e, i: f"flatten({render(e.of, i)})",
    decoding.Last: lambda e, i: f"list_slice({render(e.of, i)}, {-int(e.n)}, -1)",
    decoding.Items: lambda e, i: f"list_slice({render(e.of, i)}, {int(e.start)}, {int(e.start) + int(e.count) - 1})",
    decoding.Item: lambda e, i: f"{render(e.of, i)}[{int(e.at)}]",
    decoding.Concat: lambda e, i: f"list_concat({render(e.first, i)}, {render(e.then, i)})",
    decoding.IsNull: lambda e, i: f"{render(e.of, i)} IS NULL",
    decoding.HasItems: lambda e, i: f"len({render(e.of, i)}) = {int(e.n)}",
    decoding.When: lambda e, i: f"CASE WHEN {render(e.cond, i)} THEN {render(e.then, i)} ELSE "
                                f"{render(e.otherwise, i)} END",
    decoding.Values: _values,
    decoding.AnyType: lambda e, i: f"{render(e.of, i)}::VARIANT",
}


_DUCKDB_NUMBERS = {"bool": "BOOLEAN", "int8": "TINYINT", "int16": "SMALLINT", "int32": "INTEGER", "int64": "BIGINT",
                   "uint8": "UTINYINT", "uint16": "USMALLINT", "uint32": "UINTEGER", "uint64": "UBIGINT",
                   "float16": "FLOAT", "float32": "FLOAT", "float64": "DOUBLE"}


def values_type(dtype: str, dims: int) -> str:
    """The DuckDB type of ``dims`` nested lists of a numpy dtype's values (float16 as FLOAT)."""
    return _DUCKDB_NUMBERS[dtype] + "[]" * dims


def frame_macro(name: str, dtype: str, shape: Sequence[int]) -> str:
    """A DuckDB macro ``name(bytes)``: one image frame's raw bytes (C order) as the nested lists of its values,
    for uint8/int8 frames (other dtypes stay bytes: SQL cannot reinterpret them)."""
    if dtype not in ("uint8", "int8"):
        return f"CREATE OR REPLACE MACRO {ident(name)}(b) AS b;"
    dims = [int(d) for d in shape]
    index = " + ".join(f"i{a} * {int(np.prod(dims[a + 1:], dtype=np.int64))}" for a in range(len(dims)))
    byte = f"('0x' || substr(hex(b), 2 * ({index}) + 1, 2))::INTEGER"
    if dtype == "int8":
        byte = f"(({byte} + 128) % 256 - 128)::TINYINT"
    else:
        byte = f"{byte}::UTINYINT"
    expr = byte
    for a in reversed(range(len(dims))):
        expr = f"list_transform(range({dims[a]}), lambda i{a}: {expr})"
    return f"CREATE OR REPLACE MACRO {ident(name)}(b) AS CASE WHEN b IS NULL THEN NULL ELSE {expr} END;"


def stack_macro(name: str, frame: str) -> str:
    """A DuckDB macro ``name(frames)``: a list of frames' bytes as a list of their values (see :func:`frame_macro`)."""
    return f"CREATE OR REPLACE MACRO {ident(name)}(s) AS list_transform(s, lambda f: {ident(frame)}(f));"


def partition_of(episode_id: int) -> str:
    """The ``run_id`` and ``env_id`` of one episode's steps (none when it has no steps)."""
    return f"SELECT run_id, env_id FROM steps WHERE episode_id = {int(episode_id)} LIMIT 1"


def rows_of(source: str, env_ids: Sequence[str], obs: str | None) -> str:
    """The rows of relation ``source`` of ``env_ids`` that store their observation in ``obs`` (a stored name)."""
    where = [f"env_id IN ({', '.join(literal(e) for e in env_ids)})"]
    if obs is not None:
        where.append(f"{ident(obs)} IS NOT NULL")
    return f"SELECT * FROM {ident(source)} WHERE {' AND '.join(where)}"


def union_by_name(selects: Sequence[str]) -> str:
    """The rows of every SELECT, columns matched by name (a column some lack is NULL there)."""
    return " UNION ALL BY NAME ".join(f"({s})" for s in selects)


def parquet_source(files: Sequence[DataFile], *, uniform: bool = False) -> str:
    """The SELECT of ``files`` as stored, read by DuckDB itself (``uniform``: see :func:`steps_view`)."""
    return steps_view(files, uniform=uniform)


def registered_source(name: str) -> str:
    return f"SELECT * FROM {ident(name)}"


def with_lineage(stored: Sequence[str], source: str) -> str:
    """``source`` with every lineage column of ``step.v1.json`` it lacks added as a typed NULL, and the
    columns in one order: the schema's, then its lineage columns, then other extras by name.

    So ``steps`` and ``episodes`` have the same columns in every store, whatever its writers recorded,
    and in the same order whatever the order of the files (which compaction changes).
    """
    select = [ident(name) if null is None else f"NULL::{_DUCKDB[null]} AS {ident(name)}"
              for name, null in sch.view_columns(stored)]
    return f"SELECT {', '.join(select)} FROM {source}"


def episodes_view(step_columns: Sequence[str], *, discounted: bool = False, source: str = "steps",
                  by_id: bool = False, agents: bool = False) -> str:
    """The SELECT behind the ``episodes`` view; with ``discounted`` it adds ``discounted_return`` for ``$gamma``.

    With ``by_id`` (only when episode ids are known to be disjoint between partitions) it groups by
    ``episode_id`` alone, the same episodes for less work: the other group keys are then constant within
    each episode. With ``agents`` (some stored rows have an ``agent_id``) the columns that differ for a
    multi-agent episode take their ``agents_sql`` (the same values for single-agent episodes).
    """
    spec = sch.load(sch.EPISODE_SCHEMA_FILE)
    keys = ["episode_id"] if by_id else spec["group_by"]
    cols = [f"{_in_group(c.get('agents_sql', c['sql']) if agents else c['sql'], keys, spec['group_by'])} "
            f"AS {ident(c['name'])}" for c in spec["columns"]]
    cols += [spec["lineage"]["sql"].format(name=ident(n)) + f" AS {ident(n)}"
             for n in sch.episode_lineage() if n in step_columns]
    if discounted:
        cols.append(f"{discounted_sum('reward', 'step')} AS discounted_return")
    return f"SELECT {', '.join(cols)} FROM {source} GROUP BY {', '.join(keys)}"


# --- the episodes view from its files' fragments (query/summarized.py) ----------------------------------------

FILE = "trajstore_file"  # the column holding each row's file in a fragments query
FRAGMENT_KEYS = ("run_id", "env_id", "episode_id", "agent_id")
FRAGMENT_COLUMNS = summaries.FRAGMENT_COLUMNS
lineage_step = summaries.lineage_step


def fragment_source(files: Sequence[DataFile], columns: Sequence[tuple[str, str]], nulls: Mapping[str, str], *,
                    uniform: bool) -> str:
    """The rows of one group of ``files`` a fragments query reads: each row's file (:data:`FILE`: its index in
    ``files``), its partition,
    each ``(physical, logical)`` of ``columns`` under its logical name and each of ``nulls`` (name -> DuckDB type)
    as a typed NULL."""
    cols = [f"file_index AS {ident(FILE)}", "run_id", "env_id"] + \
        [f"{ident(p)} AS {ident(lg)}" for p, lg in columns] + \
        [f"NULL::{kind} AS {ident(name)}" for name, kind in nulls.items()]
    return f"SELECT {', '.join(cols)} FROM ({steps_view(files, uniform=uniform, file_index=True)})"


def episode_fragments(source: str, lineage: Sequence[str]) -> str:
    """Per file, episode and agent (``agent_id``, NULL for single-agent rows) of ``source`` (rows of
    :func:`fragment_source`): what the ``episodes`` view aggregates, as partial aggregates that add up over the
    files holding an episode (:func:`combined_episodes`); each lineage column taken at its first step with a value,
    that step kept beside it (:func:`lineage_step`). The aggregates are those ``schemas/episode.v1.json`` defines
    beside the view's own (its ``fragments``)."""
    spec = sch.load(sch.EPISODE_SCHEMA_FILE)["fragments"]
    keys = ", ".join(ident(k) for k in (FILE, *FRAGMENT_KEYS))
    cols = [f"{c['sql']} AS {ident(c['name'])}" for c in spec["columns"]]
    for name in lineage:
        cols += [spec["lineage"]["sql"].format(name=ident(name)) + f" AS {ident(name)}",
                 spec["lineage"]["step_sql"].format(name=ident(name)) + f" AS {ident(lineage_step(name))}"]
    return (f"SELECT {keys}, {', '.join(cols)} FROM ({source}) GROUP BY {keys} "
            f"ORDER BY {ident(FILE)}, episode_id, agent_id")


def combined_episodes(source: str, lineage: Sequence[str], columns: Sequence[tuple[str, str]]) -> str:
    """The ``episodes`` view's rows of the episodes in ``source`` (fragments of :func:`episode_fragments` of files
    of one version, in any order): each episode's fragments added up by each column's ``fragments_sql`` in
    ``schemas/episode.v1.json``, beside its definition over the steps, single-agent and multi-agent alike, every
    column cast to the view's type (``columns``: name -> DuckDB type, in the view's order)."""
    spec = sch.load(sch.EPISODE_SCHEMA_FILE)
    parts = {"single": spec["fragments"]["single"], "agents": spec["fragments"]["agents"]}
    exprs = {c["name"]: c["fragments_sql"].format(**parts) for c in spec["columns"] if "fragments_sql" in c}
    exprs.update({name: spec["lineage"]["fragments_sql"].format(name=ident(name), name_step=ident(lineage_step(name)))
                  for name in lineage})
    missing = [name for name, _ in columns if name not in exprs]
    if missing:
        raise InputError(f"the episodes view has columns fragments do not hold: {missing}")
    cols = ", ".join(f"({exprs[name]})::{kind} AS {ident(name)}" for name, kind in columns)
    return f"SELECT {cols} FROM {ident(source)} GROUP BY run_id, env_id, episode_id"


AGENT_EPISODE_KEYS = ("run_id", "env_id", "episode_id", "agent_id")


def agent_episodes_view(stored: bool, *, source: str = "steps") -> str:
    """The SELECT behind the ``agent_episodes`` view: one row per (episode, agent) of the multi-agent rows
    (none when no stored row has an ``agent_id``)."""
    keys = ", ".join(AGENT_EPISODE_KEYS)
    if not stored:  # no column agent_id: the view's columns, no rows
        return ("SELECT run_id, env_id, episode_id, NULL::VARCHAR AS agent_id, 0::DOUBLE AS agent_return, "
                "0::BIGINT AS agent_length, terminated, truncated, true AS complete, step AS first_step, "
                f"step AS last_step, env_steps FROM {source} WHERE false")
    return (f"SELECT {keys}, sum(reward::DOUBLE) AS agent_return, count(*)::BIGINT AS agent_length, "
            "bool_or(terminated) AS terminated, bool_or(truncated) AS truncated, "
            "bool_or(terminated OR truncated) AS complete, min(step) AS first_step, max(step) AS last_step, "
            f"max(env_steps) AS env_steps FROM {source} WHERE agent_id IS NOT NULL GROUP BY {keys}")


AGENT_KEYS = ("agent_id", "agent_group")  # by= keys that make statistics per agent
# an agent's group: the part of its id before the last "_" (adversary_0 -> adversary)
AGENT_GROUP = "regexp_replace(agent_id, '_[^_]*$', '')"


def per_agent(episodes: str) -> str:
    """``episodes`` (a relation with the ``episodes`` view's columns) made one row per (episode, agent) of the
    multi-agent episodes: each agent's return, length and ends in place of the episode's, with ``agent_id``
    and ``agent_group``."""
    return (f"(SELECT e.* REPLACE (a.agent_return AS episode_return, a.agent_length AS episode_length, "
            "a.terminated AS terminated, a.truncated AS truncated, a.complete AS complete), a.agent_id, "
            f"{AGENT_GROUP.replace('agent_id', 'a.agent_id')} AS agent_group "
            f"FROM agent_episodes AS a JOIN {episodes} AS e "
            "ON a.run_id = e.run_id AND a.env_id = e.env_id AND a.episode_id = e.episode_id)")


# what agent_rows() holds: statistics per agent grouped and filtered by these alone need no episodes column
AGENT_ROW_COLUMNS = ("run_id", "env_id", "episode_id", "agent_id", "agent_group", "episode_return", "episode_length",
                     "terminated", "truncated", "complete")


def agent_rows() -> str:
    """The ``agent_episodes`` view alone as :func:`per_agent` gives its rows (each agent's return, length and ends
    under the episode's names, with ``agent_group``), no join with ``episodes``: for statistics per agent grouped and
    filtered by :data:`AGENT_ROW_COLUMNS` alone."""
    return (f"(SELECT run_id, env_id, episode_id, agent_id, {AGENT_GROUP} AS agent_group, "
            "agent_return AS episode_return, agent_length AS episode_length, terminated, truncated, complete "
            "FROM agent_episodes)")


def discounted_sum(reward: str, step: str) -> str:
    """``sum_t gamma**t r_t`` of a group, in float64 from the stored rewards, for the parameter ``$gamma``."""
    return f"sum({reward}::DOUBLE * pow($gamma::DOUBLE, {step}))"


def _in_group(expr: str, keys: Sequence[str], group_by: Sequence[str]) -> str:
    return f"any_value({expr})" if expr in group_by and expr not in keys else expr


def describe(view: str) -> str:
    return f"DESCRIBE {ident(view)}"


def create_view(name: str, select: str) -> str:
    return f"CREATE OR REPLACE TEMP VIEW {ident(name)} AS {select}"


def select_all(source: str, *, limit: int | None = None) -> str:
    return f"SELECT * FROM {ident(source)}{page(limit)}"


# --- queries of the Store ------------------------------------------------------------------------------------


def episodes(conds: Sequence[str], *, source: str, order_by: Sequence[tuple[str, bool]], limit: int | None,
             offset: int = 0, total: str | None = None) -> str:
    """One page of episodes from ``source`` (the view, or the view with ``discounted_return``), in the order of the
    ``(column, descending)`` keys ``order_by``, ties by ``episode_id``."""
    count = f", count(*) OVER () AS {ident(total)}" if total else ""
    return f"SELECT *{count} FROM {source}{where(conds)}{order(order_by)}{page(limit, offset)}"


def count_rows(conds: Sequence[str], *, source: str) -> str:
    """How many rows of ``source`` the conditions select, as ``n``."""
    return f"SELECT count(*) AS n FROM {source}{where(conds)}"


WALK = ("run_id", "env_id", "ended_at", "env_steps", "episode_id")  # a series' episodes in wall-time order


def curve_episodes(series: Sequence[str], chosen: Sequence[str], *, source: str, flag: str) -> str:
    """Every episode of ``source`` in the series that ``series`` selects, in :data:`WALK` order, with ``flag``
    true for the complete episodes that ``chosen`` selects (the points of the curve)."""
    keys = ", ".join(ident(k) for k in WALK)
    return (f"SELECT *, ({' AND '.join(['complete', *chosen])}) AS {ident(flag)} FROM {source}{where(series)} "
            f"ORDER BY {keys}")


def bin_stats(source: str, quantiles: Sequence[float], series: Sequence[str] = ("run_id", "env_id")) -> str:
    """Per ``(*series, bin)`` of ``source`` (columns ``series``, ``bin``, ``y``; bin -1 left out): the count, and
    with ``quantiles`` the mean and each quantile of ``y`` (``quantile_cont``: numpy's "linear")."""
    aggs = ["count(*) AS count"]
    if quantiles:
        aggs.append("avg(y) AS mean")
        aggs += [f"quantile_cont(y, {literal(float(q))}) AS {ident(f'p{round(q * 100)}')}" for q in quantiles]
    keys = ", ".join(ident(k) for k in (*series, "bin"))
    return f"SELECT {keys}, {', '.join(aggs)} FROM {ident(source)} WHERE bin >= 0 GROUP BY {keys} ORDER BY {keys}"


def agent_curve_rows(by: str, conds: Sequence[str]) -> str:
    """``run_id, env_id, episode_id``, the agent (``by``: its ``agent_id`` or ``agent_group``, under that name),
    ``agent_return`` and ``agent_length`` of each (episode, agent) of ``agent_episodes`` that ``conds`` select."""
    if by not in AGENT_KEYS:
        raise InputError(f"by: per-agent rows are by one of {', '.join(AGENT_KEYS)}, got {by!r}")
    agent = "agent_id" if by == "agent_id" else AGENT_GROUP
    return (f"SELECT run_id, env_id, episode_id, {agent} AS {ident(by)}, agent_return, agent_length "
            f"FROM agent_episodes{where(conds)}")


def subquery(select: str) -> str:
    return f"({select})"


def stats(by: Sequence[str], *, discounted: bool, conds: Sequence[str], include_incomplete: bool,
          source: str, metric: str | None = None) -> str:
    """Episode statistics with the keys of ``imitation.data.rollout.rollout_stats`` (std as ``numpy.std``),
    over ``source`` (a relation with the ``episodes`` view's columns); with ``metric`` (a column of ``source``),
    ``metric_n`` and ``metric_*`` of it too."""
    metrics = [("return", "episode_return"), ("len", "episode_length")]
    if discounted:
        metrics.append(("discounted_return", "discounted_return"))
    if metric is not None:
        metrics.append(("metric", metric))
    aggs = ["count(*) AS n_traj"] + ([f"count({ident(metric)}) AS metric_n"] if metric is not None else [])
    for key, col in metrics:
        aggs += [f"min({col})::DOUBLE AS {key}_min", f"avg({col})::DOUBLE AS {key}_mean",
                 f"stddev_pop({col})::DOUBLE AS {key}_std", f"max({col})::DOUBLE AS {key}_max"]
    conds = ([] if include_incomplete else ["complete"]) + list(conds)
    keys = ", ".join(ident(b) for b in by)
    select = (keys + ", " if keys else "") + ", ".join(aggs)
    tail = f" GROUP BY {keys} ORDER BY {keys}" if keys else ""
    return f"SELECT {select} FROM {source}{where(conds)}{tail}"


def runs_view(source: str) -> str:
    """The ``runs`` view over the rows of :func:`~trajstore.storage.run_config.table` in ``source``:
    ``config`` as JSON."""
    return (f"SELECT run_id, tags, notes, config::JSON AS config, created, trajstore_version, git_commit, host, "
            f"problem FROM {ident(source)}")


def priorities_view(source: str) -> str:
    """The ``priorities`` view over the rows of the ``priorities`` table in ``source``
    (:mod:`~trajstore.storage.priorities_log`): each item's row of the highest version, one per replay and item."""
    return (f"SELECT replay, episode_id, step, agent_id, arg_max(priority, version) AS priority, "
            f"arg_max(\"time\", version) AS \"time\", max(version) AS version FROM {ident(source)} "
            f"GROUP BY replay, episode_id, step, agent_id")


def with_config(source: str, names: Iterable[str], runs: str = "run_info") -> str:
    """``source`` (rows with a ``run_id``) with the columns ``names`` of its run's row in ``runs`` (the rows of
    :func:`~trajstore.storage.run_config.table` with a column per config value grouped by: text, null where the
    run has none)."""
    values = ", ".join(f"r.{ident(name)}" for name in names)
    return f"(SELECT e.*, {values} FROM {source} AS e LEFT JOIN {ident(runs)} AS r ON e.run_id = r.run_id)"


STEP_AGGREGATES = {"last": "arg_max({col}, step)", "first": "arg_min({col}, step)", "sum": "sum({col})",
                   "mean": "avg({col})", "min": "min({col})", "max": "max({col})"}


def with_metric(source: str, name: str, column: str, agg: str | None) -> str:
    """``source`` (rows of the ``episodes`` view) with a ``metric`` column: its column ``column`` (``agg`` None),
    or ``agg`` (a key of :data:`STEP_AGGREGATES`) of the step column ``column`` over each episode's steps."""
    if agg is None:
        return f"(SELECT e.*, e.{ident(column)}::DOUBLE AS {ident(name)} FROM {source} AS e)"
    value = STEP_AGGREGATES[agg].format(col=f"{ident(column)}::DOUBLE")
    per_episode = (f"SELECT run_id, env_id, episode_id, {value} AS {ident(name)} FROM steps "
                   "GROUP BY run_id, env_id, episode_id")
    return (f"(SELECT e.*, m.{ident(name)} FROM {source} AS e LEFT JOIN ({per_episode}) AS m "
            "ON e.run_id = m.run_id AND e.env_id = m.env_id AND e.episode_id = m.episode_id)")


def run_scores(by: Sequence[str], task: str, metric: str, *, last: int, conds: Sequence[str], source: str) -> str:
    """Each run's score on each task (``task``, a column): the mean ``metric`` of its ``last`` complete
    episodes there that the conditions select, latest by ``env_steps``, then by end; with ``by``, ``episodes``
    (how many were averaged)."""
    keys = list(dict.fromkeys([*by, "run_id"]))
    group = ", ".join(ident(k) for k in keys)
    ranked = (f"SELECT {group}, {ident(task)} AS task, {ident(metric)} AS value, row_number() OVER (PARTITION BY "
              f"run_id, {ident(task)} ORDER BY env_steps DESC NULLS LAST, ended_at DESC NULLS LAST, "
              f"episode_id DESC) AS latest FROM {source}{where(['complete', *conds])}")
    return (f"SELECT {group}, task, avg(value) AS score, count(value)::BIGINT AS episodes FROM ({ranked}) "
            f"WHERE latest <= {int(last)} GROUP BY {group}, task ORDER BY {group}, task")


def episode_points(by: Sequence[str], task: str, metric: str, *, conds: Sequence[str], source: str) -> str:
    """Every complete episode the conditions select: its ``by`` values, run, task, ``x`` (``env_steps``, where
    it ended in its writer's stream) and ``y`` (``metric``)."""
    keys = list(dict.fromkeys([*by, "run_id"]))
    return (f"SELECT {', '.join(ident(k) for k in keys)}, {ident(task)} AS task, env_steps::DOUBLE AS x, "
            f"{ident(metric)} AS y FROM {source}{where(['complete', *conds])}")


RUNS = """
SELECT run_id, env_id, count(*) AS episodes, count(*) FILTER (WHERE complete) AS complete_episodes,
       sum(episode_length)::BIGINT AS steps, max(ended_at) AS last_write
FROM episodes GROUP BY run_id, env_id ORDER BY run_id, env_id
"""


def episode_ids(conds: Sequence[str]) -> str:
    return f"SELECT episode_id FROM episodes{where(conds)}"


def episode_partitions(conds: Sequence[str]) -> str:
    """The ``(run_id, env_id)`` partitions holding the episodes ``conds`` select."""
    return f"SELECT DISTINCT run_id, env_id FROM episodes{where(conds)}"


def episode_returns(conds: Sequence[str], *, source: str, limit: int | None) -> str:
    return (f"SELECT run_id, env_id, episode_id, episode_length, episode_return, discounted_return, complete "
            f"FROM {source}{where(conds)} ORDER BY episode_id{page(limit)}")


def step_counts(conds: Sequence[str]) -> str:
    """Steps per selected episode, by episode id."""
    return f"SELECT episode_id, count(*) AS n FROM steps{where(conds)} GROUP BY episode_id ORDER BY episode_id"


def episode_id_at_most(episode_id: int) -> str:
    return f"episode_id <= {literal(int(episode_id))}"


def step_rewards(files: Sequence[DataFile], conds: Sequence[str], *, agents: bool = False) -> str:
    """``run_id, env_id, episode_id, step, reward`` (and with ``agents`` ``agent_id``) of the selected steps, the
    partition columns cast to DuckDB ENUMs of the committed values, so that Arrow receives them
    dictionary-encoded (a byte per row)."""
    cols = []
    for name in ("run_id", "env_id"):
        values = sorted({getattr(f, name) for f in files})
        cols.append(f"{name}::ENUM({', '.join(map(literal, values))}) AS {name}" if values else name)
    agent = ", agent_id" if agents else ""
    return f"SELECT {', '.join(cols)}, episode_id, step, reward{agent} FROM steps{where(conds)}"


def steps(columns: Sequence[str], conds: Sequence[str], *, limit: int | None = None, offset: int = 0,
          agents: bool = False) -> str:
    """Selected steps in ``(episode_id, step)`` order (with ``agents``, stored ``agent_id``s: the agents of one
    step by ``agent_id``)."""
    keys = "episode_id, step, agent_id" if agents else "episode_id, step"
    return f"SELECT {select_list(columns)} FROM steps{where(conds)} ORDER BY {keys}{page(limit, offset)}"


def episode_values(column: str) -> str:
    """``episode_id`` and one column of every episode, by id (the weights of a loader's sampling)."""
    return f"SELECT episode_id, {ident(column)} AS value FROM episodes ORDER BY episode_id"


def count_other_mode(run_id: str, mode: str) -> str:
    """Steps of ``run_id`` whose lineage ``mode`` is not ``mode`` (``eval`` against train or untagged)."""
    other = "mode IS DISTINCT FROM 'eval'" if mode == "eval" else "mode = 'eval'"
    return f"SELECT count(*) AS n FROM steps WHERE {in_list('run_id', run_id)} AND {other}"


def worker_kept(run_id: str, worker_id: str) -> str:
    """What one writer (``worker_id``) stored in ``run_id``: its steps, complete and unfinished episodes, and how
    many episodes of the run other writers stored (``others``)."""
    mine = f"worker_id = {literal(worker_id)}"
    return (f"SELECT coalesce(sum(episode_length) FILTER (WHERE {mine}), 0) AS steps, "
            f"count(*) FILTER (WHERE {mine} AND complete) AS complete, "
            f"count(*) FILTER (WHERE {mine} AND NOT complete) AS unfinished, "
            f"count(*) FILTER (WHERE worker_id IS DISTINCT FROM {literal(worker_id)}) AS others "
            f"FROM episodes WHERE {in_list('run_id', run_id)}")


def stored_episode_ends(source: str, episode_ids: Sequence[int]) -> str:
    """Per ``(run_id, env_id, episode_id, agent_id)`` of ``episode_ids`` in ``source`` (stored steps, with an
    ``agent_id`` column: NULL for single-agent rows): its last stored step and the first step that ended it
    (terminated or truncated; NULL while it runs). What an ingest must continue."""
    return (f"SELECT run_id, env_id, episode_id, agent_id, max(step) AS last_step, "
            f"min(step) FILTER (WHERE terminated OR truncated) AS end_step "
            f"FROM {ident(source)} WHERE {in_list('episode_id', [int(i) for i in episode_ids])} "
            f"GROUP BY run_id, env_id, episode_id, agent_id ORDER BY episode_id, run_id, env_id, agent_id")


# --- the sandbox ---------------------------------------------------------------------------------------------


def hardening(*, memory_limit: str | None, threads: int | None) -> list[str]:
    """DuckDB's "Securing DuckDB" settings for a connection whose views read registered data only: no file
    access at all (not even temporary files: a query past its memory limit fails instead of spilling to
    disk), no setting left that names a path (``duckdb_settings()`` shows none), no Python variables read
    by name, no extension installed or loaded because a query named one of its functions, then the
    configuration locked. ``None`` keeps DuckDB's default memory limit or threads."""
    out = ["SET temp_directory = ''", "SET secret_directory = ''", "SET extension_directory = ''",
           "SET home_directory = ''", "SET python_enable_replacements = false",
           "SET autoinstall_known_extensions = false", "SET autoload_known_extensions = false",
           "SET enable_external_access = false"]
    if memory_limit is not None:
        out.append(f"SET memory_limit = {literal(memory_limit)}")
    if threads is not None:
        out.append(f"SET threads = {int(threads)}")
    return out + ["SET lock_configuration = true"]


# --- the consistency check -----------------------------------------------------------------------------------

def check_episodes(*, agents: bool) -> str:
    """The ``check_episodes`` table: per episode (per agent of a multi-agent episode, ``agents`` telling whether
    ``steps`` has an ``agent_id``; NULL for single-agent rows) its rows, steps, distinct steps, first and last step,
    rows at step 0 and the first step that ended it."""
    agent, keys = ("agent_id", ", agent_id") if agents else ("NULL::VARCHAR AS agent_id", "")
    return f"""
CREATE TEMP TABLE check_episodes AS
SELECT run_id, env_id, episode_id, {agent},
       count(*) AS n_rows,
       count(step) AS n_steps,
       count(DISTINCT step) AS n_distinct,
       min(step) AS first_step,
       max(step) AS last_step,
       count(*) FILTER (WHERE step = 0) AS starts,
       min(step) FILTER (WHERE terminated OR truncated) AS end_step
FROM steps GROUP BY run_id, env_id, episode_id{keys}
"""


# an agent's steps are unique and none follows its end; an episode's (single-agent) are also 0..n-1
_DEFECTS = ("episode_id IS NULL OR n_steps < n_rows OR n_distinct < n_steps OR end_step < last_step "
            "OR (agent_id IS NULL AND (first_step <> 0 OR last_step <> n_distinct - 1))")
_EPISODE_KEYS = "SELECT DISTINCT run_id, env_id, episode_id FROM check_episodes"
CHECK_TOTALS = (f"SELECT (SELECT count(*) FROM ({_EPISODE_KEYS})), coalesce(sum(n_rows), 0) "
                "FROM check_episodes")
CHECK_DEFECT_COUNT = f"SELECT count(*) FROM check_episodes WHERE {_DEFECTS}"


def check_defects(limit: int) -> str:
    return (f"SELECT run_id, env_id, episode_id, agent_id, n_rows, n_steps, n_distinct, first_step, last_step, "
            f"starts, end_step FROM check_episodes WHERE {_DEFECTS} ORDER BY episode_id, run_id, env_id, agent_id"
            f"{page(limit)}")


def check_mixed(limit: int) -> str:
    """The episodes of ``check_episodes`` holding single-agent rows beside the rows of agents."""
    return ("SELECT run_id, env_id, episode_id FROM check_episodes WHERE episode_id IS NOT NULL "
            "GROUP BY run_id, env_id, episode_id HAVING count(*) FILTER (WHERE agent_id IS NULL) > 0 "
            f"AND count(agent_id) > 0 ORDER BY episode_id, run_id, env_id{page(limit)}")


def _one_episode(agents: bool) -> str:
    """The steps of one episode (of one agent of it: ``$agent``, NULL for single-agent rows)."""
    agent = " AND agent_id IS NOT DISTINCT FROM $agent" if agents else ""
    return f"run_id = $run AND env_id = $env AND episode_id = $id{agent} AND step IS NOT NULL"


# Ranges of steps as (lo, hi, number of ranges), the first $limit of them: gaps and islands over the episode's
# distinct steps, so that no query builds one row per possible step value.
def check_duplicate_ranges(*, agents: bool) -> str:
    return f"""
WITH dup AS (SELECT step::BIGINT AS step FROM steps WHERE {_one_episode(agents)} GROUP BY step HAVING count(*) > 1),
islands AS (SELECT min(step) AS lo, max(step) AS hi FROM (
    SELECT step, step - row_number() OVER (ORDER BY step) AS island FROM dup) GROUP BY island)
SELECT lo, hi, count(*) OVER () FROM islands ORDER BY lo LIMIT $limit
"""


def check_missing_ranges(*, agents: bool) -> str:
    return f"""
WITH present AS (SELECT DISTINCT step::BIGINT AS step FROM steps WHERE {_one_episode(agents)}),
gaps AS (
    SELECT step + 1 AS lo, next - 1 AS hi FROM (
        SELECT step, lead(step) OVER (ORDER BY step) AS next FROM present) WHERE next > step + 1
    UNION ALL
    SELECT 0, min(step) - 1 FROM present HAVING min(step) > 0)
SELECT lo, hi, count(*) OVER () FROM gaps ORDER BY lo LIMIT $limit
"""


_SHARED = (f"SELECT episode_id, list(run_id || '/' || env_id ORDER BY run_id, env_id) FROM ({_EPISODE_KEYS}) "
           "WHERE episode_id IS NOT NULL GROUP BY episode_id HAVING count(*) > 1")
CHECK_SHARED_COUNT = f"SELECT count(*) FROM ({_SHARED})"


def check_shared(limit: int) -> str:
    return f"{_SHARED} ORDER BY episode_id{page(limit)}"


# --- lifecycle: delete ------------------------------------------------------------------------------------

def chosen_steps(where: Where | None, steps_where: str | None) -> str | None:
    """One condition over ``steps`` for what a change of the stored steps (delete, add_column) acts on: the steps of
    the episodes ``where`` (a condition over ``episodes``) selects, and of those the steps ``steps_where`` (a caller's
    condition over ``steps``) selects; None when neither is given."""
    conds = []
    if where:
        conds.append(f"episode_id IN (SELECT episode_id FROM episodes WHERE {user_condition(where)})")
    if steps_where:
        conds.append(user_condition(steps_where))
    return " AND ".join(conds) or None


def variant_types(table: str, column: str, depth: int) -> str:
    """The distinct ``variant_typeof`` of the VARIANT ``column`` of ``table``'s non-null values, and of their first
    element, its first element, … to ``depth`` (see :func:`~trajstore.query.snapshot.typed_answer`)."""
    probes = [f"variant_typeof({column}{'[1]' * d})" for d in range(depth)]
    return (f"SELECT DISTINCT {', '.join(probes)} FROM {table} WHERE {column} IS NOT NULL AND "
            f"variant_typeof({column}) <> 'VARIANT_NULL'")


def cast(column: str, duckdb_type: str) -> str:
    return f"CAST({column} AS {duckdb_type})"


def as_json_text(column: str) -> str:
    """``column``'s values as their JSON text (VARCHAR): how an answer holds a VARIANT of several types."""
    return f"CAST(CAST({column} AS JSON) AS VARCHAR)"


def typed_answer(table: str, columns: Sequence[tuple[str, str | None]]) -> str:
    """Every column of ``table``, as the expression given for it (``(name, expression or None)``, names quoted)."""
    return f"SELECT {', '.join(c if e is None else f'{e} AS {c}' for c, e in columns)} FROM {table}"


def episodes_probe(where: Where) -> str:
    """A query that fails, as the caller's, where ``where`` is no condition over ``episodes`` (a column of ``steps``
    named in it): inside :func:`chosen_steps`'s subquery such a name would silently mean the outer step's column."""
    return f"SELECT 1 FROM episodes WHERE {user_condition(where)} LIMIT 0"


def delete_matches(condition: str | None) -> str:
    """Per episode of ``steps``: how many of its steps ``condition`` (a caller's condition over ``steps``; every
    step without one) selects, and its steps; only the episodes with a selected step."""
    chosen = f"count(*) FILTER (WHERE {user_condition(condition)})" if condition else "count(*)"
    return (f"SELECT run_id, env_id, episode_id, {chosen} AS matched, count(*) AS steps FROM steps "
            "GROUP BY run_id, env_id, episode_id HAVING matched > 0 ORDER BY episode_id")


# --- lifecycle: derived columns -------------------------------------------------------------------------------

def derived_values(expression: str, where: str | None) -> str:
    """``(episode_id, step, value)`` of ``expression`` (a caller's SQL over ``steps``) for the rows ``where``
    selects (every row without one)."""
    cond = f" WHERE {user_condition(where)}" if where else ""
    return f"SELECT episode_id, step, ({expression}) AS value FROM steps{cond}"


def ordered_steps(where: str | None) -> str:
    """Every column of the ``steps`` rows ``where`` selects, in ``(episode_id, step)`` order."""
    cond = f" WHERE {user_condition(where)}" if where else ""
    return f"SELECT * FROM steps{cond} ORDER BY episode_id, step"
