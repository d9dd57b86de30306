"""The writer: validates time-major batches, cuts them into episodes and commits them to the store.

>>> import numpy as np, trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> with store.writer(run_id="demo", env_id="Toy-v0") as w:
...     n = w.add_batch({"obs": np.zeros((3, 2, 1)), "action": np.zeros((3, 2), int),
...                  "reward": np.ones((3, 2)), "next_obs": np.zeros((3, 2, 1)),
...                  "terminated": np.array([[0, 0], [1, 0], [0, 0]], bool),
...                  "truncated": np.zeros((3, 2), bool)})
>>> store.stats().column("n_traj").to_pylist()
[1]
"""

from __future__ import annotations

import logging
import os
import socket
import threading
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as wait_for
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Mapping, Sequence

import numpy as np
import pyarrow as pa

from trajstore import schema as sch
from trajstore.errors import (
    CommitError,
    CommitUnknownError,
    InputError,
    RemoteError,
    SchemaMismatchError,
    StoreAccessError,
    WriterClosedError,
)
from trajstore.storage.encoding import NEXT, OBS, FileEncoding, check_frame_stack, leaves
from trajstore.storage.names import check_column_name, check_distinct, check_fields, check_id, stored_schema
from trajstore.write import memory
from trajstore.write.buffer import Flush, RowBuffer, Rows, gather
from trajstore.write.episode_ids import EpisodeIds
from trajstore.write.segment import Autoreset, Cursors, Segments, segment
from trajstore.write.sink import CommitHook, Sink

log = logging.getLogger(__name__)

REQUIRED = sch.TRANSITION_COLUMNS
AUTORESET_MODES = ("same-step", "next-step", "off")
ENCODING = 2  # threads that order and encode: a flush that waits sends a big buffer as this many files at once
SPLIT_BYTES = 32 * 1024 * 1024  # what a big buffer is


@dataclass
class _Piece:
    """One buffer on its way to the store: its rows and their stored schema, what the sink made of them (once
    encoded) and its commit."""

    data: Flush
    schema: pa.Schema
    encoding: Future[Any]
    commit: Future[str]


@dataclass(frozen=True)
class _Unstored:
    """A buffer whose write or commit failed, kept for the next flush: its rows, their stored schema (None: not
    reserved yet) and what the sink had made of them if that much succeeded (committed again as it is: the same
    file, the same idempotency key)."""

    data: Flush
    schema: pa.Schema | None = None
    pending: Any = None


