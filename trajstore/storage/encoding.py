"""The stored format of the steps: the names and declarations of the stored columns, what a file's footer says,
how ``obs``/``next_obs`` are stored, and how every reader decodes them.

A file's Parquet key-value metadata ``trajstore`` (JSON) says how it is encoded, e.g.
``{"encoding": 3, "frame_stack": {"obs": 4}, "columns": {"obs": "obs_new_frames", "action": "action__float32_1d"}}``.
``columns`` maps a logical column name to the physical name it is stored under (see :mod:`trajstore.storage.names`).
A file without it and without declared columns is encoding 1: every column stored as given, decoding the identity.

Encodings 2 and 3 store each observation once, alike; encoding 3 gives the columns names that say what they hold
(:func:`stored_names`: ``next_obs_sparse``, ``obs_new_frames``, ``obs_bytes``) and declares how each is read back
in the Delta schema's field metadata (:func:`declaration`), which every tool that rewrites files keeps: a file
another tool wrote (no footer) is read from those declarations (:func:`foreign_format`). Each leaf of ``obs`` (the
column, or each leaf of a Dict observation by its dotted path, ``obs.pixels``) is a stack of *frames*: a leaf
declared as a frame stack of ``k`` (``frame_stack={"obs": k}``; gymnasium's ``FrameStackObservation`` layout
``(k, *F)``, newest frame last) has k frames of shape F, any other leaf is one frame (its whole per-step array). A
frame of two or more dimensions (an image) is stored as its raw bytes, C order, in a ``fixed_size_binary``
(``frames`` gives its dtype and shape: ``{"obs": ["uint8", [84, 84]]}``); a smaller one as the fixed-size list (or
scalar) it is. Then:

- ``obs``: a stacked leaf is a ``list<frame>`` holding either the row's newest frame (1 entry) or its whole stack
  (k entries: an *anchor*); decoded, ``stack[t]`` is the last k frames of the stored lists of the episode's rows
  ``t-k+1..t``; in trajstore's own files a 1-entry row always follows its episode's previous step in the same
  file. Any other leaf is its frame.
- ``next_obs`` is nullable; null means "the ``obs`` of the same episode's next step". The writer nulls it only where
  it compared the two bit for bit (every leaf of a Dict observation), so a reader gets back exactly the bits
  written. A leaf stored as frames (a stacked leaf, or an image) is a ``list<frame>`` (a null row stores nothing)
  holding one frame (an image: the whole observation; a stack: its newest frame, after ``obs[t][1:]``) or, for a
  stack, k (the whole stack); any other leaf is stored as in ``obs``.

Parquet stores an 8-bit integer as a 32-bit one with levels per value, so images as nested lists cost ~4x the
bytes and ~80x the time to write and read that their bytes do (measured: 4.7k vs 370k 84x84 frames/s written).

:class:`FileDecoder` decodes the batches of one file in order with numpy (one row of look-ahead, k-1 frames of
look-behind), each leaf by its rule of :mod:`~trajstore.storage.decoding` (which the SQL dialects follow too), and
checks what it relies on; the tests check it against plain reference loops (``tests/storage/encoding_reference.py``).
"""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from typing import Any, Callable, Collection, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError, TrajstoreError
from trajstore.storage.decoding import (
    NEXT,
    NEXT_NEW_FRAMES,
    NEXT_ONE_FRAME,
    NEXT_VALUE,
    OBS,
    OBS_NEW_FRAMES,
    OBS_VALUE,
    Leaf,
    Plan,
    leaves,
)

META_KEY = "trajstore"  # a file footer's key of its format, and a Delta schema field's key of its declaration
CURRENT = 3  # the encoding new files are written in
READS = (1, 2, 3)
KEYS = ("episode_id", "step")  # what decoding checks rows against


class EncodingError(TrajstoreError, ValueError):
    """Rows that break the invariants of their encoding (the message says which row and why). Readers raise it
    as a damaged file, an ingest as bad input."""


