"""The step decoding, described once: for each way a file stores its steps, which stored column feeds which column a
reader sees, and by what rule (:data:`RULES`).

A file's format (:class:`~trajstore.storage.encoding.FileEncoding`) and the logical type of its observations give
a :class:`Plan`: per observation leaf, the rule that reads its ``obs`` and the one that reads its ``next_obs``, and
whether its frames are image bytes. Every reader follows the plan:

- the numpy decoder (:class:`~trajstore.storage.encoding.FileDecoder`, every Python reader) dispatches on each leaf's
  rule (``OBS_DECODERS``, ``NEXT_DECODERS`` there);
- the DuckDB SQL (:func:`~trajstore.query.sql.decoded_steps`, the ``steps`` view and ``trajstore schema --sql``) and
  the Spark SQL (:mod:`~trajstore.query.spark_sql`) render the expressions the plan builds (:meth:`Plan.obs`,
  :meth:`Plan.next`, :meth:`Plan.values`, :func:`mixed`) in their dialects: a window over an episode's rows
  (:class:`Window`), the next row's value (:class:`Lead`), list slices, image bytes made values (:class:`Values`).

Adding a way of storing is one new :class:`Rule` here, its expression, and a case in
``tests/storage/test_decoding.py``, which walks every rule and checks each implementation (numpy, DuckDB's view, the
DuckDB and Spark SQL a user runs) against the plain reference loops of ``tests/storage/encoding_reference.py``; a
dialect or decoder that lacks a rule fails there naming it.

Expressions use 1-based list positions (SQL's); the dialects translate them.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable, Mapping, Union

import pyarrow as pa

OBS, NEXT = "obs", "next_obs"


@dataclass(frozen=True)
class Rule:
    """One rule of the decoding: the column a reader sees (``reads``), what the stored value holds (``stored``) and
    how the value read is made of it (``gives``), in words."""

    name: str
    reads: str
    stored: str
    gives: str


STORED = Rule("stored", "any column", "the field's values, under the field's name or a typed physical name "
              "(action__float32_1d)", "the stored values under the field's name; encoding 1 reads every column so")
OBS_VALUE = Rule("obs_value", OBS, "a leaf that is no frame stack: its value (an image: its raw bytes, see "
                 "image_bytes)", "the stored value")
OBS_NEW_FRAMES = Rule("obs_new_frames", OBS, "a stacked leaf: the list of frames new at its step (its newest frame) "
                      "or, where stacking breaks, its whole stack of k", "the last k frames stored by the episode's "
                      "rows up to this one, in step order")
NEXT_SPARSE = Rule("next_sparse", NEXT, "null where the next observation is the obs of the same episode's next step",
                   "a null row: the decoded obs of the episode's next step; a stored row: by each leaf's rule")
NEXT_VALUE = Rule("next_value", NEXT, "a leaf that is no frame stack and no image: its value", "the stored value")
NEXT_ONE_FRAME = Rule("next_one_frame", NEXT, "an image leaf that is no stack: a list of its one frame",
                      "that frame")
NEXT_NEW_FRAMES = Rule("next_new_frames", NEXT, "a stacked leaf: a list of its newest frame, or of its whole stack "
                       "of k", "k frames: the whole stack, or the obs's frames 2..k and the newest")
IMAGE_BYTES = Rule("image_bytes", f"{OBS}, {NEXT}", "an image frame (2+ dimensions) as its raw bytes, C order",
                   "the nested lists of its values, of the declared dtype and frame shape (SQL dialects make values "
                   "of the dtypes they can reinterpret)")
MIXED = Rule("mixed_types", "any column", "one field in types that cannot be one column, in groups of files of "
             "other environments", "SQL: one value type that holds both (DuckDB VARIANT, Spark JSON text); "
             "numpy: refused, naming the column and environments")

RULES: tuple[Rule, ...] = (STORED, OBS_VALUE, OBS_NEW_FRAMES, NEXT_SPARSE, NEXT_VALUE, NEXT_ONE_FRAME,
                           NEXT_NEW_FRAMES, IMAGE_BYTES, MIXED)
LEAF_RULES = (OBS_VALUE, OBS_NEW_FRAMES, NEXT_VALUE, NEXT_ONE_FRAME, NEXT_NEW_FRAMES)  # one per leaf, by its kind


# --- the expressions rules are made of (each SQL dialect renders every one) ------------------------------------

@dataclass(frozen=True)
class Column:
    """A column of the relation decoded, by name."""

    name: str


@dataclass(frozen=True)
class Field:
    """A field of a struct."""

    of: Expr
    name: str


@dataclass(frozen=True)
class Struct:
    """A struct of named values."""

    fields: tuple[tuple[str, Expr], ...]


@dataclass(frozen=True)
class Window:
    """The list of ``of`` over the episode's last ``rows`` rows up to this one, in step order."""

    of: Expr
    rows: int