class Writer:
    """Appends episodes of one ``(run_id, env_id)`` to a store; use as a context manager.

    Rows are buffered and committed as one Delta Lake append when the buffer passes
    ``flush_bytes`` and on :meth:`flush` / :meth:`close`. Steps of episodes still running are
    committed too; the next call continues their ``step`` and ``episode_id``. A full buffer is put in file
    order and encoded on a thread of its own while the next one fills, two at a time, so the writer holds up to
    about four times ``flush_bytes`` at its peak; :meth:`flush` and :meth:`close` send a big buffer as two files
    encoded at once.

    Every dtype is stored as given (or as ``observation_space``/``action_space`` declare it). ``next_obs`` is
    stored only where it is not the next step's ``obs`` (compared bit for bit on every step), and with
    ``frame_stack={"obs": k}`` (a leaf path: ``"obs.pixels"`` in a Dict observation) that leaf is a stack of its
    last k frames along its first axis, of which each frame is stored once; readers give back what was written
    (see :mod:`~trajstore.storage.encoding`).

    When the store fails (an object store that does not answer, a full disk), the error says how many steps
    are not stored yet; the writer keeps them, in order, and stores them with the next :meth:`flush` or
    :meth:`close` (call it again once the store is back). Steps committed before are never touched.

    Every row records where it happened: ``env_steps``, the writer's env steps over all its envs up to
    and including its time index (``(t + 1) * B`` for the ``t``-th time index since the writer opened,
    counting every index of every call, skipped steps too), and ``wall_time``, spread evenly per time
    index between the previous call (or the writer's opening) and this one.
    """

    def __init__(self, sink: Sink[Any], *, run_id: str, env_id: str, observation_space: Any = None,
                 action_space: Any = None, autoreset: Autoreset = "same-step",
                 flush_bytes: int = 128 * 1024 * 1024, worker_id: str | None = None,
                 frame_stack: Mapping[str, int] | None = None, upkeep: CommitHook | None = None,
                 agents: Sequence[str] | None = None, **lineage: Any) -> None:
        check_id(run_id, field="run_id")
        check_id(env_id, field="env_id")
        if autoreset not in AUTORESET_MODES:
            raise InputError(f"autoreset must be one of {AUTORESET_MODES}, got {autoreset!r}")
        self.sink, self.run_id, self.env_id = sink, run_id, env_id
        self.autoreset: Autoreset = autoreset
        self.flush_bytes = flush_bytes
        _check_lineage_names(lineage)
        self.lineage = {"worker_id": worker_id or process_worker_id(), **lineage}
        if frame_stack is not None and not isinstance(frame_stack, Mapping):
            check_frame_stack(pa.null(), frame_stack)  # raises naming frame_stack
        self.frame_stack = dict(frame_stack or {})
        self.agents = _check_agents(agents, self.frame_stack)
        self.upkeep = upkeep  # told of each commit, on the commit thread; compacts on a thread of its own
        self._types = self._initial_types(observation_space, action_space)
        if OBS in self._types:
            check_frame_stack(self._types[OBS], self.frame_stack)
        self._ids = EpisodeIds()
        self._cursors: Cursors | None = None
        self._buffer: RowBuffer | None = None
        self._buffer_key: tuple[Any, ...] | None = None
        self._reserved: dict[str, tuple[str, str]] = {}  # logical name -> (stored type, physical name)
        self._named = set(self.lineage)  # the names of this writer's columns users gave, checked
        self._repeats: dict[str, pa.Array] = {}
        self._time_indices = 0  # time indices of every accepted call so far
        self._last_us = _now_us()  # wall time of the last accepted call (the opening, before any)
        # Two stages: ordering + Parquet encoding of a buffer (up to ENCODING at a time, one thread each), and
        # fsync + commit of the files in the order they were written (one thread), so syncing one file overlaps
        # encoding the next and the caller goes on adding rows meanwhile.
        self._pieces: list[_Piece] = []
        self._unstored: list[_Unstored] = []
        self._encoder = ThreadPoolExecutor(max_workers=ENCODING, thread_name_prefix="trajstore-encode")
        self._committer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="trajstore-commit")
        self._lock = threading.Lock()
        self._closed = False
        self.steps_written = 0
        self.episodes_completed = 0
        self.files_committed: list[str] = []

    # --- public API -----------------------------------------------------------------------------------

    def add_batch(self, batch: Mapping[str, Any]) -> int:
        """Add a time-major ``(T, B, …)`` batch: T time indices of B envs, as a vector env or a ``lax.scan`` gives them.

        Episodes cross batch boundaries: each env's open episode goes on in the next call, its ``step`` and
        ``episode_id`` continued. ``reward`` is stored as float32, or as float64 when given as float64 in an
        environment with no stored steps (an environment keeps its types). Nothing of the call is kept if any part of
        it is invalid.

        Args:
            batch: ``obs, action, reward, next_obs, terminated, truncated`` (numpy or JAX arrays, ``(T, B, …)``;
                ``obs`` and ``next_obs`` may be dicts of arrays for Dict spaces), optionally ``valid`` (``(T, B)``
                bool, False for steps to skip) and ``extras`` (name → ``(T, B, …)``, each stored as a column; a
                ``numpy.ma.MaskedArray`` of scalars is stored null where masked).

        Returns:
            The number of steps stored (the valid ones).

        Raises:
            InputError: A missing field, a NaN or infinite reward, a name the store cannot hold, another ``B`` than
                the writer's first batch, or a step of an env whose episode ended without a reset (each message
                names the field, the env and the time index).
            SchemaMismatchError: A shape or dtype that does not match the stored table, or a value the stored type
                cannot hold.
            WriterClosedError: The writer was closed.
            StoreAccessError: The store failed while a full buffer was committed; the writer keeps the steps it
                could not store and stores them with the next :meth:`flush` or :meth:`close`.

        Examples:
            >>> import numpy as np
            >>> store = trajstore.open("./trajdata", create=True)
            >>> T, B = 3, 2
            >>> with store.writer(run_id="demo", env_id="Toy-v0") as w:
            ...     w.add_batch({"obs": np.zeros((T, B, 4)), "action": np.zeros((T, B), int),
            ...                  "reward": np.ones((T, B)), "next_obs": np.zeros((T, B, 4)),
            ...                  "terminated": np.array([[0, 0], [1, 0], [0, 0]], bool),
            ...                  "truncated": np.zeros((T, B), bool),
            ...                  "extras": {"value": np.zeros((T, B), np.float32)}})
            6
            >>> store.stats(include_incomplete=True)["n_traj"].to_pylist()  # env 0: one ended, one open; env 1 open
            [3]
        """
        if self.agents is not None:
            raise InputError("this writer stores the agents of multi-agent episodes: "
                             "use trajstore.write.agents.AgentWriter, which gives each row its episode and step")
        return self._add(batch)

    def _add(self, batch: Mapping[str, Any], keys: Mapping[str, np.ndarray] | None = None) -> int:
        """:meth:`add_batch`; ``keys`` (``(T, B)`` arrays), for the rows of agents, give each row's
        ``episode_id``, ``step``, ``env_steps`` and ``env_index`` instead of the lane's own."""
        if self._closed:
            raise WriterClosedError(f"writer for run {self.run_id!r} is closed")
        arrays = _host(batch)
        T, B = _lead_shape(arrays)
        named = self._check_names(arrays.get("extras") or {})
        if self.agents is not None and B != len(self.agents):
            raise InputError(f"batch has B={B} lanes but this writer stores {len(self.agents)} agents")
        valid, done = _masks(arrays, T, B)
        _check_rewards(arrays["reward"], valid, self._types.get("reward") or _reward_type(arrays["reward"]))
        cursors = self._cursors if self._cursors is not None else Cursors.empty(B)
        if cursors.num_envs != B:
            raise InputError(f"batch has B={B} envs but this writer was started with B={cursors.num_envs}; "
                             "use one writer per vector env")
        seg = segment(valid, done, cursors, self._ids, autoreset=self.autoreset)
        now = max(_now_us(), self._last_us)  # a clock set back must not make wall_time go backwards
        rows = _kept_rows(seg, done, T, B)
        if keys is not None:
            rows.episode_id = seg.episode_id = np.asarray(keys["episode_id"], np.int64).reshape(-1)[rows.tm]
            rows.step = seg.step = np.asarray(keys["step"], np.int64).reshape(-1)[rows.tm]
        columns, obs, nxt = self._gathered(arrays, seg, rows, T, B, now, keys)
        self._cursors = seg.cursors
        self._time_indices += T
        self._last_us = now
        self.steps_written += len(rows.tm)
        self.episodes_completed += seg.completed
        self._named.update(named)
        self._buffer_rows(columns, obs, nxt, rows, B)
        return len(rows.tm)

    def add_step(self, obs: Any, action: Any, reward: Any, next_obs: Any, terminated: Any, truncated: Any,
                 *, valid: Any = None, extras: Mapping[str, Any] | None = None) -> int:
        """Add one vector-env step: every array is ``(B, …)``, the batch of :meth:`add_batch` with ``T = 1``.

        Args:
            obs: The observations the actions were taken on.
            action: The actions.
            reward: The rewards.
            next_obs: The observations after the actions (a last step's true final observation).
            terminated: Whether each env's episode terminated at this step.
            truncated: Whether each env's episode was truncated at this step.
            valid: ``(B,)`` bool, False for envs whose step to skip.
            extras: Name → ``(B, …)`` array, each stored as a column.

        Returns:
            The number of steps stored.

        Raises:
            InputError: As :meth:`add_batch`.
            SchemaMismatchError: As :meth:`add_batch`.
            WriterClosedError: The writer was closed.

        Examples:
            >>> import numpy as np
            >>> store = trajstore.open("./trajdata", create=True)
            >>> with store.writer(run_id="demo", env_id="Toy-v0") as w:
            ...     for t in range(3):
            ...         stored = w.add_step(np.zeros((2, 4)), np.array([0, 1]), np.ones(2), np.zeros((2, 4)),
            ...                             terminated=np.array([t == 2, False]), truncated=np.array([False, t == 2]))
            >>> store.episodes()["episode_length"].to_pylist()
            [3, 3]
        """
        batch: dict[str, Any] = {"obs": obs, "action": action, "reward": reward, "next_obs": next_obs,
                                 "terminated": terminated, "truncated": truncated}
        if valid is not None:
            batch["valid"] = valid
        if extras:
            batch["extras"] = extras
        return self.add_batch(_add_time_axis(_host(batch)))

    def reset(self, env_indices: Any = None) -> None:
        """Mark envs as reset (needed with ``autoreset='off'``); an open episode there stays unfinished."""
        if self._cursors is None:
            return
        idx = np.arange(self._cursors.num_envs) if env_indices is None else np.asarray(env_indices)
        self._cursors.state[idx] = 0
        self._cursors.episode_id[idx] = -1
        self._cursors.next_step[idx] = 0

    def flush(self) -> None:
        """Commit everything buffered (and what a failed flush kept) and wait until it is visible to readers."""
        self._submit(parts=ENCODING)
        self._collect(keep=0)

    def close(self) -> None:
        """Flush and release the writer. Idempotent — safe to call multiple times.

        If the flush fails, the writer stays open with the steps it could not store: call ``close()`` again
        once the store is back (they are lost if the process ends first)."""
        if self._closed:
            return
        self.flush()
        self._closed = True
        self._encoder.shutdown(wait=True)
        self._committer.shutdown(wait=True)
        if self.upkeep is not None:
            self.upkeep.close()

    @property
    def steps_unstored(self) -> int:
        """Steps given to the writer that are not committed (buffered, on their way, or kept after a failure)."""
        return ((self._buffer.rows if self._buffer is not None else 0) + sum(p.data.num_rows for p in self._pieces)
                + sum(u.data.num_rows for u in self._unstored))

    @property
    def open_episodes(self) -> int:
        """Envs whose episode is open: started, not yet terminated or truncated."""
        return 0 if self._cursors is None else int((self._cursors.state == 1).sum())

    def __enter__(self) -> Writer:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- internals ------------------------------------------------------------------------------------

    def _initial_types(self, observation_space: Any, action_space: Any) -> dict[str, pa.DataType]:
        """The types this environment's stored steps have (an environment keeps them), and the declared spaces'."""
        stored = self.sink.stored_schema(env_id=self.env_id)
        types: dict[str, pa.DataType] = {f.name: f.type for f in stored} if stored is not None else {}
        if self.agents is not None:  # the agents of one env may have spaces of their own: each writer declares its
            types = {n: t for n, t in types.items() if n not in (OBS, NEXT, "action")}
        declared: dict[str, pa.DataType] = {}
        if observation_space is not None:
            declared[OBS] = declared[NEXT] = sch.type_of_space(observation_space, role="observation")
        if action_space is not None:
            declared["action"] = sch.type_of_space(action_space, role="action")
        for name, t in declared.items():
            check_fields(t, field=name)
            if name in types and not sch.compatible(types[name], t):
                raise SchemaMismatchError(f"{name}: the stored steps of env_id {self.env_id!r} hold "
                                          f"{sch.describe(types[name])}, but the given space needs {sch.describe(t)}; "
                                          "an environment keeps its types: write this one under another env_id")
            types.setdefault(name, t)
        return types

    def _type_for(self, name: str, value: Any, lead: int) -> pa.DataType:
        if name not in self._types:
            known = {**sch.lineage_columns(), **sch.fixed_types()}
            accepted = sch.accepted_type(name, value)  # a float64 reward kept as float64
            self._types[name] = accepted or known.get(name) or sch.type_of_array(name, value, lead)
            check_fields(self._types[name], field=name)  # a dict's keys: struct fields every engine can hold
            if name == OBS:
                check_frame_stack(self._types[OBS], self.frame_stack)
        return self._types[name]

    def _gathered(self, arrays: dict[str, Any], seg: Segments, rows: Rows, T: int, B: int, now: int,
                  keys: Mapping[str, np.ndarray] | None = None
                  ) -> tuple[dict[str, pa.Array | None], dict[str, np.ndarray], dict[str, np.ndarray]]:
        """The call's kept rows of every column (each gathered once), and obs/next_obs by leaf as contiguous
        ``(T*B, …)`` arrays of the stored dtype; nothing of the call is kept if a field is refused."""
        n = len(rows.tm)
        cols: dict[str, pa.Array | None] = {"episode_id": pa.array(seg.episode_id, pa.int64()),
                                            "step": pa.array(_converted(seg.step, np.int32))}
        base_types = dict(self._types)
        try:
            obs_t = self._type_for(OBS, arrays[OBS], 2)
            if self._types.setdefault(NEXT, obs_t) != obs_t:
                raise SchemaMismatchError(f"next_obs: the stored steps of env_id {self.env_id!r} hold "
                                          f"{sch.describe(self._types[NEXT])}, obs {sch.describe(obs_t)}; next_obs "
                                          "must be of the observation's type")
            obs = _leaves_of(OBS, arrays[OBS], obs_t, T, B)
            nxt = _leaves_of(NEXT, arrays[NEXT], obs_t, T, B)
            for name in ("obs", "action", "reward", "next_obs", "terminated", "truncated"):
                if name in (OBS, NEXT):
                    cols[name] = None  # filled by the buffer, encoded
                    continue
                t = self._type_for(name, arrays[name], 2)
                cols[name] = sch.to_arrow(name, gather(arrays[name], rows.tm), t, n)
            cols["wall_time"] = pa.array(memory.take(_interpolated_us(self._last_us, now, T), rows.tick),
                                         pa.timestamp("us", tz="UTC"))
            if keys is None:
                env_steps = np.add(rows.tick, self._time_indices + 1, out=memory.empty(n, np.int64))
                env_steps *= B
                cols["env_steps"] = pa.array(env_steps, pa.int64())
                cols["env_index"] = pa.array(_converted(rows.env, np.int32))
            else:
                cols["env_steps"] = pa.array(np.asarray(keys["env_steps"], np.int64).reshape(-1)[rows.tm])
                cols["env_index"] = pa.array(np.asarray(keys["env_index"], np.int32).reshape(-1)[rows.tm])
            if self.agents is not None:
                # each row's agent taken from the lanes' names by Arrow (no Python string per row)
                cols["agent_id"] = pa.array(self.agents, pa.string()).take(pa.array(rows.env))
            for name, value in self.lineage.items():
                cols[name] = self._lineage(name, value, rows.env, B, n)
            for name, value in (arrays.get("extras") or {}).items():
                _check_extra(name, value, T, B)
                cols[name] = sch.to_arrow(name, gather(value, rows.tm), self._type_for(name, value, 2), n)
        except Exception:
            self._types = base_types  # a refused call must not fix column types for the next one
            raise
        return cols, obs, nxt

    def _check_names(self, extras: Any) -> list[str]:
        """The names of ``extras`` this writer has not had yet, each refused unless a column users give can take it
        (:func:`~trajstore.storage.names.check_column_name`) and it differs in more than case from every other
        column of the call, of this writer and of the table (whose columns are read once per new name)."""
        if not isinstance(extras, Mapping):
            raise InputError(f"extras: expected a mapping of column name to array, got {type(extras).__name__}")
        given = next((name for name in extras if name in self.lineage), None)
        if given is not None:
            raise InputError(f"extras: {given!r} is also given as a lineage value of this writer; "
                             "give one of them another name")
        new = [name for name in extras if name not in self._named]
        for name in new:
            if name in RESERVED_EXTRAS:
                raise InputError(f"extras: {name!r} is a reserved column name")
            check_column_name(name, field="extras")
        if new:
            check_distinct(list(extras), [*self.sink.column_names(), *self._named], field="extras")
        return new

    def _lineage(self, name: str, value: Any, env: np.ndarray, B: int, n: int) -> pa.Array:
        """A lineage column; a per-writer scalar is converted and repeated once, then sliced by later calls."""
        t = self._type_for(name, value, 0)
        if np.ndim(value) != 0:
            return _lineage_column(name, value, env, B, n, t)
        if name not in self._repeats or len(self._repeats[name]) < n:
            self._repeats[name] = _lineage_column(name, value, env, B, n, t)
        return self._repeats[name].slice(0, n)

    def _buffer_rows(self, columns: dict[str, pa.Array | None], obs: dict[str, np.ndarray],
                     nxt: dict[str, np.ndarray], rows: Rows, B: int) -> None:
        key = tuple((name, None if a is None else sch.describe(a.type)) for name, a in columns.items())
        if self._buffer is not None and self._buffer and key != self._buffer_key:
            self._submit()  # other columns: the rows so far go to a file of their own
        if self._buffer is None:
            self._buffer = RowBuffer(B, self._types[OBS], FileEncoding.for_obs(self._types[OBS],
                                                                         frame_stack=self.frame_stack),
                                     compact=self.agents is None)
        self._buffer_key = key
        self._buffer.add(columns, obs, nxt, rows)
        if self._buffer.nbytes >= self.flush_bytes:
            self._submit()

    def _submit(self, parts: int = 1) -> None:
        """Hand what a failed flush kept, then the buffer, to the encoding threads (in that order). ``parts``:
        a buffer of at least ``SPLIT_BYTES`` goes as that many files, encoded at once (a flush that waits for
        them: nothing else would use the other cores)."""
        unstored, self._unstored = self._unstored, []
        for i, kept in enumerate(unstored):
            try:
                self._send(kept.data, kept.schema or self._stored_schema(kept.data), kept.pending)
            except BaseException:
                self._unstored[len(self._unstored):] = unstored[i:]  # not handed over yet: kept, in order
                raise
        if not self._buffer:
            return
        big = self._buffer.nbytes >= SPLIT_BYTES
        raw = self._buffer.take()
        try:
            schema = self._stored_schema(raw)
        except BaseException:  # the columns could not be reserved: kept as given, prepared at the next flush
            self._unstored.append(_Unstored(raw))
            raise
        pieces = raw.split(parts) if big and parts > 1 else [raw]
        for i, piece in enumerate(pieces):
            try:
                self._send(piece, schema, together=i > 0)
            except BaseException:
                self._unstored.extend(_Unstored(p, schema) for p in pieces[i:])
                raise

    def _send(self, data: Flush, schema: pa.Schema, pending: Any = None, *, together: bool = False) -> None:
        """Order and encode ``data`` (unless ``pending`` is what the sink made of it already) on an encoding
        thread, and commit it after the files before it. One buffer is encoded at a time (each holds its rows
        twice meanwhile: as added and in file order), the one before it maybe still committing; ``together``:
        a part of the same buffer as the one before, encoded at the same time."""
        if not together:
            self._collect(keep=ENCODING - 1)
            wait_for([p.encoding for p in self._pieces[:len(self._pieces) - ENCODING + 1]])
        if pending is None:
            encoding = self._encoder.submit(self._write, data, schema)
        else:
            encoding = Future()
            encoding.set_result(pending)
        previous = self._pieces[-1].commit if self._pieces else None
        commit = self._committer.submit(_commit_in_order, self.sink, encoding, previous, self._after_commit)
        self._pieces.append(_Piece(data, schema, encoding, commit))

    def _write(self, data: Flush, schema: pa.Schema) -> Any:
        """On an encoding thread: the rows in file order under their stored names, written by the sink. Once
        written, the rows are let go (a failed commit is retried with the file the sink made)."""
        written = self.sink.write(pa.Table.from_arrays(data.ordered().columns, schema=schema), run_id=self.run_id,
                                  env_id=self.env_id)
        data.release()
        return written

    def _after_commit(self) -> None:
        if self.upkeep is not None:
            self.upkeep.wrote(self.run_id, self.env_id)

    def _stored_schema(self, data: Flush) -> pa.Schema:
        """The schema of one file's rows under their physical names (reserved and declared in the log first),
        with its format (see :func:`~trajstore.storage.names.stored_schema`)."""
        fmt = FileEncoding.for_obs(self._types[OBS], frame_stack=self.frame_stack)
        return stored_schema(data.schema, fmt, self._types, self._reserve)

    def _reserve(self, types: Mapping[str, pa.DataType], logical: Mapping[str, pa.DataType],
                 declared: Mapping[str, Mapping[str, Any] | None]) -> dict[str, str]:
        """The sink's names for ``types``, asked once per column and type."""
        changed = {n: t for n, t in types.items() if self._reserved.get(n, ("", ""))[0] != sch.describe(t)}
        if changed:
            got = self.sink.reserve(changed, {n: logical[n] for n in changed}, {n: declared.get(n) for n in changed})
            for name, physical in got.items():
                self._reserved[name] = (sch.describe(changed[name]), physical)
        return {n: self._reserved[n][1] for n in types}

    def _collect(self, *, keep: int) -> None:
        """Record finished commits in order, waiting until at most ``keep`` are pending. At the first failure,
        that buffer and every one after it are kept for the next flush, and the error says so."""
        while self._pieces and (len(self._pieces) > keep or self._pieces[0].commit.done()):
            try:
                path = self._pieces[0].commit.result()
            except BaseException as exc:
                error = self._keep_unstored(exc)
                if error is exc:
                    raise
                raise error from exc
            self._pieces.pop(0)
            self.files_committed.append(path)

    def _keep_unstored(self, exc: BaseException) -> BaseException:
        """Move every buffer on its way (the failed one first; the commits after it fail with it) back to the
        writer, and the error to raise: ``exc``'s, saying how many steps are not stored."""
        wait_for([f for p in self._pieces for f in (p.commit, p.encoding)])  # a file written meanwhile is kept
        for piece in self._pieces:
            encoded = piece.encoding.done() and not piece.encoding.cancelled() and piece.encoding.exception() is None
            self._unstored.append(_Unstored(piece.data, piece.schema, piece.encoding.result() if encoded else None))
        self._pieces = []
        return _not_stored(exc, self.steps_unstored, self.run_id)


