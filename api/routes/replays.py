"""Prioritized replay for remote learners (``Client.replay``): the replays of ``Store.replay`` held open by the
service (:mod:`trajstore.api.replays`), every route authenticated with the API key.

- ``POST /replays``: open one (the arguments of ``Store.replay`` as query parameters, each typed; ``where`` parsed by
  :mod:`trajstore.query.condition`, the filters of ``/episodes``); answers its id and what it is.
- ``GET /replays/{replay_id}/sample?batch_size=``: one batch as an Arrow IPC stream of one record batch (arrays of
  shape ``(n, a, b)`` as nested fixed-size lists, as ``/sequences`` sends them), with ``index``, ``probability``,
  ``weight``.
- ``POST /replays/{replay_id}/update``: an Arrow IPC body with columns ``index`` (integers) and ``priority``
  (numbers); checked whole before anything changes (422 naming the column), at most ``replay_max_body_bytes`` on
  the wire and decoded (counted from its metadata before it is decoded: 413 beyond).
- ``POST /replays/{replay_id}/commit``, ``GET /replays/{replay_id}``, ``DELETE /replays/{replay_id}`` (commits and
  closes).

Every request to a replay takes one of the ``sql_max_concurrent`` places ``/sql`` and the loader streams share while
it works (429 with ``Retry-After`` when none is free); a batch is bounded by ``loader_batch_bytes`` (422 beyond) and
the open replays by ``replay_max_open`` and ``replay_memory_bytes``.
"""

from __future__ import annotations

from typing import Annotated, Any, Callable, TypeVar

import numpy as np
import pyarrow as pa
from fastapi import APIRouter, Depends, Path, Query, Request
from fastapi.concurrency import run_in_threadpool
from fastapi.responses import Response

from trajstore.api.arrow import ARROW_CONTENT
from trajstore.api.deps import SettingsDep, SqlGateDep, StoreDep, require_api_key
from trajstore.api.params import NAME, ColumnsDep, FilterDep, WhereDep
from trajstore.api.problems import problem_response
from trajstore.api.replays import Replays
from trajstore.errors import BodyTooLargeError, InputError, size_text
from trajstore.loaders.loader import to_arrow
from trajstore.loaders.replay import Replay
from trajstore.query.sandbox import Gate
from trajstore.remote.decoded_size import decoded_size
from trajstore.remote.wire import ARROW_STREAM, ipc_bytes, read_table
from trajstore.settings import PREFIX

router = APIRouter(tags=["replay"], dependencies=[Depends(require_api_key)])
T = TypeVar("T")

ReplayId = Annotated[str, Path(pattern=r"^[0-9a-f]{32}$", description="the id POST /replays answered")]
Positive = Annotated[int, Query(ge=1, le=2**31 - 1)]
Exponent = Annotated[float, Query(ge=0, le=1e6, allow_inf_nan=False)]
AgentIds = Annotated[list[str] | None, Query(description="multi-agent episodes: these agents' own trajectories")]


def replays(request: Request) -> Replays:
    return request.app.state.replays


ReplaysDep = Annotated[Replays, Depends(replays)]


def _in_place(gate: Gate, what: str, work: Callable[[], T]) -> T:
    """``work`` done holding one of the ``gate``'s places (429 at once when none is free)."""
    slot = gate.take(what)
    try:
        return work()
    finally:
        slot.release()


def _described(key: str, replay: Replay) -> dict[str, Any]:
    return {"replay_id": key, **replay.describe(), "pending": replay.pending}


@router.post("/replays", status_code=201, summary="Open a prioritized replay over the store (Store.replay)")
def open_replay(store: StoreDep, settings: SettingsDep, gate: SqlGateDep, held: ReplaysDep, flt: FilterDep,
                where: WhereDep, columns: ColumnsDep, length: Positive | None = None,
                n: Annotated[int | None, Query(ge=1, le=65_536, description="n-step transitions")] = None,
                gamma: Annotated[float | None, Query(ge=0, le=1)] = None, stride: Positive | None = None,
                pad: bool = False, agent_id: AgentIds = None,
                priorities: Annotated[str, Query(pattern=NAME, max_length=128, description=(
                    "the name its priorities are committed under and resumed from"))] = "default",
                commit: Annotated[bool, Query(description="false: priorities kept in memory only")] = True,
                priorities_version: Annotated[int | None, Query(ge=0, le=2**62, description=(
                    "resume from the priorities table as it was at this version"))] = None,
                alpha: Exponent = 0.6, beta: Exponent = 0.4,
                eps: Annotated[float, Query(gt=0, le=1e6, allow_inf_nan=False)] = 1e-6,
                capacity: Positive | None = None, follow: bool = False,
                poll: Annotated[float, Query(ge=0, le=3600, allow_inf_nan=False)] = 1.0,
                draw_seed: Annotated[int, Query(ge=0, le=2**63 - 1, description=(
                    "the seed of its draws (seed= is the lineage filter of episodes)"))] = 0) -> dict[str, Any]:
    def make() -> Replay:
        return store.replay(columns or None, length=length, n=n, gamma=gamma, stride=stride, pad=pad, where=where,
                            filter=flt, agent_id=agent_id or None, priorities=priorities if commit else None,
                            alpha=alpha, beta=beta, eps=eps, capacity=capacity, follow=follow, poll=poll,
                            seed=draw_seed, version=priorities_version, max_batch_bytes=settings.loader_batch_bytes)

    key, replay = _in_place(gate, "replay", lambda: held.open(make))
    return _described(key, replay)