@dataclass(frozen=True)
class Lead:
    """``of`` at the episode's next row (by step)."""

    of: Expr


@dataclass(frozen=True)
class Flatten:
    """A list of lists as one list."""

    of: Expr


@dataclass(frozen=True)
class Last:
    """The last ``n`` items of a list."""

    of: Expr
    n: int


@dataclass(frozen=True)
class Items:
    """``count`` items of a list from position ``start`` (1-based)."""

    of: Expr
    start: int
    count: int


@dataclass(frozen=True)
class Item:
    """The item at position ``at`` (1-based) of a list."""

    of: Expr
    at: int


@dataclass(frozen=True)
class Concat:
    """Two lists, one after the other."""

    first: Expr
    then: Expr


@dataclass(frozen=True)
class IsNull:
    of: Expr


@dataclass(frozen=True)
class HasItems:
    """Whether a list holds ``n`` items."""

    of: Expr
    n: int


@dataclass(frozen=True)
class When:
    """``then`` where ``cond`` holds, else ``otherwise``."""

    cond: Expr
    then: Expr
    otherwise: Expr


@dataclass(frozen=True)
class Values:
    """Image frame bytes (``stacked``: a list of them) of leaf ``path`` as the nested lists of their values."""

    of: Expr
    path: str
    dtype: str
    shape: tuple[int, ...]
    stacked: bool


@dataclass(frozen=True)
class AnyType:
    """A value in the one type that holds every environment's (``nested``: a list or struct, which Spark holds as
    JSON text)."""

    of: Expr
    nested: bool = False


Expr = Union[Column, Field, Struct, Window, Lead, Flatten, Last, Items, Item, Concat, IsNull, HasItems, When, Values,
             AnyType]
_LeafExpr = Callable[[Expr, str], Expr]  # an expression of one leaf, from its reference and path
EXPRESSIONS = (Column, Field, Struct, Window, Lead, Flatten, Last, Items, Item, Concat, IsNull, HasItems, When, Values,
               AnyType)


# --- a file's plan -------------------------------------------------------------------------------------------

@dataclass(frozen=True)
class Leaf:
    """One leaf of the observation (``obs``, ``obs.pixels``): its stack size, its image frames' dtype and shape, and
    the rules that read it."""

    path: str
    k: int | None
    image: tuple[str, tuple[int, ...]] | None

    @property
    def obs_rule(self) -> Rule:
        return OBS_NEW_FRAMES if self.k is not None else OBS_VALUE

    @property
    def next_rule(self) -> Rule:
        return NEXT_NEW_FRAMES if self.k is not None else NEXT_ONE_FRAME if self.image is not None else NEXT_VALUE

    @property
    def in_frames(self) -> bool:
        """Whether its ``next_obs`` is stored as a list of frames."""
        return self.k is not None or self.image is not None


def leaves(t: pa.DataType, path: str = OBS) -> list[tuple[str, pa.DataType]]:
    """The leaves of an observation type and their paths (``obs``, ``obs.pixels``, …)."""
    if pa.types.is_struct(t):
        return [leaf for f in t for leaf in leaves(f.type, f"{path}.{f.name}")]
    return [(path, t)]


