"""Training batches over REST: windows (``GET /sequences``) and n-step transitions (``GET /transitions``) as Arrow
IPC streams, one record batch per training batch, exactly the batches of ``Store.sequences`` /
``Store.transitions`` (arrays of shape ``(n, a, b)`` as nested fixed-size lists).

The stream's schema carries the iterator's starting state (``trajstore.state``, JSON) so that a client can
make its own ``state_dict()``; ``resume`` takes such a state back. ``?version=N`` reads the store as it was at
version N, as ``trajstore.open(uri, version=N).sequences(...)`` does (a state resumes over the data it was made
on: the same version, or the same latest files). The server gathers each batch as it is sent,
from the loader layout kept in the store (column files it maps, built once for every client and process):
its memory does not grow with the store. It is bounded per request:
a batch that would take more than ``loader_batch_bytes`` to build is refused (422 naming the parameters), at
most one batch is made ahead of the network, and each stream holds one of the ``sql_max_concurrent`` places
it shares with ``POST /sql`` from its start to its end (429 with ``Retry-After`` when none is free).
"""

from __future__ import annotations

import json
import weakref
from typing import Annotated, Any, Callable, Generator

import pyarrow as pa
from fastapi import APIRouter, Query
from fastapi.responses import StreamingResponse

from trajstore.api.arrow import ARROW_CONTENT
from trajstore.api.deps import ReadStoreDep, SettingsDep, SqlGateDep
from trajstore.api.params import NAME, ColumnsDep, FilterDep, WhereDep
from trajstore.api.routes.steps import _until_disconnect
from trajstore.loaders.loader import BatchStream
from trajstore.loaders.order import parse_state
from trajstore.query.sandbox import Gate, Slot
from trajstore.remote.wire import ARROW_STREAM, ipc_pieces

router = APIRouter(tags=["training"])
STATE_KEY = b"trajstore.state"


def _resume(text: str | None) -> dict[str, Any] | None:
    return None if text is None else parse_state(text)


def _stream(batches: BatchStream, slot: Slot) -> Generator[bytes, None, None]:
    schema = batches.schema.with_metadata({STATE_KEY: json.dumps(batches.state_dict()).encode()})
    reader = pa.RecordBatchReader.from_batches(schema, (b.replace_schema_metadata(schema.metadata)
                                                        for b in batches))
    try:
        yield from ipc_pieces(reader)
    finally:
        batches.close()  # the end, an error or a client gone: the column files are unmapped
        slot.release()  # and the place: the last batch is gone with them


def _response(gate: Gate, kind: str, make: Callable[[], BatchStream]) -> StreamingResponse:
    """The stream of the batches ``make`` builds, holding one of the ``gate`` 's places from now to its end."""
    slot = gate.take(kind)  # QueryBusyError (429) when every place is taken: nothing waits
    try:
        batches = make()
    except BaseException:
        slot.release()
        raise
    response = StreamingResponse(_until_disconnect(_stream(batches, slot)), media_type=ARROW_STREAM)
    weakref.finalize(response, slot.release)  # never sent at all: given back when the response is dropped
    return response


RESUME_CHARS = 1024  # a state_dict()'s JSON is ~120 characters
Length = Annotated[int, Query(ge=1, le=65_536, description="steps per window")]
Samples = Annotated[int, Query(ge=1, le=1 << 24, description="draws with replacement (with weight_by)")]
Int = Annotated[int, Query(ge=0, le=2**31 - 1)]
Positive = Annotated[int, Query(ge=1, le=2**31 - 1)]
Gamma = Annotated[float, Query(ge=0, le=1, description="discount in [0, 1]")]
WeightBy = Annotated[str | None, Query(pattern=NAME, description="a step or episodes column to draw by, "
                                                                 "with replacement")]
OrderSeed = Annotated[int, Query(ge=0, le=2**63 - 1, description="the loader's seed (seed= is the lineage "
                                                                "filter of episodes)")]
AgentIds = Annotated[list[str] | None, Query(description="multi-agent episodes: these agents' own trajectories "
                                                        "(repeat for several; their spaces must match)")]
Resume = Annotated[str | None, Query(max_length=RESUME_CHARS, description="the JSON of a state_dict() to continue "
                                                                         "from (made with the same version=)")]


@router.get("/sequences", summary="Windows inside episodes as an Arrow IPC stream of training batches",
            responses={200: {"content": ARROW_CONTENT}})
def sequences(store: ReadStoreDep, settings: SettingsDep, gate: SqlGateDep, flt: FilterDep, where: WhereDep,
              columns: ColumnsDep,
              length: Length,
              stride: Positive | None = None, pad: bool = False, gamma: Gamma | None = None,
              batch_size: Annotated[int, Query(ge=1, le=1_048_576)] = 256, shuffle: bool = False,
              order_seed: OrderSeed = 0, epoch: Int = 0, rank: Int = 0, world_size: Positive = 1,
              weight_by: WeightBy = None, num_samples: Samples | None = None, resume: Resume = None,
              agent_id: AgentIds = None) -> Any:
    state = _resume(resume)
    return _response(gate, "sequences", lambda: store.sequences(
        length, columns=columns or None, stride=stride, pad=pad, gamma=gamma, batch_size=batch_size,
        shuffle=shuffle, seed=order_seed, epoch=epoch, rank=rank, world_size=world_size, format="arrow",
        resume=state, weight_by=weight_by, num_samples=num_samples, filter=flt, where=where,
        max_batch_bytes=settings.loader_batch_bytes, agent_id=agent_id or None))


@router.get("/transitions", summary="n-step transitions as an Arrow IPC stream of training batches",
            responses={200: {"content": ARROW_CONTENT}})
def transitions(store: ReadStoreDep, settings: SettingsDep, gate: SqlGateDep, flt: FilterDep, where: WhereDep,
                columns: ColumnsDep,
                n: Positive,
                gamma: Gamma, batch_size: Annotated[int, Query(ge=1, le=1_048_576)] = 256, shuffle: bool = False,
                order_seed: OrderSeed = 0, epoch: Int = 0, rank: Int = 0, world_size: Positive = 1,
                weight_by: WeightBy = None, num_samples: Samples | None = None, resume: Resume = None,
                agent_id: AgentIds = None) -> Any:
    state = _resume(resume)
    return _response(gate, "transitions", lambda: store.transitions(
        n, gamma=gamma, columns=columns or None, batch_size=batch_size, shuffle=shuffle, seed=order_seed,
        epoch=epoch, rank=rank, world_size=world_size, format="arrow", resume=state, weight_by=weight_by,
        num_samples=num_samples, filter=flt, where=where, max_batch_bytes=settings.loader_batch_bytes,
        agent_id=agent_id or None))
