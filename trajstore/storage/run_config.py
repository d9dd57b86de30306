"""Run configs: what a run was — its hyperparameters and algorithm (``config``), ``tags``, ``notes``, when it was
first described, and the code that made it (trajstore's version, the git commit of the calling program's
repository, the host).

**Where they are kept.** Each change of a run's description is one row of the store's ``runs`` table
(:mod:`~trajstore.storage.runs_log`, ``<store>/runs/``, a Delta table beside ``steps/`` that every engine reads): one
small commit the size of the change, never every run's description at once. A store read at a version
(``store.at(version=N)``, ``as_of=``) reads the descriptions as they were while N was the latest version of ``steps``
(each row records that version). Deleting a run ends its description (a row that says so). Stores written before
(issue 31) kept each description as a property of the ``steps`` table (``trajstore.run.<run_id>``, a JSON object
``{"config", "tags", "notes", "created", "trajstore_version", "git_commit", "host"}``): those are still read, for every
run without a row (at a version, as that version's properties), and a run's next change moves it over as a row that
carries everything it held.

**What is taken.** A description is plain JSON: a config is an object whose keys are non-empty strings and whose
values are JSON values (numpy numbers and arrays, tuples taken as theirs): finite numbers, integers within 64 bits,
text UTF-8 can hold (no lone surrogates), nested at most :data:`MAX_DEPTH` levels and at most
:data:`MAX_CONFIG_BYTES` as JSON text; notes at most :data:`MAX_NOTES_BYTES`; at most :data:`MAX_TAGS` tags of at most
:data:`MAX_TAG_CHARS` characters. Anything else is an :class:`InputError` naming its path (``config.optimizer.lr:
…``) before anything is committed. Why these bounds: real configs (Hydra, gin, SB3 keyword arguments) nest fewer than
ten levels and take kilobytes, and 32 levels keep every reader (Python's ``json``, DuckDB's JSON, a browser) far from
its recursion limit (900 levels broke them); 1 MiB is the largest ``PATCH /runs/{run_id}`` body the service takes
(``run_max_body_bytes``), so one description fits one request; tags are labels to filter by, as long as a run id may
be (200, the service's bound).

**A description that breaks these rules** (another tool's row, a property written before they were checked) reads as
no config (no tags, no notes) with a ``problem`` naming the run and what is wrong; every other run reads as it is,
``trajstore check`` reports it, and ``set_run(run_id, config=…)`` (or deleting the run) repairs it.

In SQL the ``runs`` view has one row per run with steps: ``run_id, tags, notes, config`` (JSON: ``config->>'$.algo'``),
``created, trajstore_version, git_commit, host, problem``; ``by="config.<path>"`` groups episodes by a config value
(:func:`config_key`, :func:`group_value`: equal numbers are one group, ``1`` and ``1.0`` alike).
"""

from __future__ import annotations

import json
import math
import os
import socket
import subprocess
import sys
import sysconfig
import threading
from dataclasses import dataclass, field
from datetime import datetime, timezone
from pathlib import Path
from typing import Any, Callable, Iterable, Mapping, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore.__about__ import __version__
from trajstore.errors import InputError
from trajstore.storage.location import Location
from trajstore.storage.log import Log
from trajstore.storage.names import check_id
from trajstore.storage.runs_log import FOLDER, RunsLog
from trajstore.storage.runs_log import SCHEMA as ROWS

PREFIX = "trajstore.run."  # a description kept as a table property of ``steps`` (stores written before issue 47)
CONFIG = "config."  # the prefix of a ``by=`` name that is a config value (``config.optimizer.lr``)
AUTOMATIC = ("trajstore_version", "git_commit", "host")
FIELDS = ("config", "tags", "notes")  # what a caller gives
MAX_DEPTH = 32  # levels a config nests (the config itself is the first)
MAX_CONFIG_BYTES = 1 << 20  # a config's JSON text, UTF-8
MAX_NOTES_BYTES = 1 << 20
MAX_TAGS = 100
MAX_TAG_CHARS = 200
MAX_PROVENANCE_CHARS = 200
INT_MIN, INT_MAX = -(2**63), 2**64 - 1  # integers a config holds: what int64 and uint64 readers take
SCHEMA = pa.schema([("run_id", pa.string()), ("tags", pa.list_(pa.string())), ("notes", pa.string()),
                    ("config", pa.string()), ("created", pa.timestamp("us", tz="UTC")),
                    ("trajstore_version", pa.string()), ("git_commit", pa.string()), ("host", pa.string()),
                    ("problem", pa.string())])  # the rows of the ``runs`` view

