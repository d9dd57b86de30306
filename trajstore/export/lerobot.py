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
                           chunk folder every ``chunk_size`` files), one row group per episode

Each step is one frame: ``observation.state`` (obs), ``action``, ``next.observation.state`` (next_obs),
``next.reward``, ``next.terminated``, ``next.truncated``, ``next.done`` (either flag), then LeRobot's
``timestamp`` (frame_index / fps), ``frame_index``, ``episode_index``, ``index`` (over the dataset) and
``task_index``. A feature whose steps are scalars or one-element vectors (a Discrete action, Pendulum's
``Box(1,)`` action, the reward) is declared with shape ``[1]`` and stored as a scalar column, as LeRobot
declares and stores it; vectors are fixed-size lists, 2-D to 5-D arrays ``datasets``' ``ArrayND`` columns.
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
from tqdm.auto import tqdm

from trajstore.errors import InputError
from trajstore.export import lerobot_stats as stats
from trajstore.export.episodes import EpisodeGroup, ExportResult, Selection, select
from trajstore.export.target import check_new, staged

if TYPE_CHECKING:
    from trajstore.store import Store

CODEBASE_VERSION = "v3.0"
DATA_PATH = "data/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
EPISODES_PATH = "meta/episodes/chunk-{chunk_index:03d}/file-{file_index:03d}.parquet"
CHUNK_SIZE = 1000  # files per chunk folder (LeRobot's chunks_size)
FILE_SIZE_MB = 100  # a data or episodes file is closed when the next episode would take it past this size
VIDEO_FILE_SIZE_MB = 200  # recorded in info.json as LeRobot does (no videos are written)


@dataclass(frozen=True)
class Feature:
    """One numeric LeRobot feature: its name, the column of frame values it is made of, and the dtype and
    shape it declares (``(1,)`` for a scalar per step, stored as a scalar column).

    The extension point for images: an image observation (``uint8`` ``(H, W, C)``) is to become a feature of
    dtype ``"image"`` with its own ``info``/``hf``/``arrow`` (PNG bytes in ``struct<bytes, path>``) and
    per-channel ``statistics`` over sampled frames divided by 255, shape ``(C, 1, 1)``; :func:`features`
    chooses the kind per column, and everything else (files, episodes, totals) takes any feature alike.
    """

    name: str
    source: str
    dtype: np.dtype
    shape: tuple[int, ...]

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
        return stats.episode_stats(values, lengths)


STEP_FEATURES = (("observation.state", "obs"), ("action", "action"), ("next.observation.state", "next_obs"),
                 ("next.reward", "reward"), ("next.terminated", "terminated"), ("next.truncated", "truncated"),
                 ("next.done", "done"))
INDEX_FEATURES = (Feature("timestamp", "timestamp", np.dtype(np.float32), (1,)),
                  *(Feature(name, name, np.dtype(np.int64), (1,))
                    for name in ("frame_index", "episode_index", "index", "task_index")))


def features(kinds: dict[str, tuple[np.dtype, tuple[int, ...]]]) -> list[Feature]:
    """The dataset's features, given each stored column's dtype and step shape: the step's, then LeRobot's."""
    kinds = {**kinds, "done": (np.dtype(bool), ())}
    out = []
    for name, column in STEP_FEATURES:
        dtype, shape = kinds[column]
        if len(shape) > 5:
            raise InputError(f"{column}: steps of {len(shape)} dimensions; LeRobot features have at most 5")
        out.append(Feature(name, column, np.dtype(dtype), shape if len(shape) and shape != (1,) else (1,)))
    return out + list(INDEX_FEATURES)


def export_lerobot(store: Store, folder: str | Path, *, run_id: str | Sequence[str] | None = None,
                   where: str | None = None, fps: int = 30, chunk_size: int = CHUNK_SIZE,
                   file_size_mb: float = FILE_SIZE_MB, progress: bool = False) -> ExportResult:
    """Write the episodes of ``run_id`` (selected by ``where``, a condition over the episodes view) as a
    LeRobot v3.0 dataset in ``folder`` (new, or an empty folder): one frame per step, ``fps`` frames per
    second. ``chunk_size`` files per chunk folder and files of ``file_size_mb`` at most, as LeRobot's
    ``chunks_size`` and ``data_files_size_in_mb``. ``progress``: a bar over the episodes."""
    if not isinstance(fps, int) or fps < 1:
        raise InputError(f"fps: must be a positive whole number of frames per second, got {fps!r}")
    if chunk_size < 1 or not file_size_mb > 0:
        raise InputError(f"chunk_size/file_size_mb: must be positive, got {chunk_size}/{file_size_mb}")
    root = Path(folder)
    check_new(root, field="folder")
    with select(store, run_id=run_id, where=where) as selection:
        with staged(root, field="folder") as stage:
            _write(selection, stage, fps=fps, chunk_size=chunk_size, file_mb=file_size_mb, progress=progress)
        return ExportResult(str(root), selection.episodes, selection.steps, selection.runs, "LeRobot dataset")


