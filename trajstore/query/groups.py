"""The committed files as readers take them: grouped by how they are stored, and the steps' types across them.

Files of one environment share their columns' types and names; files of environments of other kinds do not
(CartPole's int64 ``action``, Pendulum's float32[1] under ``action__float32_1d``), and encoding-2 files need
decoding. A :class:`FileGroup` is a set of files read in one pass (one DuckDB ``read_parquet``, one pyarrow
dataset): one format (encoding, frame stacks, physical names), and each column of one kind (shapes may differ
where nothing is decoded: they are then read as variable-size lists). :func:`step_types` says what a reader
returns for each logical column over all groups, and which columns cannot be one column at all (other kinds,
dtypes, nestings: :class:`StepTypes` names them with their environments).
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Sequence

import numpy as np
import pyarrow as pa

from trajstore import schema as sch
from trajstore.errors import InputError
from trajstore.storage.encoding import NEXT, OBS, FileEncoding, FileSchema, logical_schema
from trajstore.storage.log import DataFile
from trajstore.storage.names import readable


@dataclass
class FileGroup:
    """Files read in one pass: their format, the physical schema they share (variable-size lists where fixed
    sizes differ) and the logical columns they give. A column whose name DuckDB cannot hold (an empty one,
    written before names were checked: see :func:`~trajstore.storage.names.readable`) is left out of both: no
    reader's view or scan has it, ``check`` names it, its files keep it."""

    files: list[DataFile]
    format: FileEncoding
    physical: pa.Schema
    logical: pa.Schema = field(init=False)
    _types: dict[str, list[pa.DataType]] = field(default_factory=dict, repr=False)
    _schemas: int = field(default=0, repr=False)  # the distinct physical schemas of its files

    def __post_init__(self) -> None:
        self.logical = logical_schema(self.physical, self.format)

    @property
    def env_ids(self) -> list[str]:
        return sorted({f.env_id for f in self.files})

    def takes(self, fmt: FileEncoding, physical: pa.Schema) -> bool:
        """Whether a file of format ``fmt`` and schema ``physical`` can be read with this group's files."""
        if fmt.key() != self.format.key():
            return False
        exact = {fmt.physical(OBS), fmt.physical(NEXT)} if fmt.encoded else set()
        for f in physical:
            if f.name in self._types:
                known = self._types[f.name][0]
                if f.name in exact and sch.describe(known) != sch.describe(f.type):
                    return False
                if _kind(known) != _kind(f.type):
                    return False
        return True

    @property
    def uniform(self) -> bool:
        """Whether every file of the group has the same columns of the same types (then one footer tells them)."""
        return self._schemas == 1

    def add(self, f: DataFile, physical: pa.Schema) -> None:
        """Take ``f``, the first file of the group stored as ``physical`` (the next ones are appended to
        :attr:`files`)."""
        self._schemas += 1
        self.files.append(f)
        logical = self.format.logical_names()
        for column in physical:
            if not (readable(column.name) and readable(logical.get(column.name, column.name))):
                continue
            types = self._types.setdefault(column.name, [])
            if all(sch.describe(t) != sch.describe(column.type) for t in types):
                types.append(column.type)
        self.physical = pa.schema([pa.field(n, t[0] if len(t) == 1 else loose(t[0])) for n, t in self._types.items()])
        self.logical = logical_schema(self.physical, self.format)


def group_files(files: Sequence[DataFile], schemas: Sequence[FileSchema]) -> list[FileGroup]:
    """``files`` in groups read in one pass each, in the order of their first file."""
    groups: list[FileGroup] = []
    # a file stored exactly as an earlier one goes where it went (the group's first types never change, and an
    # earlier group that refused it refuses it still): no type comparisons per file, however many files
    placed: dict[tuple[str, pa.Schema], FileGroup] = {}
    for f, stored in zip(files, schemas):
        key = (stored.format.key(), stored.physical)
        group = placed.get(key)
        if group is not None:
            group.files.append(f)
            continue
        group = next((g for g in groups if g.takes(stored.format, stored.physical)), None)
        if group is None:
            group = FileGroup([], stored.format, pa.schema([]))
            groups.append(group)
        group.add(f, stored.physical)
        placed[key] = group
    return groups


def _kind(t: pa.DataType) -> str:
    """A type without its fixed sizes: what files may differ in and still be read in one pass."""
    return sch.describe(loose(t))