Info = dict[str, Any]


# --- what is taken -----------------------------------------------------------------------------------------------

def given(*, config: Any = None, tags: Any = None, notes: Any = None) -> Info:
    """The fields of a change that are given (not None), each checked: :class:`InputError` naming the first bad value's
    path."""
    out: Info = {}
    if config is not None:
        out["config"] = check_config(config)
    if tags is not None:
        out["tags"] = check_tags(tags)
    if notes is not None:
        out["notes"] = check_notes(notes)
    return out


def check_config(config: Any) -> dict[str, Any]:
    """``config`` as plain JSON (numpy numbers and arrays, tuples turned into their JSON values), within the bounds of
    the module; anything else is an :class:`InputError` naming the value's path (``config.a.b``)."""
    if not isinstance(config, Mapping):
        raise InputError(f"config: expected a dict of names to values, got {type(config).__name__}")
    plain = _plain(config, "config", 0)
    size = len(dumps(plain).encode())
    if size > MAX_CONFIG_BYTES:
        raise InputError(f"config: {size} bytes as JSON text; a config takes at most {MAX_CONFIG_BYTES} bytes (1 MiB)")
    return plain


def check_tags(tags: Any) -> list[str]:
    """``tags`` as a list of distinct strings, in order; within the bounds of the module."""
    if isinstance(tags, str) or not isinstance(tags, Sequence) and not isinstance(tags, (set, frozenset)):
        raise InputError(f"tags: expected a list of strings, got {type(tags).__name__}")
    out = list(dict.fromkeys(tags))
    for i, tag in enumerate(out):
        if not isinstance(tag, str) or not tag:
            raise InputError(f"tags: expected non-empty strings, got {tag!r}")
        _text(tag, f"tags[{i}]")
        if len(tag) > MAX_TAG_CHARS:
            raise InputError(f"tags[{i}]: {len(tag)} characters; a tag has at most {MAX_TAG_CHARS}")
    if len(out) > MAX_TAGS:
        raise InputError(f"tags: {len(out)} tags; a run has at most {MAX_TAGS}")
    return out


def check_notes(notes: Any) -> str:
    if not isinstance(notes, str):
        raise InputError(f"notes: expected a string, got {type(notes).__name__}")
    size = len(_text(notes, "notes").encode())
    if size > MAX_NOTES_BYTES:
        raise InputError(f"notes: {size} bytes; notes take at most {MAX_NOTES_BYTES} bytes (1 MiB)")
    return notes


def check_provenance(provenance: Mapping[str, Any]) -> dict[str, str | None]:
    """What a program says of itself (a remote writer): :data:`AUTOMATIC`, each a short string or None."""
    unknown = sorted(set(provenance) - set(AUTOMATIC))
    if unknown:
        raise InputError(f"provenance: unknown field(s) {unknown}; expected some of {list(AUTOMATIC)}")
    out: dict[str, str | None] = {}
    for key in AUTOMATIC:
        value = provenance.get(key)
        if value is not None and (not isinstance(value, str) or len(value) > MAX_PROVENANCE_CHARS):
            raise InputError(f"provenance.{key}: expected a string of at most {MAX_PROVENANCE_CHARS} characters")
        out[key] = None if value is None else _text(value, f"provenance.{key}")
    return out


def dumps(config: Mapping[str, Any]) -> str:
    """A config's JSON text as it is stored."""
    return json.dumps(config, sort_keys=True, ensure_ascii=False, allow_nan=False)


def _plain(value: Any, where: str, depth: int) -> Any:
    if isinstance(value, (Mapping, list, tuple, np.ndarray)) and depth >= MAX_DEPTH:
        raise InputError(f"{where}: nested deeper than {MAX_DEPTH} levels; a config nests at most {MAX_DEPTH}")
    if isinstance(value, Mapping):
        return {_key(k, where): _plain(v, f"{where}.{k}", depth + 1) for k, v in value.items()}
    if isinstance(value, np.ndarray):
        return _plain(value.tolist(), where, depth)
    if isinstance(value, np.generic):
        return _plain(value.item(), where, depth)
    if isinstance(value, (list, tuple)):
        return [_plain(v, f"{where}[{i}]", depth + 1) for i, v in enumerate(value)]
    if isinstance(value, str):
        return _text(value, where)
    if isinstance(value, float) and not math.isfinite(value):
        raise InputError(f"{where}: {value} has no JSON value; expected a finite number")
    if isinstance(value, int) and not isinstance(value, bool) and not INT_MIN <= value <= INT_MAX:
        raise InputError(f"{where}: {value} is beyond 64 bits (no JSON reader holds it); give it as a string")
    if value is None or isinstance(value, (bool, int, float)):
        return value
    raise InputError(f"{where}: expected JSON values (strings, numbers, booleans, lists, dicts), got "
                     f"{type(value).__name__}")


