"""Export to a LeRobot-style dataset: chunked Parquet, one file per episode, with JSON metadata.

The layout of LeRobot's ``v2.1`` datasets, which Hugging Face hosts by the thousand and which any Parquet reader
(pandas, polars, ``datasets.load_dataset("parquet", …)``) opens without trajstore::

    meta/info.json        fps, counts, chunk size, path template, features (dtype and shape of each column)
    meta/episodes.jsonl   one line per episode: episode_index, length, tasks, and trajstore's run_id,
                          env_id and episode_id
    meta/tasks.jsonl      one task per environment (the env_id)
    data/chunk-000/episode_000000.parquet
                          one row per step: observation.state, action, next.observation.state, next.reward,
                          next.terminated, next.truncated, next.done (either flag), episode_index,
                          frame_index, timestamp (frame_index / fps), index (over the dataset), task_index

No video: observations are stored as arrays (``observation.state``), whatever their shape.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from tqdm.auto import tqdm

from trajstore.errors import InputError
from trajstore.export.episodes import ExportResult, as_episode, episodes

if TYPE_CHECKING:
    from trajstore.store import Store

CODEBASE_VERSION = "v2.1"
DATA_PATH = "data/chunk-{episode_chunk:03d}/episode_{episode_index:06d}.parquet"


def export_lerobot(store: Store, folder: str | Path, *, run_id: str | Sequence[str] | None = None,
                   where: str | None = None, fps: int = 30, chunk_size: int = 1000,
                   progress: bool = False) -> ExportResult:
    """Write the episodes of ``run_id`` (selected by ``where``, over the episodes view) under ``folder`` (new or
    empty) in LeRobot's chunked Parquet layout. ``progress``: a bar over the episodes."""
    root = Path(folder)
    if root.exists() and any(root.iterdir()):
        raise InputError(f"folder: {root} exists and is not empty; choose a new folder")
    if fps < 1 or chunk_size < 1:
        raise InputError(f"fps/chunk_size: must be positive, got {fps}/{chunk_size}")
    tables = episodes(store, run_id=run_id, where=where)
    tasks = sorted({t["env_id"][0].as_py() for t in tables})
    lines, index, features = [], 0, None
    for i, steps in enumerate(tqdm(tables, desc="export", unit="episode", disable=not progress)):
        e = as_episode(steps)
        table = _frames(e, i, index, fps, tasks.index(e.env_id))
        path = root / DATA_PATH.format(episode_chunk=i // chunk_size, episode_index=i)
        path.parent.mkdir(parents=True, exist_ok=True)
        pq.write_table(table, path, compression="zstd")
        features = features or _features(table, e, fps)
        lines.append({"episode_index": i, "tasks": [e.env_id], "length": len(e), "run_id": e.run_id,
                      "env_id": e.env_id, "episode_id": e.episode_id})
        index += len(e)
    (root / "meta").mkdir(parents=True, exist_ok=True)
    _jsonl(root / "meta" / "episodes.jsonl", lines)
    _jsonl(root / "meta" / "tasks.jsonl", [{"task_index": i, "task": t} for i, t in enumerate(tasks)])
    info = {"codebase_version": CODEBASE_VERSION, "robot_type": None, "total_episodes": len(lines),
            "total_frames": index, "total_tasks": len(tasks), "total_videos": 0,
            "total_chunks": (len(lines) - 1) // chunk_size + 1, "chunks_size": chunk_size, "fps": fps,
            "splits": {"train": f"0:{len(lines)}"}, "data_path": DATA_PATH, "video_path": None,
            "features": features, "trajstore": {"store": store.uri, "version": store.version}}
    (root / "meta" / "info.json").write_text(json.dumps(info, indent=2) + "\n")
    runs = sorted({line["run_id"] for line in lines})
    return ExportResult(str(root), len(lines), index, runs, "LeRobot-style dataset")


def _frames(e: Any, episode_index: int, first: int, fps: int, task: int) -> pa.Table:
    T = len(e)
    frame = np.arange(T, dtype=np.int64)
    return pa.table({
        "observation.state": _column(e.obs), "action": _column(e.action),
        "next.observation.state": _column(e.next_obs), "next.reward": pa.array(e.reward),
        "next.terminated": pa.array(e.terminated), "next.truncated": pa.array(e.truncated),
        "next.done": pa.array(e.terminated | e.truncated),
        "episode_index": pa.array(np.full(T, episode_index, np.int64)), "frame_index": pa.array(frame),
        "timestamp": pa.array((frame / fps).astype(np.float32)), "index": pa.array(first + frame),
        "task_index": pa.array(np.full(T, task, np.int64)),
    })


def _column(values: np.ndarray) -> pa.Array:
    """``(T, *shape)`` as nested fixed-size lists (a scalar per step as itself)."""
    arr: pa.Array = pa.array(np.ascontiguousarray(values).reshape(-1))
    for size in reversed(values.shape[1:]):
        arr = pa.FixedSizeListArray.from_arrays(arr, size)
    return arr


def _features(table: pa.Table, e: Any, fps: int) -> dict[str, Any]:
    shapes = {"observation.state": e.obs.shape[1:], "next.observation.state": e.next_obs.shape[1:],
              "action": e.action.shape[1:]}
    out = {}
    for field in table.schema:
        t = field.type
        while pa.types.is_fixed_size_list(t):
            t = t.value_type
        shape = list(shapes.get(field.name, ())) or [1]
        out[field.name] = {"dtype": "bool" if pa.types.is_boolean(t) else t.to_pandas_dtype().__name__,
                           "shape": shape, "names": None}
    return out


def _jsonl(path: Path, rows: list[dict[str, Any]]) -> None:
    path.write_text("".join(json.dumps(r) + "\n" for r in rows))