def _write(sel: Selection, root: Path, *, fps: int, chunk_size: int, file_mb: float, progress: bool) -> None:
    feats = features(sel.kinds)
    tasks = sel.env_ids
    schema = pa.schema([f.field() for f in feats], metadata={"huggingface": json.dumps(
        {"info": {"features": {f.name: f.hf() for f in feats}}})})
    data = RollingFiles(root, DATA_PATH, chunk_size, file_mb)
    meta = RollingFiles(root, EPISODES_PATH, chunk_size, file_mb)
    totals = {f.name: stats.Totals() for f in feats}
    frames = 0
    with tqdm(total=sel.episodes, desc="export", unit="episode", disable=not progress) as bar:
        for group in sel.groups():
            values = _frames(group, first_frame=frames, fps=fps, tasks=tasks)
            table = pa.table([f.arrow(values[f.source]) for f in feats], schema=schema)
            places = [data.write(table.slice(a, n), schema) for a, n in zip(group.start, group.length)]
            ep_stats = {f.name: f.statistics(values[f.source], group.length) for f in feats}
            for f in feats:
                totals[f.name].add(ep_stats[f.name])
            meta.write(_episode_rows(group, places, ep_stats, frames, meta.place(len(group))))
            frames += group.steps
            bar.update(len(group))
    data.close()
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
    """Parquet files under one path template, written in order: a table goes to the current file unless the
    file would pass ``file_mb`` with it (LeRobot's rule, from the bytes written so far per row), then to the
    next file; ``chunk_size`` files per chunk folder. Snappy with dictionaries, as LeRobot writes."""

    def __init__(self, root: Path, template: str, chunk_size: int, file_mb: float) -> None:
        self.root, self.template, self.chunk_size, self.limit = root, template, chunk_size, file_mb * 2 ** 20
        self.chunk, self.file, self.rows = 0, 0, 0
        self._writer: pq.ParquetWriter | None = None
        self._path: Path | None = None

    def place(self, rows: int) -> tuple[int, int]:
        """The (chunk, file) the next ``rows`` rows go to (a new file when the current one is full)."""
        if self._writer is not None and self._path is not None:
            size = os.path.getsize(self._path)
            if size + size / max(1, self.rows) * rows >= self.limit:
                self.close()
                self.file += 1
                if self.file == self.chunk_size:
                    self.chunk, self.file = self.chunk + 1, 0
        return self.chunk, self.file

    def write(self, table: pa.Table, schema: pa.Schema | None = None) -> tuple[int, int]:
        """Append ``table`` as one row group; where it went."""
        place = self.place(table.num_rows)
        if self._writer is None:
            self._path = self.root / self.template.format(chunk_index=place[0], file_index=place[1])
            self._path.parent.mkdir(parents=True, exist_ok=True)
            self._writer = pq.ParquetWriter(self._path, schema or table.schema, compression="snappy",
                                            use_dictionary=True)
            self.rows = 0
        self._writer.write_table(table)
        self.rows += table.num_rows
        return place

    def close(self) -> None:
        if self._writer is not None:
            self._writer.close()
            self._writer = None


def _episode_rows(group: EpisodeGroup, places: list[tuple[int, int]], ep_stats: dict[str, dict[str, np.ndarray]],
                  first_frame: int, meta_place: tuple[int, int]) -> pa.Table:
    """The group's rows of ``meta/episodes``, in LeRobot's column order."""
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
    cols["meta/episodes/chunk_index"] = pa.array(np.full(n, meta_place[0], np.int64))
    cols["meta/episodes/file_index"] = pa.array(np.full(n, meta_place[1], np.int64))
    cols["trajstore/run_id"] = pa.array(group.run_id, pa.string())
    cols["trajstore/env_id"] = pa.array(group.env_id, pa.string())
    cols["trajstore/episode_id"] = pa.array(group.episode_id.astype(np.int64))
    return pa.table(cols)


def _write_meta(root: Path, sel: Selection, feats: list[Feature], tasks: list[str], totals: dict[str, stats.Totals],
                *, fps: int, chunk_size: int, file_mb: float) -> None:
    """``meta/info.json``, ``meta/stats.json`` and ``meta/tasks.parquet``."""
    info = {"codebase_version": CODEBASE_VERSION, "fps": fps, "features": {f.name: f.info() for f in feats},
            "total_episodes": sel.episodes, "total_frames": sel.steps, "total_tasks": len(tasks),
            "chunks_size": chunk_size, "data_files_size_in_mb": file_mb,
            "video_files_size_in_mb": VIDEO_FILE_SIZE_MB, "data_path": DATA_PATH, "video_path": None,
            "robot_type": None, "splits": {"train": f"0:{sel.episodes}"}}
    _json(root / "meta" / "info.json", info)
    _json(root / "meta" / "stats.json", {name: t.result() for name, t in totals.items()})
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
