"""Export to LeRobot's dataset format v3.0, the one the current ``lerobot`` release reads:
``LeRobotDataset(repo_id, root=folder)`` opens the result offline, frame by frame, with ``delta_timestamps``.

The layout and the types are those of LeRobot's own recorder (``lerobot.datasets.dataset_writer``)::

    meta/info.json         codebase_version "v3.0", fps, counts, chunk and file sizes, path templates, features
    meta/stats.json        every feature's statistics over the dataset (:mod:`trajstore.export.lerobot_stats`)
    meta/tasks.parquet     one task per environment: its env_id (a pandas frame indexed by ``task``)
    meta/episodes/chunk-000/file-000.parquet
                           one row per episode: episode_index, tasks, length, where its frames are
                           (data/chunk_index, data/file_index, dataset_from_index, dataset_to_index), its
                           statistics (stats/<feature>/<stat>), where this row is (meta/episodes/…), and
                           trajstore's trajstore/run_id, trajstore/env_id, trajstore/episode_id
    data/chunk-000/file-000.parquet
                           one row per step, many episodes per file (a new file past ``file_size_mb``, a new
                           chunk folder every ``chunk_size`` files), in row groups of whole episodes

Each step is one frame: ``observation.state`` (obs), ``action``, ``next.observation.state`` (next_obs),
``next.reward``, ``next.terminated``, ``next.truncated``, ``next.done`` (either flag), then LeRobot's
``timestamp`` (frame_index / fps), ``frame_index``, ``episode_index``, ``index`` (over the dataset) and
``task_index``. A feature whose steps are scalars or one-element vectors (a Discrete action, Pendulum's
``Box(1,)`` action, the reward) is declared with shape ``[1]`` and stored as a scalar column, as LeRobot
declares and stores it; vectors are fixed-size lists, 2-D to 5-D arrays ``datasets``' ``ArrayND`` columns.
Observations that are ``uint8`` pictures (gray or RGB, channels first or last; a frame stack gives its newest
frame, and ``delta_timestamps`` stacks frames again) are LeRobot image features instead:
``observation.image`` and ``next.observation.image``, PNG bytes that LeRobot decodes without ffmpeg.
The data files carry the ``huggingface`` schema metadata ``datasets`` writes. Episodes are written a group at a
time from :mod:`trajstore.export.episodes`, so memory stays bounded whatever the size of the selection, and into
a hidden folder beside ``folder`` that becomes ``folder`` only when complete (:mod:`trajstore.export.target`).
"""

from __future__ import annotations

import json
import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trajstore import progress_bar
from trajstore.errors import InputError
from trajstore.export import lerobot_stats as stats
from trajstore.export.episodes import EpisodeGroup, ExportResult, Selection, select
from trajstore.export.target import check_new, staged
from trajstore.extras import needed
from trajstore.query.pictures import ImageLeaf, image_leaf, png
from trajstore.store import plumbing

if TYPE_CHECKING:
    from trajstore.store import Store

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
CHUNK_SIZE = 1000  # files per chunk folder (LeRobot's chunks_size)
FILE_SIZE_MB = 100  # a data or episodes file is closed when the next episode would take it past this size
ROW_GROUP_FRAMES = 16_384  # a data file's row groups: whole episodes, this many frames or more (the last fewer)
VIDEO_FILE_SIZE_MB = 200  # recorded in info.json as LeRobot does (no videos are written)


