"""n-step transitions for the DQN family: one row per step ``t`` of every selected episode.

With ``m = min(n, steps left in the episode from t)``: ``obs``/``action`` (and any other column asked for) at
``t``; ``reward`` = ``sum_{k<m} gamma**k r_{t+k}`` (computed in float64, given in the stored reward's dtype);
``next_obs`` = the ``next_obs`` stored at step ``t+m-1``; ``terminated`` = whether the episode terminated within
those steps; ``discount`` = ``gamma**m``, or 0 when terminated (a truncated or unfinished end bootstraps).
Rows also carry ``episode_id`` and ``step`` (= t). Over agents' own trajectories (``agent_id=``,
:mod:`~trajstore.loaders.agents`) the steps are one agent's rows of an episode (``step`` counts them, not env steps;
``terminated`` is the agent's own end) and rows carry ``agent_id`` (``str``) too. Items are numbered by step
position: episodes by id, steps ascending; the order, shards and resume are those of every loader
(:mod:`~trajstore.loaders.order`).
"""

from __future__ import annotations

from typing import Any, Mapping, Sequence

import numpy as np

from trajstore.errors import InputError
from trajstore.loaders import assemble
from trajstore.loaders import layout as lay
from trajstore.loaders.loader import Batches, check_format
from trajstore.loaders.order import check_count
from trajstore.loaders.sequences import (
    Items,
    Sampling,
    Source,
    check_batch_bytes,
    checked,
    item_weights,
    loader_batches,
    release_view,
    step_bytes,
    stored_columns,
    weight_column,
)
from trajstore.loaders.stitched import Stitched, StitchedView
from trajstore.query.returns import check_gamma

DEFAULT_COLUMNS = ("obs", "action")
OUTPUTS = ("reward", "next_obs", "terminated", "discount")  # made by the n-step rule, never taken at t
ITEM_BYTES = 8 * 8  # per transition beyond its columns: episode_id, step, discount and int64 indices
REWARD_BYTES = 5 * 8  # per transition and each of its n steps: the rewards summed and their indices


def transitions(source: Source, n: int, *, gamma: float, columns: Sequence[str] | None = None,
                sampling: Sampling = Sampling(), format: str = "numpy",  # noqa: A002, B008 - a frozen value
                resume: Mapping[str, Any] | None = None, max_batch_bytes: int | None = None) -> Batches:
    """Batches of the n-step transitions of the steps of ``source`` (see the module's description); with
    ``max_batch_bytes``, an :class:`InputError` when one batch would take more than that to build (known once
    the steps are laid out: the rewards summed are those of ``min(n, longest episode)`` steps)."""
    n = check_count("n", n)
    check_gamma(gamma)
    sampling.check_arguments()
    check_format(format)
    items = transition_items(source, n, gamma=gamma, columns=columns, weight_by=sampling.weight_by,
                             batch_size=int(sampling.batch_size), max_batch_bytes=max_batch_bytes)
    try:
        weights = item_weights(source, items.view, sampling.weight_by, items.first, items.count, items.first_step)
        return loader_batches("transitions", items.arguments, source, items.release, sampling, items.total, weights,
                              items.batch, format, resume)
    except BaseException:
        items.release()
        raise


def transition_items(source: Source, n: int, *, gamma: float, columns: Sequence[str] | None = None,
                     weight_by: str | None = None, batch_size: int = 1, max_batch_bytes: int | None = None) -> Items:
    """The n-step transitions of ``source``, one per step (see the module's description), as :class:`Items`:
    numbered by step position, made by one kernel; with ``max_batch_bytes``, an :class:`InputError` when a batch of
    ``batch_size`` would take more than that to build."""
    n = check_count("n", n)
    g = check_gamma(gamma)
    if isinstance(columns, str):
        columns = [columns]
    if columns is not None and "return_to_go" in columns:
        raise InputError("columns: 'return_to_go' is a column of store.sequences(...), not of transitions")
    asked = stored_columns(source, columns, default=DEFAULT_COLUMNS)
    at_t = [c for c in asked if c not in OUTPUTS]
    needed = ["reward", "next_obs", "terminated"]
    missing = [c for c in needed if c not in source.schema.names]
    if missing:
        raise InputError(f"columns: n-step transitions need {missing}, which these steps do not have")
    extra = [c for c in [*needed, *weight_column(source, weight_by)] if c not in at_t]
    laid = checked(source, list(dict.fromkeys([*at_t, *extra])))
    layout, release = source.laid_out(laid, None, lambda folder: lay.build(source.read, source.schema, laid, folder))
    view = layout.mapped()
    try:
        if max_batch_bytes is not None:
            _check_bytes(source, layout, at_t, n, batch_size, max_batch_bytes)
        ends = layout.offset + layout.length - 1
        terminal = view.gather("terminated", ends).astype(bool) if len(ends) else np.zeros(0, bool)
        kernel = assemble.TransitionKernel(view.spans, lay.leaf_names(view.columns, at_t),
                                           lay.leaf_names(view.columns, ["next_obs"]), min(n, view.longest), g,
                                           terminal)  # no episode is longer: the same sums, bounded arrays

        def batch(items: np.ndarray) -> dict[str, np.ndarray]:
            return source.named(transition_batch(view, at_t, kernel, items))

        arguments = {"n": n, "gamma": g, "columns": at_t}
        return Items(view, layout.length, layout.offset, 1, arguments, batch, release_view(view, release),
                     lambda items: items)
    except BaseException:
        view.close()
        release()
        raise


def _check_bytes(source: Source, layout: lay.Layout | Stitched, at_t: Sequence[str], n: int, batch_size: int,
                 max_batch_bytes: int) -> None:
    """Refuse batches of ``batch_size`` transitions that would take more than ``max_batch_bytes`` to build."""
    steps = min(n, int(layout.length.max(initial=1)))
    per_item = step_bytes(source.schema, [*at_t, "next_obs", "reward", "terminated"]) + ITEM_BYTES + \
        steps * REWARD_BYTES
    check_batch_bytes(batch_size * per_item, max_batch_bytes,
                      f"batch_size: {batch_size} transitions × {per_item} bytes each (columns "
                      f"{', '.join([*at_t, 'next_obs', 'reward', 'terminated'])}, and {steps} rewards summed)",
                      "lower batch_size or n, or select fewer columns")


def transition_batch(layout: lay.Mapped | StitchedView, names: Sequence[str], kernel: assemble.TransitionKernel,
                     positions: np.ndarray) -> dict[str, np.ndarray]:
    """The n-step transitions starting at step ``positions`` of the layout, made by one call of ``kernel``."""
    batch = layout.copying(lambda: positions, kernel.n, kernel.names, lambda: kernel(positions))
    out = {name: lay.leaves(name, layout.columns, batch.arrays.__getitem__) for name in names}
    out["reward"] = batch.reward
    out["next_obs"] = lay.leaves("next_obs", layout.columns, batch.arrays.__getitem__)
    out["terminated"] = batch.terminated
    out["discount"] = batch.discount
    out["episode_id"] = layout.episode_id[batch.episode]
    out["step"] = batch.step
    return out
