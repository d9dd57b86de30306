"""The decoding SQL in Spark SQL's dialect: one ``CREATE TEMP VIEW steps`` that Spark runs unchanged over the
table's stored rows to give the steps trajstore's readers give (:func:`decoding_sql`).

It says what :func:`trajstore.query.snapshot.decoding_sql` says for DuckDB, in what Spark has: no macros (a frame's
bytes are made values inline, by ``transform`` over ``sequence``), no ``SELECT * REPLACE`` (every column listed),
``collect_list`` over a window of rows for the frames of a stack, 0-based ``[]``. Spark has no unsigned integers:
uint8 image values are SMALLINT, as Spark reads uint8 columns. Where a column has another Spark type in another
environment (an int action beside a float one), Spark cannot hold both in one column: there it is that value as
JSON text (``to_json``), or its text for a scalar; select one environment to see it in its own type.
"""

from __future__ import annotations

from typing import Callable, Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError
from trajstore.query.groups import FileGroup, group_files
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
    fmt = g.format
    where = [f"env_id IN ({', '.join(literal(e) for e in g.env_ids)})"]
    physical = ["run_id", "env_id", *g.physical.names]
    logical = dict(zip(g.physical.names, g.logical.names))
    logical.update(run_id="run_id", env_id="env_id")
    decoded = fmt.encoded and OBS in g.logical.names
    obs = fmt.physical(OBS) if decoded else None
    nxt = fmt.physical(NEXT) if decoded and NEXT in g.logical.names else None
    if obs is not None:
        where.append(f"{ident(obs)} IS NOT NULL")
    select = f"SELECT * FROM {ident(source)} WHERE {' AND '.join(where)}"
    obs_type = g.logical.field(OBS).type if decoded else None
    stacks, images = (fmt.stacks, fmt.images) if decoded else ({}, {})
    if obs is not None and obs_type is not None and _any(obs_type, stacks):
        select = _replace(physical, {obs: _obs_expr(ident(obs), obs_type, stacks)}, select)
    if obs is not None and nxt is not None and obs_type is not None:
        stored = _next_expr(ident(nxt), ident(obs), obs_type, stacks, set(images))
        expr = f"CASE WHEN {ident(nxt)} IS NULL THEN lead({ident(obs)}) OVER ({WINDOW}) ELSE {stored} END"
        select = _replace(physical, {nxt: expr}, select)
    by_logical = {lg: p for p, lg in logical.items()}
    out = []
    for name in order:
        p = by_logical.get(name)
        if p is None:
            value = f"CAST(NULL AS {'STRING' if name in mixed else spark_type(types[name])})"
        else:
            value = ident(p)
            if obs_type is not None and p in (obs, nxt) and images:
                value = _values_expr(value, obs_type, images, stacks)
            if name in mixed:
                t = g.logical.field(name).type
                nested = pa.types.is_nested(t)
                value = f"to_json({value})" if nested else f"CAST({value} AS STRING)"
        out.append(f"{value} AS {ident(name)}")
    return f"SELECT {', '.join(out)} FROM ({select})"


def _replace(names: list[str], exprs: dict[str, str], select: str) -> str:
    cols = [f"{exprs[n]} AS {ident(n)}" if n in exprs else ident(n) for n in names]
    return f"SELECT {', '.join(cols)} FROM ({select})"


def _any(t: pa.DataType, stacks: dict[str, int], path: str = OBS) -> bool:
    if pa.types.is_struct(t):
        return any(_any(f.type, stacks, f"{path}.{f.name}") for f in t)
    return path in stacks


def _field(ref: str, name: str) -> str:
    return f"{ref}.{ident(name)}"


def _each_leaf(ref: str, t: pa.DataType, path: str, leaf: Callable[[str, pa.DataType, str], str]) -> str:
    """``leaf(ref, type, path)`` of each leaf of ``ref`` (a struct: its fields, recursively, as one struct)."""
    if not pa.types.is_struct(t):
        return leaf(ref, t, path)
    parts = [f"{literal(f.name)}, {_each_leaf(_field(ref, f.name), f.type, f'{path}.{f.name}', leaf)}" for f in t]
    return f"named_struct({', '.join(parts)})"


def _obs_expr(ref: str, t: pa.DataType, stacks: dict[str, int]) -> str:
    def leaf(r: str, _: pa.DataType, path: str) -> str:
        if path not in stacks:
            return r
        k = int(stacks[path])
        frames = f"collect_list({r}) OVER ({WINDOW} ROWS BETWEEN {k - 1} PRECEDING AND CURRENT ROW)"
        return f"slice(flatten({frames}), {-k}, {k})"

    return _each_leaf(ref, t, OBS, leaf)


def _next_expr(ref: str, obs: str, t: pa.DataType, stacks: dict[str, int], images: set[str], path: str = OBS) -> str:
    if pa.types.is_struct(t):
        parts = [f"{literal(f.name)}, "
                 f"{_next_expr(_field(ref, f.name), _field(obs, f.name), f.type, stacks, images, f'{path}.{f.name}')}"
                 for f in t]
        return f"named_struct({', '.join(parts)})"
    if path not in stacks:
        return f"{ref}[0]" if path in images else ref
    k = int(stacks[path])
    return f"CASE WHEN size({ref}) = {k} THEN {ref} ELSE concat(slice({obs}, 2, {k - 1}), {ref}) END"


def _values_expr(ref: str, t: pa.DataType, images: dict[str, tuple[str, tuple[int, ...]]],
                 stacks: dict[str, int]) -> str:
    """``ref`` with each image leaf's bytes (a stacked leaf: a list of frames' bytes) made the nested arrays of their
    values (uint8/int8 frames; other dtypes stay bytes: SQL cannot reinterpret them)."""
    def leaf(r: str, _: pa.DataType, path: str) -> str:
        if path not in images or str(images[path][0]) not in ("uint8", "int8"):
            return r
        dtype, dims = str(images[path][0]), tuple(int(d) for d in images[path][1])
        if path in stacks:
            return f"transform({r}, f -> {_frame_values('f', dtype, dims)})"
        return _frame_values(r, dtype, dims)

    return _each_leaf(ref, t, OBS, leaf)


def _frame_values(b: str, dtype: str, dims: tuple[int, ...]) -> str:
    """One frame's raw bytes (C order) as the nested arrays of its values."""
    index = " + ".join(f"i{a} * {int(np.prod(dims[a + 1:], dtype=np.int64))}" for a in range(len(dims)))
    byte = f"CAST(conv(substr(hex({b}), 2 * ({index}) + 1, 2), 16, 10) AS INT)"
    expr = f"CAST((({byte} + 128) % 256 - 128) AS TINYINT)" if dtype == "int8" else f"CAST({byte} AS SMALLINT)"
    for a in reversed(range(len(dims))):
        expr = f"transform(sequence(0, {dims[a] - 1}), i{a} -> {expr})"
    return f"CASE WHEN {b} IS NULL THEN NULL ELSE {expr} END"