def _key(key: Any, where: str) -> str:
    if not isinstance(key, str) or not key:
        raise InputError(f"{where}: keys must be non-empty strings, got {key!r}")
    return _text(key, f"{where}: the key")


def _text(value: str, where: str) -> str:
    """``value`` if UTF-8 can hold it, else an :class:`InputError` saying where it is not text."""
    try:
        value.encode()
    except UnicodeEncodeError as exc:
        raise InputError(f"{where}: not valid Unicode text (a lone surrogate {value[exc.start]!r} at character "
                         f"{exc.start}); expected text UTF-8 can hold") from None
    return value


# --- what is stored ----------------------------------------------------------------------------------------------

@dataclass
class Stored:
    """A run's description as stored: what can be used (``info``: ``config``, ``tags``, ``notes``, ``created`` and
    :data:`AUTOMATIC`), what cannot (``bad``: field -> why; left out of ``info``), and its row's ``revision`` (0: a
    table property of a store written before the ``runs`` table)."""

    info: Info
    bad: dict[str, str] = field(default_factory=dict)
    revision: int = 0

    def public(self, run_id: str) -> Info:
        """``info`` with ``problem``: what cannot be used, naming the run and how to repair it (None: nothing)."""
        problem = None
        if self.bad:
            fields = ", ".join(f"{name}=…" for name in self.bad)
            problem = (f"run {run_id!r}: its stored description cannot be used ({'; '.join(self.bad.values())}); "
                       f"replace it with set_run({run_id!r}, {fields}) or delete the run")
        return {**self.info, "config": dict(self.info["config"]), "tags": list(self.info["tags"]), "problem": problem}


def stored(raw: Mapping[str, Any], revision: int = 0) -> Stored:
    """A description as stored (a row's values or a property's JSON object; ``config`` an object or its JSON text),
    checked as a new one is."""
    info: Info = {"config": {}, "tags": [], "notes": None, "created": _when(raw.get("created")),
                  **{k: _short_text(raw.get(k)) for k in AUTOMATIC}}
    bad: dict[str, str] = {}
    for name, check in (("config", _stored_config), ("tags", check_tags), ("notes", check_notes)):
        if raw.get(name) is not None:
            try:
                info[name] = check(raw[name])
            except InputError as exc:
                bad[name] = str(exc)
    return Stored(info, bad, revision)


def undescribed() -> Info:
    """The description of a run never described: no config, tags or notes, nothing known of its program."""
    return Stored(stored({}).info).public("")


def _stored_config(value: Any) -> dict[str, Any]:
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except (ValueError, RecursionError) as exc:
            raise InputError(f"config: not JSON text ({str(exc)[:80] or type(exc).__name__})") from None
    return check_config(value)


def _short_text(value: Any) -> str | None:
    try:
        return _text(value, "") if isinstance(value, str) and len(value) <= MAX_PROVENANCE_CHARS else None
    except InputError:
        return None


def _when(value: Any) -> datetime | None:
    if isinstance(value, datetime):
        return value if value.tzinfo else value.replace(tzinfo=timezone.utc)
    try:
        return datetime.fromisoformat(value) if isinstance(value, str) else None
    except ValueError:
        return None


def from_properties(properties: Mapping[str, str], only: str | None = None) -> dict[str, Stored]:
    """The descriptions kept as table properties of ``steps`` (stores written before the ``runs`` table), of the run
    ``only`` or of all; a property that is not a JSON object is a description that cannot be used."""
    out = {}
    for key, raw in properties.items():
        run_id = key[len(PREFIX):]
        if not key.startswith(PREFIX) or only is not None and run_id != only:
            continue
        try:
            info = json.loads(raw)
        except (ValueError, RecursionError):
            info = None
        out[run_id] = stored(info) if isinstance(info, dict) else Stored(stored({}).info, {
            "config": "the table property holding it is not a JSON object"})
    return out


