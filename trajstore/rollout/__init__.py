"""Rollout workers that write straight into a store: a gymnasium vector-env loop, a JAX scan loop, evaluation of
exactly N episodes with either, and the import of recorded datasets (Minari).

The modules, in the order a rollout uses them: :mod:`~trajstore.rollout.target` (what a rollout writes to, and
the checks of its run), :mod:`~trajstore.rollout.policies` (policies named by a string, as the CLI takes them),
:mod:`~trajstore.rollout.sampling` (when it stops, what it reports), :mod:`~trajstore.rollout.progress` (its
progress bar), :mod:`~trajstore.rollout.background` (the writer on a thread of its own), then
:mod:`~trajstore.rollout.atari` (Atari games by name, DQN's preprocessing),
:mod:`~trajstore.rollout.gym_steps` (the vector-env loop) and :mod:`~trajstore.rollout.gym_loop` /
:mod:`~trajstore.rollout.gym_evaluation`, or :mod:`~trajstore.rollout.envs` (pure-JAX environments),
:mod:`~trajstore.rollout.jax_scan` (the jitted scan), :mod:`~trajstore.rollout.jax_host` (the host side) and
:mod:`~trajstore.rollout.jax_loop` / :mod:`~trajstore.rollout.evaluate`, and :mod:`~trajstore.rollout.minari`;
multi-agent PettingZoo envs: :mod:`trajstore.rollout.parallel`.

Every rollout stores ``mode`` (``'train'``, or ``'eval'`` for the evaluations) and ``seed`` (the seed it was
given, one value for the run; ``env_index`` and ``worker_id`` tell its envs apart) in every row, and refuses a
``run_id`` the store already holds unless ``append=True``.
"""

from __future__ import annotations

from typing import Any

__all__ = ["RolloutResult", "gym_evaluate", "gym_rollout", "import_minari",  # noqa: F822 - lazy
           "jax_evaluate", "jax_rollout", "load_policy", "parallel_rollout", "sample_until"]

_HOMES = {"gym_rollout": "gym_loop", "gym_evaluate": "gym_evaluation", "jax_rollout": "jax_loop",
          "jax_evaluate": "evaluate", "import_minari": "minari", "parallel_rollout": "parallel",
          "load_policy": "policies", "RolloutResult": "sampling", "sample_until": "sampling"}


def __getattr__(name: str) -> Any:
    # Imported lazily so that `import trajstore.rollout` does not import JAX for gym users.
    if name in _HOMES:
        import importlib

        return getattr(importlib.import_module(f"trajstore.rollout.{_HOMES[name]}"), name)
    raise AttributeError(f"module 'trajstore.rollout' has no attribute {name!r}")
