"""Typed physical column names: how environments whose columns differ in type share one Delta table.

The Delta log has one type per column name. A column whose type (as the log records it, see
:func:`~trajstore.schema.delta_type`) differs from the type the log already has under its name (CartPole's
``action`` int64 beside Pendulum's float32[1]; ``obs`` float32[4] beside uint8 frames) is stored under
``<name>__<tag>``, the tag derived from its type alone (``action__float32_1d``, ``obs__uint8_3d``,
``obs__struct_1a2b3c``). A file records the names it uses in its format (``columns``: logical -> physical);
trajstore's readers always show logical names, external Delta readers see honest, typed columns.

Names are resolved against the log before a writer writes its first file, and the new columns are added to the
log's schema in a commit of their own (:meth:`~trajstore.storage.table.StepsTable.reserve`): two writers racing
for one name with different types cannot both get it (the loser's commit fails, it resolves again).

>>> import pyarrow as pa
>>> resolve({"action": pa.list_(pa.float32(), 1)}, {"action": pa.int64()})
({'action': 'action__float32_1d'}, [pa.field('action__float32_1d', pa.list_(pa.float32()))])

The names users give are checked here too, by one rule, where they enter (writer extras and lineage, ingest,
``info_keys``, ``add_column``): a column name (:func:`check_column_name`) is one every engine of the open table can
hold, and no two columns differ only in case (:func:`check_distinct`); a run, environment or agent id
(:func:`check_id`) is one every path takes alike (a folder name, a segment of the REST API's paths).

>>> name_problem("Seed")
"it differs only in case from the step column 'seed'"
>>> name_problem("TimeLimit.truncated") is None
True
"""

from __future__ import annotations

import json
import unicodedata
from functools import lru_cache
from typing import Any, Iterable, Mapping, Protocol
from urllib.parse import quote

import pyarrow as pa

from trajstore import schema as sch
from trajstore.errors import InputError
from trajstore.schema import delta_type, describe, type_tag
from trajstore.storage.encoding import OBS, FileEncoding, declaration, declare, stored_names, type_declaration

SEPARATOR = "__"
META = "trajstore"  # the field-metadata key of a declaration
MAX_TRIES = 100


def candidates(name: str, t: pa.DataType) -> list[str]:
    """The physical names a column ``name`` whose logical type is ``t`` may take, in order of preference."""
    tagged = f"{name}{SEPARATOR}{type_tag(t)}"
    return [name, tagged] + [f"{tagged}_{i}" for i in range(2, MAX_TRIES)]


def resolve(types: Mapping[str, pa.DataType], log: Mapping[str, pa.DataType],
            logical: Mapping[str, pa.DataType] | None = None, *,
            declared: Mapping[str, Mapping[str, Any] | None] | None = None,
            log_declared: Mapping[str, Mapping[str, Any] | None] | None = None,
            ) -> tuple[dict[str, str], list[pa.Field]]:
    """For each column (name -> stored Arrow type), the physical name it is stored under, given the log's columns
    (name -> type); and the columns the log must gain (their Delta types, each with its declaration in its field
    metadata). Tags are made from the ``logical`` types where given (an image's bytes say nothing of its dtype),
    else from the stored ones. ``declared``: what a column must declare (its field and how it is stored, see
    :func:`~trajstore.storage.encoding.declaration`); a name already taken with another type or another way of
    storing (``log_declared``), or taken in another case (a column whose name was not checked, or one a racing
    writer added), is not reused."""
    declared, log_declared = declared or {}, log_declared or {}
    taken = {name: _key(delta_type(t), log_declared.get(name)) for name, t in log.items()}
    folded = {name.lower() for name in taken}  # Delta refuses a name another column has in another case
    mapping: dict[str, str] = {}
    new: list[pa.Field] = []
    for name, t in types.items():
        wanted = delta_type(t)
        spec = dict(declared.get(name) or {})
        field = spec.pop("field", name)
        key = _key(wanted, spec)
        for candidate in candidates(name, (logical or {}).get(name, t)):
            have = taken.get(candidate)
            if have is None and candidate.lower() in folded:
                continue
            if have is None:
                taken[candidate] = key
                folded.add(candidate.lower())
                meaning = {"field": field, **spec} if spec or candidate != field else None
                metadata = {META: json.dumps(meaning, separators=(",", ":"))} if meaning else None
                new.append(pa.field(candidate, wanted, metadata=metadata))
            elif have != key:
                continue
            mapping[name] = candidate
            break
        else:
            raise ValueError(f"{name}: no free column name for type {describe(t)} after {MAX_TRIES} tries")
    return mapping, new


def _key(t: pa.DataType, spec: Mapping[str, Any] | None) -> str:
    """What a physical name stands for: its Delta type and how it stores its field (not which field)."""
    how = {k: v for k, v in (spec or {}).items() if k != "field"}
    return describe(t) + (json.dumps(how, sort_keys=True) if how else "")