@dataclass(frozen=True)
class FileEncoding:
    """How one file is stored: its ``encoding``, the declared frame stacks (leaf path -> k) and the typed
    physical names of its columns (logical -> physical, only those that differ)."""

    encoding: int = 1
    frame_stack: tuple[tuple[str, int], ...] = ()
    columns: tuple[tuple[str, str], ...] = ()
    frames: tuple[tuple[str, str, tuple[int, ...]], ...] = ()  # image leaves: path, dtype, frame shape
    foreign: bool = False  # written by another tool from the table's declarations: rows in any order, any file

    @classmethod
    def create(cls, *, encoding: int = CURRENT, frame_stack: Mapping[str, int] | None = None,
               columns: Mapping[str, str] | None = None,
               frames: Mapping[str, tuple[str, Sequence[int]]] | None = None, foreign: bool = False) -> FileEncoding:
        renames = tuple(sorted((k, v) for k, v in (columns or {}).items() if k != v))
        images = tuple(sorted((p, str(np.dtype(d).name), tuple(int(x) for x in shape))
                              for p, (d, shape) in (frames or {}).items()))
        return cls(encoding, tuple(sorted((frame_stack or {}).items())), renames, images, foreign)

    @classmethod
    def for_obs(cls, obs: pa.DataType, *, frame_stack: Mapping[str, int] | None = None,
                columns: Mapping[str, str] | None = None) -> FileEncoding:
        """The current format of files whose observations are of logical type ``obs`` (``columns``: the
        physical names, where they differ; the files a writer stores take :func:`stored_names`)."""
        return cls.create(frame_stack=frame_stack, columns=columns, frames=frames_of(obs, frame_stack or {}))

    @classmethod
    def of(cls, metadata: Mapping[bytes, bytes] | None, *, where: str = "file") -> FileEncoding:
        """The format a file's (or an IPC stream's) schema metadata records; encoding 1 without any."""
        raw = (metadata or {}).get(META_KEY.encode())
        if raw is None:
            return cls()
        try:
            spec = json.loads(raw)
            encoding = int(spec["encoding"])
            stacks = {str(k): int(v) for k, v in dict(spec.get("frame_stack") or {}).items()}
            columns = {str(k): str(v) for k, v in dict(spec.get("columns") or {}).items()}
            frames = {str(k): (str(np.dtype(d).name), [int(x) for x in shape])
                      for k, (d, shape) in dict(spec.get("frames") or {}).items()}
            foreign = bool(spec.get("foreign", False))
        except (ValueError, TypeError, KeyError) as exc:
            raise EncodingError(f"{where}: its {META_KEY!r} metadata is not a trajstore format: {exc}") from None
        if encoding not in READS:
            raise EncodingError(f"{where}: encoding {encoding} is newer than this trajstore reads {READS}; "
                                "upgrade trajstore")
        return cls.create(encoding=encoding, frame_stack=stacks, columns=columns, frames=frames, foreign=foreign)

    def metadata(self) -> dict[bytes, bytes]:
        """The schema metadata that records this format."""
        spec: dict[str, Any] = {"encoding": self.encoding}
        if self.frame_stack:
            spec["frame_stack"] = dict(self.frame_stack)
        if self.columns:
            spec["columns"] = dict(self.columns)
        if self.frames:
            spec["frames"] = {p: [d, list(shape)] for p, d, shape in self.frames}
        if self.foreign:
            spec["foreign"] = True
        return {META_KEY.encode(): json.dumps(spec, separators=(",", ":")).encode()}

    @property
    def encoded(self) -> bool:
        """Whether obs/next_obs need decoding (encoding 2)."""
        return self.encoding >= 2

    @property
    def stacks(self) -> dict[str, int]:
        return dict(self.frame_stack)

    @property
    def renames(self) -> dict[str, str]:
        return dict(self.columns)

    @property
    def images(self) -> dict[str, tuple[str, tuple[int, ...]]]:
        """The leaves whose frames are stored as bytes: path -> (dtype name, frame shape)."""
        return {p: (d, shape) for p, d, shape in self.frames}

    def physical(self, name: str) -> str:
        return self.renames.get(name, name)

    def plan(self, obs_type: pa.DataType) -> Plan:
        """How files of this format read observations of logical type ``obs_type``: each leaf's rules (see
        :mod:`~trajstore.storage.decoding`)."""
        return Plan.of(obs_type, self.stacks, self.images)

    def logical_names(self) -> dict[str, str]:
        """Physical -> logical, for the renamed columns."""
        return {v: k for k, v in self.columns}

    def with_columns(self, columns: Mapping[str, str]) -> FileEncoding:
        return FileEncoding(self.encoding, self.frame_stack, FileEncoding.create(columns=columns).columns, self.frames,
                      self.foreign)

    def key(self) -> str:
        return json.dumps([self.encoding, self.frame_stack, self.columns, self.frames, self.foreign])


# --- what the table declares: each stored column's meaning, in the Delta schema's field metadata ---------

# a declaration's ``stored``/``sparse`` in the words ``trajstore schema`` prints (the rules readers follow to decode
# such columns are :data:`trajstore.storage.decoding.RULES`)
DECLARED = {
    "new_frames": "each row holds the frames new at its step: per stacked leaf its newest frame, or its whole "
                  "stack where stacking breaks (an episode's first row in a file, a reset); a step's stack is the "
                  "last k frames of its episode's rows up to it, in step order; image frames as raw bytes",
    "bytes": "image leaves as their raw bytes, C order, of the declared dtype and shape (frames)",
    "sparse": "null where the next observation is the obs of the same episode's next step; elsewhere the next "
              "observation, stored as the obs column stores one (for a stack: its newest frame, after obs[1:], "
              "or its whole stack)",
}


def described(spec: Mapping[str, Any]) -> list[str]:
    """A declaration in words: how its column stores its field."""
    out = [DECLARED["sparse"]] if spec.get("sparse") else []
    if spec.get("stored") in DECLARED:
        out.append(DECLARED[spec["stored"]])
    if spec.get("frame_stack"):
        out.append("frame stacks: " + ", ".join(f"{p} of {k}" for p, k in spec["frame_stack"].items()))
    if spec.get("frames"):
        out.append("frames: " + ", ".join(f"{p} {d}{list(shape)}" for p, (d, shape) in spec["frames"].items()))
    if spec.get("type"):
        out.append(f"values of type {spec['type']}")
    return out


def stored_names(fmt: FileEncoding) -> dict[str, str]:
    """The names ``obs`` and ``next_obs`` are stored under (before a type tag, see :mod:`.names`), saying what
    they hold: ``obs`` (its values), ``obs_new_frames`` (frame stacks, each frame once), ``obs_bytes`` (images as
    bytes); ``next_obs_sparse`` (null where it is the next step's obs), ``next_obs_sparse_new_frames``,
    ``next_obs_sparse_bytes``."""
    kind = "_new_frames" if fmt.frame_stack else "_bytes" if fmt.frames else ""
    return {OBS: f"{OBS}{kind}", NEXT: f"{NEXT}_sparse{kind}"}


def declaration(fmt: FileEncoding, name: str) -> dict[str, Any] | None:
    """What the table declares about the column holding the logical column ``name`` in files of ``fmt``: None
    for a column that holds its field's values under the field's own name."""
    physical = fmt.physical(name)
    if name not in (OBS, NEXT) or fmt.encoding < 3:
        return {"field": name} if physical != name else None
    kind = "new_frames" if fmt.frame_stack else "bytes" if fmt.frames else "values"
    if name == OBS and kind == "values":
        return {"field": name} if physical != name else None
    spec: dict[str, Any] = {"field": name, "stored": kind}
    if name == NEXT:
        spec["sparse"] = True
    if fmt.frame_stack:
        spec["frame_stack"] = dict(fmt.frame_stack)
    if fmt.frames:
        spec["frames"] = {p: [d, list(shape)] for p, d, shape in fmt.frames}
    return spec