def latest_rows(rows: pa.Table, *, pinned: int | None = None, only: str | None = None) -> dict[str, dict[str, Any]]:
    """Each run's row with the highest revision (of the run ``only`` or of all), among the rows written while
    ``steps`` was at most at version ``pinned`` (every row without one)."""
    if only is not None:
        rows = rows.filter(pc.equal(rows["run_id"], only))
    out: dict[str, dict[str, Any]] = {}
    for row in rows.to_pylist():
        written_at = -1 if row["steps_version"] is None else row["steps_version"]
        if row["run_id"] is None or pinned is not None and written_at > pinned:
            continue
        kept = out.get(row["run_id"])
        if kept is None or (row["revision"] or 0) >= (kept["revision"] or 0):
            out[row["run_id"]] = row
    return out


def described(rows: pa.Table, properties: Mapping[str, str], *, pinned: int | None = None,
              only: str | None = None) -> dict[str, Stored]:
    """Every described run's description (of the run ``only`` or of all): its latest row (none for a deleted run),
    else its table property."""
    latest = latest_rows(rows, pinned=pinned, only=only)
    out = {r: s for r, s in from_properties(properties, only).items() if r not in latest}
    out.update({r: stored(row, row["revision"] or 0) for r, row in latest.items() if not row["deleted"]})
    return dict(sorted(out.items()))


# --- a change ----------------------------------------------------------------------------------------------------

def changed(run_id: str, before: Stored | None, change: Info, *, replace: bool,
            provenance: Mapping[str, Any] | None = None,
            program: Callable[[], Mapping[str, Any]] | None = None) -> Info | None:
    """The description of ``run_id`` after ``change`` (checked fields; see :meth:`Descriptions.change`), or None when
    it is what is stored. A run described the first time records ``created`` and :data:`AUTOMATIC` (``provenance``:
    a remote program's own; else ``program()``, by default :func:`automatic`) even when nothing is given."""
    if before is None:
        return {"config": {}, "tags": [], "notes": None, "created": datetime.now(timezone.utc),
                **(check_provenance(provenance) if provenance else (program or automatic)()), **change}
    if not change:
        return None
    _check_repaired(run_id, before, change, replace=replace)
    info = dict(before.info)
    if replace:
        info.update(change)
    else:
        if "config" in change and change["config"] != info["config"]:
            raise InputError(f"config: run {run_id!r} was recorded with another config "
                             f"({_difference(info['config'], change['config'])}); change it with store.set_run, or "
                             "write to another run_id")
        info["tags"] = check_tags([*info["tags"], *change.get("tags", [])])
        if info["notes"] is None and "notes" in change:
            info["notes"] = change["notes"]
    same = all(info[k] == before.info[k] and type(info[k]) is type(before.info[k]) for k in FIELDS)
    return None if same and not before.bad else info


def _check_repaired(run_id: str, before: Stored, change: Info, *, replace: bool) -> None:
    """A change to a description that cannot be used must replace what cannot be (``set_run``)."""
    left = [name for name in before.bad if not replace or name not in change]
    if left:
        raise InputError(f"{left[0]}: run {run_id!r} has a stored {left[0]} that cannot be used "
                         f"({before.bad[left[0]]}); replace it first with set_run({run_id!r}, {left[0]}=…)")


def rows_of(changes: Sequence[tuple[str, int, Info | None]], *, steps_version: int) -> pa.Table:
    """The rows of the ``runs`` table for ``changes`` (run id, revision, description; None: the run was deleted)."""
    now = datetime.now(timezone.utc)
    out = []
    for run_id, revision, info in changes:
        row = {"run_id": run_id, "revision": revision, "changed_at": now, "steps_version": steps_version,
               "deleted": info is None}
        if info is not None:
            row.update({k: info.get(k) for k in ("tags", "notes", "created", *AUTOMATIC)}, config=dumps(info["config"]))
        out.append(row)
    return pa.Table.from_pylist(out, schema=ROWS)


def revision(rows: pa.Table, run_id: str) -> int:
    """The highest revision of ``run_id``'s rows (0: none)."""
    found = latest_rows(rows, only=run_id).get(run_id)
    return 0 if found is None else int(found["revision"] or 0)