@dataclass(frozen=True)
class Feature:
    """One numeric LeRobot feature: its name, the column of frame values it is made of, and the dtype and
    shape it declares (``(1,)`` for a scalar per step, stored as a scalar column).

    Image observations are :class:`ImageFeature` s, with their own ``info``/``hf``/``field``/``arrow`` and
    ``statistics``; :func:`features` chooses the kind per column, and everything else (files, episodes, totals)
    takes any feature alike.
    """

    name: str
    source: str
    dtype: np.dtype
    shape: tuple[int, ...]
    ordered: bool = False  # values never decrease within an episode (indices, timestamps)

    def info(self) -> dict[str, Any]:
        return {"dtype": self.dtype.name, "shape": list(self.shape), "names": None}

    def hf(self) -> dict[str, Any]:
        """The feature as ``datasets.Features`` serialize it (the data files' ``huggingface`` metadata)."""
        value = {"dtype": self.dtype.name, "_type": "Value"}
        if self.shape == (1,):
            return value
        if len(self.shape) == 1:
            return {"feature": value, "length": self.shape[0], "_type": "List"}
        return {"shape": list(self.shape), "dtype": self.dtype.name, "_type": f"Array{len(self.shape)}D"}

    def field(self) -> pa.Field:
        t = pa.from_numpy_dtype(self.dtype)
        if self.shape == (1,):
            return pa.field(self.name, t)
        if len(self.shape) == 1:
            return pa.field(self.name, pa.list_(pa.field("element", t), self.shape[0]))
        for _ in self.shape:
            t = pa.list_(pa.field("element", t))
        return pa.field(self.name, t, metadata={  # as datasets stores its ArrayND extension types
            "ARROW:extension:name": f"datasets.features.features.Array{len(self.shape)}DExtensionType",
            "ARROW:extension:metadata": json.dumps([list(self.shape), self.dtype.name])})

    def arrow(self, values: np.ndarray) -> pa.Array:
        flat = pa.array(np.ascontiguousarray(values, dtype=self.dtype).reshape(-1))
        if self.shape == (1,):
            return flat
        if len(self.shape) == 1:
            return pa.FixedSizeListArray.from_arrays(flat, type=self.field().type)
        arr: pa.Array = flat
        for size in reversed(self.shape):
            arr = pa.ListArray.from_arrays(np.arange(0, len(arr) + 1, size, dtype=np.int32), arr)
        return arr.cast(self.field().type)

    def statistics(self, values: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
        return stats.episode_stats(values, lengths, ordered=self.ordered)

    @property
    def few_values(self) -> bool:
        """Whether a column of it holds few distinct values per file (worth a dictionary)."""
        return self.dtype == np.bool_ or self.name in ("episode_index", "task_index")

    def dataset_stats(self, result: dict[str, list[Any]]) -> dict[str, list[Any]]:
        """``meta/stats.json``'s entry from the feature's :meth:`Totals.result <trajstore.export.lerobot_stats.
        Totals.result>`."""
        return result


@dataclass(frozen=True)
class ImageFeature(Feature):
    """An image observation as LeRobot's ``"image"`` feature: each step's picture (:mod:`trajstore.query.pictures`: a
    frame stack's newest frame, channels last) as PNG bytes in ``struct<bytes, path>``, which LeRobot decodes
    with PIL into a ``(C, H, W)`` float tensor in [0, 1]. Declared ``(H, W, C)`` as LeRobot's recorder declares
    cameras; statistics per channel over every pixel of every frame, divided by 255, shape ``(C, 1, 1)`` in
    ``meta/stats.json`` (LeRobot's own recorder estimates them from sampled, downscaled frames)."""

    leaf: ImageLeaf | None = None

    def info(self) -> dict[str, Any]:
        return {"dtype": "image", "shape": list(self.shape), "names": ["height", "width", "channels"]}

    def hf(self) -> dict[str, Any]:
        return {"_type": "Image"}

    def field(self) -> pa.Field:
        return pa.field(self.name, pa.struct([pa.field("bytes", pa.binary()), pa.field("path", pa.string())]))

    def pictures(self, values: np.ndarray) -> np.ndarray:
        """Each step's picture, ``(steps, H, W, C)`` ``uint8``."""
        assert self.leaf is not None
        return np.stack([self.leaf.picture(v) for v in values]).reshape(len(values), *self.shape) \
            if len(values) else np.zeros((0, *self.shape), np.uint8)

    def arrow(self, values: np.ndarray) -> pa.Array:
        encoded = [png(p[..., 0] if self.shape[-1] == 1 else p) for p in self.pictures(values)]
        return pa.StructArray.from_arrays([pa.array(encoded, pa.binary()), pa.nulls(len(encoded), pa.string())],
                                          fields=list(self.field().type))

    def statistics(self, values: np.ndarray, lengths: np.ndarray) -> dict[str, np.ndarray]:
        return stats.episode_stats(self.pictures(values).astype(np.float32) / np.float32(255.0), lengths)

    @property
    def few_values(self) -> bool:
        return False

    def dataset_stats(self, result: dict[str, list[Any]]) -> dict[str, list[Any]]:
        return {k: v if k == "count" else [[[x]] for x in v] for k, v in result.items()}


STEP_FEATURES = (("observation.state", "obs"), ("action", "action"), ("next.observation.state", "next_obs"),
                 ("next.reward", "reward"), ("next.terminated", "terminated"), ("next.truncated", "truncated"),
                 ("next.done", "done"))
INDEX_FEATURES = (Feature("timestamp", "timestamp", np.dtype(np.float32), (1,), ordered=True),
                  *(Feature(name, name, np.dtype(np.int64), (1,), ordered=True)
                    for name in ("frame_index", "episode_index", "index", "task_index")))


IMAGE_FEATURES = {"obs": "observation.image", "next_obs": "next.observation.image"}


def features(kinds: dict[str, tuple[np.dtype, tuple[int, ...]]],
             images: dict[str, ImageLeaf] | None = None) -> list[Feature]:
    """The dataset's features, given each stored column's dtype and step shape (and ``images``: the columns
    whose steps are pictures): the step's, then LeRobot's."""
    kinds = {**kinds, "done": (np.dtype(bool), ())}
    out: list[Feature] = []
    for name, column in STEP_FEATURES:
        dtype, shape = kinds[column]
        leaf = (images or {}).get(column)
        if leaf is not None:
            out.append(ImageFeature(IMAGE_FEATURES[column], column, np.dtype(np.uint8),
                                    (leaf.height, leaf.width, leaf.channels), leaf=leaf))
            continue
        if len(shape) > 5:
            raise InputError(f"{column}: steps of {len(shape)} dimensions; LeRobot features have at most 5")
        out.append(Feature(name, column, np.dtype(dtype), shape if len(shape) and shape != (1,) else (1,)))
    return out + list(INDEX_FEATURES)


def export_lerobot(store: Store, folder: str | Path, *, run_id: str | Sequence[str] | None = None,
                   where: str | None = None, fps: int = 30, chunk_size: int = CHUNK_SIZE,
                   file_size_mb: float = FILE_SIZE_MB, progress: bool = False,
                   include_unfinished: bool = False, agent: str | None = None) -> ExportResult:
    """Write the complete episodes of ``run_id`` (selected by ``where``, a condition over the episodes view;
    ``include_unfinished``: the unfinished ones too) as a
    LeRobot v3.0 dataset in ``folder`` (new, or an empty folder): one frame per step, ``fps`` frames per
    second. ``chunk_size`` files per chunk folder and files of ``file_size_mb`` at most, as LeRobot's
    ``chunks_size`` and ``data_files_size_in_mb``. ``progress``: a bar over the episodes. Multi-agent episodes
    are exported one ``agent`` at a time: its own trajectory in each episode (its rows in step order, complete
    when its last row ended it) is an episode of the dataset, ``trajstore/agent_id`` in ``meta/episodes``."""
    if not isinstance(fps, int) or fps < 1:
        raise InputError(f"fps: must be a positive whole number of frames per second, got {fps!r}")
    if chunk_size < 1 or not file_size_mb > 0:
        raise InputError(f"chunk_size/file_size_mb: must be positive, got {chunk_size}/{file_size_mb}")
    root = Path(folder)
    check_new(root, field="folder")
    with select(store, run_id=run_id, where=where, include_unfinished=include_unfinished, agent=agent) as selection:
        with staged(root, field="folder") as stage:
            _write(selection, stage, fps=fps, chunk_size=chunk_size, file_mb=file_size_mb, progress=progress)
        return ExportResult(str(root), selection.episodes, selection.steps, selection.runs, "LeRobot dataset",
                            selection.agent)


def image_columns(sel: Selection) -> dict[str, ImageLeaf]:
    """``obs`` and ``next_obs`` as pictures when the selected observations are ``uint8`` pictures of one (gray)
    or three (RGB) channels (a frame stack's newest frame; see :mod:`trajstore.query.pictures`), else nothing: such
    observations are exported as LeRobot image features, any other stay arrays."""
    dtype, shape = sel.kinds["obs"]
    if np.dtype(dtype) != np.uint8:
        return {}
    leaves = plumbing(sel.store).image_leaves
    declared = [leaf.stack for env in sel.env_ids for leaf in leaves(env) if leaf.path == "obs"]
    leaf = image_leaf("obs", shape, np.dtype(dtype), declared[0] if declared else None)
    if leaf is None or leaf.channels not in (1, 3):
        return {}
    with needed("lerobot", "export_lerobot of picture observations (PNG image features)"):
        import PIL  # noqa: F401 - before anything is written
    return {"obs": leaf, "next_obs": leaf}


def _write(sel: Selection, root: Path, *, fps: int, chunk_size: int, file_mb: float, progress: bool) -> None:
    feats = features(sel.kinds, image_columns(sel))
    tasks = sel.env_ids
    schema = pa.schema([f.field() for f in feats], metadata={"huggingface": json.dumps(
        {"info": {"features": {f.name: f.hf() for f in feats}}})})
    data = RollingFiles(root, DATA_PATH, schema, chunk_size=chunk_size, file_mb=file_mb,
                        row_group_rows=ROW_GROUP_FRAMES, dictionary=[f.name for f in feats if f.few_values])
    meta = None
    totals = {f.name: stats.Totals() for f in feats}
    frames = 0
    with progress_bar.bar(total=sel.episodes, desc="export", unit="episode", enabled=progress) as bar:
        for group in sel.groups():
            values = _frames(group, first_frame=frames, fps=fps, tasks=tasks)
            table = pa.table([f.arrow(values[f.source]) for f in feats], schema=schema)
            places = [data.add(table.slice(a, n)) for a, n in zip(group.start, group.length)]
            ep_stats = {f.name: f.statistics(values[f.source], group.length) for f in feats}
            for f in feats:
                totals[f.name].add(ep_stats[f.name])
            rows = _episode_rows(group, places, ep_stats, frames)
            meta = meta or RollingFiles(root, EPISODES_PATH, rows.schema, chunk_size=chunk_size, file_mb=file_mb)
            meta.add(_placed(rows, meta.place(rows)))
            frames += group.steps
            data.detach()
            bar.update(len(group))
    data.close()
    if meta is not None:
        meta.close()
    _write_meta(root, sel, feats, tasks, totals, fps=fps, chunk_size=chunk_size, file_mb=file_mb)


def _frames(group: EpisodeGroup, *, first_frame: int, fps: int, tasks: list[str]) -> dict[str, np.ndarray]:
    """Every feature's values for the group's steps, by source name."""
    c = group.columns
    frame_index = np.arange(group.steps, dtype=np.int64) - np.repeat(group.start, group.length)
    task = np.array([tasks.index(e) for e in group.env_id], dtype=np.int64)
    return {**c, "done": c["terminated"] | c["truncated"],
            "timestamp": (frame_index / fps).astype(np.float32), "frame_index": frame_index,
            "episode_index": np.repeat(group.first + np.arange(len(group), dtype=np.int64), group.length),
            "index": first_frame + np.arange(group.steps, dtype=np.int64),
            "task_index": np.repeat(task, group.length)}


class RollingFiles:
    """Parquet files under one path template, filled in order: rows go to the current file unless the file would
    pass ``file_mb`` with them (LeRobot's rule: the size so far plus the rows at the file's bytes per row), then
    to the next file; ``chunk_size`` files per chunk folder. Rows are written in row groups of whole tables of at
    least ``row_group_rows`` rows (each table is one when None): a Parquet writer holds ~10 KB of metadata per
    row group until it closes, so one row group per short episode, as LeRobot's recorder writes, would cost
    memory growing with the episodes. Snappy, as LeRobot writes; dictionaries for the columns named in
    ``dictionary`` (all when None: a dictionary of floats costs time for nothing)."""

    def __init__(self, root: Path, template: str, schema: pa.Schema, *, chunk_size: int, file_mb: float,
                 row_group_rows: int | None = None, dictionary: list[str] | None = None) -> None:
        self.root, self.template, self.schema = root, template, schema
        self.chunk_size, self.limit, self.row_group_rows = chunk_size, file_mb * 2 ** 20, row_group_rows
        self.dictionary: bool | list[str] = True if dictionary is None else dictionary
        self.chunk, self.file = 0, 0
        self.written = 0  # rows in the current file's row groups
        self.pending: list[pa.Table] = []
        self._writer: pq.ParquetWriter | None = None
        self._path: Path | None = None

    @property
    def pending_rows(self) -> int:
        return sum(t.num_rows for t in self.pending)

    def place(self, table: pa.Table) -> tuple[int, int]:
        """The (chunk, file) ``table``'s rows go to: the next file when the current one would pass the limit."""
        rows = self.written + self.pending_rows
        if rows:
            per_row = os.path.getsize(self._path) / self.written if self._path is not None and self.written else \
                table.nbytes / max(1, table.num_rows)  # nothing on disk yet: the uncompressed size, an upper bound
            if per_row * (rows + table.num_rows) >= self.limit:
                self.close()
                self.file += 1
                if self.file == self.chunk_size:
                    self.chunk, self.file = self.chunk + 1, 0
        return self.chunk, self.file

    def add(self, table: pa.Table) -> tuple[int, int]:
        """Append ``table`` (written once a row group's worth is pending); where its rows go."""
        place = self.place(table)
        self.pending.append(table)
        if self.row_group_rows is None or self.pending_rows >= self.row_group_rows:
            self.flush()
        return place

    def detach(self) -> None:
        """Copy the pending rows, so that the tables they were sliced from can be freed."""
        if self.pending:
            rows = pa.concat_tables(self.pending)
            self.pending = [rows.take(np.arange(rows.num_rows))]  # a copy (combining one chunk would not copy)

    def flush(self) -> None:
        """Write the pending rows as one row group."""
        if not self.pending:
            return
        if self._writer is None:
            self._path = self.root / self.template.format(chunk_index=self.chunk, file_index=self.file)
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self._path, self.schema, compression="snappy",
                                            use_dictionary=self.dictionary)
        rows = pa.concat_tables(self.pending)
        self._writer.write_table(rows, row_group_size=max(1, rows.num_rows))
        self.written += rows.num_rows
        self.pending = []

    def close(self) -> None:
        self.flush()
        if self._writer is not None:
            self._writer.close()
            self._writer = None
            self._path, self.written = None, 0


