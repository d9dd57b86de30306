"""The decoding SQL in Spark SQL's dialect: one ``CREATE TEMP VIEW steps`` that Spark runs unchanged over the
table's stored rows to give the steps trajstore's readers give (:func:`decoding_sql`).

It renders the rules of :mod:`trajstore.storage.decoding`, as :func:`trajstore.query.snapshot.decoding_sql` does for
DuckDB, in what Spark has (:func:`render`): no macros (a frame's bytes are made values inline, by ``transform`` over
``sequence``), no ``SELECT * REPLACE`` (every column listed), ``collect_list`` over a window of rows for the frames of
a stack, 0-based ``[]``. Spark has no unsigned integers: uint8 image values are SMALLINT, as Spark reads uint8
columns. Where a column has another Spark type in another environment (an int action beside a float one), Spark cannot
hold both in one column: there it is that value as JSON text (``to_json``), or its text for a scalar; select one
environment to see it in its own type.
"""

from __future__ import annotations

from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError
from trajstore.query.groups import FileGroup, group_files
from trajstore.storage import decoding
from trajstore.storage.encoding import NEXT, OBS, FileSchema
from trajstore.storage.log import DataFile

WINDOW = "PARTITION BY episode_id ORDER BY step"


def ident(name: str) -> str:
    """``name`` as a backquoted identifier (backquotes doubled)."""
    return "`" + name.replace("`", "``") + "`"


def literal(text: str) -> str:
    """A string literal (backslashes and quotes escaped, as Spark reads them)."""
    return "'" + text.replace("\\", "\\\\").replace("'", "\\'") + "'"


def spark_type(t: pa.DataType) -> str:
    """The Spark SQL type Spark reads a Parquet column of Arrow type ``t`` as."""
    if pa.types.is_struct(t):
        return "STRUCT<" + ", ".join(f"{ident(f.name)}: {spark_type(f.type)}" for f in t) + ">"
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_fixed_size_list(t):
        return f"ARRAY<{spark_type(t.value_type)}>"
    if pa.types.is_timestamp(t):
        return "TIMESTAMP"
    if pa.types.is_string(t) or pa.types.is_large_string(t):
        return "STRING"
    if pa.types.is_binary(t) or pa.types.is_large_binary(t) or pa.types.is_fixed_size_binary(t):
        return "BINARY"
    names = {"bool": "BOOLEAN", "int8": "TINYINT", "int16": "SMALLINT", "int32": "INT", "int64": "BIGINT",
             "uint8": "SMALLINT", "uint16": "INT", "uint32": "BIGINT", "uint64": "DECIMAL(20,0)", "float": "FLOAT",
             "double": "DOUBLE", "halffloat": "FLOAT"}
    if str(t) not in names:
        raise InputError(f"a column of type {t} has no Spark SQL type here")
    return names[str(t)]


def decoding_sql(files: Sequence[DataFile], schemas: Sequence[FileSchema], *, source: str = "stored_steps") -> str:
    """A Spark SQL statement creating the temporary view ``steps`` over the relation ``source`` (the table's stored
    rows with ``run_id``/``env_id``: the committed files read with their partition folders, or the Delta table)."""
    groups = group_files(files, schemas)
    columns: dict[str, set[str]] = {}
    order: list[str] = ["run_id", "env_id"]
    types: dict[str, pa.DataType] = {}
    for g in groups:
        for lg in g.logical:
            if lg.name not in columns:
                order.append(lg.name)
            columns.setdefault(lg.name, set()).add(spark_type(lg.type))
            types.setdefault(lg.name, lg.type)
    mixed = {name for name, kinds in columns.items() if len(kinds) > 1}
    selects = [_group_select(g, source, order, types, mixed) for g in groups]
    if not selects:
        body = "SELECT CAST(NULL AS STRING) AS run_id, CAST(NULL AS STRING) AS env_id WHERE false"
    else:
        body = " UNION ALL ".join(f"({s})" for s in selects)
    return f"CREATE OR REPLACE TEMP VIEW steps AS {body}\n"


