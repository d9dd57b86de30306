"""Retention: delete the files that no version committed within a horizon needs.

A delete or a compaction removes files from the log, not from the folder: readers of older versions
(``trajstore.open(uri, version=N)``) still read them. :func:`vacuum` deletes a removed file once the commit that
removed it is older than the horizon (``older_than``), so every version that was current at any time since then
keeps all its files; and files no commit ever listed (a killed writer's, a failed compaction's) once they are
older than the horizon and at least :data:`UNCOMMITTED_GRACE_S`, since a live writer commits its file just after
writing it. It builds on :func:`~trajstore.operations.check.removable_orphans`, the same selection
``trajstore check --remove-orphans`` uses. Files are deleted one by one: a vacuum killed midway leaves a store
every retained version of which still reads, with some files left for the next vacuum.
"""

from __future__ import annotations

import re
from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from trajstore.errors import InputError
from trajstore.loaders.map_store import Horizon, remove_empty_folders, unneeded
from trajstore.operations.check import removable_orphans
from trajstore.storage.log import display

if TYPE_CHECKING:
    from trajstore.store import Store

UNCOMMITTED_GRACE_S = 3600.0  # a file no commit lists stays at least this long: a writer may be about to commit it
UNITS = {"s": 1, "m": 60, "h": 3600, "d": 86400, "w": 7 * 86400}
DURATION = re.compile(r"^\s*(\d+(?:\.\d*)?)\s*([smhdw])\s*$")


@dataclass
class VacuumReport:
    """The files :func:`vacuum` deleted (or, with ``dry_run``, would delete), and their bytes."""

    files: list[str] = field(default_factory=list)
    bytes: int = 0
    older_than_s: float = 0.0
    dry_run: bool = False

    def format(self) -> str:
        verb = "would delete" if self.dry_run else "deleted"
        head = f"{verb} {len(self.files)} file(s), {self.bytes:,} bytes, not needed by any version of the last " \
               f"{format_duration(self.older_than_s)}"
        return "\n".join([head] + [f"  {f}" for f in self.files] if self.dry_run else [head])

    __str__ = format


def parse_duration(value: float | str | timedelta) -> float:
    """Seconds from a number of seconds, a timedelta, or text like ``"7d"``, ``"12h"``, ``"30m"``, ``"90s"``."""
    if isinstance(value, timedelta):
        seconds = value.total_seconds()
    elif isinstance(value, str):
        m = DURATION.match(value)
        if not m:
            raise InputError(f"older_than: expected a duration like 7d, 12h, 30m or 90s, got {value!r}")
        seconds = float(m.group(1)) * UNITS[m.group(2)]
    elif isinstance(value, (int, float)) and not isinstance(value, bool):
        seconds = float(value)
    else:
        raise InputError(f"older_than: expected seconds, a timedelta or a duration like 7d, got {value!r}")
    if seconds < 0:
        raise InputError(f"older_than: must not be negative, got {value!r}")
    return seconds


def vacuum(store: Store, *, older_than: float | str | timedelta = "7d", dry_run: bool = False) -> VacuumReport:
    """Delete (or list, with ``dry_run``) the files no version committed within ``older_than`` needs."""
    store.table.log.writable("vacuum")
    horizon = parse_duration(older_than)
    paths = removable_orphans(store, removed_before_s=horizon,
                              written_before_s=max(horizon, UNCOMMITTED_GRACE_S))
    fs = store.table.fs
    report = VacuumReport(older_than_s=horizon, dry_run=dry_run)
    for path, info in zip(paths, fs.get_file_info(paths) if paths else []):
        _remove(fs, info, report)
    layouts = unneeded(store.location, _horizon(store, horizon), grace_s=max(horizon, UNCOMMITTED_GRACE_S))
    for info in layouts:
        _remove(store.location.fs, info, report)
    if not dry_run:
        remove_empty_folders(store.location, layouts)
        store.layouts.opened.clear()  # layouts this store keeps open may be gone
        store.layouts.prune_copies()  # this machine's copies of removed s3:// layouts
    return report


def _remove(fs: pafs.FileSystem, info: pafs.FileInfo, report: VacuumReport) -> None:
    """Delete one file (unless the report is a dry run) and count it."""
    if not report.dry_run:
        try:
            fs.delete_file(info.path)
        except FileNotFoundError:  # another vacuum got there first
            return
    report.files.append(display(info.path, fs))
    report.bytes += max(int(info.size or 0), 0)


def _horizon(store: Store, older_than_s: float) -> Horizon | None:
    """The version that was current ``older_than_s`` ago (the oldest a vacuum keeps) and its files; None when
    the store has no version that old (every version is kept)."""
    log = store.table.log
    number = log.latest_number()
    if number < 0:
        return None
    if older_than_s > 0:
        try:
            number = log.number_at(datetime.now(timezone.utc) - timedelta(seconds=older_than_s))
        except Exception:  # noqa: BLE001 - deltalake's error for a time before the first version
            return None
    version = log.read(number)
    if version is None:
        return None
    return Horizon(number, [(store.table.location.relative(f.path), f.run_id, f.env_id) for f in version.files])


def format_duration(seconds: float) -> str:
    """``seconds`` as :func:`parse_duration` reads it back, in days, hours, minutes or seconds (7d, not 1w)."""
    for unit in ("d", "h", "m"):
        if seconds >= UNITS[unit] and seconds % UNITS[unit] == 0:
            return f"{int(seconds // UNITS[unit])}{unit}"
    return f"{seconds:g}s"
