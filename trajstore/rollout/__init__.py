"""Rollout workers that write straight into a store: a gymnasium vector-env loop and a JAX scan loop."""

from __future__ import annotations

from typing import Any

__all__ = ["gym_rollout", "jax_evaluate", "jax_rollout", "RolloutResult", "sample_until"]


def __getattr__(name: str) -> Any:
    # Imported lazily so that `import trajstore.rollout` does not import JAX for gym users.
    if name in ("gym_rollout",):
        from trajstore.rollout import gym_loop

        return getattr(gym_loop, name)
    if name in ("jax_rollout",):
        from trajstore.rollout import jax_loop

        return getattr(jax_loop, name)
    if name in ("jax_evaluate",):
        from trajstore.rollout import evaluate

        return getattr(evaluate, name)
    if name in ("RolloutResult", "sample_until"):
        from trajstore.rollout import sampling

        return getattr(sampling, name)
    raise AttributeError(f"module 'trajstore.rollout' has no attribute {name!r}")
