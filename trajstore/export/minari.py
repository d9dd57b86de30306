"""Export to Minari: a run's episodes (or those a condition selects) as a local Minari dataset.

Each stored episode of ``T`` steps becomes a Minari episode of ``T + 1`` observations (``obs`` of every step,
then the last step's ``next_obs``) and ``T`` actions, rewards, terminations and truncations, the two flags kept
apart: the inverse of :mod:`trajstore.rollout.minari`. The spaces are the environment's when gymnasium knows
its ``env_id`` and its observations have the stored shape, else a ``Box`` of the stored shape and dtype (an
integer type's range as bounds: ``uint8`` pictures and frame stacks are ``Box(0, 255)``, exported whole), and
``Discrete`` actions for integer scalar actions. ``minari.load_dataset(dataset_id)`` opens the result (it is
written under ``$MINARI_DATASETS_PATH``, default ``~/.minari/datasets``). Needs the ``minari`` extra.

Minari's own ``create_dataset_from_buffers`` takes every episode at once, and its Arrow storage writes one
episode per call, re-measuring the whole dataset folder after each (quadratic: thousands of short episodes took
minutes). Here the episodes stream from :mod:`trajstore.export.episodes` a group at a time, and the Arrow and
Parquet formats are written in minari's layout (a folder per episode holding its table, ``part-0.<format>``, and
``metadata.json``), the values encoded by minari's own encoder a batch of episodes at a time and the files made
on a few threads; the dataset's size is measured once, at the end. Other formats (``hdf5``) go through minari's
``update_episodes``, a group per call.
The dataset is written into a hidden folder of the datasets folder and moved to its id's place when complete:
a failed or interrupted export leaves nothing behind.
"""

from __future__ import annotations

import json
import os
import warnings
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import TYPE_CHECKING, Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from trajstore import progress_bar
from trajstore.errors import InputError
from trajstore.export.episodes import EpisodeGroup, ExportResult, Selection, select
from trajstore.export.target import staged
from trajstore.extras import needed

if TYPE_CHECKING:
    from trajstore.store import Store

BATCH_EPISODES = 1000  # episodes encoded at a time
FILE_THREADS = 8  # episodes' files made at once


def export_minari(store: Store, dataset_id: str, *, run_id: str | Sequence[str] | None = None,
                  where: str | None = None, data_format: str = "arrow", progress: bool = False,
                  include_unfinished: bool = False, agent: str | None = None) -> ExportResult:
    """Write the complete episodes of ``run_id`` (selected by ``where``, a condition over the episodes view;
    ``include_unfinished``: the unfinished ones too) as the
    Minari dataset ``dataset_id`` (``(namespace/)name-vN``); refused if it exists already. ``data_format``:
    one of minari's storage formats (``arrow``, ``parquet``, ``hdf5``). ``progress``: a bar over the
    episodes. Multi-agent episodes are exported one ``agent`` at a time: its own trajectory in each episode (its
    rows in step order, complete when its last row ended it) is a Minari episode."""
    minari = _minari()
    from minari.dataset._storages import get_storage_keys
    from minari.storage.datasets_root_dir import get_dataset_path

    namespace = check_dataset_id(dataset_id)
    if data_format not in get_storage_keys():
        raise InputError(f"data_format: one of {', '.join(get_storage_keys())}, got {data_format!r}")
    try:
        root = get_dataset_path()  # minari makes its datasets folder here
    except OSError as exc:
        raise InputError(f"MINARI_DATASETS_PATH: cannot use {os.environ.get('MINARI_DATASETS_PATH', '~/.minari')} "
                         f"for Minari's datasets: {exc.strerror or exc}") from None
    final = get_dataset_path(dataset_id)
    if final.exists():
        raise InputError(f"dataset_id: a local Minari dataset {dataset_id!r} exists already ({final}); choose "
                         f"another id or delete it (minari delete {dataset_id})")
    with select(store, run_id=run_id, where=where, include_unfinished=include_unfinished, agent=agent) as selection:
        with staged(final, field="dataset_id", stage_in=root,
                    before_move=lambda: _namespace(namespace, get_dataset_path)) as stage:
            _write(selection, stage / "data", dataset_id, data_format, progress, minari.__version__)
        return ExportResult(dataset_id, selection.episodes, selection.steps, selection.runs, "Minari dataset",
                            selection.agent)


def _minari() -> Any:
    with needed("minari", "exporting a Minari dataset"):
        import minari
    return minari


