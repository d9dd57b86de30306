"""Steps read straight from the committed Parquet files: the rows of ``SELECT … FROM steps`` as a stream
of record batches, at the speed of a direct pyarrow read, in the types the files store.

Streaming for training reads every selected step once and in storage order; a SQL engine adds nothing
there but its own cost. :func:`steps_dataset` is a pyarrow dataset over exactly some files of one
committed version (never a listing of the folder), with ``run_id`` and ``env_id`` taken from each file's
partition, every column cast to one type, and columns a file lacks filled with nulls. :func:`scan_steps`
reads the files group by group (:mod:`~trajstore.query.groups`: files stored alike), one dataset each, decodes
each file's batches (:mod:`~trajstore.storage.encoding`) and gives them their logical names; a
:class:`~trajstore.query.snapshot.Snapshot` registers the same datasets to let DuckDB read them instead of the
files. Files are read two ahead, their row groups decoded on Arrow's thread pool; memory is bounded by the
read-ahead, not by the result.
"""

from __future__ import annotations

from typing import Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.fs as pafs

from trajstore.errors import StoreDamagedError
from trajstore.schema import PARTITION_COLUMNS
from trajstore.query.groups import FileGroup, group_files
from trajstore.storage.encoding import NEXT, OBS, EncodingError, FileDecoder, FileLayout
from trajstore.storage.log import DataFile

FRAGMENT_READAHEAD = 2  # files read ahead of the one being sent
BATCH_READAHEAD = 4  # record batches decoded ahead, per file
KEYS = ("episode_id", "step")