def type_declaration(t: pa.DataType) -> dict[str, Any]:
    """What a column of stored type ``t`` declares of its type where the Delta log records another (a fixed-size
    list as a list, uint8 as int16, float16 as float32, frames as binary): ``type`` as
    :func:`~trajstore.schema.describe` names it, so that a file another tool rewrote in the log's types reads
    back in its own."""
    from trajstore.schema import delta_type, describe

    return {} if describe(delta_type(t)) == describe(t) else {"type": describe(t)}


def declared_type(spec: Mapping[str, Any] | None) -> pa.DataType | None:
    """The stored type a declaration gives (see :func:`type_declaration`), or None."""
    from trajstore.schema import parse_described

    try:
        return parse_described(spec["type"]) if spec and spec.get("type") else None
    except (ValueError, TypeError):
        return None


def declare(schema: pa.Schema, fmt: FileEncoding) -> pa.Schema:
    """``schema`` (physical names) with each column's declaration in its field metadata."""
    logical = fmt.logical_names()
    fields = []
    for f in schema:
        name = logical.get(f.name, f.name)
        spec = {**(declaration(fmt, name) or {}), **type_declaration(f.type)}
        if spec:
            spec.setdefault("field", name)
        fields.append(f.with_metadata({META_KEY: json.dumps(spec, separators=(",", ":"))}) if spec else
                      f.remove_metadata())
    return pa.schema(fields, metadata=schema.metadata)


def declared(f: pa.Field) -> dict[str, Any] | None:
    """The declaration in a (Delta schema) field's metadata, or None."""
    raw = (f.metadata or {}).get(META_KEY.encode())
    if raw is None:
        return None
    try:
        spec = json.loads(raw)
    except ValueError:
        return None
    return spec if isinstance(spec, dict) and isinstance(spec.get("field"), str) else None


def declarations(schema: pa.Schema) -> dict[str, dict[str, Any] | None]:
    """Every column of a table's schema -> its declaration (None where it declares nothing)."""
    return {f.name: declared(f) for f in schema}


def foreign_format(physical: pa.Schema, table: Mapping[str, dict[str, Any] | None], empty: Collection[str], *,
                   where: str = "file") -> tuple[FileEncoding, pa.Schema]:
    """The format of a file without trajstore's footer (another tool wrote it: OPTIMIZE, DELETE, an append), from
    the ``table``'s declarations (every column of the table -> its declaration or None), and the file's schema
    without the columns it holds only as nulls for rows of other kinds (``empty``: its all-null columns; a
    rewrite gives every file every column of the table). Rows of such a file may be in any order and any file."""
    by_field: dict[str, list[str]] = {}
    for f in physical:
        spec = table.get(f.name)
        if spec is not None:
            logical = spec["field"]
        else:
            base, sep, _ = f.name.rpartition("__")  # a typed name of a store whose columns declared nothing
            logical = base if sep and base in table else f.name
        by_field.setdefault(logical, []).append(f.name)
    keep: dict[str, str] = {}
    for logical in sorted(by_field, key=lambda n: n == NEXT):  # next_obs after obs: it is stored as obs is
        names = by_field[logical]
        full = [n for n in names if n not in empty]
        if len(full) > 1:
            raise EncodingError(f"{where}: the columns {full} all hold {logical!r}: another tool mixed rows stored "
                                "in different ways into one file")
        if not full and logical == NEXT and OBS in keep:  # null in every row of the file: the one obs's kind
            obs: dict[str, Any] | None = table.get(keep[OBS]) or {}
            full = [n for n in names if _same_kind(table.get(n) or {}, obs)]  # type: ignore[arg-type]  # a dict here
        keep[logical] = (full or names)[0]
    obs, nxt = table.get(keep.get(OBS, "")), table.get(keep.get(NEXT, ""))
    spec = nxt or obs or {}
    if (obs or {}).get("frame_stack") != (nxt or obs or {}).get("frame_stack") and nxt and obs:
        raise EncodingError(f"{where}: {keep[OBS]} and {keep[NEXT]} declare different frame stacks")
    encoding = 3 if (nxt or {}).get("sparse") or (obs or {}).get("stored") else 1
    try:
        fmt = FileEncoding.create(encoding=encoding, frame_stack={str(k): int(v) for k, v in
                                                           dict(spec.get("frame_stack") or {}).items()},
                            columns=keep, frames={str(k): (str(d), [int(x) for x in shape])
                                                  for k, (d, shape) in dict(spec.get("frames") or {}).items()},
                            foreign=True)
    except (ValueError, TypeError) as exc:
        raise EncodingError(f"{where}: the table declares an unreadable format for {keep.get(OBS)}: {exc}") from None
    fields = []
    for n in keep.values():
        t = declared_type(table.get(n))
        fields.append(physical.field(n) if t is None else pa.field(n, t))
    return fmt, pa.schema(fields)


def _same_kind(nxt: Mapping[str, Any], obs: Mapping[str, Any]) -> bool:
    """Whether a next-observation column's declaration stores observations as an obs column's does."""
    return all(nxt.get(k) == obs.get(k) for k in ("type", "frame_stack", "frames")) and \
        (nxt.get("stored") or "values") == (obs.get("stored") or "values")