def _episode_rows(group: EpisodeGroup, places: list[tuple[int, int]], ep_stats: dict[str, dict[str, np.ndarray]],
                  first_frame: int) -> pa.Table:
    """The group's rows of ``meta/episodes``, in LeRobot's column order (their own place still unset)."""
    n = len(group)
    start = first_frame + group.start
    cols: dict[str, pa.Array] = {
        "episode_index": pa.array(group.first + np.arange(n, dtype=np.int64)),
        "tasks": pa.array([[e] for e in group.env_id], pa.list_(pa.string())),
        "length": pa.array(group.length.astype(np.int64)),
        "data/chunk_index": pa.array([p[0] for p in places], pa.int64()),
        "data/file_index": pa.array([p[1] for p in places], pa.int64()),
        "dataset_from_index": pa.array(start), "dataset_to_index": pa.array(start + group.length)}
    for name, values in ep_stats.items():
        for stat in stats.STATS:
            v = values[stat]
            offsets = np.arange(0, v.size + 1, v.shape[1], dtype=np.int32)
            cols[f"stats/{name}/{stat}"] = pa.ListArray.from_arrays(offsets, pa.array(v.reshape(-1)))
    cols["meta/episodes/chunk_index"] = cols["meta/episodes/file_index"] = pa.array(np.zeros(n, np.int64))
    cols["trajstore/run_id"] = pa.array(group.run_id, pa.string())
    cols["trajstore/env_id"] = pa.array(group.env_id, pa.string())
    cols["trajstore/episode_id"] = pa.array(group.episode_id.astype(np.int64))
    if group.agent is not None:  # one agent's trajectories of multi-agent episodes
        cols["trajstore/agent_id"] = pa.array([group.agent] * n, pa.string())
    return pa.table(cols)