def process_worker_id() -> str:
    """The ``worker_id`` a writer stores when given none: this process, as ``host:pid``."""
    return f"{socket.gethostname()}:{os.getpid()}"


def _not_stored(exc: BaseException, steps: int, run_id: str) -> BaseException:
    """``exc`` again (same type), its message saying that ``steps`` steps are kept for the next flush."""
    note = (f"; {steps} steps of run {run_id!r} are not stored yet: the writer keeps them for its next flush() or "
            "close() (lost if the process ends first)")
    if isinstance(exc, CommitUnknownError):
        return CommitUnknownError(f"{exc}; the writer keeps the {steps} steps of run {run_id!r} it has not seen "
                                  "committed: its next flush() or close() looks for them in the log and sends only "
                                  "what is not there (lost if the process ends first)")
    if isinstance(exc, RemoteError):
        return RemoteError(exc.status, exc.title, f"{exc.detail or ''}{note}")
    for kind in (StoreAccessError, CommitError):
        if type(exc) is kind:
            return kind(f"{exc}{note}")
    exc.add_note(note.removeprefix("; "))
    return exc


def _commit_in_order(sink: Sink[Any], written: Future[Any], previous: Future[str] | None,
                     after: Any = None) -> str:
    """Commit a buffer once it is encoded and the one before it is committed (a failure stops the chain), then
    call ``after()`` (which tells the writer's upkeep, and returns at once)."""
    if previous is not None:
        previous.result()
    where = sink.commit(written.result())
    if after is not None:
        after()
    return where