def lost_meaning(physical: pa.Schema, nulls: Mapping[str, int | None], *, where: str = "file") -> None:
    """Raise :class:`EncodingError` when a file that has neither trajstore's footer nor declared columns holds what
    only an encoding-2 footer gave a meaning to (another tool rewrote a file of a store written before encoding 3,
    dropping the footer): observations as frames (bytes), or a ``next_obs`` with nulls."""
    for name in (OBS, NEXT):
        if name in physical.names and _has_bytes(physical.field(name).type):
            raise EncodingError(f"{where}: {name} holds frames as bytes, whose shape only an encoding-2 footer said; "
                                "another tool rewrote this file and dropped it: the observations cannot be read back")
    if NEXT in physical.names and nulls.get(NEXT):
        raise EncodingError(f"{where}: next_obs is null in {nulls[NEXT]} rows, which only an encoding-2 footer said "
                            "are the next step's obs; another tool rewrote this file and dropped it: next_obs cannot "
                            "be read back")


def _plain(t: pa.DataType) -> pa.DataType:
    """``t`` without the view and large variants other writers use (string_view, large_list, …)."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, _plain(f.type)) for f in t])
    if pa.types.is_fixed_size_list(t):
        return pa.list_(_plain(t.value_type), t.list_size)
    if pa.types.is_list(t) or pa.types.is_large_list(t) or pa.types.is_list_view(t) or pa.types.is_large_list_view(t):
        return pa.list_(_plain(t.value_type))
    if pa.types.is_string_view(t) or pa.types.is_large_string(t):
        return pa.string()
    if pa.types.is_binary_view(t) or pa.types.is_large_binary(t):
        return pa.binary()
    return t


def _has_bytes(t: pa.DataType) -> bool:
    if pa.types.is_struct(t):
        return any(_has_bytes(f.type) for f in t)
    while pa.types.is_list(t) or pa.types.is_large_list(t) or _fixed(t):
        t = t.value_type
    return pa.types.is_binary(t) or pa.types.is_fixed_size_binary(t) or pa.types.is_large_binary(t)


# --- types: logical (what readers return) <-> physical (what the file holds) ---------------------------

def _fixed(t: pa.DataType) -> bool:
    return pa.types.is_fixed_size_list(t)


def check_frame_stack(obs: pa.DataType, frame_stack: Mapping[str, int]) -> dict[str, int]:
    """``frame_stack`` checked against the (logical) observation type: each key a leaf path of ``obs`` whose
    per-step shape is ``(k, …)``; raises :class:`InputError` naming the leaf otherwise."""
    if not isinstance(frame_stack, Mapping):
        raise InputError(f"frame_stack: expected a dict of observation leaf -> stack size, e.g. {{'obs': 4}}, "
                         f"got {frame_stack!r}")
    known = dict(leaves(obs))
    out = {}
    for path, k in frame_stack.items():
        if isinstance(k, bool) or not isinstance(k, (int, np.integer)) or k < 2:
            raise InputError(f"frame_stack: {path!r} must be a stack size >= 2, got {k!r}")
        if path not in known:
            raise InputError(f"frame_stack: {path!r} is not a leaf of the observation; its leaves are "
                             f"{sorted(known)} (nested leaves of a Dict observation by their dotted path)")
        t = known[path]
        if not _fixed(t) or t.list_size != k:
            from trajstore.schema import describe

            raise InputError(f"frame_stack: {path!r} is {describe(t)} per step, not a stack of {k} frames "
                             f"(expected shape ({k}, …), newest frame last)")
        out[path] = int(k)
    return out


IMAGE_DIMS = 2  # frames of at least this many dimensions are stored as raw bytes


def frames_of(obs: pa.DataType, stacks: Mapping[str, int]) -> dict[str, tuple[str, tuple[int, ...]]]:
    """The leaves of a (logical) observation type whose frames are images: path -> (dtype name, frame shape)."""
    from trajstore.schema import leaf_of_type

    out = {}
    for path, t in leaves(obs):
        frame = t.value_type if path in stacks else t
        leaf = leaf_of_type(frame)
        if len(leaf.shape) >= IMAGE_DIMS:
            out[path] = (leaf.dtype.name, tuple(leaf.shape))
    return out


def _stored_frame(frame: pa.DataType, image: tuple[str, tuple[int, ...]] | None) -> pa.DataType:
    if image is None:
        return frame
    dtype, shape = image
    return pa.binary(np.dtype(dtype).itemsize * int(np.prod(shape, dtype=np.int64)))


def _image_type(image: tuple[str, tuple[int, ...]]) -> pa.DataType:
    dtype, shape = image
    t = pa.from_numpy_dtype(np.dtype(dtype))
    for size in reversed(shape):
        t = pa.list_(t, size)
    return t


def stored_frame(t: pa.DataType, fmt: FileEncoding, path: str) -> pa.DataType:
    """The stored type of one frame of the leaf ``path`` of logical type ``t``."""
    return _stored_frame(t.value_type if path in fmt.stacks else t, fmt.images.get(path))


def physical_obs_type(t: pa.DataType, fmt: FileEncoding, path: str = OBS) -> pa.DataType:
    """The stored type of ``obs`` of logical type ``t``: each stacked leaf a ``list<frame>``, each other leaf its
    frame; an image frame as bytes."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, physical_obs_type(f.type, fmt, f"{path}.{f.name}")) for f in t])
    k = fmt.stacks.get(path)
    frame = _stored_frame(t.value_type if k else t, fmt.images.get(path))
    return pa.list_(frame) if k else frame


def in_frames(fmt: FileEncoding, path: str) -> bool:
    """Whether leaf ``path`` is stored as frames in ``next_obs`` (a ``list<frame>``): a stack, or an image."""
    return path in fmt.stacks or path in fmt.images


