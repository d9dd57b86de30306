"""Run configs: what a run was — its hyperparameters and algorithm (``config``), ``tags``, ``notes``, when it was
first described, and the code that made it (trajstore's version, the git commit of the calling program's
repository, the host) — kept in the table itself, so that every engine sees it and time travel shows it as it was.

Each described run is one property of the Delta table (its ``configuration``, which Spark shows with
``SHOW TBLPROPERTIES`` and deltalake as ``DeltaTable.metadata().configuration``): ``trajstore.run.<run_id>`` holding
a JSON object ``{"config": {...}, "tags": [...], "notes": ..., "created": <ISO time>, "trajstore_version": ...,
"git_commit": ..., "host": ...}``. A change is a commit of its own (versioned with the steps: ``store.at(version=N)``
reads the configs as they were then); deltalake's OPTIMIZE, VACUUM and checkpoints keep table properties.

In SQL the ``runs`` view has one row per run with steps: ``run_id, tags, notes, config`` (JSON:
``config->>'$.algo'``), ``created, trajstore_version, git_commit, host``; ``by="config.<path>"`` groups episodes by a
config value (:func:`config_key`).
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa

from trajstore.__about__ import __version__
from trajstore.errors import InputError

PREFIX = "trajstore.run."
CONFIG = "config."  # the prefix of a ``by=`` name that is a config value (``config.optimizer.lr``)
AUTOMATIC = ("trajstore_version", "git_commit", "host")
SCHEMA = pa.schema([("run_id", pa.string()), ("tags", pa.list_(pa.string())), ("notes", pa.string()),
                    ("config", pa.string()), ("created", pa.timestamp("us", tz="UTC")),
                    ("trajstore_version", pa.string()), ("git_commit", pa.string()), ("host", pa.string())])
_UNSET = object()


def infos(properties: Mapping[str, str]) -> dict[str, dict[str, Any]]:
    """Every described run's info (run id -> info) in the table ``properties``; a property that is not valid JSON
    (another tool's edit) is skipped."""
    out = {}
    for key, raw in properties.items():
        if key.startswith(PREFIX):
            try:
                info = json.loads(raw)
            except ValueError:
                continue
            if isinstance(info, dict):
                out[key[len(PREFIX):]] = info
    return out


def run_info(properties: Mapping[str, str], run_id: str) -> dict[str, Any]:
    """What describes ``run_id`` in the table ``properties``: ``config``, ``tags``, ``notes``, ``created`` (a
    datetime; None for a run never described) and :data:`AUTOMATIC`."""
    return _public(infos(properties).get(run_id, {}))


def table(properties: Mapping[str, str], run_ids: Iterable[str]) -> pa.Table:
    """The rows of the ``runs`` view of the runs ``run_ids`` (described or not), by id."""
    described = infos(properties)
    rows = [{"run_id": r, **_public(described.get(r, {}))} for r in sorted(set(run_ids))]
    for row in rows:
        row["config"] = json.dumps(row["config"], sort_keys=True)
    return pa.Table.from_pylist(rows, schema=SCHEMA)


def describe(table_log: Any, run_id: str, *, config: Any = _UNSET, tags: Any = _UNSET, notes: Any = _UNSET,
             replace: bool, what: str) -> None:
    """Commit the info of ``run_id`` given (``_UNSET``: left as stored). ``replace`` (``set_run``): each given
    field replaces the stored one. Otherwise (a writer opening the run): the run is described the first time;
    later, ``tags`` are added to the stored ones, ``notes`` are kept where stored, and a ``config`` other than the
    stored one is an :class:`InputError` naming what differs. The first description also records
    :data:`AUTOMATIC` and ``created``."""
    given = {}
    if config is not _UNSET and config is not None:
        given["config"] = check_config(config)
    if tags is not _UNSET and tags is not None:
        given["tags"] = check_tags(tags)
    if notes is not _UNSET and notes is not None:
        if not isinstance(notes, str):
            raise InputError(f"notes: expected a string, got {type(notes).__name__}")
        given["notes"] = notes
    if not given:
        return
    key = PREFIX + run_id

    def change(current: Mapping[str, str]) -> dict[str, str]:
        stored = infos({key: current[key]}).get(run_id) if key in current else None
        info = dict(stored) if stored is not None else {"config": {}, "tags": [], "notes": None,
                                                        "created": _now(), **automatic()}
        if replace or stored is None:
            info.update(given)
        else:
            if "config" in given and given["config"] != info.get("config"):
                raise InputError(f"config: run {run_id!r} was recorded with another config "
                                 f"({_difference(info.get('config') or {}, given['config'])}); change it with "
                                 "store.set_run, or write to another run_id")
            info["tags"] = list(dict.fromkeys([*info.get("tags", []), *given.get("tags", [])]))
            if info.get("notes") is None and "notes" in given:
                info["notes"] = given["notes"]
        raw = json.dumps(info, sort_keys=True, allow_nan=False)
        return {} if stored is not None and json.dumps(stored, sort_keys=True) == raw else {key: raw}

    table_log.set_properties(change, what=what)


def check_config(config: Any) -> dict[str, Any]:
    """``config`` as plain JSON (numpy numbers and arrays, tuples turned into their JSON values); anything else is
    an :class:`InputError` naming the key."""
    if not isinstance(config, Mapping):
        raise InputError(f"config: expected a dict of names to values, got {type(config).__name__}")
    return _plain(config, "config")


def check_tags(tags: Any) -> list[str]:
    if isinstance(tags, str) or not isinstance(tags, Sequence) and not isinstance(tags, (set, frozenset)):
        raise InputError(f"tags: expected a list of strings, got {type(tags).__name__}")
    bad = [t for t in tags if not isinstance(t, str) or not t]
    if bad:
        raise InputError(f"tags: expected non-empty strings, got {bad[0]!r}")
    return list(dict.fromkeys(tags))


def config_key(name: str) -> str | None:
    """The JSON path (``$."a"."b"``) of a ``by=`` name ``config.a.b``, or None for a name that is not one."""
    if not name.startswith(CONFIG) or len(name) == len(CONFIG):
        return None
    parts = name[len(CONFIG):].split(".")
    if any(not p for p in parts):
        raise InputError(f"by: {name!r} is not a config path; expected config.<key>[.<key>…]")
    return "$." + ".".join('"' + p.replace('"', '\\"') + '"' for p in parts)


def automatic() -> dict[str, str | None]:
    """What is recorded about the code that describes a run: trajstore's version, the git commit of the calling
    program's repository (its script's folder, else the working directory; with ``+dirty`` when files tracked
    there have changes; None outside a repository or without git), and the host."""
    return {"trajstore_version": __version__, "git_commit": git_commit(_program_folder()),
            "host": socket.gethostname()}


def git_commit(folder: Path) -> str | None:
    """The commit checked out in the git repository holding ``folder``, or None."""
    try:
        head = subprocess.run(["git", "-C", str(folder), "rev-parse", "HEAD"], capture_output=True, text=True,
                              timeout=5)
        if head.returncode != 0:
            return None
        dirty = subprocess.run(["git", "-C", str(folder), "status", "--porcelain", "--untracked-files=no"],
                               capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    return head.stdout.strip() + ("+dirty" if dirty.returncode == 0 and dirty.stdout.strip() else "")


def _program_folder() -> Path:
    main = getattr(sys.modules.get("__main__"), "__file__", None)
    return Path(main).resolve().parent if main else Path(os.getcwd())


def _public(info: Mapping[str, Any]) -> dict[str, Any]:
    created = info.get("created")
    try:
        when = datetime.fromisoformat(created) if isinstance(created, str) else None
    except ValueError:
        when = None
    return {"config": dict(info.get("config") or {}), "tags": list(info.get("tags") or []),
            "notes": info.get("notes"), "created": when, **{k: info.get(k) for k in AUTOMATIC}}


def _now() -> str:
    return datetime.now(timezone.utc).isoformat()


def _plain(value: Any, where: str) -> Any:
    if isinstance(value, Mapping):
        out = {}
        for k, v in value.items():
            if not isinstance(k, str) or not k:
                raise InputError(f"{where}: keys must be non-empty strings, got {k!r}")
            out[k] = _plain(v, f"{where}.{k}")
        return out
    if isinstance(value, np.ndarray):
        return _plain(value.tolist(), where)
    if isinstance(value, np.generic):
        return _plain(value.item(), where)
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]") for i, v in enumerate(value)]
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{where}: {value} has no JSON value; expected a finite number")
    if value is None or isinstance(value, (str, bool, int, float)):
        return value
    raise InputError(f"{where}: expected JSON values (strings, numbers, booleans, lists, dicts), got "
                     f"{type(value).__name__}")


def _difference(stored: Mapping[str, Any], given: Mapping[str, Any]) -> str:
    keys = sorted(k for k in set(stored) | set(given) if stored.get(k, _UNSET) != given.get(k, _UNSET))
    shown = [f"{k}: {json.dumps(stored.get(k)) if k in stored else '(none)'} → "
             f"{json.dumps(given.get(k)) if k in given else '(none)'}" for k in keys[:3]]
    return ", ".join(shown) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