# --- helpers (pure functions over the batch) --------------------------------------------------------------

def _host(batch: Mapping[str, Any]) -> dict[str, Any]:
    """The batch with every (JAX or numpy) array copied to host memory once."""
    if not isinstance(batch, Mapping):
        raise InputError(f"batch must be a mapping of column name to array, got {type(batch).__name__}")
    missing = [k for k in REQUIRED if k not in batch]
    if missing:
        raise InputError(f"batch is missing {missing}; expected {list(REQUIRED)} (+ optional valid, extras)")
    unknown = set(batch) - set(REQUIRED) - {"valid", "extras"}
    if unknown:
        raise InputError(f"batch has unknown keys {sorted(unknown)}; put per-step extras under batch['extras']")
    return {k: _to_host(v) for k, v in batch.items()}


def _to_host(value: Any) -> Any:
    if isinstance(value, Mapping):
        return {k: _to_host(v) for k, v in value.items()}
    return value if isinstance(value, np.ma.MaskedArray) else np.asarray(value)  # masked: null where masked


def _lead_shape(arrays: dict[str, Any]) -> tuple[int, int]:
    """The batch's ``(T, B)``: the leading dims every field shares, else an error naming the fields that differ
    from the others (see :func:`_odd_ones_out`)."""
    reward = arrays["reward"]
    if reward.ndim != 2:
        raise InputError(f"reward: expected a time-major (T, B) array, got shape {reward.shape}")
    shapes = {leaf_name: leaf.shape for name in ("reward", "obs", "action", "next_obs", "terminated", "truncated",
                                                  "valid") if name in arrays
              for leaf_name, leaf in _leaves(name, arrays[name])}
    if len({shape[:2] for shape in shapes.values()}) > 1:
        raise InputError(_odd_ones_out(shapes))
    return reward.shape[0], reward.shape[1]