class Descriptions:
    """What describes each run of the store at ``location``, read at the version its ``steps`` log reads (``steps``:
    pinned, or the latest), and changed one row at a time in its ``runs`` table."""

    def __init__(self, location: Location, steps: Log) -> None:
        self.runs = RunsLog(location.child(FOLDER), rule=steps.retention)  # the same retention as steps
        self.steps = steps
        self._lock = threading.Lock()
        self._kept: tuple[tuple[int, int], dict[str, Stored]] | None = None

    def stored(self) -> dict[str, Stored]:
        """Every described run's description (run id -> :class:`Stored`), read once per version of both tables."""
        state = self.steps.read()
        properties = {} if state is None else {k: v for k, v in state.properties.items() if k.startswith(PREFIX)}
        version, rows = self.runs.rows()
        key = (version, _number(state) if properties else -1)  # a new version of steps alone changes nothing
        with self._lock:
            if self._kept is not None and self._kept[0] == key:
                return self._kept[1]
        found = described(rows, properties, pinned=self.steps.pinned)
        with self._lock:
            self._kept = (key, found)
        return found

    def infos(self) -> dict[str, Info]:
        """Every described run's description, as :meth:`Store.run_info <trajstore.store.Store.run_info>` gives it."""
        return {run_id: s.public(run_id) for run_id, s in self.stored().items()}

    def problems(self) -> list[str]:
        """What is wrong with each stored description that cannot be used, naming its run."""
        return [s.public(run_id)["problem"] for run_id, s in self.stored().items() if s.bad]

    def change(self, run_id: str, change: Info, *, replace: bool, what: str,
               provenance: Mapping[str, Any] | None = None) -> None:
        """Commit ``run_id``'s description after ``change`` (checked fields, see :func:`given`). ``replace``
        (``set_run``): each field given replaces the stored one. Otherwise (a writer opening the run): the run is
        described the first time (with ``created`` and :data:`AUTOMATIC`, also when nothing is given); later,
        ``tags`` are added to the stored ones, ``notes`` are kept where stored, and a ``config`` other than the
        stored one is an :class:`InputError` naming what differs. ``run_id`` is checked as every path that writes one
        checks it (:func:`~trajstore.storage.names.check_id`)."""
        self.steps.writable(what)
        check_id(run_id, field="run_id")
        asked: list[Mapping[str, Any]] = []

        def program() -> Mapping[str, Any]:
            """:func:`automatic`, asked once for all the tries of this change (it runs git twice)."""
            if not asked:
                asked.append(automatic())
            return asked[0]

        def plan(rows: pa.Table) -> pa.Table | None:
            state = self.steps.read()
            before = described(rows, {} if state is None else state.properties, only=run_id).get(run_id)
            info = changed(run_id, before, change, replace=replace, provenance=provenance, program=program)
            if info is None:
                return None
            return rows_of([(run_id, revision(rows, run_id) + 1, info)], steps_version=_number(state))

        self.runs.commit(plan, what=f"{what} of run {run_id!r}")

    def forget(self, run_ids: Iterable[str]) -> None:
        """End the descriptions of ``run_ids`` (deleted runs), in one commit; runs not described are passed over."""
        wanted = sorted(set(run_ids))

        def plan(rows: pa.Table) -> pa.Table | None:
            state = self.steps.read()
            live = [r for r in wanted if described(rows, {} if state is None else state.properties, only=r)]
            return rows_of([(r, revision(rows, r) + 1, None) for r in live],
                           steps_version=_number(state)) if live else None

        self.runs.commit(plan, what=f"the deletion of run(s) {wanted}")


def _number(state: Any) -> int:
    return -1 if state is None else int(state.number)


# --- the ``runs`` view and grouping by a config value ----------------------------------------------------------

def table(infos: Mapping[str, Info], run_ids: Iterable[str],
          groups: Mapping[str, tuple[str, ...]] | None = None) -> pa.Table:
    """The rows of the ``runs`` view of the runs ``run_ids`` (described or not), by id; with ``groups`` (a name ->
    config path), also a column per name holding each run's value there as text (:func:`group_value`)."""
    groups = groups or {}
    rows = []
    for run_id in sorted(set(run_ids)):
        info = infos.get(run_id) or undescribed()
        row = {"run_id": run_id, **{k: info[k] for k in SCHEMA.names if k not in ("run_id", "config")},
               "config": dumps(info["config"])}
        rows.append({**row, **{name: group_value(info["config"], path) for name, path in groups.items()}})
    schema = pa.schema(list(SCHEMA) + [pa.field(name, pa.string()) for name in groups])
    return pa.Table.from_pylist(rows, schema=schema)


