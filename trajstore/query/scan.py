"""Steps read straight from the committed Parquet files: the rows of ``SELECT … FROM steps`` as a stream
of record batches, at the speed of a direct pyarrow read, in the types the files store.

Streaming for training reads every selected step once and in storage order; a SQL engine adds nothing
there but its own cost. :func:`~trajstore.storage.table.steps_dataset` is a pyarrow dataset over exactly some
files of one committed version (never a listing of the folder), with ``run_id`` and ``env_id`` taken from each
file's partition, every column cast to one type, and columns a file lacks filled with nulls. :func:`scan_steps`
reads the files group by group (:mod:`~trajstore.query.groups`: files stored alike), one dataset each, decodes
each file's batches (:mod:`~trajstore.storage.encoding`) and gives them their logical names; a
:class:`~trajstore.query.snapshot.Snapshot` registers the same datasets to let DuckDB read them instead of the
files. Files are read two ahead, their row groups decoded on Arrow's thread pool; memory is bounded by the
read-ahead, not by the result. :func:`scan` and :func:`scan_plan` give the steps of one committed version, selected
by the readers' filters.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Iterator, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.dataset as ds

from trajstore.errors import InputError, StoreDamagedError
from trajstore.query import foreign, sql
from trajstore.query.filters import EpisodeFilter, Ids, Names, both, selected
from trajstore.query.groups import FileGroup, StepTypes, group_files
from trajstore.query.snapshot import check_names
from trajstore.schema import PARTITION_COLUMNS
from trajstore.storage.encoding import NEXT, OBS, EncodingError, FileDecoder, FileSchema
from trajstore.storage.log import DataFile, files_holding
from trajstore.storage.table import read_file_schema, steps_dataset

if TYPE_CHECKING:
    from trajstore.query.engine import Engine

FRAGMENT_READAHEAD = 2  # files read ahead of the one being sent
BATCH_READAHEAD = 4  # record batches decoded ahead, per file
KEYS = ("episode_id", "step")


def scan_steps(files: Sequence[DataFile], schema: pa.Schema, columns: Sequence[str], *,
               episode_ids: np.ndarray | None = None, batch_size: int = 65_536,
               max_batch_bytes: int | None = None,
               schemas: Sequence[FileSchema] | None = None) -> pa.RecordBatchReader:
    """``columns`` of the steps in ``files``, typed as in ``schema`` (what :func:`~trajstore.query.groups.step_types`
    gives), decoded (see :mod:`~trajstore.storage.encoding`), under their logical names.

    Files are read group by group (:func:`~trajstore.query.groups.group_files`; ``schemas`` are the files' own,
    read from their footers when not given), each group's files in order. With ``episode_ids``, only the steps
    of those episodes: files whose logged id range holds none of them are skipped, row groups by their
    statistics, and the remaining rows filtered (whole episodes, so decoding within a file still works). With
    ``max_batch_bytes``, batches hold fewer than ``batch_size`` rows when decoded rows are wide (image
    observations), so that one batch stays near that size.
    """
    out = pa.schema([schema.field(c) for c in columns])
    if episode_ids is not None:
        episode_ids = np.unique(np.asarray(episode_ids, dtype=np.int64))
        holding = {f.path for f in files_holding(files, episode_ids)}
        keep = [i for i, f in enumerate(files) if f.path in holding]
        files = [files[i] for i in keep]
        schemas = None if schemas is None else [schemas[i] for i in keep]
    if not files:
        return pa.RecordBatchReader.from_batches(out, iter(()))
    schemas = list(schemas) if schemas is not None else [read_file_schema(f) for f in files]
    if max_batch_bytes is not None:
        batch_size = max(1, min(batch_size, int(max_batch_bytes // max(1.0, decoded_row_bytes(files, out, schemas)))))
    groups = group_files(files, schemas)
    batches = (b for g in groups for b in _group_batches(g, out, episode_ids, batch_size))
    return pa.RecordBatchReader.from_batches(out, batches)


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
    if decode and fmt.foreign and not foreign.in_order(group.files, fmt):
        yield from _sorted_batches(group, dataset, physical, read, condition, out, obs_type, batch_size)
        return
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
        yield from (_typed(b, out) for b in _decoded(lambda: decoder.push(batch), path))  # type: ignore[union-attr]  # noqa: B023
    if decoder is not None:
        yield from (_typed(b, out) for b in _decoded(decoder.finish, path))


def _sorted_batches(group: FileGroup, dataset: ds.Dataset, physical: list[str], read: list[str],
                    condition: ds.Expression | None, out: pa.Schema, obs_type: pa.DataType,
                    batch_size: int) -> Iterator[pa.RecordBatch]:
    """The batches of a group of files another tool wrote out of trajstore's order (a Z-ORDER): every row read,
    put in episode and step order, decoded as one file."""
    table = dataset.to_table(columns=physical, filter=condition).rename_columns(read)
    where = ", ".join(f.uri for f in group.files[:3]) + (" …" if len(group.files) > 3 else "")
    decoder = FileDecoder(group.format, obs_type, where)
    for batch in foreign.sorted_rows(table).to_batches(max_chunksize=batch_size):
        yield from (_typed(b, out) for b in _decoded(lambda: decoder.push(batch), where))  # noqa: B023
    yield from (_typed(b, out) for b in _decoded(decoder.finish, where))


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


def decoded_row_bytes(files: Sequence[DataFile], out: pa.Schema, schemas: Sequence[FileSchema]) -> float:
    """The widest decoded row of ``out``'s columns among the environments of ``files``, in bytes: exact for
    fixed-width types, from the Parquet footer of one file per ``env_id`` for the others (text)."""
    fixed = sum(_width(f.type) or 0 for f in out)
    variable = [f.name for f in out if _width(f.type) is None]
    return float(fixed) + (row_bytes(files, variable, schemas) if variable else 0.0)


def row_bytes(files: Sequence[DataFile], columns: Sequence[str],
              schemas: Sequence[FileSchema] | None = None) -> float:
    """The widest stored row of ``columns`` (logical names) among the environments of ``files``, in bytes, from
    the Parquet footer of one file per ``env_id`` (uncompressed sizes; ``schemas``, the files' own, say the
    physical names, read from the footers when not given)."""
    import pyarrow.parquet as pq

    first = {f.env_id: i for i, f in reversed(list(enumerate(files)))}.values()
    widest = 0.0
    for i in first:
        f = files[i]
        meta = pq.read_metadata(f.path, filesystem=f.fs)
        if not meta.num_rows:
            continue
        fmt = (schemas[i] if schemas is not None else FileSchema.of(meta.schema.to_arrow_schema())).format
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


# --- the steps of one committed version ---------------------------------------------------------------------

@dataclass(frozen=True)
class ScanPlan:
    """The committed files a scan reads (in log order), the types a scan of them returns for every column of the
    steps view, the columns asked for and the episode ids selected (None: every episode in the files); the types
    of the selected files (with the columns they store unlike each other) and their schemas."""

    files: list[DataFile]
    schema: pa.Schema
    columns: list[str]
    episode_ids: np.ndarray | None
    types: StepTypes | None = None
    schemas: list[FileSchema] | None = None


def scan_plan(engine: Engine, columns: Sequence[str] | None = None, *, run_id: Names = None, env_id: Names = None,
              episode_id: Ids = None, where: sql.Where | None = None,
              filter: EpisodeFilter | None = None) -> ScanPlan:  # noqa: A002
    """What :func:`scan` reads: the committed files, their types, the columns and the episode ids (None: every
    episode of the files), resolved on one snapshot. Another engine (Ray) can read the plan's files in pieces, with
    :func:`scan_steps`, and get exactly the rows of :func:`scan`."""
    if filter is not None:  # ids, runs and envs select files and rows directly; the rest needs episodes
        run_id, env_id = both(run_id, filter.run_id), both(env_id, filter.env_id)
        episode_id = both(episode_id, filter.episode_id)
        filter = filter.per_episode()  # noqa: A001 - the keyword's own value, narrowed
        filter = None if filter.is_empty() else filter  # noqa: A001
    ids = None if episode_id is None else np.atleast_1d(np.asarray(episode_id, dtype=np.int64))
    partitions = None
    if where or filter is not None:  # episode-level conditions: the episode ids they select, on one snapshot
        with engine.query_snapshot(episodes="if-cached") as snap:
            conds = sql.conditions(run_id=run_id, env_id=env_id, where=where, filter=filter, episode_id=episode_id)
            ids = snap.arrow(sql.episode_ids(conds))["episode_id"].to_numpy()
            held = snap.arrow(sql.episode_partitions(conds))  # files of other partitions hold none of them
            partitions = set(zip(held["run_id"].to_pylist(), held["env_id"].to_pylist()))
            committed = snap.files
    else:  # no SQL at all once the files' schemas are known for this version
        committed = engine.files()
    known = engine.step_types(committed).schema
    names = list(dict.fromkeys(columns)) if columns else known.names
    check_names(names, known.names, view="steps", field="columns")
    files = [f for f in committed if selected(f.run_id, run_id) and selected(f.env_id, env_id)
             and (partitions is None or (f.run_id, f.env_id) in partitions)]
    if ids is not None:
        ids = np.unique(ids)
        files = files_holding(files, ids)
    types = engine.step_types(files)
    own = types.schema
    schema = pa.schema([own.field(f.name) if f.name in own.names else f for f in known])
    return ScanPlan(files, schema, names, ids, types, engine.file_schemas(files))


def scan(engine: Engine, columns: Sequence[str] | None = None, *, batch_size: int = 65_536,
         max_batch_bytes: int | None = None, **selection: object) -> pa.RecordBatchReader:
    """The steps of the selected episodes as a stream of record batches, in storage order, read straight from the
    committed files: the rows and types of ``SELECT columns FROM steps`` with the same filters (``selection``:
    :func:`scan_plan`'s), at most ``batch_size`` rows a batch and fewer when rows are so wide that a batch would
    pass ``max_batch_bytes``."""
    if batch_size < 1:
        raise InputError(f"batch_size: must be a positive number of rows, got {batch_size}")
    if max_batch_bytes is not None and max_batch_bytes < 1:
        raise InputError(f"max_batch_bytes: must be a positive number of bytes, got {max_batch_bytes}")
    plan = scan_plan(engine, columns, **selection)  # type: ignore[arg-type]
    plan.types.check_one_type(plan.columns)  # type: ignore[union-attr]
    engine.verify_sizes(plan.files)
    try:
        reader = scan_steps(plan.files, plan.schema, plan.columns, episode_ids=plan.episode_ids,
                            batch_size=batch_size, max_batch_bytes=max_batch_bytes, schemas=plan.schemas)
    except (OSError, pa.ArrowException) as exc:
        raise engine.damage(exc, plan.files) or exc
    return pa.RecordBatchReader.from_batches(reader.schema, engine.damage_named(reader, plan.files))


def loader_plan(engine: Engine, run_id: Names, env_id: Names, committed: list[DataFile]) -> ScanPlan:
    """:func:`scan_plan` for a selection of runs and envs alone among ``committed`` files, without opening DuckDB
    (~35 MiB a loader need not pay): the files' own types."""
    files = [f for f in committed if selected(f.run_id, run_id) and selected(f.env_id, env_id)]
    types = engine.step_types(files) if files else StepTypes(pa.schema([]))  # no file: no column
    return ScanPlan(files, types.schema, types.schema.names, None, types, engine.file_schemas(files))