def _odd_ones_out(shapes: dict[str, tuple[int, ...]]) -> str:
    """What is wrong with fields whose leading dims differ: the leading dims most fields share are the batch's
    ``(T, B)``, and each other field is named with its shape; with no such majority (a tie), every group is named."""
    groups: dict[tuple[int, ...], list[str]] = {}
    for name, shape in shapes.items():
        groups.setdefault(shape[:2], []).append(name)
    ranked = sorted(groups.items(), key=lambda item: -len(item[1]))
    (lead, most), runner_up = ranked[0], ranked[1][1]
    if len(most) == len(runner_up):
        named = "; ".join(f"{_listed(names)} {'has' if len(names) == 1 else 'have'} leading dims {dims}"
                          for dims, names in ranked)
        return f"{named}: the fields disagree on the batch's leading dims (T, B); give every field the same (T, B)"
    odd = {name: shape for name, shape in shapes.items() if shape[:2] != lead}
    got = ", ".join(str(shape) for shape in odd.values())
    return (f"{_listed(list(odd))}: expected leading dims (T, B) = {lead} like {_listed(most)}, got shape"
            f"{'s' if len(odd) > 1 else ''} {got}")


def _listed(names: list[str], most: int = 5) -> str:
    """``names`` for a message: ``a, b and c``, or the first ``most`` and how many more."""
    if len(names) > most:
        return f"{', '.join(names[:most])} and {len(names) - most} more"
    return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"


