"""Fixed-length windows inside episodes, for recurrent and sequence models (R2D2 burn-in, Decision Transformer).

A window is ``length`` consecutive steps of one episode, starting at step ``0, stride, 2·stride, …``; it never
crosses into another episode. With ``pad=False`` only the windows that fit wholly inside their episode exist;
with ``pad=True`` also the partial ones at its end, their missing steps zero and ``mask`` False. Windows are
numbered episode by episode (ids ascending), starts ascending; :mod:`~trajstore.loaders.order` makes an epoch's
order of them and :mod:`~trajstore.loaders.layout` holds the steps they are gathered from.

A batch is a dict: each column ``(n, length, …)``, ``mask`` ``(n, length)``, ``episode_id`` ``(n,)`` and
``start`` ``(n,)``. Over agents' own trajectories (``agent_id=``, :mod:`~trajstore.loaders.agents`) a window stays
inside one agent's rows of one episode, ``start`` counts that agent's rows, and ``agent_id`` ``(n,)`` (``str``) names
the agent. ``return_to_go`` (with ``gamma``) is the exact return-to-go of the whole episode at each
step, ``G_t = r_t + gamma G_{t+1}``, in float64.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Hashable, Iterator, Mapping, Sequence

import numpy as np
import pyarrow as pa

from trajstore.errors import InputError, size_text
from trajstore.loaders import assemble
from trajstore.loaders import layout as lay
from trajstore.loaders.agents import Trajectories
from trajstore.loaders.layout_store import Basis, LayoutKey, LayoutStore
from trajstore.loaders.loader import Batches, check_format
from trajstore.loaders.order import (
    GroupWeights,
    Position,
    StepWeights,
    Weights,
    check_count,
    check_shard,
    digest,
    epoch_order,
    resume_position,
)
from trajstore.loaders.stitched import Stitched, StitchedView
from trajstore.query.returns import check_gamma, episodes_return_to_go
from trajstore.storage.arrays import value_bytes

RETURN_TO_GO = "return_to_go"
# bytes per step of a batch beyond its columns: the mask, and the int64 step and position indices gathered by
GATHER_BYTES = 1 + 3 * 8
KEYS = ("episode_id", "step", "run_id", "env_id")  # never a batched column: given as episode_id/start
DEFAULT_COLUMNS = ("obs", "action", "reward", "terminated", "truncated")


@dataclass
class Source:
    """The steps a loader reads, pinned to one committed version: their types, a reader of their columns, the
    value of an ``episodes`` view column per episode (same version), and a key naming the version's files (a
    digest of their paths relative to the table)."""

    schema: pa.Schema
    read: lay.Reader
    episode_values: Callable[[str], tuple[np.ndarray, np.ndarray]]  # sorted ids, values; InputError if unknown
    version_key: str
    arguments: dict[str, Any] = field(default_factory=dict)  # the selection (run_id, where, filter), digested
    layouts: LayoutStore | None = None  # where layouts are found and kept (None: built for each call)
    basis: Basis | None = None  # what the store's vacuum judges a layout of these steps by
    check_types: Callable[[Sequence[str]], None] | None = None  # InputError for columns no array can stack
    # the layout of column leaves (dtype and shape each) stitched from the files' array copies, or None
    stitch: Callable[[dict[str, Any]], Stitched | None] | None = None
    # agents' own trajectories (loaders.agents), laid out in place of episodes; batches name them (named)
    trajectories: Trajectories | None = None

    def named(self, batch: dict[str, Any]) -> dict[str, Any]:
        """A batch of items of the layout, with ``episode_id`` and ``agent_id`` of agents' trajectories."""
        return batch if self.trajectories is None else self.trajectories.named(batch)

    def laid_out(self, columns: Sequence[str], derived: Any,
                 make: Callable[[Path | None], lay.Layout]) -> tuple[lay.Layout | Stitched, Callable[[], None]]:
        """The layout of ``columns`` (plus what ``derived`` names) of these steps, and its release: stitched from
        the files' array copies where they hold them all (no derived column), else found, or built by
        ``make(folder)``."""
        if derived is None and self.stitch is not None:
            key: Hashable = ("arrays", self.version_key, self.arguments.get("episodes"), tuple(columns))
            kept = lay.OpenLayouts(0) if self.layouts is None else self.layouts.opened
            try:  # kept open for the next epoch, like a built layout (its pages stay mapped)
                # a Stitched serves as a Layout (the members used are the same): OpenLayouts' types say Layout
                return kept.get(key, lambda: self._stitched(columns) or _no_copies())  # type: ignore[arg-type, return-value]
            except _NoCopies:
                pass
        if self.layouts is None or self.basis is None:
            return lay.OpenLayouts(0).get(None, lambda: make(None))
        types = tuple(str(self.schema.field(c).type) for c in columns)
        key = LayoutKey(self.version_key, self.arguments.get("episodes"), tuple(columns), types,
                        None if derived is None else tuple(derived))
        return self.layouts.get(key, make, self.basis)

    def _stitched(self, columns: Sequence[str]) -> Stitched | None:
        if self.stitch is None:
            return None
        try:
            kinds = {leaf: kind for c in columns for leaf, kind in lay.column_leaves(self.schema, c).items()}
        except InputError:
            return None  # the build says so, or lays out an empty selection
        return self.stitch(kinds)