def check_dataset_id(dataset_id: str) -> str | None:
    """The namespace of ``dataset_id``, or an :class:`InputError` unless minari's rules accept the id."""
    from minari.dataset.minari_dataset import DATASET_ID_RE

    match = DATASET_ID_RE.fullmatch(dataset_id) if isinstance(dataset_id, str) else None
    if match is None or match.group("version") is None:
        raise InputError(f"dataset_id: {dataset_id!r} is not a Minari dataset id: (namespace/)name-vN of "
                         "letters, digits, '-' and '_', e.g. cartpole/trajstore-v0")
    return match.group("namespace") or None


def _namespace(namespace: str | None, path_of: Callable[[str], Path]) -> Callable[[], None] | None:
    """Register ``namespace`` (and its parents) as minari does for a new dataset, if it is new; the call that
    removes what this made."""
    if namespace is None:
        return None
    from minari.namespace import NAMESPACE_METADATA_FILENAME, create_namespace, list_local_namespaces

    if namespace in list_local_namespaces():
        return None
    parts = namespace.split("/")
    folders = [path_of("/".join(parts[:i + 1])) for i in range(len(parts))]
    new_folders = [f for f in folders if not f.exists()]
    new_files = [f / NAMESPACE_METADATA_FILENAME for f in folders if not (f / NAMESPACE_METADATA_FILENAME).exists()]
    create_namespace(namespace)

    def undo() -> None:
        for f in new_files:
            f.unlink(missing_ok=True)
        for f in reversed(new_folders):
            try:
                f.rmdir()
            except OSError:
                pass

    return undo


def _write(sel: Selection, data_path: Path, dataset_id: str, data_format: str, progress: bool,
           version: str) -> None:
    from minari.dataset.minari_storage import MinariStorage

    env_id, obs_space, act_space = _spaces(sel)
    spec = _env_spec(env_id)
    storage = MinariStorage.new(data_path, observation_space=obs_space, action_space=act_space, env_spec=spec,
                                data_format=data_format)
    storage.update_metadata({"dataset_id": dataset_id, "algorithm_name": "trajstore export",
                             "description": f"exported by trajstore from {sel.store.uri} at version "
                                            f"{sel.store.version}" + ("" if sel.agent is None else
                                                                       f", the trajectories of agent {sel.agent!r}"),
                             "minari_version": version})
    encode = _encoder() if data_format in ("arrow", "parquet") else None
    with progress_bar.bar(total=sel.episodes, desc="export", unit="episode", enabled=progress) as bar:
        for group in sel.groups():
            for a in range(0, len(group), BATCH_EPISODES):
                if encode is not None:
                    _write_batch(storage, group, a, min(len(group), a + BATCH_EPISODES), encode)
                else:
                    storage.update_episodes(_buffers(group, a, min(len(group), a + BATCH_EPISODES)))
            bar.update(len(group))
    storage.update_metadata({"total_steps": sel.steps, "total_episodes": sel.episodes,
                             "dataset_size": _size_mb(str(storage.data_path))})


def _encoder() -> Callable[..., pa.Array] | None:
    """minari's encoder of a space's values into an Arrow column (what its Arrow storage writes), if this
    minari has it where 0.5 has it."""
    try:
        from minari.dataset._storages.arrow_storage import _encode_space
    except ImportError:
        return None
    return _encode_space


def _write_batch(storage: Any, group: EpisodeGroup, a: int, b: int, encode: Callable[..., pa.Array]) -> None:
    """Episodes ``a:b`` of the group into minari's layout: ``data/<id>/part-0.<format>`` with the episode's
    table (``T + 1`` rows, the last one's action, reward and flags zero) and ``data/<id>/metadata.json``, the
    values encoded in one call per column, the files made on a few threads (making thousands of small files
    waits on the file system far more than on the CPU)."""
    lengths = group.length[a:b]
    lo, hi = int(group.start[a]), int(group.start[b - 1] + lengths[-1])
    c = {name: values[lo:hi] for name, values in group.columns.items()}
    ends = np.cumsum(lengths)  # the row of each episode's extra (last) observation, counted in steps before it
    steps = np.arange(hi - lo) + np.repeat(np.arange(b - a), lengths)  # rows of the steps among T + 1 per episode

    def padded(values: np.ndarray, last: np.ndarray | None = None) -> np.ndarray:
        out = np.zeros((len(values) + b - a, *values.shape[1:]), values.dtype)
        out[steps] = values
        if last is not None:
            out[ends + np.arange(b - a)] = last
        return out

    table = pa.table({
        "observations": encode(storage.observation_space, padded(c["obs"], c["next_obs"][ends - 1]),
                               jpeg_encoding=storage.jpeg_encoding),
        "actions": encode(storage.action_space, padded(c["action"]), jpeg_encoding=storage.jpeg_encoding),
        "rewards": pa.array(padded(c["reward"])), "terminations": pa.array(padded(c["terminated"])),
        "truncations": pa.array(padded(c["truncated"]))})
    first = np.concatenate([[0], ends[:-1] + np.arange(1, b - a)])
    jobs = [(group.first + i, table.slice(int(f), int(n) + 1), int(n)) for i, f, n in
            zip(range(a, b), first, lengths)]
    with ThreadPoolExecutor(FILE_THREADS) as pool:
        for _ in pool.map(lambda job: _write_episode(str(storage.data_path), storage.FORMAT, *job), jobs):
            pass