def scan_steps(files: Sequence[DataFile], schema: pa.Schema, columns: Sequence[str], *,
               episode_ids: np.ndarray | None = None, batch_size: int = 65_536,
               max_batch_bytes: int | None = None,
               layouts: Sequence[FileLayout] | None = None) -> pa.RecordBatchReader:
    """``columns`` of the steps in ``files``, typed as in ``schema`` (what :func:`~trajstore.query.groups.step_types`
    gives), decoded (see :mod:`~trajstore.storage.encoding`), under their logical names.

    Files are read group by group (:func:`~trajstore.query.groups.group_files`; ``layouts`` are the files' own,
    read from their footers when not given), each group's files in order. With ``episode_ids``, only the steps
    of those episodes: files whose logged id range holds none of them are skipped, row groups by their
    statistics, and the remaining rows filtered (whole episodes, so decoding within a file still works). With
    ``max_batch_bytes``, batches hold fewer than ``batch_size`` rows when decoded rows are wide (image
    observations), so that one batch stays near that size.
    """
    out = pa.schema([schema.field(c) for c in columns])
    if episode_ids is not None:
        episode_ids = np.unique(np.asarray(episode_ids, dtype=np.int64))
        keep = [i for i, f in enumerate(files) if _may_hold(f, episode_ids)]
        files = [files[i] for i in keep]
        layouts = None if layouts is None else [layouts[i] for i in keep]
    if not files:
        return pa.RecordBatchReader.from_batches(out, iter(()))
    layouts = list(layouts) if layouts is not None else [file_layout(f) for f in files]
    if max_batch_bytes is not None:
        batch_size = max(1, min(batch_size, int(max_batch_bytes // max(1.0, decoded_row_bytes(files, out, layouts)))))
    groups = group_files(files, layouts)
    batches = (b for g in groups for b in _group_batches(g, out, episode_ids, batch_size))
    return pa.RecordBatchReader.from_batches(out, batches)


def file_layout(f: DataFile) -> FileLayout:
    """The layout of one committed file, from its footer."""
    import pyarrow.parquet as pq

    try:
        return FileLayout.of(pq.read_schema(f.path, filesystem=f.fs), where=f.uri)
    except EncodingError as exc:
        raise StoreDamagedError.of_file(f.uri, f"has an unreadable format ({exc})", None) from exc


def _group_batches(group: FileGroup, out: pa.Schema, episode_ids: np.ndarray | None,
                   batch_size: int) -> Iterator[pa.RecordBatch]:
    """The batches of one group's files: read, decoded file by file, renamed, typed as ``out``."""
    fmt = group.format
    wanted = [c for c in out.names if c in group.logical.names or c in PARTITION_COLUMNS]
    decode = fmt.encoded and bool({OBS, NEXT} & set(wanted))
    read = list(dict.fromkeys(wanted + ([*KEYS, OBS] if decode else [])))
    if (episode_ids is not None or not read) and "episode_id" not in read:
        read.append("episode_id")  # to filter by, or to count rows by when the files hold no column asked for
    physical = [fmt.physical(c) for c in read]
    dataset = steps_dataset(group.files, group.physical)
    condition = ds.field(fmt.physical("episode_id")).isin(pa.array(episode_ids)) if episode_ids is not None else None
    scanner = dataset.scanner(columns=physical, filter=condition, batch_size=batch_size, use_threads=True,
                              fragment_readahead=FRAGMENT_READAHEAD, batch_readahead=BATCH_READAHEAD)
    obs_type = group.logical.field(OBS).type if OBS in group.logical.names else pa.null()
    decoder, path = None, None
    for tagged in scanner.scan_batches():
        batch = pa.record_batch(tagged.record_batch.columns, names=read)
        if not decode:
            yield _typed(batch, out)
            continue
        if tagged.fragment.path != path:
            if decoder is not None:
                yield from (_typed(b, out) for b in _decoded(decoder.finish, path))
            decoder, path = FileDecoder(fmt, obs_type, _uri(group, tagged.fragment.path)), tagged.fragment.path
        yield from (_typed(b, out) for b in _decoded(lambda: decoder.push(batch), path))  # noqa: B023
    if decoder is not None:
        yield from (_typed(b, out) for b in _decoded(decoder.finish, path))


def _decoded(step: object, path: str | None) -> list[pa.RecordBatch]:
    try:
        return step()  # type: ignore[operator]
    except EncodingError as exc:
        raise StoreDamagedError.of_file(str(path), f"breaks its encoding: {exc}", None) from exc


def _uri(group: FileGroup, path: str) -> str:
    return next((f.uri for f in group.files if f.path == path), path)


def _typed(batch: pa.RecordBatch, out: pa.Schema) -> pa.RecordBatch:
    """``batch`` with the columns of ``out`` in its order and types; those it lacks as nulls."""
    arrays = []
    for f in out:
        if f.name in batch.schema.names:
            column = batch.column(f.name)
            arrays.append(column if column.type == f.type and column.type.equals(f.type, check_metadata=False)
                          else column.cast(f.type))
        else:
            arrays.append(pa.nulls(batch.num_rows, f.type))
    return pa.RecordBatch.from_arrays(arrays, schema=out)


def steps_dataset(files: Sequence[DataFile], schema: pa.Schema) -> ds.FileSystemDataset:
    """A pyarrow dataset over exactly ``files`` (in order; never a listing of their folder), typed as ``schema``
    (stored names): ``run_id`` and ``env_id`` from each file's partition, every column cast to its type in
    ``schema``, columns a file lacks as nulls."""
    partitions = [(ds.field("run_id") == f.run_id) & (ds.field("env_id") == f.env_id) for f in files]
    filesystem = files[0].fs if files else pafs.LocalFileSystem()  # one table's files share its filesystem
    full = schema
    for name in ("env_id", "run_id"):
        if name not in full.names:
            full = full.insert(0, pa.field(name, pa.string()))
    return ds.FileSystemDataset.from_paths([f.path for f in files], schema=full, format=ds.ParquetFileFormat(),
                                           filesystem=filesystem, partitions=partitions)


def decoded_row_bytes(files: Sequence[DataFile], out: pa.Schema, layouts: Sequence[FileLayout]) -> float:
    """The widest decoded row of ``out``'s columns among the environments of ``files``, in bytes: exact for
    fixed-width types, from the Parquet footer of one file per ``env_id`` for the others (text)."""
    fixed = sum(_width(f.type) or 0 for f in out)
    variable = [f.name for f in out if _width(f.type) is None]
    return float(fixed) + (row_bytes(files, variable, layouts) if variable else 0.0)


def row_bytes(files: Sequence[DataFile], columns: Sequence[str],
              layouts: Sequence[FileLayout] | None = None) -> float:
    """The widest stored row of ``columns`` (logical names) among the environments of ``files``, in bytes, from
    the Parquet footer of one file per ``env_id`` (uncompressed sizes; ``layouts``, the files' own, say the
    physical names, read from the footers when not given)."""
    import pyarrow.parquet as pq

    first = {f.env_id: i for i, f in reversed(list(enumerate(files)))}.values()
    widest = 0.0
    for i in first:
        f = files[i]
        meta = pq.read_metadata(f.path, filesystem=f.fs)
        if not meta.num_rows:
            continue
        fmt = (layouts[i] if layouts is not None else FileLayout.of(meta.schema.to_arrow_schema())).format
        names = {fmt.physical(n) for n in columns}
        size = sum(meta.row_group(g).column(c).total_uncompressed_size
                   for g in range(meta.num_row_groups) for c in range(meta.num_columns)
                   if meta.row_group(g).column(c).path_in_schema.split(".")[0] in names)
        widest = max(widest, size / meta.num_rows)
    return widest


def _width(t: pa.DataType) -> int | None:
    """Bytes of one value of a fixed-width type (None for text and variable-size lists)."""
    if pa.types.is_struct(t):
        widths = [_width(f.type) for f in t]
        return None if any(w is None for w in widths) else sum(widths)  # type: ignore[arg-type]
    if pa.types.is_fixed_size_list(t):
        inner = _width(t.value_type)
        return None if inner is None else inner * t.list_size
    if pa.types.is_boolean(t):
        return 1
    try:
        return t.bit_width // 8 if t.bit_width else None
    except ValueError:
        return None


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
