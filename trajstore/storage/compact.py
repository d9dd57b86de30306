"""Compaction: a partition's many small files rewritten as a few large ones, in one commit.

Runs that flush often (a trainer that flushes every iteration, remote workers' 16 MiB commits) leave
thousands of small files, and every query pays for each one (its footer, its scan set-up).
:func:`compact` rewrites each ``(run_id, env_id)`` partition that would end up with fewer files: its
files are read in the order they were written and written again as files of about ``target_bytes``,
with the writer's Parquet settings and the stored types (fixed-size observation columns stay
fixed-size), then committed in one Delta transaction that removes exactly the files that were read.
Only files of one format (:mod:`~trajstore.storage.encoding`) are joined, as they are: an encoded file's rows
decode from the rows around them in that file, and whole files concatenated keep every such neighbour.

Appends that land in the partition meanwhile stay. A concurrent compaction of the same partition makes
the later commit fail, and that partition is left as it was (its new files deleted). The old files stay
on disk for readers that listed them before the commit; ``trajstore check --remove-orphans`` deletes
them once they were removed long enough ago.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Iterator, Sequence

import pyarrow as pa
import pyarrow.parquet as pq

from trajstore.errors import CommitError, InputError, RunNotFoundError
from trajstore.storage.table import DataFile, WrittenFile

if TYPE_CHECKING:
    from trajstore.store import Store

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


def compact(store: Store, *, run_id: str | Sequence[str] | None = None, env_id: str | Sequence[str] | None = None,
            target_bytes: int = TARGET_BYTES, progress: bool = True) -> CompactReport:
    """Rewrite the partitions (of ``run_id``/``env_id``, or all) whose files could be fewer."""
    store.table.writable("compact")
    if target_bytes < 1:
        raise InputError(f"target_bytes: must be a positive number of bytes, got {target_bytes}")
    runs = {run_id} if isinstance(run_id, str) else set(run_id or ())
    envs = {env_id} if isinstance(env_id, str) else set(env_id or ())
    partitions: dict[tuple[str, str], list[DataFile]] = {}
    files = store.files()
    held = sorted({f.run_id for f in files})
    missing = sorted(runs - set(held))
    if missing:
        raise RunNotFoundError.naming(missing, store.uri, held)
    for f in files:
        if (not runs or f.run_id in runs) and (not envs or f.env_id in envs):
            partitions.setdefault((f.run_id, f.env_id), []).append(f)
    todo = sorted(key for key, files in partitions.items()
                  if len(files) > max(1, math.ceil(sum(f.size for f in files) / target_bytes)))
    report = CompactReport()
    from tqdm.auto import tqdm

    with tqdm(total=len(todo), desc="compact", unit="partition", disable=not progress, dynamic_ncols=True) as bar:
        for run, env in todo:
            _compact_partition(store, run, env, target_bytes, report)
            bar.update(1)
    return report


def _compact_partition(store: Store, run_id: str, env_id: str, target_bytes: int, report: CompactReport) -> None:
    dt, files = store.table.partition_files(run_id, env_id)  # the files of one version, which the commit removes
    if dt is None or len(files) < 2:
        return
    written: list[WrittenFile] = []
    try:
        for group in _groups(sorted(files, key=lambda f: (f.modified_ms, f.path)), target_bytes,
                             _formats(store, files)):
            # ParquetFile, not read_table: no partition columns inferred from the path
            tables = [pq.ParquetFile(f.path, filesystem=f.fs).read() for f in group]
            metadata = tables[0].schema.metadata
            data = pa.concat_tables(tables, promote_options="default").replace_schema_metadata(metadata)
            written.append(store.table.write(data, run_id=run_id, env_id=env_id))
        store.table.replace(dt, written, run_id=run_id, env_id=env_id)
    except BaseException as exc:
        store.table.discard([w.path for w in written], exc)
        if not isinstance(exc, CommitError):
            raise
        report.skipped.append(f"run_id={run_id}/env_id={env_id}: {exc}")
        return
    report.partitions += 1
    report.files_before += len(files)
    report.files_after += len(written)


def _formats(store: Store, files: list[DataFile]) -> dict[str, str]:
    """Each file's format, as a key (files of one format are joined)."""
    return {f.path: layout.format.key() for f, layout in zip(files, store.table.layouts(files))}


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
