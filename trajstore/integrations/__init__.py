"""Recording from where users already step their environments: gymnasium wrappers
(:class:`RecordToStore`, :class:`VectorRecordToStore`, in :mod:`trajstore.integrations.gymnasium`) and a
Stable-Baselines3 callback (:class:`trajstore.integrations.sb3.StoreCallback`, the ``[sb3]`` extra; import
that module, :mod:`trajstore.integrations.sb3`, by name). Both, and the rollout workers, read ``info_keys`` out of
each step's info the same way (:mod:`trajstore.integrations.info`). Multi-agent PettingZoo envs are recorded by
:mod:`trajstore.integrations.pettingzoo` (the ``[pettingzoo]`` extra; import it by name)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from trajstore.integrations.gymnasium import RecordToStore, VectorRecordToStore

__all__ = ["RecordToStore", "VectorRecordToStore"]


def __getattr__(name: str) -> Any:
    # Imported when first used, so that the modules every rollout shares (info) need no gymnasium (the [gym] extra)
    if name in __all__:
        from trajstore.integrations import gymnasium

        return getattr(gymnasium, name)
    raise AttributeError(f"module 'trajstore.integrations' has no attribute {name!r}")
