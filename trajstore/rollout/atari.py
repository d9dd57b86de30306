"""Atari games by name (the ``[atari]`` extra: ale-py, and OpenCV for gymnasium's ``AtariPreprocessing``).

:func:`register_env` makes ``ALE/…`` ids known to gymnasium (ale-py registers its games when imported) before an
env is made from one; :func:`dqn_preprocessing` is the usual preprocessing of DQN (Mnih et al., 2015) as
gymnasium has it: each env made with ``frameskip=1`` (``AtariPreprocessing`` skips the frames, max-pooling the
last two), 84×84 gray frames, and a stack of the last ``frame_stack`` of them, ``(k, 84, 84)`` uint8, which
:func:`~trajstore.rollout.gym_loop.gym_rollout` finds and stores one frame per step.

>>> import trajstore, tempfile                                                       # doctest: +SKIP
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> wrappers, env_kwargs = dqn_preprocessing(frame_stack=4)
>>> gym_rollout(store, "ALE/Breakout-v5", run_id="breakout", wrappers=wrappers, env_kwargs=env_kwargs, steps=1000)
"""

from __future__ import annotations

import functools
from typing import Any, Callable

from trajstore.errors import InputError, MissingExtraError

NAMESPACE = "ALE"
EXTRA = "pip install 'trajstore[atari]'"


def register_env(env_id: str) -> None:
    """Register ale-py's games with gymnasium when ``env_id`` is one of them (namespace ``ALE``); a one-line
    error naming the extra when ale-py is not installed. Other ids are left as they are."""
    if not is_atari(env_id):
        return
    try:
        import ale_py
    except ImportError:
        raise MissingExtraError(f"env: {env_id} is an Atari game, which needs ale-py: {EXTRA}", extra="atari",
                                name="ale_py") from None
    import gymnasium as gym

    gym.register_envs(ale_py)


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` (``module:`` prefix allowed) names one of ale-py's games (``ALE/…``)."""
    return env_id.rpartition(":")[2].startswith(NAMESPACE + "/")


def dqn_preprocessing(frame_stack: int = 4) -> tuple[list[Callable[[Any], Any]], dict[str, Any]]:
    """``(wrappers, env_kwargs)`` for :func:`~trajstore.rollout.gym_loop.gym_rollout` (or ``gym.make_vec``):
    gymnasium's ``AtariPreprocessing(frame_skip=4, screen_size=84, grayscale_obs=True)`` and
    ``FrameStackObservation(frame_stack)`` around each env, made with ``frameskip=1``."""
    if not isinstance(frame_stack, int) or isinstance(frame_stack, bool) or frame_stack < 1:
        raise InputError(f"frame_stack: must be a positive number of frames, got {frame_stack!r}")
    try:
        import cv2  # noqa: F401 - AtariPreprocessing resizes with OpenCV
    except ImportError:
        raise MissingExtraError(f"atari: gymnasium's AtariPreprocessing needs OpenCV: {EXTRA}", extra="atari",
                                name="cv2") from None
    import gymnasium as gym

    wrappers: list[Callable[[Any], Any]] = [functools.partial(gym.wrappers.AtariPreprocessing, frame_skip=4,
                                                              screen_size=84, grayscale_obs=True)]
    if frame_stack > 1:
        wrappers.append(functools.partial(gym.wrappers.FrameStackObservation, stack_size=frame_stack))
    return wrappers, {"frameskip": 1}