def _placed(rows: pa.Table, place: tuple[int, int]) -> pa.Table:
    """``meta/episodes`` rows with the (chunk, file) they are written to."""
    for name, value in zip(("meta/episodes/chunk_index", "meta/episodes/file_index"), place):
        rows = rows.set_column(rows.schema.get_field_index(name), name, pa.array(np.full(len(rows), value, np.int64)))
    return rows


def _write_meta(root: Path, sel: Selection, feats: list[Feature], tasks: list[str], totals: dict[str, stats.Totals],
                *, fps: int, chunk_size: int, file_mb: float) -> None:
    """``meta/info.json``, ``meta/stats.json`` and ``meta/tasks.parquet``."""
    info = {"codebase_version": CODEBASE_VERSION, "fps": fps, "features": {f.name: f.info() for f in feats},
            "total_episodes": sel.episodes, "total_frames": sel.steps, "total_tasks": len(tasks),
            "chunks_size": chunk_size, "data_files_size_in_mb": file_mb,
            "video_files_size_in_mb": VIDEO_FILE_SIZE_MB, "data_path": DATA_PATH, "video_path": None,
            "robot_type": None, "splits": {"train": f"0:{sel.episodes}"}}
    _json(root / "meta" / "info.json", info)
    _json(root / "meta" / "stats.json", {f.name: f.dataset_stats(totals[f.name].result()) for f in feats})
    _json(root / "meta" / "trajstore.json", {"store": sel.store.uri, "version": sel.store.version,
                                             "runs": sel.runs})
    pq.write_table(_tasks_table(tasks), root / "meta" / "tasks.parquet", compression="snappy")


def _tasks_table(tasks: list[str]) -> pa.Table:
    """The tasks as pandas writes a frame indexed by ``task`` with a ``task_index`` column (LeRobot reads it
    with ``pandas.read_parquet`` and looks tasks up by that index)."""
    pandas = {"index_columns": ["task"],
              "column_indexes": [{"name": None, "field_name": None, "pandas_type": "unicode",
                                  "numpy_type": "object", "metadata": {"encoding": "UTF-8"}}],
              "columns": [{"name": "task_index", "field_name": "task_index", "pandas_type": "int64",
                           "numpy_type": "int64", "metadata": None},
                          {"name": "task", "field_name": "task", "pandas_type": "unicode", "numpy_type": "object",
                           "metadata": None}],
              "attributes": {}, "creator": {"library": "pyarrow", "version": pa.__version__}}
    return pa.table({"task_index": pa.array(np.arange(len(tasks), dtype=np.int64)), "task": pa.array(tasks)},
                    metadata={"pandas": json.dumps(pandas)})


def _json(path: Path, value: Any) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(value, indent=4, ensure_ascii=False))