def _write_episode(data_path: str, data_format: str, episode_id: int, table: pa.Table, steps: int) -> None:
    """One episode's folder, as minari's storage writes it (``ds.write_dataset`` partitioned by episode id)."""
    folder = os.path.join(data_path, str(episode_id))
    os.mkdir(folder)
    if data_format == "parquet":
        pq.write_table(table, os.path.join(folder, "part-0.parquet"))
    else:
        with pa.OSFile(os.path.join(folder, "part-0.arrow"), "wb") as sink, pa.ipc.new_file(sink, table.schema) as w:
            w.write_table(table)
    with open(os.path.join(folder, "metadata.json"), "w") as f:
        f.write(json.dumps({"id": episode_id, "total_steps": steps}))


def _size_mb(path: str) -> float:
    """minari's ``MinariStorage.get_size`` (every file and folder under ``path``, in MB to one decimal), by
    ``os.scandir`` rather than its ``pathlib`` glob, which takes as long as writing the episodes."""
    total, stack = 0, [path]
    while stack:
        with os.scandir(stack.pop()) as entries:
            for entry in entries:
                total += entry.stat(follow_symlinks=False).st_size
                if entry.is_dir(follow_symlinks=False):
                    stack.append(entry.path)
    return float(np.round(total / 1e6, 1))


def _buffers(group: EpisodeGroup, a: int, b: int) -> list[Any]:
    from minari.data_collector import EpisodeBuffer

    out = []
    for i in range(a, b):
        e = group.episode(i)
        out.append(EpisodeBuffer(id=group.first + i, observations=np.concatenate([e.obs, e.next_obs[-1:]]),
                                 actions=e.action, rewards=e.reward, terminations=e.terminated,
                                 truncations=e.truncated))
    return out


def _env_spec(env_id: str | None) -> Any:
    if env_id is None:
        return None
    import gymnasium as gym

    return gym.spec(env_id)


def _spaces(sel: Selection) -> tuple[str | None, Any, Any]:
    """The environment (when there is one, gymnasium knows it and its observations fit) and the observation
    and action spaces."""
    import gymnasium as gym

    obs_dtype, obs_shape = sel.kinds["obs"]
    act_dtype, act_shape = sel.kinds["action"]
    if len(sel.env_ids) == 1:
        env_id = sel.env_ids[0]
        try:
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                env = gym.make(env_id)
        except Exception:  # noqa: BLE001 - an env gymnasium does not know (or cannot make): spaces from the data
            env = None
        if env is not None:
            fits = env.observation_space.shape == obs_shape
            env.close()
            if fits:
                return env_id, env.observation_space, env.action_space
    obs = _box(obs_dtype, obs_shape)
    if np.issubdtype(act_dtype, np.integer) and act_shape == ():
        return None, obs, gym.spaces.Discrete(int(sel.largest("action")) + 1)
    return None, obs, _box(act_dtype, act_shape)


def _box(dtype: np.dtype, shape: tuple[int, ...]) -> Any:
    """A ``Box`` of the stored dtype and shape: an integer type's own range (``uint8`` pictures ``[0, 255]``, as
    gymnasium's pixel environments declare them), floats unbounded. Frame stacks are stored and exported whole,
    as the environment returned them."""
    import gymnasium as gym

    if np.issubdtype(dtype, np.integer):
        info = np.iinfo(dtype)
        return gym.spaces.Box(int(info.min), int(info.max), shape=shape, dtype=dtype)
    return gym.spaces.Box(-np.inf, np.inf, shape=shape, dtype=dtype)