def config_key(name: str) -> tuple[str, ...] | None:
    """The path (keys, outermost first) of a ``by=`` name ``config.a.b``, or None for a name that is not one."""
    if not name.startswith(CONFIG) or len(name) == len(CONFIG):
        return None
    parts = tuple(name[len(CONFIG):].split("."))
    if any(not p for p in parts):
        raise InputError(f"by: {name!r} is not a config path; expected config.<key>[.<key>…]")
    return parts


def group_value(config: Mapping[str, Any], path: Sequence[str]) -> str | None:
    """The value at ``path`` of ``config`` as the text episodes are grouped by (None where there is none): a string
    as it is, a number as its shortest exact text with whole numbers as integers (``1`` and ``1.0`` are one group,
    2**53 + 1 and 2**53 are two), ``true``/``false``, a list or object as its JSON text (numbers inside alike)."""
    value: Any = config
    for key in path:
        if not isinstance(value, Mapping) or key not in value:
            return None
        value = value[key]
    if value is None or isinstance(value, str):
        return value
    return json.dumps(_canonical(value), sort_keys=True, separators=(",", ":"), ensure_ascii=False)


def _canonical(value: Any) -> Any:
    if isinstance(value, float) and value.is_integer():
        return int(value)
    if isinstance(value, Mapping):
        return {k: _canonical(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_canonical(v) for v in value]
    return value


# --- the program that describes a run ----------------------------------------------------------------------------

def automatic() -> dict[str, str | None]:
    """What is recorded about the code that describes a run: trajstore's version, the git commit of the calling
    program's repository (see :func:`program_folder`; with ``+dirty`` when files tracked there have changes; None
    outside a repository or without git), and the host."""
    return {"trajstore_version": __version__, "git_commit": git_commit(program_folder()),
            "host": socket.gethostname()}


def git_commit(folder: Path) -> str | None:
    """The commit checked out in the git repository holding ``folder`` (``+dirty`` when tracked files changed), or
    None (no repository, no commit yet, no git). One ``git status --porcelain=v2 --branch``: its ``# branch.oid``
    header is the commit, any other line a change."""
    try:
        status = subprocess.run(["git", "-C", str(folder), "status", "--porcelain=v2", "--branch",
                                 "--untracked-files=no"], capture_output=True, text=True, timeout=5)
    except (OSError, subprocess.SubprocessError):
        return None
    if status.returncode != 0:
        return None
    lines = status.stdout.splitlines()
    head = next((line.split()[2] for line in lines if line.startswith("# branch.oid ")), None)
    if head is None or head == "(initial)":
        return None
    return head + ("+dirty" if any(not line.startswith("#") for line in lines) else "")


def program_folder(main: str | None = None, *, installed: Callable[[Path], bool] | None = None) -> Path:
    """The folder of the program that describes a run: its script's (``main``, default ``__main__``'s file), or the
    working directory when there is none or the script is not the user's own — an installed command (``trajstore``,
    ``pytest``, ``ray``: a file of this Python environment) or trajstore itself (``python -m trajstore.cli``)."""
    main = main if main is not None else getattr(sys.modules.get("__main__"), "__file__", None)
    if not main:
        return Path(os.getcwd())
    script = Path(main).resolve()
    return Path(os.getcwd()) if (installed or _installed)(script) else script.parent


def _installed(script: Path) -> bool:
    """Whether ``script`` is trajstore's own or a file Python installed (a command, a package, the standard
    library: of this environment or the user's)."""
    if script.is_relative_to(Path(__file__).resolve().parents[1]):
        return True
    folders = set()
    for scheme in {sysconfig.get_default_scheme(), sysconfig.get_preferred_scheme("user")}:
        paths = sysconfig.get_paths(scheme)
        folders |= {paths[k] for k in ("scripts", "purelib", "platlib", "stdlib") if k in paths}
    return any(script.is_relative_to(Path(f).resolve()) for f in folders)


def _difference(stored: Mapping[str, Any], given: Mapping[str, Any]) -> str:
    unset = object()
    keys = sorted(k for k in set(stored) | set(given) if stored.get(k, unset) != given.get(k, unset))
    shown = [f"{k}: {json.dumps(stored.get(k)) if k in stored else '(none)'} → "
             f"{json.dumps(given.get(k)) if k in given else '(none)'}" for k in keys[:3]]
    return ", ".join(shown) + (f" and {len(keys) - 3} more" if len(keys) > 3 else "")
