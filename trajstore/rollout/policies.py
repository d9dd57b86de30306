"""Policies named by a string, as ``trajstore rollout --policy`` takes them.

- ``module:function`` imports ``module`` and takes its attribute ``function`` (``a.b`` for an attribute of an
  attribute). For the gymnasium backend it is called as ``function(obs)`` with the observations of the whole
  vector env, ``(num_envs, …)``, and returns their actions, ``(num_envs, …)`` (``gym_rollout``'s ``policy``); for
  the JAX backend it is ``jax_rollout``'s policy, ``function(params, obs, key)``, called with ``params=None``
  (a module closes over its own parameters).
- ``sb3:ALGO:path.zip`` loads a Stable-Baselines3 checkpoint (the ``[sb3]`` extra) with ``ALGO.load(path)``, ALGO
  one of :data:`SB3_ALGORITHMS`; its actions are ``model.predict(obs, deterministic=…)[0]``, deterministic in
  evaluation. gymnasium backend only (the model runs in PyTorch, not under ``jit``). **A checkpoint is a pickle:**
  loading one runs any code its author put in it, so load only checkpoints from sources you trust; each load logs
  a warning that says so (:data:`SB3_PICKLE_WARNING`; the CLI prints it on stderr).

>>> policy = load_policy("numpy:zeros_like")
>>> policy([[0.5, 1.5]]).tolist()
[[0.0, 0.0]]
"""

from __future__ import annotations

import importlib
import logging
from pathlib import Path
from typing import Any, Callable, Literal

from trajstore.errors import InputError, first_line, one_line
from trajstore.extras import needed

__all__ = ["SB3_ALGORITHMS", "SB3_PICKLE_WARNING", "SB3Policy", "load_policy"]

log = logging.getLogger(__name__)

SB3_ALGORITHMS = ("A2C", "DDPG", "DQN", "PPO", "SAC", "TD3")
FORMS = "module:function or sb3:ALGO:path.zip"
# logged (the CLI prints it on stderr) before each SB3 checkpoint is loaded, the checkpoint's path after "policy: "
SB3_PICKLE_WARNING = ("policy: {path} is a Stable-Baselines3 checkpoint, which is a pickle: loading it runs any code "
                      "its author put in it. Load checkpoints only from sources you trust.")


def load_policy(spec: str, *, backend: Literal["gym", "jax"] = "gym",
                deterministic: bool = False) -> Callable[..., Any]:
    """The policy ``spec`` names (see the module's docstring); an :class:`InputError` naming ``policy`` when it
    names none. An ``sb3:`` checkpoint is a pickle, loaded with a warning: load only checkpoints you trust."""
    if not isinstance(spec, str) or ":" not in spec:
        raise InputError(f"policy: expected {FORMS}, got {spec!r}")
    if spec.startswith("sb3:"):
        if backend != "gym":
            raise InputError(f"policy: {spec} is a PyTorch model for gymnasium envs; use it with --backend gym")
        return _sb3(spec, deterministic=deterministic)
    return _function(spec)


def _function(spec: str) -> Callable[..., Any]:
    module_name, _, attribute = spec.partition(":")
    if not module_name or not attribute:
        raise InputError(f"policy: expected {FORMS}, got {spec!r}")
    try:
        found: Any = importlib.import_module(module_name)
    except ImportError as exc:
        raise InputError(f"policy: cannot import module {module_name!r}: {one_line(exc)}") from None
    except Exception as exc:  # noqa: BLE001 - the user's module failed as it ran: say so in one line
        raise InputError(f"policy: importing module {module_name!r} failed: {type(exc).__name__}: "
                         f"{one_line(exc)}") from None
    for part in attribute.split("."):
        if not hasattr(found, part):
            raise InputError(f"policy: {spec}: module {module_name!r} has no attribute {attribute!r}")
        found = getattr(found, part)
    if not callable(found):
        raise InputError(f"policy: {spec} is a {type(found).__name__}, not a function of the observations")
    return found  # type: ignore[no-any-return]


def _sb3(spec: str, *, deterministic: bool) -> SB3Policy:
    _, _, rest = spec.partition(":")
    algorithm, _, path = rest.partition(":")
    name = algorithm.upper()
    if name not in SB3_ALGORITHMS or not path:
        raise InputError(f"policy: expected sb3:ALGO:path.zip, ALGO one of {', '.join(SB3_ALGORITHMS)}; got {spec!r}")
    with needed("sb3", f"policy: {spec}"):
        import stable_baselines3
    if not Path(path).is_file() and not Path(f"{path}.zip").is_file():
        raise InputError(f"policy: no SB3 checkpoint at {path}")
    log.warning(SB3_PICKLE_WARNING.format(path=path))
    try:
        model = getattr(stable_baselines3, name).load(path)
    except Exception as exc:  # noqa: BLE001 - not a checkpoint of this algorithm: one line, not SB3's traceback
        raise InputError(f"policy: cannot load {path} as a {name} checkpoint: {type(exc).__name__}: "
                         f"{first_line(exc)}") from None
    return SB3Policy(model, deterministic=deterministic, name=f"{name} model {path}")


class SB3Policy:
    """A Stable-Baselines3 model as a vector env's policy: ``(B, …)`` observations in, ``(B, …)`` actions out."""

    def __init__(self, model: Any, *, deterministic: bool, name: str = "SB3 model") -> None:
        self.model, self.deterministic, self.name = model, deterministic, name

    def __call__(self, obs: Any) -> Any:
        try:
            actions, _ = self.model.predict(obs, deterministic=self.deterministic)
        except ValueError as exc:  # SB3's words for observations its model was not trained on
            raise InputError(f"policy: the {self.name} does not take these observations: "
                             f"{first_line(exc)}") from None
        return actions

    def __repr__(self) -> str:
        return f"SB3Policy({self.name}, deterministic={self.deterministic})"
