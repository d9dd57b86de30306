"""Values of a step's ``info`` stored as step columns (``info_keys=[...]`` on recorders and rollouts).

Each named key becomes a step column of that name. Envs report many keys only at some steps
(``is_success`` at an episode's end, ``TimeLimit.truncated`` where a limit cut it): where a step's info lacks a
key, its column is null there. A key is read from whatever the recorder sees: one env's info dict, a gymnasium
vector env's info (values with a ``_key`` mask per env; in same-step autoreset an ended env's values are those
of its last step, ``info["final_info"]``, not its reset's), or SB3's list of per-env dicts.

Values are stored as the recorder is given them. A gymnasium vector env types each key of a step's info by the
first env's value (FrozenLake's reset gives ``prob=1``, an int: another env's 1/3 in that step is reported as 0);
record such keys from one env (:class:`~trajstore.integrations.RecordToStore`) where that matters.

A column appears from the first step any env reports the key, with the type of that first value; before that,
the rows are written without it (read as null). Array values are stored too, as fixed-size lists, but only where
every step carries them: only scalars can be missing.

>>> columns = InfoColumns(["is_success"], num_envs=2)
>>> columns.add(vector_info({"is_success": np.array([True, False]), "_is_success": np.array([True, False])},
...                         columns.keys, 2))
>>> columns.take()["is_success"].tolist()
[[True, None]]
"""

from __future__ import annotations

from typing import Any, Iterable, Mapping, Sequence

import numpy as np

from trajstore.errors import InputError
from trajstore.storage.names import check_column_name, check_distinct
from trajstore.write.writer import RESERVED_EXTRAS

Values = dict[str, tuple[np.ndarray, np.ndarray]]
"""Per key: ``(values, present)``, each with a leading env axis (``present`` a bool mask)."""


def check_info_keys(keys: Iterable[str] | None) -> tuple[str, ...]:
    """``keys`` as a tuple, each a name a step column users give can take (not one the writer fills itself, see
    :func:`~trajstore.storage.names.check_column_name`), no two differing only in case."""
    if keys is None:
        return ()
    if isinstance(keys, str) or not all(isinstance(k, str) and k for k in keys):
        raise InputError(f"info_keys: expected a list of info keys (strings), got {keys!r}")
    keys = tuple(keys)
    clash = [k for k in keys if k in RESERVED_EXTRAS]
    if clash:
        raise InputError(f"info_keys: {clash[0]!r} is a step column of its own; an info key cannot be stored "
                         "under that name")
    if len(set(keys)) != len(keys):
        raise InputError(f"info_keys: each key once, got {list(keys)}")
    for key in keys:
        check_column_name(key, field="info_keys")
    check_distinct(keys, field="info_keys")
    return keys


def check_writer(keys: Sequence[str], writer: Any) -> None:
    """Refuse an info key that names one of ``writer``'s lineage columns (``seed``, ``worker_id``, …), in any case."""
    clash = [k for k in keys if k in getattr(writer, "lineage", {})]
    if clash:
        raise InputError(f"info_keys: {clash[0]!r} is also given as a lineage value of this writer; give one of "
                         "them another name")
    check_distinct(keys, getattr(writer, "lineage", {}), field="info_keys")


def env_info(info: Mapping[str, Any], keys: Sequence[str]) -> Values:
    """One env's ``info`` dict (an env axis of 1)."""
    out = {}
    for key in keys:
        present = key in info
        value = np.array(info[key], copy=True) if present else np.zeros(())
        out[key] = (value[None], np.array([present]))
    return out


def vector_info(info: Mapping[str, Any], keys: Sequence[str], num_envs: int, *, same_step: bool = False) -> Values:
    """A gymnasium vector env's ``info`` (``info[key]`` per env, ``info["_" + key]`` which envs gave it); in
    same-step autoreset, an ended env's values come from ``info["final_info"]``."""
    out = {key: _masked(info, key, num_envs) for key in keys}
    final, ended = info.get("final_info"), info.get("_final_info")
    if same_step and final is not None and ended is not None and np.any(ended):
        ended = np.asarray(ended, bool)
        for key in keys:
            values, present = out[key]
            last, had = _masked(final, key, num_envs)
            values = np.zeros_like(last) if not present.any() else values.astype(np.result_type(values, last))
            values[ended] = last[ended]
            present = np.where(ended, had, present)
            out[key] = (values, present)
    return out


def list_info(infos: Sequence[Mapping[str, Any]], keys: Sequence[str]) -> Values:
    """SB3's infos: one dict per env."""
    out = {}
    for key in keys:
        present = np.array([key in info for info in infos])
        given = [np.asarray(info[key]) for info in infos if key in info]
        blank = np.zeros_like(given[0]) if given else np.zeros(())
        values = iter(given)
        out[key] = (np.stack([next(values) if p else blank for p in present]), present)
    return out


def _masked(info: Mapping[str, Any], key: str, num_envs: int) -> tuple[np.ndarray, np.ndarray]:
    if key not in info:
        return np.zeros(num_envs), np.zeros(num_envs, bool)
    values = np.array(info[key], copy=True)
    if values.ndim == 0 or values.shape[0] != num_envs:
        raise InputError(f"info_keys: {key!r} of a vector env's info must have one value per env ({num_envs}), "
                         f"got shape {values.shape}")
    mask = info.get("_" + key)
    present = np.ones(num_envs, bool) if mask is None else np.asarray(mask, bool)
    return values, present


class InfoColumns:
    """Steps' info values collected until :meth:`take`, as one ``(T, B)`` column per key (a masked array where
    some steps lack the key)."""

    def __init__(self, keys: Sequence[str], num_envs: int) -> None:
        self.keys = check_info_keys(keys)
        self.num_envs = num_envs
        self._steps: list[Values] = []
        self._seen: dict[str, tuple[tuple[int, ...], np.dtype]] = {}  # key -> (shape of one value, dtype)

    def add(self, values: Values) -> None:
        for key, (value, present) in values.items():
            if key not in self._seen and present.any():
                first = value[np.argmax(present)]
                self._seen[key] = (first.shape, first.dtype)
        self._steps.append(values)

    def take(self) -> dict[str, np.ndarray]:
        """The columns of the steps added since the last call: keys no step has reported yet are left out."""
        steps, self._steps = self._steps, []
        if not steps:
            return {}
        out = {}
        for key in self.keys:
            if key not in self._seen:
                continue
            shape, dtype = self._seen[key]
            values = np.zeros((len(steps), self.num_envs, *shape), dtype)
            present = np.zeros((len(steps), self.num_envs), bool)
            for t, step in enumerate(steps):
                value, present[t] = step[key]
                if not present[t].any():
                    continue
                if value.shape[1:] != shape:
                    raise InputError(f"info_keys: {key!r} changed shape, from {shape} to {value.shape[1:]}")
                values[t][present[t]] = value[present[t]]
            if present.all():
                out[key] = values
            elif shape:
                raise InputError(f"info_keys: {key!r} holds arrays of shape {shape} and some steps do not report "
                                 "it; only scalar info values can be missing (stored as null)")
            else:
                out[key] = np.ma.MaskedArray(values, mask=~present)
        return out
