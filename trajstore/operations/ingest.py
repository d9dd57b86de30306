"""Appending rows that arrive already cut into episodes (from a :class:`~trajstore.remote.writer.RemoteWriter`).

A remote writer segments its batches itself, exactly as a local :class:`~trajstore.write.writer.Writer`
does, and sends each commit as an Arrow table of rows, encoded as its files would be (encoding 2, the format in
the stream's schema metadata ``trajstore``, logical column names; see :mod:`~trajstore.storage.encoding`).
:func:`validate_rows` checks those rows against the environment's stored types, each episode's rows among
themselves, and every invariant of their encoding (the service decodes them: nothing the client says is trusted);
:func:`append_rows` also checks that they continue what the store holds (:mod:`~trajstore.operations.continuity`),
stores them under the physical names the log resolves (:mod:`~trajstore.storage.names`) and commits them once per
idempotency key.

Both hold under concurrency: the rows are checked against one committed version V of the log and committed
as version V+1 or not at all (a newer commit sends them back to be checked again), so two requests can never
both append step 5 of one episode; within a process, ingests of one store take turns. The key's app
transaction records a digest of the request (:func:`request_digest`) in the log, so a retry of the same
request is a no-op and another request under a used key is refused, even after a restart. A writer that numbers its
requests keeps one key for all of them (:class:`IdempotencyKey`).
"""

from __future__ import annotations

import hashlib
import json
import threading
from collections import Counter
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import Any, Callable, Sequence

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc

from trajstore import schema as sch
from trajstore.errors import CommitError, ConflictError, InputError, SchemaMismatchError
from trajstore.operations.continuity import Spans, StoredEnd, check_continues, request_spans, stored_ends
from trajstore.retry import tries
from trajstore.storage.encoding import (
    NEXT,
    OBS,
    EncodingError,
    FileEncoding,
    check_frame_stack,
    decode_batches,
    logical_schema,
    physical_next_type,
    physical_schema,
)
from trajstore.storage.log import DataFile, TableState, WrittenFile
from trajstore.storage.names import check_column_name, check_distinct, check_fields, check_id, stored_rows
from trajstore.storage.table import StepsTable

KEYS = {"episode_id": pa.int64(), "step": pa.int32()}
ATTEMPTS = 30  # reads of the log per request while other processes keep committing before it
LEGACY_DIGEST = 1  # what trajstore recorded for every key before it kept the request's digest
CHECK_BYTES = 16 * 1024 * 1024  # decoded obs and next_obs at a time while the rows' encoding is checked
DIGEST_HELD = 8 * 1024 * 1024  # rows up to this are serialized whole for their digest, larger ones hashed as written
PHYSICAL_KEPT = 1_000  # (rows' schema, log's schema) pairs whose physical schema is kept, then forgotten at once

Ends = Callable[[Sequence[DataFile], np.ndarray], list[StoredEnd]]  # what files hold of episodes (stored_ends)


def validate_rows(rows: pa.Table, stored: pa.Schema | None) -> pa.Table:
    """``rows`` checked and cast to the store's types (``stored``: the environment's, logical); raises naming the
    first bad field (and, for an episode whose rows repeat or skip a step or go on after it ended, or rows that
    break their encoding, the episode and the step)."""
    return _checked(rows, stored)[0]


def _checked(rows: pa.Table, stored: pa.Schema | None) -> tuple[pa.Table, Spans]:
    """:func:`validate_rows`, and the first and last step of each episode in ``rows``."""
    fmt = row_format(rows)
    _check_columns(rows, fmt)
    rows = _stamped(_cast_env_steps(_cast_keys(rows)))
    _check_flags_and_rewards(rows)
    ended = pc.or_(rows["terminated"], rows["truncated"]).to_numpy()
    agents = _agent_ids(rows)
    _check_agent_names(agents)
    spans = request_spans(rows["episode_id"].to_numpy(), rows["step"].to_numpy(), ended, agents)
    _check_encoding(rows, fmt)
    rows = rows if stored is None else _fitted(rows, _kept_types(stored, agents), fmt)
    return rows.replace_schema_metadata(fmt.metadata()), spans


