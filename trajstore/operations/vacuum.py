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

from dataclasses import dataclass, field
from datetime import datetime, timedelta, timezone
from typing import TYPE_CHECKING

import pyarrow.fs as pafs

from trajstore.durations import seconds, text
from trajstore.loaders.layout_store import Horizon, LayoutStore, remove_empty_folders, unneeded
from trajstore.operations.check import removable_orphans
from trajstore.storage.log import display

if TYPE_CHECKING:
    from trajstore.query.engine import Engine

UNCOMMITTED_GRACE_S = 3600.0  # a file no commit lists stays at least this long: a writer may be about to commit it


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
               f"{text(self.older_than_s)}"
        return "\n".join([head] + [f"  {f}" for f in self.files] if self.dry_run else [head])

    __str__ = format


def parse_duration(value: float | str | timedelta) -> float:
    """Seconds of ``older_than``: a number of seconds, a timedelta, or a duration like ``"7d"``, ``"12h"``,
    ``"30m"`` (:mod:`trajstore.durations`); not negative."""
    return seconds(value, "older_than")


def vacuum(engine: Engine, layouts: LayoutStore, *, older_than: float | str | timedelta = "7d",
           dry_run: bool = False) -> VacuumReport:
    """Delete (or list, with ``dry_run``) the files no version committed within ``older_than`` needs, and the
    loader layouts (kept by ``layouts``) no retained version needs, and the files of the ``priorities`` and
    ``runs`` tables none of their versions of that time lists; then what the caches keep of data files no longer
    there (:mod:`~trajstore.storage.cache`: array copies, summaries, an ``s3://`` store's copies on this machine)."""
    engine.table.log.writable("vacuum")
    horizon = parse_duration(older_than)
    paths = removable_orphans(engine, removed_before_s=horizon,
                              written_before_s=max(horizon, UNCOMMITTED_GRACE_S))
    fs = engine.table.fs
    report = VacuumReport(older_than_s=horizon, dry_run=dry_run)
    for info in fs.get_file_info(paths) if paths else []:
        _remove(fs, info, report)
    stale = unneeded(engine.location, _horizon(engine, horizon), grace_s=max(horizon, UNCOMMITTED_GRACE_S))
    for info in stale:
        _remove(engine.location.fs, info, report)
    # the priorities and runs tables' files merged or rewritten away (kept an hour at least: a learner's or a
    # description's file is written just before the commit that lists it)
    for table in (engine.priorities, engine.descriptions.runs):
        gone = table.unneeded(max(horizon, UNCOMMITTED_GRACE_S))
        for info in engine.location.fs.get_file_info(gone) if gone else []:
            _remove(engine.location.fs, info, report)
    if not dry_run:
        remove_empty_folders(engine.location, stale)
        layouts.opened.clear()  # layouts this store keeps open may be gone
        layouts.prune_copies()  # this machine's copies of removed s3:// layouts
        engine.table.prune_caches()  # what the caches keep of the files removed (now, or before)
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


def _horizon(engine: Engine, older_than_s: float) -> Horizon | None:
    """The version that was current ``older_than_s`` ago (the oldest a vacuum keeps) and its files; None when
    the store has no version that old (every version is kept)."""
    log = engine.table.log
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
    return Horizon(number, [(engine.table.location.relative(f.path), f.run_id, f.env_id) for f in version.files])
