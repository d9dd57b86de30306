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
"""

from __future__ import annotations

import json
from typing import Any, Mapping, Protocol

import pyarrow as pa

from trajstore.schema import delta_type, describe, type_tag
from trajstore.storage.encoding import Format, declaration, declare, stored_names, type_declaration

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
    storing (``log_declared``) is not reused."""
    declared, log_declared = declared or {}, log_declared or {}
    taken = {name: _key(delta_type(t), log_declared.get(name)) for name, t in log.items()}
    mapping: dict[str, str] = {}
    new: list[pa.Field] = []
    for name, t in types.items():
        wanted = delta_type(t)
        spec = dict(declared.get(name) or {})
        field = spec.pop("field", name)
        key = _key(wanted, spec)
        for candidate in candidates(name, (logical or {}).get(name, t)):
            have = taken.get(candidate)
            if have is None:
                taken[candidate] = key
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


def stored_rows(rows: pa.Table, fmt: Format, logical: Mapping[str, pa.DataType], reserve: Reserve) -> pa.Table:
    """``rows`` (logical names, obs/next_obs encoded as ``fmt`` says; ``logical``: the types readers return) under
    the names they are stored under in the current encoding (:func:`stored_schema`)."""
    return pa.Table.from_arrays(rows.columns, schema=stored_schema(rows.schema, fmt, logical, reserve))


def stored_schema(schema: pa.Schema, fmt: Format, logical: Mapping[str, pa.DataType], reserve: Reserve) -> pa.Schema:
    """The schema rows of ``schema`` are stored with: the names of the current encoding
    (:func:`~trajstore.storage.encoding.stored_names`, then a type tag where the name is taken), each reserved and
    declared in the log first by ``reserve``; the file's footer records its format, its fields their declarations."""
    target = Format.create(frame_stack=fmt.stacks, frames=fmt.images)
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