def _leaves(name: str, value: Any) -> list[tuple[str, np.ndarray]]:
    if isinstance(value, Mapping):
        return [leaf for k, v in value.items() for leaf in _leaves(f"{name}.{k}", v)]
    return [(name, value)]


def _masks(arrays: dict[str, Any], T: int, B: int) -> tuple[np.ndarray, np.ndarray]:
    for name in ("terminated", "truncated", "valid"):
        if name in arrays and arrays[name].shape != (T, B):
            raise InputError(f"{name}: expected shape ({T}, {B}), got {arrays[name].shape}")
        if name in arrays and arrays[name].dtype.kind not in ("bui" if name == "valid" else "b"):
            raise InputError(f"{name}: expected a bool array, got dtype {arrays[name].dtype}")
    valid = arrays["valid"].astype(bool) if "valid" in arrays else np.ones((T, B), bool)
    return valid, (arrays["terminated"].astype(bool) | arrays["truncated"].astype(bool))


def _reward_type(reward: np.ndarray) -> pa.DataType:
    """The type rewards are stored as in an environment that has no stored steps yet: float64 when they are given
    as float64, else float32 (the schema's type)."""
    return sch.accepted_type("reward", reward) or sch.fixed_types()["reward"]


def _check_rewards(reward: np.ndarray, valid: np.ndarray, stored: pa.DataType) -> None:
    if reward.dtype.kind not in "fiub":
        raise InputError(f"reward: expected a float array, got dtype {reward.dtype}")
    finite = np.isfinite(reward)
    if stored == pa.float32() and reward.dtype.itemsize > 4:  # finite in float64 may be inf in float32
        finite &= np.abs(reward) <= np.finfo(np.float32).max
    bad = valid & ~finite
    if bad.any():
        t, b = (int(i[0]) for i in np.nonzero(bad))
        raise InputError(f"reward must be finite (as {stored}, the table's reward type): got {reward[t, b]} "
                         f"at env {b}, t={t}")


