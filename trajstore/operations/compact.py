"""Compaction, the one implementation: a partition's files merged into a few large ones, in one commit. ``trajstore
compact`` (:func:`compact`), the writers' upkeep and the service's (:mod:`~trajstore.operations.upkeep`, its small files
only) all call :func:`compact_partition`.

Runs that flush often (a trainer that flushes every iteration, remote workers' 16 MiB commits) leave
thousands of small files, and every query pays for each one (its footer, its scan set-up).
:func:`compact_partition` reads the committed files it is given, of one ``(run_id, env_id)`` partition, in the
order they were written, and writes them again as files of about ``target_bytes``, with the writer's Parquet
settings and the stored types (fixed-size observation columns stay fixed-size); then one commit
(:meth:`Log.swap <trajstore.storage.log.Log.swap>`) removes exactly the files read and adds the new ones.
Files written in an older encoding are rewritten in the current one, alone too (:func:`upgraded`: the same stored
values, under the names that say what they hold, declared in the log): ``trajstore compact`` upgrades an old store.
Only files of one format (:mod:`~trajstore.storage.encoding`) are joined (:func:`merged`), their rows ordered by
``(episode_id, step)``: each episode is contiguous in the new file, and an encoded row still has the neighbour it
decodes from (a null ``next_obs`` or a one-frame row always follows its episode's previous step in its file, and
an episode's rows from a later file start with an anchor and a stored ``next_obs`` ends its rows in each file).

Appends that land in the partition meanwhile stay (the commit is rebased onto them). A change that removed some
of the files first (another compaction, a delete, an ``add_column``) makes the commit fail: nothing is committed,
the new files are cleaned up by :meth:`~trajstore.storage.table.StepsTable.discard`'s rule (only once the log says
the commit did not land, see :mod:`~trajstore.storage.landing`) and the partition is skipped. The old files stay
on disk for readers that listed them before the commit; ``trajstore vacuum`` (or ``check --remove-orphans``)
deletes them once they were removed long enough ago.
"""

from __future__ import annotations

import logging
import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from trajstore import progress_bar
from trajstore.errors import CommitError, InputError
from trajstore.query.filters import check_runs
from trajstore.storage.encoding import CURRENT, FileEncoding, logical_schema
from trajstore.storage.log import DataFile, TableState, WrittenFile
from trajstore.storage.names import stored_rows
from trajstore.storage.table import StepsTable

if TYPE_CHECKING:
    from trajstore.query.engine import Engine

log = logging.getLogger(__name__)

TARGET_BYTES = 128 * 1024 * 1024


@dataclass
class CompactReport:
    """What :func:`compact` did: partitions rewritten, their files before and after, and the ones skipped."""

    partitions: int = 0
    files_before: int = 0
    files_after: int = 0
    skipped: list[str] = field(default_factory=list)

    def format(self) -> str:
        line = (f"compacted {self.partitions} partition(s): {self.files_before} files into {self.files_after}"
                if self.partitions else "nothing to compact")
        return "\n".join([line] + [f"  skipped {s}" for s in self.skipped])

    __str__ = format


def compact(engine: Engine, *, run_id: str | Sequence[str] | None = None, env_id: str | Sequence[str] | None = None,
            target_bytes: int = TARGET_BYTES, progress: bool = True) -> CompactReport:
    """Rewrite the partitions (of ``run_id``/``env_id``, or all) whose files could be fewer, or that hold files of
    an older encoding (rewritten in the current one: names that say what they hold, declared in the log)."""
    engine.table.log.writable("compact")
    if target_bytes < 1:
        raise InputError(f"target_bytes: must be a positive number of bytes, got {target_bytes}")
    runs = {run_id} if isinstance(run_id, str) else set(run_id or ())
    envs = {env_id} if isinstance(env_id, str) else set(env_id or ())
    partitions: dict[tuple[str, str], list[DataFile]] = {}
    files = engine.files()
    check_runs([run_id], (f.run_id for f in files), engine.uri)
    for f in files:
        if (not runs or f.run_id in runs) and (not envs or f.env_id in envs):
            partitions.setdefault((f.run_id, f.env_id), []).append(f)
    older = {f.path for f, stored in zip(files, engine.file_schemas(files)) if _older(stored.format)}
    todo = sorted(key for key, files in partitions.items()
                  if len(files) > max(1, math.ceil(sum(f.size for f in files) / target_bytes))
                  or any(f.path in older for f in files))  # files of an older encoding are rewritten in the current
    report = CompactReport()
    with progress_bar.bar(total=len(todo), desc="compact", unit="partition", enabled=progress) as bar:
        for run, env in todo:
            _compact_partition(engine, run, env, target_bytes, report)
            bar.update(1)
    return report