def row_format(rows: pa.Table) -> FileEncoding:
    """The format the rows say they are in (encoding 1 without one), refused naming it when it is no format or
    renames columns (rows name their columns logically; the service resolves physical names)."""
    try:
        fmt = FileEncoding.of(rows.schema.metadata, where="rows")
    except EncodingError as exc:
        raise InputError(f"{str(exc).replace('rows: its', 'rows: their')}") from None
    if fmt.columns:
        raise InputError(f"{'trajstore'}: rows name their columns logically (obs, action, …); got the physical "
                         f"names {dict(fmt.columns)}")
    return fmt


def _check_encoding(rows: pa.Table, fmt: FileEncoding) -> None:
    """Every invariant of the rows' encoding, checked by decoding them (what a reader will do)."""
    if not fmt.encoded or OBS not in rows.column_names:
        return
    obs = logical_schema(rows.schema, fmt).field(OBS).type
    check_frame_stack(obs, fmt.stacks)
    if NEXT in rows.column_names and sch.describe(rows[NEXT].type) != sch.describe(physical_next_type(obs, fmt)):
        raise InputError(f"next_obs: encoded rows store it as {sch.describe(physical_next_type(obs, fmt))} (obs "
                         f"{sch.describe(obs)}), got {sch.describe(rows[NEXT].type)}")
    pieces = rows.to_batches(max_chunksize=max(1, CHECK_BYTES // (2 * _value_bytes(obs))))
    try:  # piece by piece: the decoded observations (k frames a row for a stack of k) are let go at once
        for _ in decode_batches(iter(pieces), fmt, obs, where="rows"):
            pass
    except EncodingError as exc:
        raise InputError(f"next_obs/obs: {exc}; rows must be encoded as the writer encodes them") from None


def _value_bytes(t: pa.DataType) -> int:
    """The bytes of one value of ``t`` (an observation: numbers in fixed-size lists and structs); 1 KiB for a
    value of variable size."""
    if pa.types.is_fixed_size_list(t):
        return t.list_size * _value_bytes(t.value_type)
    if pa.types.is_struct(t):
        return max(1, sum(_value_bytes(f.type) for f in t))
    if pa.types.is_fixed_size_binary(t):
        return t.byte_width
    try:
        return max(1, t.bit_width // 8)
    except ValueError:  # lists, strings: no width
        return 1024


def _check_columns(rows: pa.Table, fmt: FileEncoding) -> None:
    repeated = [n for n, k in Counter(rows.column_names).items() if k > 1]
    if repeated:
        raise InputError(f"{repeated[0]}: {rows.column_names.count(repeated[0])} columns of the body have this name;"
                         " each column once")
    _check_names(rows.schema)
    for field in rows.schema:
        _check_storable(field.name, field.type)
    present = set(rows.column_names)
    for name in sch.PARTITION_COLUMNS:
        if name in present:
            raise InputError(f"{name}: comes from the request (path or query), not from a column of the body")
    missing = [c for c in (*KEYS, *sch.TRANSITION_COLUMNS) if c not in present]
    if missing:
        raise InputError(f"{missing[0]}: missing column; rows need {[*KEYS, *sch.TRANSITION_COLUMNS]}")
    for name in rows.column_names:
        if name == NEXT and fmt.encoded:
            continue  # null where it is the next row's obs (checked with the encoding)
        if rows[name].null_count and name in (*KEYS, *sch.TRANSITION_COLUMNS):
            raise InputError(f"{name}: {rows[name].null_count} null value(s); every row needs one")


def _check_names(schema: pa.Schema) -> None:
    """Refuse, by name, a column other than the schema's own whose name no column users give can take, a struct
    field no engine can hold, and two columns that differ only in case (the one rule of
    :mod:`~trajstore.storage.names`, as the local writer checks its extras)."""
    own = {c["name"] for c in sch.step_columns()} | set(sch.lineage_columns())
    for field in schema:
        if field.name not in own:
            check_column_name(field.name, field="columns")
        check_fields(field.type, field=field.name)
    check_distinct(schema.names, field="columns")


def _check_storable(name: str, t: pa.DataType) -> None:
    """Refuse a column type the table cannot hold (before anything is written or committed: a type the commit
    log records but cannot give back would break every later read of its schema): numbers, booleans, strings
    and UTC timestamps, alone or in fixed-size lists, lists and structs of them, as the local writer stores."""
    leaf = t
    while pa.types.is_fixed_size_list(leaf) or pa.types.is_list(leaf) or pa.types.is_large_list(leaf):
        leaf = leaf.value_type
    if pa.types.is_struct(leaf):  # its fields' names are checked by _check_names
        for f in leaf:
            _check_storable(f"{name}.{f.name}", f.type)
        return
    plain = pa.types.is_integer(leaf) or pa.types.is_boolean(leaf) or pa.types.is_string(leaf) or \
        pa.types.is_large_string(leaf) or leaf in (pa.float16(), pa.float32(), pa.float64())
    utc = pa.types.is_timestamp(leaf) and leaf.tz in (None, "UTC")
    frames = pa.types.is_fixed_size_binary(leaf)  # image frames of encoded rows, as their bytes
    if not (plain or utc or frames):
        raise InputError(f"{name}: columns of type {t} cannot be stored; expected numbers (integers, float16, "
                         "float32, float64), booleans, strings or UTC timestamps, or fixed-size lists, lists or "
                         "structs of them (or, in encoded rows, image frames as fixed-size binary)")


def _stamped(rows: pa.Table) -> pa.Table:
    """``rows`` with a ``wall_time``: stamped on arrival when the sender did not."""
    if "wall_time" in rows.column_names:
        return rows
    now = pa.scalar(datetime.now(timezone.utc), pa.timestamp("us", tz="UTC"))
    return rows.append_column("wall_time", pa.repeat(now, rows.num_rows))


def _fitted(rows: pa.Table, stored: pa.Schema, fmt: FileEncoding) -> pa.Table:
    """``rows`` cast to the environment's ``stored`` (logical) types, refused where they cannot be."""
    logical = logical_schema(rows.schema.remove_metadata(), fmt)
    for field in logical:
        if field.name in stored.names and not sch.compatible(stored.field(field.name).type, field.type):
            raise SchemaMismatchError(f"{field.name}: the stored steps of this environment hold "
                                      f"{sch.describe(stored.field(field.name).type)}, got {sch.describe(field.type)}")
    target = pa.schema([stored.field(f.name) if f.name in stored.names else f for f in logical])
    if fmt.encoded and OBS in target.names and OBS in stored.names and \
            sch.describe(stored.field(OBS).type) != sch.describe(logical.field(OBS).type):
        raise SchemaMismatchError(f"obs: encoded rows must have the stored observation type "
                                  f"{sch.describe(stored.field(OBS).type)}, "
                                  f"got {sch.describe(logical.field(OBS).type)}")
    return _cast_to(rows, physical_schema(target, FileEncoding(fmt.encoding, fmt.frame_stack, (), fmt.frames)))


def _cast_keys(rows: pa.Table) -> pa.Table:
    for name, t in KEYS.items():
        col = rows[name]
        if not pa.types.is_integer(col.type):
            raise InputError(f"{name}: expected integers, got {col.type}")
        if name == "step" and len(col) and pc.min(col).as_py() < 0:
            raise InputError("step: must be >= 0")
        _check_range(rows, name, t)
        rows = rows.set_column(rows.schema.get_field_index(name), name, col.cast(t))
    return rows


def _check_range(rows: pa.Table, name: str, t: pa.DataType) -> None:
    """Refuse values of ``name`` that its stored type ``t`` cannot hold, naming the episode and the step."""
    col, top = rows[name], np.iinfo(sch.numpy_dtype(t)).max
    if not len(col) or pc.max(col).as_py() <= top:
        return
    i = pc.index(pc.greater(col, pa.scalar(top, col.type)), True).as_py()
    where = f"episode_id {rows['episode_id'][i].as_py()}" if name == "step" else f"step {rows['step'][i].as_py()}"
    raise InputError(f"{name}: {rows[name][i].as_py()} at row {i} ({where}) is beyond {t}; expected at most {top}")


def _agent_ids(rows: pa.Table) -> pa.ChunkedArray | None:
    """Each row's agent (null for a single-agent row), checked: strings, none empty; None without the column."""
    if "agent_id" not in rows.column_names:
        return None
    col = rows["agent_id"]
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type)):
        raise InputError(f"agent_id: expected strings (the agent of each row of a multi-agent episode, null for "
                         f"single-agent rows), got {col.type}")
    col = col.cast(pa.string())
    if len(col) and pc.any(pc.equal(col, "")).as_py():
        raise InputError("agent_id: expected non-empty agent names (null for single-agent rows), got ''")
    return col


def _check_agent_names(agents: pa.ChunkedArray | None) -> None:
    """Each agent's id checked as the multi-agent writer checks it (:func:`~trajstore.storage.names.check_id`)."""
    if agents is not None:
        for agent in pc.unique(agents.drop_null()).to_pylist():
            check_id(agent, field="agent_id")


def _kept_types(stored: pa.Schema, agents: pa.ChunkedArray | None) -> pa.Schema:
    """The environment's stored types that ``rows`` must fit: for the rows of agents, all but observations and
    actions (the agents of one env may have spaces of their own, as each kind of an ``AgentWriter`` declares)."""
    if agents is None or agents.null_count == len(agents):
        return stored
    return pa.schema([f for f in stored if f.name not in (OBS, NEXT, "action")])


def _cast_env_steps(rows: pa.Table) -> pa.Table:
    """The sender's ``env_steps`` (its writer's position, see ``step.v1.json``) as the schema's int64."""
    if "env_steps" not in rows.column_names:
        return rows
    col = rows["env_steps"]
    if not pa.types.is_integer(col.type):
        raise InputError(f"env_steps: expected integers, got {col.type}")
    return rows.set_column(rows.schema.get_field_index("env_steps"), "env_steps", col.cast(pa.int64()))


def _check_flags_and_rewards(rows: pa.Table) -> None:
    for name in ("terminated", "truncated"):
        if not pa.types.is_boolean(rows[name].type):
            raise InputError(f"{name}: expected bool, got {rows[name].type}")
    reward = rows["reward"]
    if not (pa.types.is_floating(reward.type) or pa.types.is_integer(reward.type)):
        raise InputError(f"reward: expected float32 or float64, got {reward.type}")
    values = reward.to_numpy()
    bad = ~np.isfinite(values)
    if bad.any():
        i = int(np.flatnonzero(bad)[0])
        ep, step = rows["episode_id"][i].as_py(), rows["step"][i].as_py()
        raise InputError(f"reward must be finite: got {values[i]} at row {i} (episode_id {ep}, step {step})")


def _cast_to(rows: pa.Table, stored: pa.Schema) -> pa.Table:
    for i, field in enumerate(rows.schema):
        if field.name in stored.names and sch.describe(stored.field(field.name).type) != sch.describe(field.type):
            rows = rows.set_column(i, field.name, rows[field.name].cast(stored.field(field.name).type))
    return rows


SEQUENCE_LIMIT = 2 ** 32  # a writer's sequence numbers: 0 up to this (a version's bits above its 31 of digest)
_DIGEST_BITS = 31
_PLAIN, _SEQUENCED = "trajstore-ingest:", "trajstore-writer:"


@dataclass(frozen=True)
class IdempotencyKey:
    """A request's key as an app transaction of the log (an id, and a version recorded under it).

    A plain key (``Idempotency-Key`` alone) names one request: its id is the key, its version the request's digest
    (:func:`request_digest`), so the log holds a key per request. A sequenced key (``Idempotency-Key`` naming a
    writer, ``Idempotency-Sequence`` numbering its requests in the order it sends them, as Kafka's idempotent
    producers do) is one app transaction per writer: its version is the request's number above 31 bits of its
    digest, rising with each request as Delta's ``txn`` versions do, so the log holds a key per writer, not per
    request. :meth:`holds` says what a version recorded under the key means for this request."""

    app_id: str
    version: int
    sequence: int | None = None

    @classmethod
    def of(cls, key: str, rows: pa.Table, *, run_id: str, env_id: str,
           sequence: int | None = None) -> IdempotencyKey:
        digest = request_digest(rows, run_id=run_id, env_id=env_id)
        if sequence is None:
            return cls(_PLAIN + key, digest)
        if isinstance(sequence, bool) or not isinstance(sequence, int) or not 0 <= sequence < SEQUENCE_LIMIT:
            raise InputError(f"idempotency_sequence: expected an integer from 0 to {SEQUENCE_LIMIT - 1}, "
                             f"got {sequence!r}")
        return cls(_SEQUENCED + key, sequence << _DIGEST_BITS | digest & ((1 << _DIGEST_BITS) - 1), sequence)

    @property
    def name(self) -> str:
        """The key as the client gave it."""
        return self.app_id.removeprefix(_PLAIN).removeprefix(_SEQUENCED)

    def holds(self, version: int | None) -> bool:
        """Whether ``version``, what the log (or a request committed with this one) recorded under this key's id,
        holds this request already: False when it holds none of it (no version, or an earlier request of the same
        writer), True for this request (a retry) or, for a sequenced key, a later request of its writer (this one
        came before it). :class:`ConflictError` when the key, or the writer's number, went to another request."""
        if version is None:
            return False
        if self.sequence is None:
            if version in (self.version, LEGACY_DIGEST):
                return True
            raise self.conflict()
        number = version >> _DIGEST_BITS
        if number != self.sequence:
            return number > self.sequence
        if version == self.version:
            return True
        raise self.conflict()

    def conflict(self) -> ConflictError:
        if self.sequence is None:
            return ConflictError(f"idempotency_key: {self.name!r} was already used for another request (other rows, "
                                 "run_id or env_id); a retry must repeat its request exactly, and new rows need a "
                                 "new key")
        return ConflictError(f"idempotency_sequence: number {self.sequence} of writer {self.name!r} was already "
                             "used for another request (other rows, run_id or env_id); a retry must repeat its "
                             "request exactly, and new rows need the writer's next number")


def key_of(key: str | None, sequence: int | None, rows: pa.Table, *, run_id: str,
           env_id: str) -> IdempotencyKey | None:
    """The :class:`IdempotencyKey` of a request (None without ``key``); :class:`InputError` for a sequence without
    a key, or one out of range."""
    if key is None:
        if sequence is not None:
            raise InputError("idempotency_sequence: numbers a writer's requests, so it needs the idempotency_key "
                             "that names the writer")
        return None
    return IdempotencyKey.of(key, rows, run_id=run_id, env_id=env_id, sequence=sequence)


def request_digest(rows: pa.Table, *, run_id: str, env_id: str) -> int:
    """A 63-bit digest (sha256) of a request: its run, environment and rows as they came (types included,
    schema metadata left out); a positive int64, the version of the key's app transaction."""
    fmt = (rows.schema.metadata or {}).get(b"trajstore")
    rows = rows.replace_schema_metadata(None).combine_chunks()
    h = hashlib.sha256(json.dumps([run_id, env_id]).encode())
    if rows.nbytes <= DIGEST_HELD:  # written whole, then hashed: one call back into Python, not one per buffer
        sink = pa.BufferOutputStream()
        with pa.ipc.new_stream(sink, rows.schema) as stream:
            stream.write_table(rows)
        h.update(sink.getvalue())
    else:
        with pa.ipc.new_stream(_Digesting(h), rows.schema) as stream:  # hashed as written, never held whole
            stream.write_table(rows)
    if fmt is not None:  # encoded rows are another request than the same rows unencoded (none before had one)
        h.update(fmt)
    return int.from_bytes(h.digest()[:8], "big") >> 1


class _Digesting:
    """A write-only file that adds what is written to a hash."""

    def __init__(self, digest: Any) -> None:
        self.digest = digest
        self.closed = False

    def write(self, data: Any) -> int:
        self.digest.update(data)
        return len(data)

    def flush(self) -> None:
        pass

    def close(self) -> None:
        self.closed = True


def append_rows(table: StepsTable, rows: pa.Table, *, run_id: str, env_id: str, idempotency_key: str | None = None,
                idempotency_sequence: int | None = None) -> tuple[str | None, bool]:
    """Commit ``rows`` once, if they continue what the store holds; returns ``(file, duplicate)``.

    A request repeated under its ``idempotency_key`` is a no-op (``(None, True)``); another request under a
    used key raises :class:`ConflictError` (with ``idempotency_sequence``, the key names a writer and the number one
    of its requests: see :class:`IdempotencyKey`); rows that do not continue their episodes raise
    :class:`InputError` naming the episode and the step, and store nothing.
    """
    check_id(run_id, field="run_id")
    check_id(env_id, field="env_id")
    key = key_of(idempotency_key, idempotency_sequence, rows, run_id=run_id, env_id=env_id)
    if key is not None and _seen(table.log.read(), key):
        return None, True
    rows, spans = _checked(rows, table.stored_schema(env_id=env_id))
    check_distinct(rows.column_names, table.column_names(), field="columns")  # one schema for every environment
    state = table.log.read()  # rows that do not continue their episodes are refused before any column is reserved
    if state is not None:
        check_continues(spans, stored_ends(state.files, spans.episodes), run_id=run_id, env_id=env_id)
    rows = _physical(table, rows)
    written = table.write(rows, run_id=run_id, env_id=env_id)  # encoded outside the lock: requests overlap here
    try:
        with _lock(table.uri):
            landed = _commit_checked(table, written, spans, run_id=run_id, env_id=env_id, key=key)
    except BaseException as exc:
        table.discard([written.path], exc)
        raise
    if not landed:
        table.discard([written.path], None)
    return (str(written.path), False) if landed else (None, True)


def _physical(table: StepsTable, rows: pa.Table, known: TableState | None = None) -> pa.Table:
    """``rows`` under the physical names the log resolves and declares for them (reserved there first; ``known``:
    a version read already, which answers when it holds them all). What ``known``'s schema answers is kept for the
    next rows of the same schema (a writer's requests all have one): resolving names and declarations costs more
    than the rest of the check of a small request, and gives the same answer for the same two schemas."""
    key = None if known is None else (rows.schema.serialize().to_pybytes(), known.schema_key)
    found = None if key is None else _physical_schemas.get(key)
    if found is not None:
        table.log.writable("write")  # as a reserve would
        return pa.Table.from_arrays(rows.columns, schema=found)
    out = _resolved(table, rows, known)
    if key is not None and known is not None and set(out.column_names) <= set(known.schema.names):
        with _physical_lock:  # kept only when ``known`` held every column: no column was added to the log for them
            if len(_physical_schemas) >= PHYSICAL_KEPT:
                _physical_schemas.clear()
            _physical_schemas[key] = out.schema
    return out


_physical_schemas: dict[tuple[bytes, bytes], pa.Schema] = {}  # (rows' schema, log's schema) -> physical schema
_physical_lock = threading.Lock()


def _resolved(table: StepsTable, rows: pa.Table, known: TableState | None) -> pa.Table:
    """:func:`_physical`, made from the log."""
    fmt = FileEncoding.of(rows.schema.metadata)
    logical = logical_schema(rows.schema.remove_metadata(), fmt)

    def reserve(types: Any, logical: Any = None, declared: Any = None) -> dict[str, str]:
        return table.log.reserve(types, logical, declared, known=known)

    return stored_rows(rows.replace_schema_metadata(None), fmt, {f.name: f.type for f in logical}, reserve)


@dataclass(frozen=True)
class Prepared:
    """One ingest request checked on its own, ready to be committed with others (see
    :mod:`~trajstore.operations.group_commit`): its ``rows`` under their physical names, its episodes' ``spans``,
    its idempotency ``key``, the version its rows were checked against (``checked``) and what the store held of its
    episodes then (``stored``)."""

    rows: pa.Table
    spans: Spans
    run_id: str
    env_id: str
    key: IdempotencyKey | None
    checked: int
    stored: tuple[StoredEnd, ...]


def prepare(table: StepsTable, state: TableState | None, rows: pa.Table, *, run_id: str, env_id: str,
            key: IdempotencyKey | None, ends: Ends = stored_ends,
            schema_of: Callable[[str], pa.Schema | None] | None = None,
            app_version: Callable[[str], int | None] | None = None) -> Prepared | None:
    """``rows`` checked as :func:`append_rows` checks them, against the version ``state`` (None: before the first
    commit), and put under their physical names; None when ``state`` holds the request of ``key`` already (a retry:
    recognised before anything else is checked, also when its rows no longer continue what the store holds).
    ``ends`` finds what the version's files hold of the rows' episodes (:func:`stored_ends`, or one that keeps what it
    read: :class:`~trajstore.operations.continuity.EndsCache`); ``schema_of`` gives an environment's stored schema
    at ``state`` (default: :meth:`~trajstore.storage.table.StepsTable.stored_schema`), ``app_version`` the digest a
    key's id holds at ``state`` (or at a later version; default: :meth:`~trajstore.storage.log.TableState.app_version`).
    """
    check_id(run_id, field="run_id")
    check_id(env_id, field="env_id")
    if key is not None and _seen(state, key, app_version):
        return None
    files = [] if state is None else state.files
    schema = schema_of(env_id) if schema_of is not None else \
        table.stored_schema(env_id=env_id, files=files, state=state)
    rows, spans = _checked(rows, schema)
    check_distinct(rows.column_names, table.column_names(state) if state is not None else [], field="columns")
    stored = ends(files, spans.episodes)
    try:
        check_continues(spans, stored, run_id=run_id, env_id=env_id)
    except InputError:
        if key is not None and _seen(table.log.read(), key):  # a retry whose first try landed since
            return None
        raise
    return Prepared(_physical(table, rows, state), spans, run_id, env_id, key,
                    -1 if state is None else state.number, tuple(stored))


def _commit_checked(table: StepsTable, written: WrittenFile, spans: Spans, *, run_id: str, env_id: str,
                    key: IdempotencyKey | None) -> bool:
    """Check ``spans`` against the latest version V and commit ``written`` as V+1; again on a newer V.
    False when a request with the same key and digest was committed meanwhile. Rows that bring new columns
    are checked once before the table is given them, so that refused rows change nothing."""
    if _new_columns(table, written):
        state = table.log.read()
        check_continues(spans, stored_ends(state.files if state is not None else [], spans.episodes),
                        run_id=run_id, env_id=env_id)
    for _ in tries(ATTEMPTS):
        state = table.log.ensure(written.schema)
        if key is not None and _seen(state, key):
            return False
        check_continues(spans, stored_ends(state.files, spans.episodes), run_id=run_id, env_id=env_id)
        if table.log.commit_after(state, written, app=None if key is None else (key.app_id, key.version)):
            return True
    raise CommitError(f"rows for run_id={run_id!r}, env_id={env_id!r} were not committed: other commits kept "
                      f"coming first ({ATTEMPTS} attempts); nothing was stored, send the request again")


def _new_columns(table: StepsTable, written: WrittenFile) -> bool:
    """Whether committing ``written`` first gives the table columns it lacks (a change of its own, in the log)."""
    known = table.log.read()
    return known is not None and bool(set(written.schema.names) - set(known.schema.names))


def _seen(state: TableState | None, key: IdempotencyKey,
          app_version: Callable[[str], int | None] | None = None) -> bool:
    """Whether the table ``state`` holds the request of ``key`` (:meth:`IdempotencyKey.holds`); :class:`ConflictError`
    if the key went to another. ``app_version``: where to look the key up (default: ``state`` itself)."""
    if state is None:
        return False
    return key.holds((state.app_version if app_version is None else app_version)(key.app_id))


_LOCKS: dict[str, threading.Lock] = {}
_LOCKS_GUARD = threading.Lock()


def _lock(uri: str) -> threading.Lock:
    """The lock that makes this process's ingests into the table at ``uri`` take turns."""
    with _LOCKS_GUARD:
        return _LOCKS.setdefault(uri, threading.Lock())