class Reserve(Protocol):
    def __call__(self, types: Mapping[str, pa.DataType], logical: Mapping[str, pa.DataType],
                 declared: Mapping[str, Mapping[str, Any] | None]) -> dict[str, str]: ...


def stored_rows(rows: pa.Table, fmt: FileEncoding, logical: Mapping[str, pa.DataType], reserve: Reserve) -> pa.Table:
    """``rows`` (logical names, obs/next_obs encoded as ``fmt`` says; ``logical``: the types readers return) under
    the names they are stored under in the current encoding (:func:`stored_schema`)."""
    return pa.Table.from_arrays(rows.columns, schema=stored_schema(rows.schema, fmt, logical, reserve))


def stored_schema(schema: pa.Schema, fmt: FileEncoding, logical: Mapping[str, pa.DataType],
                  reserve: Reserve) -> pa.Schema:
    """The schema rows of ``schema`` are stored with: the names of the current encoding
    (:func:`~trajstore.storage.encoding.stored_names`, then a type tag where the name is taken), each reserved and
    declared in the log first by ``reserve``; the file's footer records its format, its fields their declarations."""
    target = FileEncoding.create(frame_stack=fmt.stacks, frames=fmt.images)
    target = target.with_columns(stored_names(target))
    base = {n: target.physical(n) for n in schema.names}
    types = {base[n]: schema.field(n).type for n in schema.names}
    declared = {base[n]: {**(declaration(target, n) or {}), **type_declaration(types[base[n]])}
                for n in schema.names}
    names = reserve(types, {base[n]: logical.get(n, types[base[n]]) for n in schema.names},
                    {b: ({"field": n, **d} if d else None) for n, b, d in
                     ((n, base[n], declared[base[n]]) for n in schema.names)})
    final = {n: names[base[n]] for n in schema.names}
    stored = target.with_columns(final)
    renamed = pa.schema([f.with_name(final[f.name]) for f in schema])
    return declare(renamed, stored).with_metadata(stored.metadata())


# --- the names users give: one rule, checked where each name enters ------------------------------------------

MAX_NAME = 128  # characters: with a type tag (<name>__<tag>, ~25 more) a stored name stays within AWS Glue's 255
REFUSED = " ,;{}()=\n\t"  # what Spark and Delta refuse in a column name without column mapping (Delta's own list)
MAX_ID = 200  # characters of a run, environment or agent id (what the REST routes take)
MAX_FOLDER = 255  # bytes of one file name: a partition folder ``run_id=<id, percent-encoded>``
HIVE_NULL = "__HIVE_DEFAULT_PARTITION__"  # the folder name Hive partitioning reads back as null
PARTITIONS = tuple(sch.PARTITION_COLUMNS)  # ids that are folder names
SEGMENTS = ("run_id",)  # ids that are a segment of the REST API's paths (/runs/{run_id}): no "/"
RULE = (f"a name has 1-{MAX_NAME} characters, no whitespace at either end, no control characters and none of "
        "' ,;{}()=' (Delta and Spark refuse them in names without column mapping; DuckDB cannot hold an empty one)")


@lru_cache(maxsize=1)
def own_names() -> frozenset[str]:
    """The names trajstore gives columns itself: the step schema's columns, and the names it stores ``obs`` and
    ``next_obs`` under (:func:`~trajstore.storage.encoding.stored_names` of each encoding)."""
    formats = [FileEncoding.create(), FileEncoding.create(frame_stack={OBS: 2}),
               FileEncoding.create(frames={OBS: ("uint8", (2, 2))})]
    stored = {name for fmt in formats for name in stored_names(fmt).values()}
    return frozenset({c["name"] for c in sch.step_columns()} | stored)


def name_problem(name: Any) -> str | None:
    """Why ``name`` cannot be the name of a column users give (an extra, a lineage value, an info key, a derived
    column), or None: the characters Delta, Spark or DuckDB cannot hold (:data:`RULE`), trajstore's own
    columns in any case (:func:`own_names`), another case of a lineage column of the schema (``Seed``), and the
    typed form trajstore gives its columns (``reward__float64``). A lineage column under its own name is fine."""
    return _characters_problem(name) or _taken_problem(name)


def _characters_problem(name: Any) -> str | None:
    """Why no engine of the open table can hold ``name`` as a column's or a struct field's name (:data:`RULE`)."""
    if not isinstance(name, str):
        return f"expected a string, got {type(name).__name__}"
    if not name:
        return "it is empty"
    if len(name) > MAX_NAME:
        return f"it has {len(name)} characters"
    if name.strip() != name:
        return "it begins or ends with whitespace"
    bad = next((c for c in name if c in REFUSED or unicodedata.category(c) in ("Cc", "Cs")), None)
    return None if bad is None else f"it holds {bad!r}"