class _NoCopies(Exception):
    """The files of a selection have no array copies holding its columns: its layout is built."""


def _no_copies() -> Stitched:
    raise _NoCopies


@dataclass(frozen=True)
class Sampling:
    """Order arguments shared by every loader."""

    batch_size: int = 256
    shuffle: bool = False
    seed: int = 0
    epoch: int = 0
    rank: int = 0
    world_size: int = 1
    weight_by: str | None = None
    num_samples: int | None = None

    def check_arguments(self) -> None:
        check_count("batch_size", self.batch_size)
        check_shard(self.rank, self.world_size)
        check_count("epoch", self.epoch, minimum=0)
        if not isinstance(self.seed, (int, np.integer)) or isinstance(self.seed, bool) or self.seed < 0:
            raise InputError(f"seed: must be an integer >= 0, got {self.seed!r}")
        if self.num_samples is not None:
            check_count("num_samples", self.num_samples)
            if self.weight_by is None:
                raise InputError("num_samples: draws with replacement need weight_by (a column to weight by)")

    def digested(self) -> dict[str, Any]:
        return {"shuffle": bool(self.shuffle), "seed": int(self.seed), "rank": int(self.rank),
                "world_size": int(self.world_size), "weight_by": self.weight_by, "num_samples": self.num_samples}


def stored_columns(source: Source, columns: Sequence[str] | None, *, default: Sequence[str] | None = None) -> list[str]:
    """The stored columns asked for (those of ``default`` the steps have, without ``columns``), checked."""
    names = source.schema.names
    if columns is None:
        return [c for c in (DEFAULT_COLUMNS if default is None else default) if c in names]
    if isinstance(columns, str):
        columns = [columns]
    unknown = [c for c in columns if c not in names and c != RETURN_TO_GO]
    if unknown:
        raise InputError(f"columns: unknown column(s) {unknown}; the steps have {list(names)} (and "
                         f"{RETURN_TO_GO!r} with gamma)")
    keys = [c for c in columns if c in KEYS]
    if keys:
        raise InputError(f"columns: {keys} cannot be batched per step; each batch has episode_id and start")
    return list(dict.fromkeys(c for c in columns if c != RETURN_TO_GO))


def checked(source: Source, columns: Sequence[str]) -> list[str]:
    """``columns``, refused (naming the environments) where no array can stack their steps."""
    if source.check_types is not None:
        source.check_types(columns)
    return list(columns)