WRITER_COLUMNS = frozenset(c["name"] for c in sch.step_columns())  # filled by the writer, never by its caller
RESERVED_EXTRAS = WRITER_COLUMNS | {"env_index"}  # names no extra (an info key, a policy output) may take


def _check_agents(agents: Sequence[str] | None, frame_stack: Mapping[str, int]) -> list[str] | None:
    """The agents a writer's lanes are (one lane each), checked; None for a single-agent writer."""
    if agents is None:
        return None
    names = list(agents)
    if not names or any(not isinstance(a, str) or not a for a in names) or len(set(names)) != len(names):
        raise InputError(f"agents: expected distinct non-empty agent names, got {names!r}")
    for name in names:
        check_id(name, field="agent_id")
    if frame_stack:
        raise InputError("frame_stack: not for the agents of multi-agent episodes (each agent's next_obs is "
                         "stored whole); stack the frames in the observation instead")
    return names


def _check_lineage_names(lineage: Mapping[str, Any]) -> None:
    """Refuse lineage values under a name the writer fills itself, one no column users give can take
    (:func:`~trajstore.storage.names.check_column_name`), or two names that differ only in case."""
    reserved = sorted(WRITER_COLUMNS & set(lineage))
    if reserved:
        raise InputError(f"{reserved[0]}: a column the writer fills itself, not a lineage value; "
                         "give your own value under another name")
    for name in lineage:
        check_column_name(name, field="lineage")
    check_distinct(["worker_id", *lineage], field="lineage")