def _taken_problem(name: str) -> str | None:
    """Why ``name`` is a name trajstore takes for itself (see :func:`name_problem`), or None."""
    folded, lineage = name.lower(), set(sch.lineage_columns())
    if folded in own_names():
        which = f"{folded!r} is" if name == folded else f"it differs only in case from {folded!r},"
        return f"{which} a column trajstore fills or stores itself"
    if folded in lineage and name != folded:
        return f"it differs only in case from the step column {folded!r}"
    typed = next((c for c in sorted(own_names() | lineage) if folded.startswith(c + SEPARATOR)), None)
    return None if typed is None else f"trajstore stores {typed!r} under names of the form {typed}{SEPARATOR}<type>"


def check_column_name(name: Any, *, field: str) -> str:
    """``name``, refused naming ``field`` unless it can be the name of a column users give (:func:`name_problem`)."""
    problem = name_problem(name)
    if problem is not None:
        raise InputError(f"{field}: {name!r} cannot be a column name: {problem}; {RULE}, and a column users give "
                         "is none of trajstore's own (in any case)")
    return name  # type: ignore[no-any-return]


def check_distinct(names: Iterable[str], existing: Iterable[str] = (), *, field: str) -> None:
    """Refuse a name given twice in ``names`` (one batch's columns, one struct's fields), and two names that differ
    only in case: two of ``names``, or one of them and one of ``existing`` (the table's columns). Delta, Spark and
    DuckDB take names case-insensitively: Delta refuses such a pair in one schema, DuckDB reads one of them under
    another name."""
    seen = {n.lower(): (n, "a column already there") for n in existing}
    given: set[str] = set()
    for name in names:
        if name in given:
            raise InputError(f"{field}: {name!r} is given twice; each name once")
        other, where = seen.setdefault(name.lower(), (name, "given beside it"))
        if other != name:
            raise InputError(f"{field}: {name!r} and {other!r} ({where}) differ only in case; Delta, Spark and "
                             "DuckDB take names case-insensitively: give one of them another name")
        given.add(name)


def check_fields(t: pa.DataType, *, field: str) -> None:
    """Refuse a struct field of a column of type ``t`` (a Dict observation's keys, a dict extra's; at any depth,
    in lists too) whose name no engine can hold (the characters of :data:`RULE`), or two fields of one struct
    that differ only in case; ``field`` names the column."""
    while pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        t = t.value_type
    if not pa.types.is_struct(t):
        return
    for f in t:
        problem = _characters_problem(f.name)
        if problem is not None:
            raise InputError(f"{field}.{f.name}: {f.name!r} cannot be a field name: {problem}; {RULE}")
        check_fields(f.type, field=f"{field}.{f.name}")
    check_distinct([f.name for f in t], field=field)


def id_problem(value: Any, *, field: str) -> str | None:
    """Why ``value`` cannot be a ``run_id``, ``env_id`` or ``agent_id``, or None: it is a non-empty string of at
    most :data:`MAX_ID` characters without whitespace at either end or control characters; a run or environment
    id is also a folder name (``run_id=<percent-encoded>``, at most :data:`MAX_FOLDER` bytes, never the one Hive
    reads as null), and a run id a segment of the REST API's paths (no ``/``)."""
    if not isinstance(value, str) or not value:
        return "it is empty" if isinstance(value, str) else f"it is not a string but {type(value).__name__}"
    if value.strip() != value:
        return "whitespace at either end"
    bad = next((c for c in value if unicodedata.category(c) in ("Cc", "Cs")), None)
    if bad is not None:
        return f"it holds {bad!r}"
    if field in SEGMENTS and "/" in value:
        return "it holds '/'; a run id is a segment of the REST API's paths (/runs/{run_id})"
    if len(value) > MAX_ID:
        return f"it has {len(value)} characters"
    folder = f"{field}={quote(value, safe='')}"
    if field in PARTITIONS and len(folder) > MAX_FOLDER:
        return f"its folder name {field}=… is {len(folder)} bytes percent-encoded; at most {MAX_FOLDER}"
    if field in PARTITIONS and value == HIVE_NULL:
        return "it is the folder name Hive partitioning reads back as null"
    return None


def check_id(value: Any, *, field: str) -> str:
    """``value``, refused naming ``field`` unless it can be a ``run_id``, ``env_id`` or ``agent_id``
    (:func:`id_problem`): the one check of every path that writes one (writers, ingest, run descriptions,
    rollouts, the CLI)."""
    problem = id_problem(value, field=field)
    if problem is not None:
        slash = " or '/'" if field in SEGMENTS else ""
        raise InputError(f"{field} must be a non-empty string without surrounding spaces, control characters{slash}, "
                         f"of at most {MAX_ID} characters; got {value!r}: {problem}")
    return value  # type: ignore[no-any-return]


def readable(name: str) -> bool:
    """Whether DuckDB can hold a stored column of this name (all but the empty one, which DuckDB cannot hold at
    all: readers leave such a column, written before names were checked, out of their views)."""
    return name != ""