@dataclass(frozen=True)
class Windows:
    """The windows of a layout's episodes, numbered episode by episode, starts ascending: ``count[e]`` windows
    in episode ``e``, numbered from ``end[e] - count[e]``, starting at steps ``0, stride, …``. Memory per
    episode: a window's episode and start are found from its number (:meth:`locate`)."""

    count: np.ndarray
    end: np.ndarray
    stride: int

    @classmethod
    def of(cls, lengths: np.ndarray, length: int, stride: int, pad: bool) -> Windows:
        lengths = np.asarray(lengths, np.int64)
        if pad:
            count = np.where(lengths > 0, (lengths - 1) // stride + 1, 0)
        else:
            count = np.where(lengths >= length, (lengths - length) // stride + 1, 0)
        return cls(count, np.cumsum(count), stride)

    def __len__(self) -> int:
        return int(self.end[-1]) if len(self.end) else 0

    @property
    def first(self) -> np.ndarray:
        return self.end - self.count

    def locate(self, items: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """``(episode, start)`` of windows ``items``."""
        episode = np.searchsorted(self.end, items, side="right")
        return episode, (items - (self.end[episode] - self.count[episode])) * self.stride


WEIGHT_CHUNK = 1 << 20  # items whose step weights are gathered at a time


def item_weights(source: Source, layout: lay.Layout | lay.Mapped | StitchedView, weight_by: str | None,
                 first: np.ndarray, count: np.ndarray,
                 first_step: Callable[[np.ndarray], np.ndarray]) -> Weights | None:
    """The items' weights: the step column ``weight_by`` at each item's (first) step, ``first_step(items)``,
    or the ``episodes`` view's column ``weight_by`` of its episode (``count[e]`` items of episode ``e`` from
    item ``first[e]`` on)."""
    if weight_by is None:
        return None
    if weight_by in layout.columns:
        n = int(count.sum())

        def chunks() -> Iterator[np.ndarray]:
            for lo in range(0, n, WEIGHT_CHUNK):
                items = np.arange(lo, min(lo + WEIGHT_CHUNK, n), dtype=np.int64)
                yield layout.gather(weight_by, first_step(items)).astype(np.float64)

        return StepWeights(chunks(), n)
    ids, values = source.episode_values(weight_by)
    at = np.minimum(np.searchsorted(ids, layout.episode_id), max(len(ids) - 1, 0))
    per_episode = np.where(ids[at] == layout.episode_id, values[at], 0.0) if len(ids) else \
        np.zeros(len(layout.episode_id))
    return GroupWeights(np.asarray(per_episode, np.float64), first, count)


def weight_column(source: Source, weight_by: str | None) -> list[str]:
    """The step column to lay out for ``weight_by`` (none if it names an episodes column)."""
    if weight_by is None or weight_by not in source.schema.names or weight_by in KEYS:
        return []
    lay.column_type(source.schema, weight_by)
    return [weight_by]


def step_bytes(schema: pa.Schema, names: Sequence[str]) -> int:
    """The bytes one step of ``names`` (stored columns typed by ``schema``) takes in a batch."""
    total = 0
    for name in names:
        for dtype, shape in lay.column_leaves(schema, name, empty=True).values():  # a Dict column: its leaves
            total += value_bytes(dtype, shape)
    return total


def check_batch_bytes(nbytes: int, max_batch_bytes: int | None, what: str, advice: str) -> None:
    """Refuse a batch that would take ``nbytes`` (``what`` says of what) past ``max_batch_bytes``."""
    if max_batch_bytes is not None and nbytes > max_batch_bytes:
        raise InputError(f"{what} would take {size_text(nbytes)} to build, over the limit of "
                         f"{size_text(max_batch_bytes)} a batch may take (max_batch_bytes; a server's "
                         f"TRAJSTORE_LOADER_BATCH_BYTES); {advice}")


@dataclass
class Items:
    """A loader's items over one layout, and how a batch of them is made: ``count[e]`` items in the layout's episode
    ``e``, numbered from ``first[e]``, the ``k``-th starting at step ``k · stride`` of it; ``batch(items)`` the batch
    of those numbers (named: ``episode_id``, ``agent_id``). ``release()`` unmaps the layout (once: the loader's
    iterator, or a replay, calls it)."""

    view: lay.Mapped | StitchedView
    count: np.ndarray
    first: np.ndarray
    stride: int
    arguments: dict[str, Any]
    batch: Callable[[np.ndarray], dict[str, np.ndarray]]
    release: Callable[[], None]
    first_step: Callable[[np.ndarray], np.ndarray]  # the position of each item's first step in the layout

    @property
    def total(self) -> int:
        return int(self.count.sum())


def sequences(source: Source, length: int, *, columns: Sequence[str] | None = None, stride: int | None = None,
              pad: bool = False, gamma: float | None = None, sampling: Sampling = Sampling(),
              format: str = "numpy", resume: Mapping[str, Any] | None = None,  # noqa: A002
              max_batch_bytes: int | None = None) -> Batches:
    """Batches of windows of the steps of ``source`` (see the module's description); with ``max_batch_bytes``,
    an :class:`InputError` (before anything is read) when one batch would take more than that to build."""
    length = check_count("length", length)
    stride = length if stride is None else check_count("stride", stride)
    sampling.check_arguments()
    check_format(format)
    items = window_items(source, length, columns=columns, stride=stride, pad=pad, gamma=gamma,
                         weight_by=sampling.weight_by, batch_size=int(sampling.batch_size),
                         max_batch_bytes=max_batch_bytes)
    try:
        weights = item_weights(source, items.view, sampling.weight_by, items.first, items.count, items.first_step)
        return loader_batches("sequences", items.arguments, source, items.release, sampling, items.total, weights,
                              items.batch, format, resume)
    except BaseException:
        items.release()
        raise


def window_items(source: Source, length: int, *, columns: Sequence[str] | None = None, stride: int | None = None,
                 pad: bool = False, gamma: float | None = None, weight_by: str | None = None, batch_size: int = 1,
                 max_batch_bytes: int | None = None) -> Items:
    """The windows of ``length`` steps of ``source`` (see the module's description) as :class:`Items`: their
    layout found, stitched or built (with ``weight_by``'s step column too), numbered, and made by one kernel; with
    ``max_batch_bytes``, an :class:`InputError` (before anything is read) when a batch of ``batch_size`` would take
    more than that to build."""
    length = check_count("length", length)
    stride = length if stride is None else check_count("stride", stride)
    g = None if gamma is None else check_gamma(gamma)
    names = stored_columns(source, columns)
    wants_rtg = (columns is None and g is not None) or (columns is not None and RETURN_TO_GO in list(columns))
    if wants_rtg and g is None:
        raise InputError(f"gamma: {RETURN_TO_GO!r} needs a discount; pass gamma in [0, 1]")
    if wants_rtg and "reward" not in source.schema.names:  # e.g. the empty first version of a store
        raise InputError(f"gamma: {RETURN_TO_GO!r} is computed from the steps' reward, which these steps do not have")
    extra = (["reward"] if wants_rtg and "reward" not in names else []) + \
        [c for c in weight_column(source, weight_by) if c not in names]
    checked(source, [*names, *extra])
    if max_batch_bytes is not None:
        per_step = step_bytes(source.schema, names) + (8 if wants_rtg else 0) + GATHER_BYTES
        check_batch_bytes(batch_size * length * per_step, max_batch_bytes,
                          f"batch_size × length: {batch_size} windows × {length} steps × {per_step} bytes "
                          f"a step ({', '.join([*names, *([RETURN_TO_GO] if wants_rtg else []), 'mask'])} and "
                          "indices)", "lower batch_size or length, or select fewer columns")

    def make(folder: Path | None) -> lay.Layout:
        layout = lay.build(source.read, source.schema, [*names, *extra], folder)
        try:
            if wants_rtg and g is not None:
                lay.derive(layout, RETURN_TO_GO, np.dtype(np.float64), "reward",
                           lambda r, starts: episodes_return_to_go(r, starts, g))
        except BaseException:
            layout.close()
            raise
        return layout

    layout, release = source.laid_out([*names, *extra], (RETURN_TO_GO, g) if wants_rtg else None, make)
    view = layout.mapped()
    try:
        if wants_rtg:
            names.append(RETURN_TO_GO)
        windows = Windows.of(layout.length, length, stride, bool(pad))
        if not len(windows):
            check_fits(layout, length, source.trajectories)
        kernel = assemble.WindowKernel(view.spans, lay.leaf_names(view.columns, names), windows.end, windows.count,
                                       windows.stride, length)

        def batch(items: np.ndarray) -> dict[str, np.ndarray]:
            return source.named(window_batch(view, names, kernel, windows, items))

        arguments = {"length": length, "columns": names, "stride": stride, "pad": bool(pad), "gamma": g}
        return Items(view, windows.count, windows.first, stride, arguments, batch, release_view(view, release),
                     lambda items: _first_steps(view, windows, items))
    except BaseException:
        view.close()
        release()
        raise


def check_fits(layout: lay.Layout | Stitched, length: int, trajectories: Trajectories | None = None) -> None:
    """An :class:`InputError` when windows of ``length`` steps fit in none of the selected episodes (with
    ``pad=False`` they would give nothing), naming the longest episode (or agent's trajectory)."""
    if not len(layout.length):
        return
    longest = int(np.argmax(layout.length))
    what, named = ("episode", f"episode_id {int(layout.episode_id[longest])}") if trajectories is None else \
        ("agent's trajectory", trajectories.describe(int(layout.episode_id[longest])))
    raise InputError(f"length: {length} steps is longer than every selected {what}; the longest, {named}, has "
                     f"{int(layout.length[longest])} steps: ask for at most that, or pass pad=True for windows "
                     f"padded (and masked) past episode ends")


def _first_steps(view: lay.Mapped | StitchedView, windows: Windows, items: np.ndarray) -> np.ndarray:
    episode, start = windows.locate(items)
    return view.offset[episode] + start


def release_view(view: lay.Mapped | StitchedView, release: Callable[[], None]) -> Callable[[], None]:
    """What ends an iterator: its maps closed, then its layout released."""
    def close() -> None:
        view.close()
        release()
    return close


def loader_batches(kind: str, arguments: dict[str, Any], source: Source, release: Callable[[], None],
                   sampling: Sampling, items: int, weights: Weights | None,
                   assemble: Callable[[np.ndarray], dict[str, np.ndarray]], format: str,  # noqa: A002
                   resume: Mapping[str, Any] | None) -> Batches:
    """The iterator over this epoch's shard of ``items`` items: its order, where ``resume`` puts it, and the
    digest of everything that fixes the order (``arguments``, the sampling, the selection, the data)."""
    digested = {"kind": kind, **arguments, **sampling.digested(), **source.arguments, "data": source.version_key}
    order = epoch_order(items, shuffle=bool(sampling.shuffle), seed=sampling.seed, epoch=sampling.epoch,
                        rank=sampling.rank, world_size=sampling.world_size, weights=weights,
                        num_samples=sampling.num_samples)
    position = Position(kind, digest(digested), int(sampling.epoch), 0)
    begin = resume_position(resume, kind=kind, digest_=position.digest, epoch=position.epoch, total=len(order))
    return Batches(order, start=begin, batch_size=int(sampling.batch_size), assemble=assemble, format=format,
                   position=position, on_close=release)


def window_batch(layout: lay.Mapped | StitchedView, names: Sequence[str], kernel: assemble.WindowKernel,
                 windows: Windows, items: np.ndarray) -> dict[str, np.ndarray]:
    """The windows ``items`` (``windows`` number them): each column ``(n, length, …)`` (zero past the episode's
    end), ``mask``, ``episode_id`` and ``start``, made by one call of ``kernel`` (a window inside one fragment
    copied as one block)."""
    batch = layout.copying(lambda: _first_steps(layout, windows, items), kernel.length, kernel.names,
                           lambda: kernel(items))
    out: dict[str, np.ndarray] = {name: lay.leaves(name, layout.columns, batch.arrays.__getitem__) for name in names}
    out["mask"] = batch.mask
    out["episode_id"] = layout.episode_id[batch.episode]
    out["start"] = batch.start
    return out
