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

from typing import Mapping

import pyarrow as pa

from trajstore.schema import delta_type, describe, type_tag

SEPARATOR = "__"
MAX_TRIES = 100


def candidates(name: str, t: pa.DataType) -> list[str]:
    """The physical names a column ``name`` whose logical type is ``t`` may take, in order of preference."""
    tagged = f"{name}{SEPARATOR}{type_tag(t)}"
    return [name, tagged] + [f"{tagged}_{i}" for i in range(2, MAX_TRIES)]


def resolve(types: Mapping[str, pa.DataType], log: Mapping[str, pa.DataType],
            logical: Mapping[str, pa.DataType] | None = None) -> tuple[dict[str, str], list[pa.Field]]:
    """For each column (logical name -> stored Arrow type), the physical name it is stored under, given the
    log's columns (name -> type); and the columns the log must gain (their Delta types). Tags are made from the
    ``logical`` types where given (an image's bytes say nothing of its dtype), else from the stored ones."""
    taken = {name: describe(delta_type(t)) for name, t in log.items()}
    mapping: dict[str, str] = {}
    new: list[pa.Field] = []
    for name, t in types.items():
        wanted = delta_type(t)
        key = describe(wanted)
        for candidate in candidates(name, (logical or {}).get(name, t)):
            have = taken.get(candidate)
            if have is None:
                taken[candidate] = key
                new.append(pa.field(candidate, wanted))
            elif have != key:
                continue
            mapping[name] = candidate
            break
        else:
            raise ValueError(f"{name}: no free column name for type {describe(t)} after {MAX_TRIES} tries")
    return mapping, new