@router.get("/replays/{replay_id}", summary="What an open replay is and holds")
def describe(replay_id: ReplayId, held: ReplaysDep) -> dict[str, Any]:
    replay = held.get(replay_id)
    return {**_described(replay_id, replay), "items": len(replay)}


@router.get("/replays/{replay_id}/sample", summary="A batch drawn in proportion to the priorities (Arrow IPC)",
            responses={200: {"content": ARROW_CONTENT}})
def sample(replay_id: ReplayId, gate: SqlGateDep, held: ReplaysDep,
           batch_size: Annotated[int, Query(ge=1, le=1_048_576)] = 256) -> Response:
    replay = held.get(replay_id)
    batch = _in_place(gate, "replay", lambda: replay.sample(batch_size))
    return Response(ipc_bytes(pa.Table.from_batches([to_arrow(batch)])), media_type=ARROW_STREAM)


@router.post("/replays/{replay_id}/update", summary="New priorities of sampled items (an Arrow IPC body: index, "
                                                     "priority)",
             openapi_extra={"requestBody": {"required": True, "content": {ARROW_STREAM: {"schema": {
                 "type": "string", "format": "binary"}}}}},
             responses={413: problem_response(413, "a body over TRAJSTORE_REPLAY_MAX_BODY_BYTES (default 16 MiB) on "
                                                   "the wire or decoded, refused before it is read or decoded"),
                        422: problem_response(422, "a body that is no Arrow IPC stream of index and priority, a "
                                                   "handle the replay never gave, or a priority that is not finite "
                                                   "or below 0 (the detail names the column); nothing is changed")})
async def update(replay_id: ReplayId, request: Request, gate: SqlGateDep, settings: SettingsDep,
                 held: ReplaysDep) -> dict[str, Any]:
    replay = held.get(replay_id)
    body = await request.body()
    limit = settings.replay_max_body_bytes
    size = decoded_size(body, limit=limit)
    if size.bytes > limit:  # a small compressed body that would decode to gigabytes: refused before it is decoded
        raise BodyTooLargeError(f"body: decodes to {size.describe()}, over the limit of {limit} bytes "
                                f"({size_text(limit)}) of an update ({PREFIX}REPLAY_MAX_BODY_BYTES); nothing of it "
                                "was decoded or stored. Send fewer updates per request")
    index, priority = updates_of(read_table(body, field="body"))
    await run_in_threadpool(_in_place, gate, "replay", lambda: replay.update(index, priority))
    return {"updated": len(index), "pending": replay.pending}


@router.post("/replays/{replay_id}/commit", summary="Commit the updates given so far to the priorities table")
def commit(replay_id: ReplayId, gate: SqlGateDep, held: ReplaysDep) -> dict[str, Any]:
    replay = held.get(replay_id)
    return {"version": _in_place(gate, "replay", replay.commit)}


@router.delete("/replays/{replay_id}", summary="Commit what is pending and close the replay")
def close(replay_id: ReplayId, gate: SqlGateDep, held: ReplaysDep) -> dict[str, Any]:
    replay = _in_place(gate, "replay", lambda: held.close(replay_id))
    return {"replay_id": replay_id, "version": replay.version}


def updates_of(table: pa.Table) -> tuple[np.ndarray, np.ndarray]:
    """The ``index`` and ``priority`` columns of an update's body, each checked for its type (an
    :class:`InputError` naming the column); their values are checked by :meth:`Replay.update`."""
    names = set(table.column_names)
    if names != {"index", "priority"}:
        raise InputError(f"body: expected the columns index and priority, got {sorted(names)}")
    index, priority = table["index"], table["priority"]
    if not pa.types.is_integer(index.type) or index.null_count:
        raise InputError(f"index: expected integers (the handles a batch gave) without nulls, got {index.type}"
                         f"{' with nulls' if index.null_count else ''}")
    if not (pa.types.is_floating(priority.type) or pa.types.is_integer(priority.type)) or priority.null_count:
        raise InputError(f"priority: expected numbers without nulls, got {priority.type}"
                         f"{' with nulls' if priority.null_count else ''}")
    return index.to_numpy().astype(np.int64), priority.to_numpy().astype(np.float64)