def physical_next_type(t: pa.DataType, fmt: FileEncoding, path: str = OBS) -> pa.DataType:
    """The stored type of ``next_obs`` whose observations are of logical type ``t``: each leaf stored as frames
    a ``list<frame>`` (a null row stores nothing), the others as in ``obs``."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, physical_next_type(f.type, fmt, f"{path}.{f.name}")) for f in t])
    return pa.list_(stored_frame(t, fmt, path)) if in_frames(fmt, path) else t


def logical_obs_type(t: pa.DataType, fmt: FileEncoding, path: str = OBS) -> pa.DataType:
    """Inverse of :func:`physical_obs_type`."""
    if pa.types.is_struct(t):
        return pa.struct([pa.field(f.name, logical_obs_type(f.type, fmt, f"{path}.{f.name}")) for f in t])
    k = fmt.stacks.get(path)
    image = fmt.images.get(path)
    frame = _image_type(image) if image is not None else (t.value_type if k else t)
    return pa.list_(frame, k) if k else frame


def physical_schema(logical: pa.Schema, fmt: FileEncoding) -> pa.Schema:
    """The schema a file of format ``fmt`` holding ``logical`` columns has (renamed, obs/next_obs encoded)."""
    fields = []
    for f in logical:
        t = f.type
        if fmt.encoded and f.name == OBS:
            t = physical_obs_type(t, fmt)
        elif fmt.encoded and f.name == NEXT:
            t = physical_next_type(logical.field(OBS).type if OBS in logical.names else t, fmt)
        fields.append(pa.field(fmt.physical(f.name), t))
    return pa.schema(fields, metadata=fmt.metadata())


def logical_schema(physical: pa.Schema, fmt: FileEncoding) -> pa.Schema:
    """The columns a reader returns for a file of schema ``physical``: logical names and decoded types."""
    names = fmt.logical_names()
    fields = [pa.field(names.get(f.name, f.name), f.type) for f in physical]
    if fmt.encoded:
        by = {f.name: i for i, f in enumerate(fields)}
        if OBS in by:
            obs = logical_obs_type(fields[by[OBS]].type, fmt)
            fields[by[OBS]] = pa.field(OBS, obs)
            if NEXT in by:
                fields[by[NEXT]] = pa.field(NEXT, obs)
    return pa.schema(fields)


@dataclass(frozen=True)
class FileSchema:
    """One stored file's schema as its footer describes it: its own Arrow schema (physical names and types), its
    format, and the columns readers get (logical names, decoded types)."""

    physical: pa.Schema
    format: FileEncoding
    logical: pa.Schema

    @classmethod
    def of(cls, schema: pa.Schema, *, where: str = "file", table: Mapping[str, dict[str, Any] | None] | None = None,
           nulls: Mapping[str, int | None] | None = None, rows: int | None = None) -> FileSchema:
        """A file's schema from its footer's format; a file without one (another tool wrote it) from the
        ``table``'s declarations (see :func:`foreign_format`), ``nulls`` (its null values per column, None where
        unknown) and ``rows`` telling the columns it holds only as nulls."""
        physical = pa.schema([f.remove_metadata() for f in schema])
        if (schema.metadata or {}).get(META_KEY.encode()) is not None or table is None:
            fmt = FileEncoding.of(schema.metadata, where=where)
        elif any(table.get(f.name) for f in physical):
            physical = pa.schema([pa.field(f.name, _plain(f.type)) for f in physical])
            nulls = nulls or {}
            empty = {n for n, c in nulls.items() if c is not None and rows is not None and c >= rows > 0}
            fmt, physical = foreign_format(physical, table, empty, where=where)
            undeclared = {fmt.physical(n): n for n in (OBS, NEXT) if not table.get(fmt.physical(n))}
            lost_meaning(pa.schema([pa.field(undeclared[f.name], f.type) for f in physical if f.name in undeclared]),
                         {undeclared[n]: c for n, c in nulls.items() if n in undeclared}, where=where)
        else:
            physical = pa.schema([pa.field(f.name, _plain(f.type)) for f in physical])
            lost_meaning(physical, nulls or {}, where=where)
            fmt = FileEncoding(foreign=True)
        try:
            logical = logical_schema(physical, fmt)
        except (KeyError, AttributeError, ValueError, TypeError) as exc:
            raise EncodingError(f"{where}: its columns do not fit its format {fmt.metadata()}: {exc}") from None
        return cls(physical, fmt, logical)


# --- numpy <-> Arrow for fixed-shape leaves ---------------------------------------------------------------

def fixed_numpy(arr: pa.Array) -> np.ndarray:
    """A column of (nested) fixed-size lists, or of scalars, as an ``(n, *shape)`` array (no copy for numbers;
    a null row's values are whatever its slot holds)."""
    shape, values = [], arr
    while _fixed(values.type):
        size = values.type.list_size
        shape.append(size)
        values = values.values.slice(values.offset * size, len(values) * size)
    out = values.to_numpy(zero_copy_only=False) if not values.null_count else \
        values.fill_null(False if pa.types.is_boolean(values.type) else 0).to_numpy(zero_copy_only=False)
    return out.reshape(len(arr), *shape)


def from_numpy(values: np.ndarray, t: pa.DataType) -> pa.Array:
    """An ``(n, *shape)`` array as an Arrow array of the fixed-shape type ``t`` (no copy for contiguous numbers)."""
    levels, base = [], t
    while _fixed(base):
        levels.append(base)
        base = base.value_type
    flat = pa.array(np.ascontiguousarray(values).reshape(-1), type=base)
    for level in reversed(levels):
        flat = pa.FixedSizeListArray.from_arrays(flat, type=level)
    return flat


def frames_numpy(arr: pa.Array, image: tuple[str, tuple[int, ...]] | None) -> np.ndarray:
    """Stored frames (non-null) as an ``(n, *frame shape)`` array: an image's bytes viewed as its dtype (no copy),
    other frames as :func:`fixed_numpy` gives them."""
    if image is None:
        return fixed_numpy(arr)
    dtype, shape = np.dtype(image[0]), image[1]
    width = arr.type.byte_width
    data = np.frombuffer(arr.buffers()[1], np.uint8, count=len(arr) * width, offset=arr.offset * width)
    return data.view(dtype).reshape(len(arr), *shape)


def frames_array(values: np.ndarray, frame: pa.DataType) -> pa.Array:
    """``(m, *frame shape)`` frames as an Arrow array of the stored ``frame`` type (bytes of contiguous frames
    are shared, not copied)."""
    if pa.types.is_fixed_size_binary(frame):
        data = np.ascontiguousarray(values)
        return pa.FixedSizeBinaryArray.from_buffers(frame, len(data), [None, pa.py_buffer(data.reshape(-1))])
    return from_numpy(values, frame)


def with_validity(arr: pa.Array, valid: np.ndarray) -> pa.Array:
    """``arr`` (offset 0) with its top-level validity replaced by ``valid``; children and values shared."""
    bitmap = pa.array(valid, pa.bool_()).buffers()[1]
    t = arr.type
    own = 1 if pa.types.is_list(t) else 0 if pa.types.is_fixed_size_list(t) or pa.types.is_struct(t) else 1
    children = [arr.values] if pa.types.is_list(t) or pa.types.is_fixed_size_list(t) else \
        [arr.field(i) for i in range(t.num_fields)] if pa.types.is_struct(t) else None
    return pa.Array.from_buffers(t, len(arr), [bitmap, *arr.buffers()[1:1 + own]], children=children)


def leaf_column(arr: pa.Array, path: str) -> pa.Array:
    """The leaf at ``path`` (``obs.a.b``) of a (struct) column, aligned with its rows."""
    for name in path.split(".")[1:]:
        arr = arr.field(name)
    return arr


def _assemble(t: pa.DataType, values: Mapping[str, np.ndarray], path: str = OBS) -> pa.Array:
    """An Arrow column of logical type ``t`` from its leaves' ``(n, *shape)`` arrays."""
    if pa.types.is_struct(t):
        children = [_assemble(f.type, values, f"{path}.{f.name}") for f in t]
        return pa.StructArray.from_arrays(children, fields=list(t))
    return from_numpy(values[path], t)


# --- the decoder ------------------------------------------------------------------------------------------

@dataclass
class _Behind:
    """The row before the current batch: its episode, step and decoded stacks (one per stacked leaf)."""

    episode_id: int
    step: int
    stacks: dict[str, np.ndarray]


@dataclass
class _Held:
    """A batch whose ``obs`` is decoded, waiting for the next batch's first row to decode its ``next_obs``."""

    batch: pa.RecordBatch
    obs: dict[str, np.ndarray]
    follows: np.ndarray


@dataclass
class FileDecoder:
    """Decodes the record batches of one encoding-2 file, in file order (whole episodes may be filtered out):
    :meth:`push` each batch, then :meth:`finish`; both return the decoded batches ready so far (``next_obs``
    needs the next batch's first row, so a batch holding it comes out one push later). Batches need
    ``episode_id`` and ``step``, and ``obs`` when ``next_obs`` is there; ``obs_type`` is the logical type. Each
    leaf is decoded by its rules (:meth:`FileEncoding.plan`; :data:`OBS_DECODERS`, :data:`NEXT_DECODERS`)."""

    fmt: FileEncoding
    obs_type: pa.DataType
    where: str = "file"
    _behind: _Behind | None = None
    _held: _Held | None = None
    _rows: int = field(default=0)
    _plan: Plan = field(init=False, repr=False)

    def __post_init__(self) -> None:
        self._plan = self.fmt.plan(self.obs_type)

    def push(self, batch: pa.RecordBatch) -> list[pa.RecordBatch]:
        if batch.num_rows == 0:
            return []
        eid = batch.column("episode_id").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        step = batch.column("step").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        follows = np.empty(len(eid), bool)
        b = self._behind
        follows[0] = b is not None and b.episode_id == eid[0] and b.step + 1 == step[0]
        follows[1:] = (eid[1:] == eid[:-1]) & (step[1:] == step[:-1] + 1)
        obs = self._decode_obs(batch, follows, eid, step) if OBS in batch.schema.names else {}
        self._behind = _Behind(int(eid[-1]), int(step[-1]),
                               {p: v[-1].copy() for p, v in obs.items() if p in self.fmt.stacks})
        first = self._rows
        self._rows += batch.num_rows
        out = []
        if self._held is not None:
            out.append(self._finish(self._held, {p: v[:1] for p, v in obs.items()}, bool(follows[0]),
                                    first - self._held.batch.num_rows))
            self._held = None
        held = _Held(batch, obs, follows)
        if NEXT in batch.schema.names:
            self._held = held
        else:
            out.append(self._finish(held, None, False, first))
        return out

    def finish(self) -> list[pa.RecordBatch]:
        if self._held is None:
            return []
        held, self._held = self._held, None
        return [self._finish(held, None, False, self._rows - held.batch.num_rows)]

    # --- obs ---

    def _decode_obs(self, batch: pa.RecordBatch, follows: np.ndarray, eid: np.ndarray,
                    step: np.ndarray) -> dict[str, np.ndarray]:
        column = batch.column(OBS)
        return {leaf.path: OBS_DECODERS[leaf.obs_rule.name](self, leaf_column(column, leaf.path), leaf, follows, eid,
                                                            step) for leaf in self._plan.leaves}

    def _obs_value(self, arr: pa.Array, leaf: Leaf, follows: np.ndarray, eid: np.ndarray,
                   step: np.ndarray) -> np.ndarray:
        """``obs_value``: the stored values (an image's bytes viewed as its values: ``image_bytes``)."""
        return frames_numpy(arr, leaf.image)

    def _frames(self, arr: pa.Array, leaf: Leaf, follows: np.ndarray, eid: np.ndarray,
                step: np.ndarray) -> np.ndarray:
        """``obs_new_frames``: row i's stack is the k frames ending where its stored ones end."""
        k, path = int(leaf.k), leaf.path  # type: ignore[arg-type]  # a stacked leaf
        offsets = arr.offsets.to_numpy().astype(np.int64)
        counts = np.diff(offsets)
        bad = np.flatnonzero((counts != 1) & (counts != k))
        if len(bad):
            self._fail(bad[0], eid, step, f"{path} holds {counts[bad[0]]} frames; expected 1 or {k}")
        lone = np.flatnonzero((counts == 1) & ~follows)
        if len(lone):
            self._fail(lone[0], eid, step, f"{path} holds one frame, but the row before it is not the same "
                                           "episode's previous step")
        frames = frames_numpy(arr.values, leaf.image)
        lo = int(offsets[0])
        idx = offsets[1:, None] - k + np.arange(k)
        out = np.take(frames, np.maximum(idx, lo).reshape(-1), axis=0).reshape(len(counts), k, *frames.shape[1:])
        before = idx < lo
        if before.any():  # the first rows continue the stack of the row before this batch
            rows, cols = np.nonzero(before)
            out[rows, cols] = self._behind.stacks[path][k + idx[rows, cols] - lo]  # type: ignore[union-attr]
        return out

    # --- next_obs ---

    def _finish(self, held: _Held, ahead: dict[str, np.ndarray] | None, ahead_follows: bool,
                first_row: int) -> pa.RecordBatch:
        batch = held.batch
        columns = {name: batch.column(i) for i, name in enumerate(batch.schema.names)}
        if OBS in columns:
            columns[OBS] = _assemble(self.obs_type, held.obs)
        if NEXT in columns:
            columns[NEXT] = self._next(batch.column(NEXT), held, ahead, ahead_follows, first_row)
        return pa.record_batch(list(columns.values()), names=list(columns))

    def _next(self, column: pa.Array, held: _Held, ahead: dict[str, np.ndarray] | None, ahead_follows: bool,
              first_row: int) -> pa.Array:
        n = len(column)
        valid = column.is_valid().to_numpy(zero_copy_only=False)
        then = np.r_[held.follows[1:], ahead_follows]  # whether row i+1 is row i's episode's next step
        bad = np.flatnonzero(~valid & ~then)
        if len(bad):
            eid = held.batch.column("episode_id").to_numpy(zero_copy_only=False)
            step = held.batch.column("step").to_numpy(zero_copy_only=False)
            self._fail(bad[0], eid, step, "next_obs is null, but the next row is not the same episode's next step",
                       first_row)
        stored = np.flatnonzero(valid)
        nulls = np.flatnonzero(~valid)
        out = {}
        for path, _ in leaves(self.obs_type):
            obs = held.obs[path]
            values = np.empty_like(obs)
            if len(stored):
                values[stored] = self._stored_next(leaf_column(column, path), path, stored, obs, held, first_row)
            if len(nulls):
                inside = nulls[nulls < n - 1]
                values[inside] = obs[inside + 1]
                if len(inside) < len(nulls):
                    values[n - 1] = ahead[path][0]  # type: ignore[index]
            out[path] = values
        return _assemble(self.obs_type, out)

    def _stored_next(self, arr: pa.Array, path: str, rows: np.ndarray, obs: np.ndarray, held: _Held,
                     first_row: int) -> np.ndarray:
        """The stored ``next_obs`` of leaf ``path`` at ``rows`` (non-null), decoded by the leaf's rule."""
        leaf = self._plan.leaf(path)
        if not leaf.in_frames:
            return NEXT_DECODERS[leaf.next_rule.name](self, arr, leaf, rows, obs)
        offsets = arr.offsets.to_numpy().astype(np.int64)
        counts = np.diff(offsets)[rows]
        k = leaf.k
        ok = (counts == 1) | (counts == k) if k is not None else counts == 1
        if not ok.all():
            i = int(rows[np.flatnonzero(~ok)[0]])
            eid = held.batch.column("episode_id").to_numpy(zero_copy_only=False)
            step = held.batch.column("step").to_numpy(zero_copy_only=False)
            self._fail(i, eid, step, f"next_obs leaf {path} holds {np.diff(offsets)[i]} frames; expected 1"
                                     + (f" or {k}" if k is not None else ""), first_row)
        return NEXT_DECODERS[leaf.next_rule.name](self, arr, leaf, rows, obs)

    def _next_value(self, arr: pa.Array, leaf: Leaf, rows: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """``next_value``: the stored values."""
        return fixed_numpy(arr)[rows]

    def _next_one_frame(self, arr: pa.Array, leaf: Leaf, rows: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """``next_one_frame``: each row's one stored frame (``image_bytes``: viewed as its values)."""
        return frames_numpy(arr.values, leaf.image)[arr.offsets.to_numpy()[:-1][rows]]

    def _next_new_frames(self, arr: pa.Array, leaf: Leaf, rows: np.ndarray, obs: np.ndarray) -> np.ndarray:
        """``next_new_frames``: a whole stack of k frames, or the obs's frames 2..k and the one stored."""
        k = int(leaf.k)  # type: ignore[arg-type]  # a stacked leaf
        offsets = arr.offsets.to_numpy().astype(np.int64)
        counts, starts = np.diff(offsets)[rows], offsets[:-1][rows]
        frames = frames_numpy(arr.values, leaf.image)
        out = np.empty((len(rows), *obs.shape[1:]), obs.dtype)
        whole = np.flatnonzero(counts == k)
        if len(whole):
            out[whole] = np.take(frames, (starts[whole, None] + np.arange(k)).reshape(-1), axis=0) \
                .reshape(len(whole), *obs.shape[1:])
        one = np.flatnonzero(counts != k)
        if len(one):
            out[one, :-1] = obs[rows[one], 1:]
            out[one, -1] = frames[starts[one]]
        return out

    def _fail(self, i: int, eid: np.ndarray, step: np.ndarray, problem: str, first_row: int | None = None) -> None:
        row = (self._rows if first_row is None else first_row) + int(i)
        raise EncodingError(f"{self.where}: row {row} (episode {int(eid[i])}, step {int(step[i])}): {problem}")


# the numpy decoding of each leaf rule of :mod:`~trajstore.storage.decoding` (``next_sparse`` is
# :meth:`FileDecoder._next`, ``image_bytes`` :func:`frames_numpy`, ``stored`` :func:`decode_table` returning a table
# that needs no decoding as it is)
OBS_DECODERS: dict[str, Callable[..., np.ndarray]] = {
    OBS_VALUE.name: FileDecoder._obs_value, OBS_NEW_FRAMES.name: FileDecoder._frames}
NEXT_DECODERS: dict[str, Callable[..., np.ndarray]] = {
    NEXT_VALUE.name: FileDecoder._next_value, NEXT_ONE_FRAME.name: FileDecoder._next_one_frame,
    NEXT_NEW_FRAMES.name: FileDecoder._next_new_frames}


def check_rows(batches: Iterator[pa.RecordBatch], fmt: FileEncoding, obs_type: pa.DataType, *,
               where: str = "file") -> int:
    """Check every invariant a reader relies on over one file's batches (logical names, physical types, file
    order) without decoding a frame: entries per row of each stacked and ``next_obs`` leaf, and the neighbours of
    one-frame rows and null ``next_obs``, as each leaf's rules need them (:meth:`FileEncoding.plan`). Raises
    :class:`EncodingError` naming the row; returns the rows seen."""
    plan = fmt.plan(obs_type)
    prev: tuple[int, int] | None = None
    waiting: tuple[int, int, int] | None = None  # a null next_obs at the end of the batch before: row, episode, step
    row = 0
    for batch in batches:
        n = batch.num_rows
        if not n:
            continue
        eid = batch.column("episode_id").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        step = batch.column("step").to_numpy(zero_copy_only=False).astype(np.int64, copy=False)
        follows = np.r_[prev is not None and prev == (eid[0], step[0] - 1),
                        (eid[1:] == eid[:-1]) & (step[1:] == step[:-1] + 1)]
        if waiting is not None and not follows[0]:
            raise EncodingError(f"{where}: row {waiting[0]} (episode {waiting[1]}, step {waiting[2]}): next_obs is "
                                "null, but the next row is not the same episode's next step")
        for leaf in plan.leaves:
            k, path = leaf.k, leaf.path
            if leaf.obs_rule is OBS_NEW_FRAMES and OBS in batch.schema.names:
                counts = np.diff(leaf_column(batch.column(OBS), path).offsets.to_numpy())
                _refuse(where, row, eid, step, (counts != 1) & (counts != k),
                        f"{path} holds other than 1 or {k} frames")
                _refuse(where, row, eid, step, (counts == 1) & ~follows,
                        f"{path} holds one frame, but the row before it is not the same episode's previous step")
        waiting = None
        if NEXT in batch.schema.names:
            column = batch.column(NEXT)
            valid = column.is_valid().to_numpy(zero_copy_only=False)
            then = np.r_[follows[1:], True]
            _refuse(where, row, eid, step, ~valid & ~then,
                    "next_obs is null, but the next row is not the same episode's next step")
            if not valid[-1]:
                waiting = (row + n - 1, int(eid[-1]), int(step[-1]))
            for leaf in plan.leaves:
                if not leaf.in_frames:
                    continue
                k, path = leaf.k, leaf.path
                counts = np.diff(leaf_column(column, path).offsets.to_numpy())
                ok = (counts == 1) | (counts == k) if k is not None else counts == 1
                _refuse(where, row, eid, step, valid & ~ok,
                        f"next_obs leaf {path} holds other than 1" + (f" or {k}" if k else "") + " frames")
        prev = (int(eid[-1]), int(step[-1]))
        row += n
    if waiting is not None:
        raise EncodingError(f"{where}: row {waiting[0]} (episode {waiting[1]}, step {waiting[2]}): next_obs is null, "
                            "but it is the file's last row")
    return row


def _refuse(where: str, first: int, eid: np.ndarray, step: np.ndarray, bad: np.ndarray, problem: str) -> None:
    hit = np.flatnonzero(bad)
    if len(hit):
        i = int(hit[0])
        raise EncodingError(f"{where}: row {first + i} (episode {int(eid[i])}, step {int(step[i])}): {problem}")


def decode_table(table: pa.Table, fmt: FileEncoding, *, where: str = "file") -> pa.Table:
    """Every row of one file's ``table`` (logical names, physical types, rows in file order) decoded."""
    if not fmt.encoded or (OBS not in table.column_names and NEXT not in table.column_names):
        return table
    obs = logical_schema(table.schema, fmt).field(OBS).type
    decoder = FileDecoder(fmt, obs, where)
    batches = [b for batch in table.to_batches() for b in decoder.push(batch)] + decoder.finish()
    return pa.Table.from_batches(batches, schema=_decoded_schema(table.schema, fmt))


def decode_batches(batches: Iterator[pa.RecordBatch], fmt: FileEncoding, obs_type: pa.DataType, *,
                   where: str = "file") -> Iterator[pa.RecordBatch]:
    """The batches of one file, in order, decoded as they come (see :class:`FileDecoder`)."""
    decoder = FileDecoder(fmt, obs_type, where)
    for batch in batches:
        yield from decoder.push(batch)
    yield from decoder.finish()


def _decoded_schema(schema: pa.Schema, fmt: FileEncoding) -> pa.Schema:
    obs = logical_schema(schema, fmt).field(OBS).type
    return pa.schema([pa.field(f.name, obs) if f.name in (OBS, NEXT) else f for f in schema])
