"""Recording from where users already step their environments: gymnasium wrappers
(:class:`RecordToStore`, :class:`VectorRecordToStore`, in :mod:`trajstore.integrations.gymnasium`) and a
Stable-Baselines3 callback (:class:`trajstore.integrations.sb3.StoreCallback`, the ``[sb3]`` extra; import
that module, :mod:`trajstore.integrations.sb3`, by name). Both, and the rollout workers, read ``info_keys`` out of
each step's info the same way (:mod:`trajstore.integrations.info`)."""

from __future__ import annotations

from trajstore.integrations.gymnasium import RecordToStore, VectorRecordToStore

__all__ = ["RecordToStore", "VectorRecordToStore"]