def loose(t: pa.DataType) -> pa.DataType:
    """``t`` with every fixed-size list a variable-size one."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, loose(f.type)) for f in t])
    if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
        return pa.list_(loose(t.value_type))
    return t


def as_duckdb_reads(schema: pa.Schema) -> pa.Schema:
    """``schema`` as DuckDB's ``read_parquet`` gives it: variable-size lists, float16 as float32 (so that a
    registered dataset reads as the files do)."""
    def of(t: pa.DataType) -> pa.DataType:
        if pa.types.is_struct(t):
            return pa.struct([pa.field(f.name, of(f.type)) for f in t])
        if pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t):
            return pa.list_(of(t.value_type))
        return pa.float32() if t == pa.float16() else t
    return pa.schema([pa.field(f.name, of(f.type)) for f in schema])


def unify(types: Sequence[pa.DataType]) -> pa.DataType | None:
    """One type for values of every one of ``types``: the type itself when they agree, variable-size lists where
    only sizes differ, a struct of unified fields, the wider of numeric scalars; None when there is none."""
    first = types[0]
    if all(sch.describe(t) == sch.describe(first) for t in types):
        return first
    if all(pa.types.is_struct(t) for t in types):
        names = [f.name for f in first]
        if any([f.name for f in t] != names for t in types):
            return None
        fields = [unify([t.field(n).type for t in types]) for n in names]
        return None if any(f is None for f in fields) else pa.struct(list(zip(names, fields)))  # type: ignore[arg-type]
    if all(_kind(t) == _kind(first) for t in types):
        return loose(first)
    if all(_numeric(t) for t in types):
        dtype = np.result_type(*[sch.numpy_dtype(t) for t in types])
        return pa.from_numpy_dtype(dtype)
    return None


def _numeric(t: pa.DataType) -> bool:
    return pa.types.is_integer(t) or pa.types.is_floating(t)


@dataclass(frozen=True)
class StepTypes:
    """What readers return for the steps of some files: ``schema`` (every column of the ``steps`` view, in its
    order, typed as a scan returns it), ``conflicts`` (columns whose types cannot be one: column -> type -> the
    environments storing it that way) and ``ragged`` (columns that are one column of variable-size lists, as
    their environments store them in other shapes: no array can stack them)."""

    schema: pa.Schema
    conflicts: dict[str, dict[str, list[str]]] = field(default_factory=dict)
    ragged: dict[str, dict[str, list[str]]] = field(default_factory=dict)

    def check_one_type(self, columns: Sequence[str], *, stackable: bool = False, hint: str | None = None) -> None:
        """Raise :class:`InputError` naming the first of ``columns`` whose environments store it in types that
        cannot be one column (with ``stackable``: one array), their env ids and types; ``hint`` says how to
        select one environment (default: env_id=, or leave the column out)."""
        for name in columns:
            found = self.conflicts.get(name) or (self.ragged.get(name) if stackable else None)
            if found:
                kinds = "; ".join(f"{', '.join(envs)}: {t}" for t, envs in found.items())
                what = "one array" if name not in self.conflicts else "one column"
                raise InputError(f"columns: {name!r} is stored in types that cannot be {what} by the selected "
                                 f"environments ({kinds}); "
                                 f"{hint or f'select one with env_id= (or leave {name!r} out)'}")


def step_types(groups: Sequence[FileGroup]) -> StepTypes:
    """The types of the ``steps`` columns over ``groups`` (see :class:`StepTypes`)."""
    seen: dict[str, list[tuple[pa.DataType, list[str]]]] = {}
    for g in groups:
        for f in g.logical:
            seen.setdefault(f.name, []).append((f.type, g.env_ids))
    types, conflicts, ragged = {}, {}, {}
    for name, found in seen.items():
        unified = unify([t for t, _ in found])
        by_type: dict[str, set[str]] = {}
        for t, envs in found:
            by_type.setdefault(sch.describe(t), set()).update(envs)
        described = {t: sorted(envs) for t, envs in by_type.items()}
        if unified is None:
            conflicts[name] = described
            unified = found[0][0]
        elif len(described) > 1 and not _numeric(unified):
            ragged[name] = described
        types[name] = unified
    types.update({name: pa.string() for name in sch.PARTITION_COLUMNS})
    fields = [pa.field(name, types[name] if null_type is None else null_type)
              for name, null_type in sch.view_columns(list(types))]
    return StepTypes(pa.schema(fields), conflicts, ragged)