def _check_extra(name: str, value: Any, T: int, B: int) -> None:
    for leaf_name, leaf in _leaves(f"extras.{name}", value):
        if leaf.shape[:2] != (T, B):
            raise InputError(f"{leaf_name}: expected leading dims (T, B) = ({T}, {B}), got shape {leaf.shape}")


def _kept_rows(seg: Segments, done: np.ndarray, T: int, B: int) -> Rows:
    """The kept rows of a cut: env-major, each with its time-major index into the call's ``(T*B, …)`` arrays."""
    n = len(seg.rows)
    env = np.floor_divide(seg.rows, T, out=memory.empty(n, np.int64))
    tick = np.multiply(env, T, out=memory.empty(n, np.int64))
    np.subtract(seg.rows, tick, out=tick)
    tm = np.multiply(tick, B, out=memory.empty(n, np.int64))
    tm += env
    return Rows(tm, env, seg.episode_id, seg.step, memory.take(done.reshape(-1), tm), tick)


def _leaves_of(name: str, value: Any, t: pa.DataType, T: int, B: int) -> dict[str, np.ndarray]:
    """An observation batch by leaf path (``obs``, ``obs.pixels``), each checked against its type in ``t`` and
    made a contiguous ``(T*B, *shape)`` array of the stored dtype (a copy only where it was not one)."""
    out = {}
    for path, leaf_t in leaves(t):
        leaf = _at(name, value, path, t)
        want = sch.leaf_of_type(leaf_t)
        arr = np.asarray(leaf)
        sch.check_leaf(name + path[len(OBS):], arr.shape[2:], arr.dtype, want)
        fitted = sch.fitting(name, arr, want.dtype)
        out[path] = np.ascontiguousarray(fitted, dtype=want.dtype).reshape(T * B, *want.shape)
    return out


def _at(name: str, value: Any, path: str, t: pa.DataType) -> Any:
    """The leaf at ``path`` of a (dict) batch value; refused naming the field when the keys differ."""
    for part in path.split(".")[1:]:
        if not isinstance(value, Mapping) or set(value) != {f.name for f in t}:
            expected = sorted(f.name for f in t)
            got = sorted(value) if isinstance(value, Mapping) else type(value).__name__
            raise SchemaMismatchError(f"{name}: expected a dict with keys {expected}, got {got}")
        value, t, name = value[part], t.field(part).type, f"{name}.{part}"
    if isinstance(value, Mapping):
        raise SchemaMismatchError(f"{name}: expected an array, got a dict with keys {sorted(value)}")
    return value


def _lineage_column(name: str, value: Any, env: np.ndarray, B: int, n: int, t: pa.DataType) -> pa.Array:
    arr = np.asarray(value)
    if arr.ndim == 0:  # one value per writer: converted once, repeated by Arrow (not n Python strings)
        return pa.repeat(sch.to_arrow(name, arr.reshape(1), t, 1)[0], n)
    if arr.shape == (B,):
        return sch.to_arrow(name, arr[env], t, n)
    raise InputError(f"{name}: a writer lineage value must be a scalar or one value per env (shape ({B},)), "
                     f"got shape {arr.shape}")


def _converted(values: np.ndarray, dtype: Any) -> np.ndarray:
    """``values.astype(dtype)`` in Arrow's memory pool (:mod:`~trajstore.write.memory`)."""
    out = memory.empty(values.shape, dtype)
    out[...] = values
    return out


def _add_time_axis(batch: Mapping[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in batch.items():
        out[k] = _add_time_axis(v) if isinstance(v, Mapping) else np.asarray(v)[None]
    return out


def _now_us() -> int:
    return int(datetime.now(timezone.utc).timestamp() * 1_000_000)


def _interpolated_us(last: int, now: int, T: int) -> np.ndarray:
    """``T`` wall times (µs) evenly from just after ``last`` to ``now``, the last one ``now``: one per time index."""
    return last + (now - last) * np.arange(1, T + 1, dtype=np.int64) // max(T, 1)
