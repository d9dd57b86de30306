"""Steps read straight from the committed Parquet files: the rows of ``SELECT … FROM steps`` as a stream
of record batches, at the speed of a direct pyarrow read.

Streaming for training reads every selected step once and in storage order; a SQL engine adds nothing
there but its own cost. :func:`steps_dataset` is a pyarrow dataset over exactly the files of one
committed version (never a listing of the folder), with ``run_id`` and ``env_id`` taken from each file's
partition, every column cast to the type the ``steps`` view gives it (so both paths yield identical
tables), and columns a file lacks filled with nulls; :func:`scan_steps` streams it, and a
:class:`~trajstore.query.snapshot.Snapshot` given a schema lets DuckDB read it instead of the files. Files are read in the order the log lists them (the
order of the ``steps`` view), two ahead, their row groups decoded on Arrow's thread pool; memory is bounded
by the read-ahead, not by the result.
"""

from __future__ import annotations

from typing import Sequence

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from trajstore.storage.table import DataFile

FRAGMENT_READAHEAD = 2  # files read ahead of the one being sent
BATCH_READAHEAD = 4  # record batches decoded ahead, per file


def scan_steps(files: Sequence[DataFile], schema: pa.Schema, columns: Sequence[str], *,
               episode_ids: np.ndarray | None = None, batch_size: int = 65_536,
               max_batch_bytes: int | None = None) -> pa.RecordBatchReader:
    """``columns`` of the steps in ``files`` (in order), typed as in ``schema`` (the ``steps`` view's).

    With ``episode_ids``, only the steps of those episodes: files whose logged id range holds none of
    them are skipped, row groups by their statistics, and the remaining rows filtered. With
    ``max_batch_bytes``, batches hold fewer than ``batch_size`` rows when rows are wide (image
    observations), so that one batch stays near that size.
    """
    out = pa.schema([schema.field(c) for c in columns])
    if episode_ids is not None:
        episode_ids = np.unique(np.asarray(episode_ids, dtype=np.int64))
        files = files_holding(files, episode_ids)
    if not files:
        return pa.RecordBatchReader.from_batches(out, iter(()))
    if max_batch_bytes is not None:
        batch_size = max(1, min(batch_size, int(max_batch_bytes // max(1.0, row_bytes(files, columns)))))
    dataset = steps_dataset(files, schema)
    condition = ds.field("episode_id").isin(pa.array(episode_ids)) if episode_ids is not None else None
    return dataset.scanner(columns=list(columns), filter=condition, batch_size=batch_size, use_threads=True,
                           fragment_readahead=FRAGMENT_READAHEAD, batch_readahead=BATCH_READAHEAD).to_reader()


def steps_dataset(files: Sequence[DataFile], schema: pa.Schema) -> ds.FileSystemDataset:
    """A pyarrow dataset over exactly ``files`` (in order; never a listing of their folder), typed as ``schema``
    (the ``steps`` view's types): ``run_id`` and ``env_id`` from each file's partition, every column cast to
    its type in ``schema``, columns a file lacks as nulls."""
    partitions = [(ds.field("run_id") == f.run_id) & (ds.field("env_id") == f.env_id) for f in files]
    filesystem = files[0].fs if files else pafs.LocalFileSystem()  # one table's files share its filesystem
    return ds.FileSystemDataset.from_paths([f.path for f in files], schema=schema, format=ds.ParquetFileFormat(),
                                           filesystem=filesystem, partitions=partitions)


def row_bytes(files: Sequence[DataFile], columns: Sequence[str]) -> float:
    """The widest decoded row of ``columns`` among the environments of ``files``, in bytes, from the Parquet
    footer of one file per ``env_id`` (the writer keeps an environment's types alike in every run)."""
    import pyarrow.parquet as pq

    first = {f.env_id: f for f in reversed(files)}.values()
    widest = 0.0
    for f in first:
        meta = pq.read_metadata(f.path, filesystem=f.fs)
        if not meta.num_rows:
            continue
        size = sum(meta.row_group(g).column(c).total_uncompressed_size
                   for g in range(meta.num_row_groups) for c in range(meta.num_columns)
                   if meta.row_group(g).column(c).path_in_schema.split(".")[0] in columns)
        widest = max(widest, size / meta.num_rows)
    return widest


def files_holding(files: Sequence[DataFile], episode_ids: np.ndarray) -> list[DataFile]:
    """The files of ``files`` that may hold steps of one of the sorted unique ``episode_ids``, judged by the
    episode_id range the log records for each file (a file without one may hold any)."""
    return [f for f in files if _may_hold(f, episode_ids)]


def _may_hold(f: DataFile, ids: np.ndarray) -> bool:
    """Whether ``f``'s logged episode_id range contains one of the sorted ``ids`` (true when not logged)."""
    if f.min_episode_id is None or f.max_episode_id is None:
        return True
    i = int(np.searchsorted(ids, f.min_episode_id))
    return i < len(ids) and ids[i] <= f.max_episode_id
