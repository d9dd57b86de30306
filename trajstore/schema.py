"""The ``steps`` and ``episodes`` schemas, read from the versioned JSON files in ``schemas/``.

The writer builds its Arrow schema from ``step.v1.json`` and the observation/action spaces;
the query layer builds the ``episodes`` view from ``episode.v1.json``. Nothing here is a
second copy of those files.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore.errors import InputError, SchemaMismatchError

STEP_SCHEMA_FILE = "step.v1.json"
EPISODE_SCHEMA_FILE = "episode.v1.json"

_SCALAR_TYPES: dict[str, pa.DataType] = {
    "string": pa.string(),
    "int64": pa.int64(),
    "int32": pa.int32(),
    "float32": pa.float32(),
    "float64": pa.float64(),
    "bool": pa.bool_(),
    "timestamp[us, UTC]": pa.timestamp("us", tz="UTC"),
}


def _schema_dir() -> Path:
    here = Path(__file__).resolve().parent
    for candidate in (here / "_schemas", here.parent / "schemas"):
        if (candidate / STEP_SCHEMA_FILE).is_file():
            return candidate
    raise FileNotFoundError(f"trajstore's schema files ({STEP_SCHEMA_FILE}) are missing from the installation")


@lru_cache(maxsize=None)
def load(name: str) -> dict[str, Any]:
    """The parsed JSON schema file ``name`` (``step.v1.json`` or ``episode.v1.json``)."""
    return json.loads((_schema_dir() / name).read_text())


def _names(role: str) -> tuple[str, ...]:
    return tuple(c["name"] for c in load(STEP_SCHEMA_FILE)["columns"] if c.get("role") == role)


PARTITION_COLUMNS = _names("partition")  # ("run_id", "env_id")
TRANSITION_COLUMNS = _names("transition")  # ("obs", "action", "reward", "next_obs", "terminated", "truncated")


def arrow_type(name: str) -> pa.DataType:
    """The Arrow type of a type name used in the schema files."""
    return _SCALAR_TYPES[name]


def step_columns() -> list[dict[str, Any]]:
    return list(load(STEP_SCHEMA_FILE)["columns"])


def lineage_columns() -> dict[str, pa.DataType]:
    """Known lineage/extra columns and their Arrow types, in schema order."""
    return {c["name"]: arrow_type(c["type"]) for c in load(STEP_SCHEMA_FILE)["lineage"]}


def fixed_types() -> dict[str, pa.DataType]:
    """Arrow types the step schema fixes (every column but the space-typed ``obs``/``action``/``next_obs``)."""
    return {c["name"]: arrow_type(c["type"]) for c in load(STEP_SCHEMA_FILE)["columns"] if c["type"] != "space"}


def accepted_type(name: str, value: Any) -> pa.DataType | None:
    """The type a column the step schema fixes takes for ``value`` (an array) in an environment that has none yet:
    its own dtype where the schema ``accepts`` it (``reward``: float32, or float64 kept as float64), else None (the
    column's fixed type). An environment's stored type, once it has one, wins over this."""
    spec = next((c for c in load(STEP_SCHEMA_FILE)["columns"] if c["name"] == name), None)
    dtype = getattr(value, "dtype", None)
    if spec is None or dtype is None or np.dtype(dtype).name not in spec.get("accepts", ()):
        return None
    return arrow_type(np.dtype(dtype).name)


def view_columns(stored: Sequence[str]) -> list[tuple[str, pa.DataType | None]]:
    """The columns of the ``steps`` view over stored columns named ``stored``, in its order: the schema's own
    (lineage ones always, as a typed null where not stored; ``agent_id`` only where stored), then every lineage
    column, then other extras by name. Each with None when stored, else the type of the null that stands for
    it."""
    spec = load(STEP_SCHEMA_FILE)
    out: list[tuple[str, pa.DataType | None]] = []
    for c in spec["columns"]:
        if c["name"] in stored:
            out.append((c["name"], None))
        elif c.get("role") == "lineage":
            out.append((c["name"], arrow_type(c["type"])))
    for c in spec["lineage"]:
        out.append((c["name"], None if c["name"] in stored else arrow_type(c["type"])))
    described = {c["name"] for c in spec["columns"] + spec["lineage"]}
    return out + [(n, None) for n in sorted(n for n in stored if n not in described)]


def episode_columns() -> list[dict[str, Any]]:
    return list(load(EPISODE_SCHEMA_FILE)["columns"])


def episode_lineage() -> list[str]:
    """Lineage columns the ``episodes`` view carries (taken at each episode's first step)."""
    return [c["name"] for c in load(STEP_SCHEMA_FILE)["lineage"] if c.get("in_episodes")]


def episode_names() -> list[str]:
    """Columns of the ``episodes`` view that every store has: those of ``episode.v1.json``."""
    return [c["name"] for c in episode_columns()]


def episode_column_names() -> list[str]:
    """Columns of the ``episodes`` view: those of ``episode.v1.json``, then its lineage columns."""
    return [c["name"] for c in episode_columns()] + episode_lineage()


# --- spaces and arrays -> Arrow types -------------------------------------------------------------

@dataclass(frozen=True)
class Leaf:
    """What one step of an array column holds: its per-step shape and numpy dtype."""

    shape: tuple[int, ...]
    dtype: np.dtype

    def describe(self) -> str:
        return f"shape {self.shape} {self.dtype}"


def nested_list_type(leaf: Leaf) -> pa.DataType:
    """Arrow type for one step of ``leaf``: the dtype wrapped in one fixed-size list per dimension."""
    t = pa.from_numpy_dtype(leaf.dtype)
    for size in reversed(leaf.shape):
        t = pa.list_(t, size)
    return t


def leaf_of_type(t: pa.DataType) -> Leaf:
    """Inverse of :func:`nested_list_type` (variable-size lists give -1 for that dimension)."""
    shape: list[int] = []
    while _is_list(t):
        shape.append(t.list_size if pa.types.is_fixed_size_list(t) else -1)
        t = t.value_type
    return Leaf(tuple(shape), numpy_dtype(t))


@lru_cache(maxsize=1024)
def numpy_dtype(t: pa.DataType) -> np.dtype:
    """The numpy dtype Arrow converts values of type ``t`` to (``DataType.to_pandas_dtype`` imports pandas,
    which trajstore does not depend on). Kept per type: every check of a request's columns asks, and making an
    empty array of the type to see costs more than the rest of the check."""
    return pa.array([], t).to_numpy(zero_copy_only=False).dtype


def type_of_space(space: Any, *, role: str) -> pa.DataType:
    """Arrow type for one element of a gymnasium space (``role`` is "observation" or "action"): the space's own
    dtype, whatever it is (uint8 images stay uint8, a float64 Box stays float64)."""
    from gymnasium import spaces

    if isinstance(space, spaces.Dict):
        return pa.struct([pa.field(k, type_of_space(s, role=role)) for k, s in space.spaces.items()])
    if isinstance(space, spaces.Discrete):
        return pa.from_numpy_dtype(np.dtype(space.dtype))
    if isinstance(space, (spaces.Box, spaces.MultiBinary, spaces.MultiDiscrete)):
        return nested_list_type(Leaf(tuple(space.shape), np.dtype(space.dtype)))
    raise InputError(f"{role}_space: unsupported gymnasium space {type(space).__name__}; "
                     "expected Box, Discrete, MultiDiscrete, MultiBinary or Dict")


def type_of_array(name: str, value: Any, lead: int) -> pa.DataType:
    """Arrow type inferred from a batch array whose first ``lead`` dimensions are time/env: its own dtype
    (bool, every int and uint width, float16/32/64), strings for per-step text."""
    if isinstance(value, Mapping):
        return pa.struct([pa.field(k, type_of_array(f"{name}.{k}", v, lead)) for k, v in value.items()])
    arr = np.asarray(value)
    dtype = arr.dtype
    if dtype.kind not in "biuf":
        if dtype.kind in "US" and arr.ndim == lead:
            return pa.string()
        raise InputError(f"{name}: unsupported dtype {arr.dtype}; expected a numeric or bool array")
    return nested_list_type(Leaf(tuple(arr.shape[lead:]), dtype.newbyteorder("=")))


# --- the Delta log's view of a type, and type names ---------------------------------------------------

_DELTA_WIDER = {pa.uint8(): pa.int16(), pa.uint16(): pa.int32(), pa.uint32(): pa.int64(), pa.uint64(): pa.int64(),
                pa.float16(): pa.float32()}


def delta_type(t: pa.DataType) -> pa.DataType:
    """The type the Delta log records for a column of Arrow type ``t``: the lossless widening of what Delta cannot
    express (uint8 -> int16, uint16 -> int32, uint32 -> int64, uint64 -> int64 (values >= 2**63 do not fit),
    float16 -> float32), every list as a variable-size list. External Delta readers read the files as these."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, delta_type(f.type)) for f in t])
    if _is_list(t):
        return pa.list_(delta_type(t.value_type))
    if pa.types.is_large_string(t) or pa.types.is_string_view(t):
        return pa.string()
    if pa.types.is_fixed_size_binary(t) or pa.types.is_large_binary(t) or pa.types.is_binary_view(t):
        return pa.binary()  # image frames: Delta has no fixed-size binary
    return _DELTA_WIDER.get(t, t)


def delta_schema(schema: pa.Schema) -> pa.Schema:
    """``schema`` with every column's type as :func:`delta_type` gives it (what deltalake is handed)."""
    return pa.schema([pa.field(f.name, delta_type(f.type), nullable=True, metadata=f.metadata) for f in schema])


def describe(t: pa.DataType) -> str:
    """A short name of an Arrow type, the same for equal types whatever their list fields are called:
    ``int64``, ``float32[4]``, ``uint8[4,84,84]``, ``uint8[*,84,84]`` (a variable first axis), ``{a: int64}``."""
    if pa.types.is_struct(t):
        return "{" + ", ".join(f"{f.name}: {describe(f.type)}" for f in t) + "}"
    dims = []
    while _is_list(t):
        dims.append(str(t.list_size) if pa.types.is_fixed_size_list(t) else "*")
        t = t.value_type
    base = _base_name(t)
    return f"{base}[{','.join(dims)}]" if dims else base


def parse_described(text: str) -> pa.DataType:
    """The type :func:`describe` names (numbers, bools, strings and frames' ``fixed_size_binary[n]`` in lists of
    fixed or variable sizes, structs of them); raises ValueError for another text."""
    text = text.strip()
    if text.startswith("{") and text.endswith("}"):
        fields, depth, start, body = [], 0, 0, text[1:-1]
        for i, c in enumerate(body + ","):
            depth += c in "{[" and 1 or (-1 if c in "}]" else 0)
            if c == "," and depth == 0:
                name, _, kind = body[start:i].partition(":")
                fields.append(pa.field(name.strip(), parse_described(kind)))
                start = i + 1
        return pa.struct(fields)
    match = re.fullmatch(r"(fixed_size_binary\[(\d+)\]|[a-z][a-z0-9_]*)(?:\[([0-9*,]+)\])?", text)
    if match is None:
        raise ValueError(f"not a described type: {text!r}")
    base, width, dims = match.groups()
    t = pa.binary(int(width)) if width else pa.bool_() if base == "bool" else pa.string() if base == "string" \
        else pa.from_numpy_dtype(np.dtype(base))
    for d in reversed(dims.split(",") if dims else []):
        t = pa.list_(t) if d == "*" else pa.list_(t, int(d))
    return t


_ARROW_NAMES = {"float": "float32", "double": "float64", "halffloat": "float16", "large_string": "string",
                "string_view": "string"}


def _base_name(t: pa.DataType) -> str:
    """numpy's name of a numeric or bool type (``float32``, ``uint8``, ``bool``), Arrow's of the others."""
    name = str(t)
    return _ARROW_NAMES.get(name, name)


def type_tag(t: pa.DataType) -> str:
    """A readable tag of a stored type for a typed column name: ``float32_1d``, ``uint8_3d``, ``int64``, or
    ``struct_<6 hex digits of its Delta type>``."""
    if pa.types.is_struct(t):
        import hashlib

        return "struct_" + hashlib.sha256(describe(delta_type(t)).encode()).hexdigest()[:6]
    depth = 0
    while _is_list(t):
        depth, t = depth + 1, t.value_type
    base = _base_name(t).replace("[", "_").replace(",", "_").replace(" ", "").replace("]", "").replace("=", "")
    return f"{base}_{depth}d" if depth else base


# --- numpy <-> Arrow ---------------------------------------------------------------------------------

def _castable(src: np.dtype, dst: np.dtype) -> bool:
    if dst.kind == "f":
        return src.kind in "fiub"
    if dst.kind in "iu":
        return src.kind in "iub"
    if dst.kind == "b":
        return src.kind == "b"
    return src == dst


def check_leaf(name: str, shape: tuple[int, ...], dtype: np.dtype, want: Leaf) -> None:
    """Raise :class:`SchemaMismatchError` naming ``name`` unless values of per-step ``shape`` and ``dtype`` fit
    ``want`` (the stored shape, a dtype they convert to)."""
    if tuple(shape) != want.shape or not _castable(np.dtype(dtype), want.dtype):
        got = Leaf(tuple(shape), np.dtype(dtype))
        raise SchemaMismatchError(f"{name}: expected {want.describe()} per step (the table's schema), "
                                  f"got {got.describe()}")


def fitting(name: str, arr: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``arr`` as ``dtype``, refused naming ``name`` when a value does not fit a narrower type: an integer out of the
    integer type's range, or a finite number that the float type holds only as infinity (1e5 in a float16).
    Precision lost in the last bits of a float (what every narrowing float does) is not refused."""
    if arr.dtype == dtype or np.can_cast(arr.dtype, dtype, "safe") or not arr.size:
        return arr
    if dtype.kind == "f":
        with np.errstate(over="ignore", invalid="ignore"):
            overflow = np.isfinite(arr) & ~np.isfinite(arr.astype(dtype))
        if overflow.any():
            info: np.finfo[Any] | np.iinfo[Any] = np.finfo(dtype)
            bad = arr[overflow]
            raise SchemaMismatchError(f"{name}: values {bad.min()}..{bad.max()} do not fit the stored {dtype} (they "
                                      f"would be stored as infinity); expected finite values in "
                                      f"{float(info.min):g}..{float(info.max):g}, or a wider dtype for the column")
        return arr
    if dtype.kind not in "iu":
        return arr
    info = np.iinfo(dtype)
    lo, hi = arr.min(), arr.max()
    if lo < info.min or hi > info.max:
        raise SchemaMismatchError(f"{name}: values {lo}..{hi} do not fit the stored {dtype}; expected values in "
                                  f"{info.min}..{info.max}")
    return arr


def to_arrow(name: str, value: Any, t: pa.DataType, n: int) -> pa.Array:
    """``value`` of shape ``(n, *step_shape)`` (already flattened over time/env) as an Arrow array of type ``t``
    (no copy when it already has the stored dtype and is contiguous); a masked array's masked values are null.

    Raises :class:`SchemaMismatchError` naming ``name`` when shape or dtype do not fit ``t``.
    """
    if pa.types.is_struct(t):
        if not isinstance(value, Mapping) or set(value) != {f.name for f in t}:
            expected = sorted(f.name for f in t)
            got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            raise SchemaMismatchError(f"{name}: expected a dict with keys {expected}, got {got}")
        children = [to_arrow(f"{name}.{f.name}", value[f.name], f.type, n) for f in t]
        return pa.StructArray.from_arrays(children, fields=list(t))
    if pa.types.is_string(t):
        return pa.array(np.asarray(value).astype(str).reshape(n), pa.string())
    arr = np.asarray(value)
    leaf = leaf_of_type(t)
    check_leaf(name, arr.shape[1:], arr.dtype, leaf)
    data = np.ascontiguousarray(fitting(name, arr, leaf.dtype), dtype=leaf.dtype).reshape(-1)
    if np.ma.is_masked(value):  # missing values (an info key some steps lack): null, scalars only
        if arr.ndim != 1:
            raise SchemaMismatchError(f"{name}: only a column of scalars can have missing values")
        return pa.array(data, mask=np.ma.getmaskarray(value).reshape(-1))
    flat = pa.array(data)
    levels = []
    while _is_list(t):
        levels.append(t)
        t = t.value_type
    for level in reversed(levels):
        flat = pa.FixedSizeListArray.from_arrays(flat, type=level)
    return flat


def to_numpy(column: pa.Array | pa.ChunkedArray) -> Any:
    """An Arrow column of this schema as numpy: ``(n, *step_shape)`` arrays, dicts of them for structs.

    Rows of different shapes (steps of environments whose observations differ, in one batch) give a
    ``(n,)`` object array holding one array per row.
    """
    if isinstance(column, pa.ChunkedArray):
        column = column.combine_chunks() if column.num_chunks != 1 else column.chunk(0)
    t = column.type
    if pa.types.is_struct(t):
        return {f.name: to_numpy(column.field(i)) for i, f in enumerate(t)}
    if not _is_list(t):
        return column.to_numpy(zero_copy_only=False)
    if not _uniform(column):
        out = np.empty(len(column), dtype=object)
        out[:] = [to_numpy(column.slice(i, 1))[0] for i in range(len(column))]
        return out
    shape: list[int] = []
    values: pa.Array = column
    while _is_list(values.type):
        outer, fixed = len(values), values.type.list_size if pa.types.is_fixed_size_list(values.type) else 0
        values = values.flatten()
        shape.append(len(values) // outer if outer else fixed)
    return values.to_numpy(zero_copy_only=False).reshape((len(column), *shape))


def _uniform(column: pa.Array) -> bool:
    """Whether every row of a (nested) list column has the same shape."""
    values: pa.Array = column
    while _is_list(values.type):
        if not pa.types.is_fixed_size_list(values.type) and len(values):
            lengths = pc.list_value_length(values)
            if pc.min(lengths).as_py() != pc.max(lengths).as_py():
                return False
        values = values.flatten()
    return True


def _is_list(t: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(t) or pa.types.is_list(t) or pa.types.is_large_list(t)


def _numeric_leaf(t: pa.DataType) -> bool:
    while _is_list(t):
        t = t.value_type
    return pa.types.is_integer(t) or pa.types.is_floating(t) or pa.types.is_boolean(t)


def same_kind(stored: pa.DataType, incoming: pa.DataType) -> bool:
    """Whether both types fit one column of the Delta table: :func:`compatible` but list sizes may differ."""
    if pa.types.is_struct(stored) or pa.types.is_struct(incoming):
        return pa.types.is_struct(stored) and pa.types.is_struct(incoming) and \
            {f.name for f in stored} == {f.name for f in incoming} and \
            all(same_kind(stored.field(f.name).type, incoming.field(f.name).type) for f in incoming)
    if _is_list(stored) or _is_list(incoming):
        return _is_list(stored) and _is_list(incoming) and same_kind(stored.value_type, incoming.value_type)
    return compatible(stored, incoming)


def compatible(stored: pa.DataType, incoming: pa.DataType) -> bool:
    """Whether a column of type ``incoming`` can be appended to a table whose files have ``stored``."""
    if pa.types.is_struct(stored) or pa.types.is_struct(incoming):
        return pa.types.is_struct(stored) and pa.types.is_struct(incoming) and \
            {f.name for f in stored} == {f.name for f in incoming} and \
            all(compatible(stored.field(f.name).type, incoming.field(f.name).type) for f in incoming)
    if not _numeric_leaf(stored) or not _numeric_leaf(incoming):
        return stored == incoming
    a, b = leaf_of_type(stored), leaf_of_type(incoming)
    return a.shape == b.shape and _castable(b.dtype, a.dtype)