def _group_select(g: FileGroup, source: str, order: list[str], types: dict[str, pa.DataType], mixed: set[str]) -> str:
    """One group's rows decoded by the rules of :mod:`~trajstore.storage.decoding`, every column of ``order``."""
    fmt = g.format
    where = [f"env_id IN ({', '.join(literal(e) for e in g.env_ids)})"]
    physical = ["run_id", "env_id", *g.physical.names]
    logical = dict(zip(g.physical.names, g.logical.names))
    logical.update(run_id="run_id", env_id="env_id")
    obs = fmt.physical(OBS) if fmt.encoded and OBS in g.logical.names else None
    nxt = fmt.physical(NEXT) if obs is not None and NEXT in g.logical.names else None
    select, decoded = f"SELECT * FROM {ident(source)} WHERE {' AND '.join(where)}", {}
    if obs is not None:
        where.append(f"{ident(obs)} IS NOT NULL")
        select = f"SELECT * FROM {ident(source)} WHERE {' AND '.join(where)}"
        plan = fmt.plan(g.logical.field(OBS).type)
        stacked = plan.obs(obs)
        if stacked is not None:
            select = _replace(physical, {obs: render(stacked)}, select)
        if nxt is not None:
            select = _replace(physical, {nxt: render(plan.next(nxt, obs))}, select)
        decoded = {p: plan.values(p) for p in (obs, nxt) if p is not None}
    by_logical = {lg: p for p, lg in logical.items()}
    out = []
    for name in order:
        p = by_logical.get(name)
        if p is None:
            value = f"CAST(NULL AS {'STRING' if name in mixed else spark_type(types[name])})"
        else:
            expr = decoded.get(p) or decoding.Column(p)
            if name in mixed:
                expr = decoding.mixed(expr, g.logical.field(name).type)
            value = render(expr)
        out.append(f"{value} AS {ident(name)}")
    return f"SELECT {', '.join(out)} FROM ({select})"


def _replace(names: list[str], exprs: dict[str, str], select: str) -> str:
    cols = [f"{exprs[n]} AS {ident(n)}" if n in exprs else ident(n) for n in names]
    return f"SELECT {', '.join(cols)} FROM ({select})"


def render(expr: decoding.Expr) -> str:
    """A decoding expression (:mod:`~trajstore.storage.decoding`) in Spark SQL: 0-based ``[]``, ``slice(list, start,
    length)``, ``collect_list`` over a window of rows, image bytes made values inline."""
    return _RENDER[type(expr)](expr)


def _struct(e: decoding.Struct) -> str:
    return f"named_struct({', '.join(f'{literal(n)}, {render(v)}' for n, v in e.fields)})"


def _values(e: decoding.Values) -> str:
    """Image frame bytes (a stacked leaf: a list of frames' bytes) as the nested arrays of their values (uint8/int8
    frames; other dtypes stay bytes: SQL cannot reinterpret them)."""
    ref = render(e.of)
    if e.dtype not in ("uint8", "int8"):
        return ref
    dims = tuple(int(d) for d in e.shape)
    if e.stacked:
        return f"transform({ref}, f -> {_frame_values('f', e.dtype, dims)})"
    return _frame_values(ref, e.dtype, dims)


def _any_type(e: decoding.AnyType) -> str:
    return f"to_json({render(e.of)})" if e.nested else f"CAST({render(e.of)} AS STRING)"


_RENDER: dict[type, Callable[[Any], str]] = {
    decoding.Column: lambda e: ident(e.name),
    decoding.Field: lambda e: f"{render(e.of)}.{ident(e.name)}",
    decoding.Struct: _struct,
    decoding.Window: lambda e: f"collect_list({render(e.of)}) OVER ({WINDOW} ROWS BETWEEN {int(e.rows) - 1} "
                               "PRECEDING AND CURRENT ROW)",
    decoding.Lead: lambda e: f"lead({render(e.of)}) OVER ({WINDOW})",
    decoding.Flatten: lambda e: f"flatten({render(e.of)})",
    decoding.Last: lambda e: f"slice({render(e.of)}, {-int(e.n)}, {int(e.n)})",
    decoding.Items: lambda e: f"slice({render(e.of)}, {int(e.start)}, {int(e.count)})",
    decoding.Item: lambda e: f"{render(e.of)}[{int(e.at) - 1}]",
    decoding.Concat: lambda e: f"concat({render(e.first)}, {render(e.then)})",
    decoding.IsNull: lambda e: f"{render(e.of)} IS NULL",
    decoding.HasItems: lambda e: f"size({render(e.of)}) = {int(e.n)}",
    decoding.When: lambda e: f"CASE WHEN {render(e.cond)} THEN {render(e.then)} ELSE {render(e.otherwise)} END",
    decoding.Values: _values,
    decoding.AnyType: _any_type,
}


def _frame_values(b: str, dtype: str, dims: tuple[int, ...]) -> str:
    """One frame's raw bytes (C order) as the nested arrays of its values."""
    index = " + ".join(f"i{a} * {int(np.prod(dims[a + 1:], dtype=np.int64))}" for a in range(len(dims)))
    byte = f"CAST(conv(substr(hex({b}), 2 * ({index}) + 1, 2), 16, 10) AS INT)"
    expr = f"CAST((({byte} + 128) % 256 - 128) AS TINYINT)" if dtype == "int8" else f"CAST({byte} AS SMALLINT)"
    for a in reversed(range(len(dims))):
        expr = f"transform(sequence(0, {dims[a] - 1}), i{a} -> {expr})"
    return f"CASE WHEN {b} IS NULL THEN NULL ELSE {expr} END"