@dataclass(frozen=True)
class Plan:
    """How the observations of one file format are read: the observation's logical type and each leaf's rules."""

    obs_type: pa.DataType
    leaves: tuple[Leaf, ...]

    @classmethod
    def of(cls, obs_type: pa.DataType, stacks: Mapping[str, int],
           images: Mapping[str, tuple[str, tuple[int, ...]]]) -> Plan:
        return cls(obs_type, tuple(Leaf(p, stacks.get(p), images.get(p)) for p, _ in leaves(obs_type)))

    def leaf(self, path: str) -> Leaf:
        return next(leaf for leaf in self.leaves if leaf.path == path)

    @property
    def rules(self) -> list[Rule]:
        """Every rule the plan uses (besides :data:`STORED` for the other columns)."""
        found = [r for leaf in self.leaves for r in (leaf.obs_rule, NEXT_SPARSE, leaf.next_rule)]
        found += [IMAGE_BYTES] if any(leaf.image for leaf in self.leaves) else []
        return list(dict.fromkeys(found))

    def obs(self, obs: str) -> Expr | None:
        """The stored column ``obs`` with its frame stacks decoded (image frames still bytes); None where no leaf is
        stacked (the column reads as stored)."""
        if not any(leaf.k is not None for leaf in self.leaves):
            return None
        return self._each(Column(obs), self.obs_type, OBS, self._obs_leaf)

    def next(self, nxt: str, obs: str) -> Expr:
        """The stored column ``nxt`` decoded, with ``obs`` the column of the decoded observations (by
        :meth:`obs`; image frames still bytes): :data:`NEXT_SPARSE`, then each stored leaf by its rule."""
        stored = self._each(Column(nxt), self.obs_type, OBS, lambda ref, path: self._next_leaf(ref, Column(obs), path))
        return When(IsNull(Column(nxt)), Lead(Column(obs)), stored)

    def values(self, column: str) -> Expr | None:
        """The column ``column`` (decoded obs or next_obs) with each image leaf's bytes made values
        (:data:`IMAGE_BYTES`); None without image leaves."""
        if not any(leaf.image for leaf in self.leaves):
            return None
        return self._each(Column(column), self.obs_type, OBS, self._values_leaf)

    def _obs_leaf(self, ref: Expr, path: str) -> Expr:
        leaf = self.leaf(path)
        if leaf.obs_rule is OBS_VALUE:
            return ref
        k = int(leaf.k)  # type: ignore[arg-type]  # obs_new_frames: a stacked leaf
        return Last(Flatten(Window(ref, k)), k)

    def _next_leaf(self, ref: Expr, obs: Expr, path: str) -> Expr:
        leaf, decoded = self.leaf(path), _at(obs, path)
        rule = leaf.next_rule
        if rule is NEXT_VALUE:
            return ref
        if rule is NEXT_ONE_FRAME:
            return Item(ref, 1)
        k = int(leaf.k)  # type: ignore[arg-type]  # next_new_frames: a stacked leaf
        return When(HasItems(ref, k), ref, Concat(Items(decoded, 2, k - 1), ref))

    def _values_leaf(self, ref: Expr, path: str) -> Expr:
        leaf = self.leaf(path)
        if leaf.image is None:
            return ref
        return Values(ref, path, leaf.image[0], tuple(leaf.image[1]), leaf.k is not None)

    def _each(self, ref: Expr, t: pa.DataType, path: str, leaf: _LeafExpr) -> Expr:
        """``leaf(ref, path)`` of each leaf of ``ref`` (a struct: its fields, recursively, as one struct)."""
        if not pa.types.is_struct(t):
            return leaf(ref, path)
        return Struct(tuple((f.name, self._each(Field(ref, f.name), f.type, f"{path}.{f.name}", leaf)) for f in t))


def _at(ref: Expr, path: str) -> Expr:
    for name in path.split(".")[1:]:
        ref = Field(ref, name)
    return ref


def mixed(value: Expr, t: pa.DataType) -> Expr:
    """``value`` (of this group's type ``t``) in the type that holds every environment's (:data:`MIXED`)."""
    return AnyType(value, pa.types.is_nested(t))
