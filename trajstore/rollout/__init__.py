"""Rollout workers that write straight into a store: a gymnasium vector-env loop, a JAX scan loop, JAX
evaluation, and the import of recorded datasets (Minari).

The modules, in the order a rollout uses them: :mod:`~trajstore.rollout.target` (what a rollout writes to),
:mod:`~trajstore.rollout.sampling` (when it stops, what it reports), :mod:`~trajstore.rollout.progress` (its progress
bar), :mod:`~trajstore.rollout.background` (the writer on a thread of its own), then
:mod:`~trajstore.rollout.gym_loop`, or :mod:`~trajstore.rollout.envs` (pure-JAX environments),
:mod:`~trajstore.rollout.jax_scan` (the jitted scan), :mod:`~trajstore.rollout.jax_host` (the host side) and
:mod:`~trajstore.rollout.jax_loop` / :mod:`~trajstore.rollout.evaluate`, and :mod:`~trajstore.rollout.minari`;
multi-agent PettingZoo envs: :mod:`trajstore.rollout.parallel`.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RolloutResult", "gym_rollout", "import_minari", "jax_evaluate", "jax_rollout",  # noqa: F822 - lazy
           "parallel_rollout", "sample_until"]

_HOMES = {"gym_rollout": "gym_loop", "jax_rollout": "jax_loop", "jax_evaluate": "evaluate",
          "import_minari": "minari", "parallel_rollout": "parallel", "RolloutResult": "sampling",
          "sample_until": "sampling"}


def __getattr__(name: str) -> Any:
    # Imported lazily so that `import trajstore.rollout` does not import JAX for gym users.
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f"trajstore.rollout.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'trajstore.rollout' has no attribute {name!r}")