def _compact_partition(engine: Engine, run_id: str, env_id: str, target_bytes: int, report: CompactReport) -> None:
    state = engine.table.log.read()  # the files of one version, which the commit removes
    files = [] if state is None else state.partition(run_id, env_id)
    if state is None or not files:
        return
    try:
        done = compact_partition(engine.table, state, files, target_bytes=target_bytes)
    except CommitError as exc:
        report.skipped.append(f"run_id={run_id}/env_id={env_id}: {exc}")
        return
    if done.files_removed:  # the partition's files before and after (a lone file of its format stays as it is)
        report.partitions += 1
        report.files_before += len(files)
        report.files_after += len(files) - done.files_removed + done.files_added


@dataclass(frozen=True)
class Compaction:
    """What one :func:`compact_partition` committed: the partition, the files it removed and added, the version."""

    run_id: str
    env_id: str
    files_removed: int
    files_added: int
    version: int | None = None


def compact_partition(table: StepsTable, state: TableState, files: Sequence[DataFile], *, target_bytes: int,
                      auto: bool = False) -> Compaction:
    """Merge ``files`` (committed files of one partition in the table ``state``): the consecutive files of each format
    in groups of about ``target_bytes``, one new file per group of two or more, in one commit removing exactly the
    files read (``auto``: recorded as upkeep's in the commit). Raises :class:`CommitError` when another change
    removed some of them first: nothing was committed."""
    run_id, env_id = files[0].run_id, files[0].env_id
    formats = {f.path: stored.format for f, stored in zip(files, table.schemas(files))}
    groups = [g for g in _groups(sorted(files, key=lambda f: (f.modified_ms, f.path)), target_bytes,
                                 {p: fmt.key() for p, fmt in formats.items()})
              if len(g) > 1 or _older(formats[g[0].path])]
    if not groups:
        return Compaction(run_id, env_id, 0, 0)
    written: list[WrittenFile] = []
    try:
        for group in groups:
            data = merged(group)
            if _older(formats[group[0].path]):
                data = upgraded(table, data, formats[group[0].path])
            written.append(table.write(data, run_id=run_id, env_id=env_id))
        number = table.log.swap(state, [f for g in groups for f in g], written,
                                metadata={"operation": "compact", **({"auto": True} if auto else {})})
    except BaseException as exc:
        table.discard([w.path for w in written], exc)  # only what the log says did not land
        raise
    log.info("compacted run_id=%s/env_id=%s: %d files into %d (version %s)", run_id, env_id,
             sum(map(len, groups)), len(written), number)
    return Compaction(run_id, env_id, sum(map(len, groups)), len(written), number)


def merged(files: Sequence[DataFile]) -> pa.Table:
    """The rows of ``files`` (all of one format) as one table ordered by ``(episode_id, step)``, with their format's
    metadata: what one compacted file holds."""
    # ParquetFile, not read_table: no partition columns inferred from the path
    tables = [pq.ParquetFile(f.path, filesystem=f.fs).read() for f in files]
    metadata = tables[0].schema.metadata
    data = pa.concat_tables(tables, promote_options="default").replace_schema_metadata(metadata)
    order = pc.sort_indices(data, sort_keys=[("episode_id", "ascending"), ("step", "ascending")])
    return data.take(order)


def _older(fmt: FileEncoding) -> bool:
    """Whether a file of trajstore's own is in an encoding older than the current one (then rewritten, alone too)."""
    return not fmt.foreign and fmt.encoding < CURRENT


def upgraded(table: StepsTable, data: pa.Table, fmt: FileEncoding) -> pa.Table:
    """Rows of a file in an older encoding (``fmt``; physical names, its footer) in the current one: the same
    stored values under the names that say what they hold, declared in the log (encodings 1 and 2 store them
    alike; encoding 1 has no sparse rows and no frames)."""
    names = fmt.logical_names()
    rows = data.rename_columns([names.get(n, n) for n in data.column_names]).replace_schema_metadata(None)
    logical = logical_schema(data.schema.remove_metadata(), fmt)
    return stored_rows(rows, fmt, {f.name: f.type for f in logical}, table.reserve)


def _groups(files: list[DataFile], target_bytes: int, formats: dict[str, str]) -> Iterator[list[DataFile]]:
    """Consecutive files of each format in groups of about ``target_bytes`` (one new file each)."""
    for key in dict.fromkeys(formats[f.path] for f in files):
        group: list[DataFile] = []
        size = 0
        for f in (f for f in files if formats[f.path] == key):
            if group and size + f.size > target_bytes:
                yield group
                group, size = [], 0
            group.append(f)
            size += f.size
        if group:
            yield group
