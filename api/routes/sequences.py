"""Training batches over REST: windows (``GET /sequences``) and n-step transitions (``GET /transitions``) as Arrow
IPC streams, one record batch per training batch, exactly the batches of ``Store.sequences`` /
``Store.transitions`` (arrays of shape ``(n, a, b)`` as nested fixed-size lists).

The stream's schema carries the iterator's starting state (``trajstore.state``, JSON) so that a client can
make its own ``state_dict()``; ``resume`` takes such a state back. ``?version=N`` reads the store as it was at
version N, as ``trajstore.open(uri, version=N).sequences(...)`` does (a state resumes over the data it was made
on: the same version, or the same latest files). The server gathers each batch as it is sent,
from the loader's column files on disk: its memory does not grow with the store.
"""

from __future__ import annotations

import json
from typing import Annotated, Any, Generator

import pyarrow as pa
from fastapi import APIRouter, HTTPException, Query
from fastapi.responses import StreamingResponse

from trajstore.api.arrow import ARROW_CONTENT
from trajstore.api.deps import ReadStoreDep
from trajstore.api.params import NAME, ColumnsDep, FilterDep
from trajstore.api.routes.steps import _until_disconnect
from trajstore.query.loader import Batches
from trajstore.query.order import parse_state
from trajstore.remote.wire import ARROW_STREAM, ipc_pieces

router = APIRouter(tags=["training"])
STATE_KEY = b"trajstore.state"


def _resume(text: str | None) -> dict[str, Any] | None:
    return None if text is None else parse_state(text)


def _stream(batches: Batches) -> Generator[bytes, None, None]:
    schema = batches.schema.with_metadata({STATE_KEY: json.dumps(batches.state_dict()).encode()})
    reader = pa.RecordBatchReader.from_batches(schema, (b.replace_schema_metadata(schema.metadata)
                                                        for b in batches))
    try:
        yield from ipc_pieces(reader)
    finally:
        batches.close()  # the end, an error or a client gone: the column files go


def _response(batches: Batches) -> StreamingResponse:
    return StreamingResponse(_until_disconnect(_stream(batches)), media_type=ARROW_STREAM)


RESUME_CHARS = 1024  # a state_dict()'s JSON is ~120 characters
MAX_BATCH_STEPS = 1 << 24  # steps in one streamed batch of windows
Length = Annotated[int, Query(ge=1, le=65_536, description="steps per window")]
Samples = Annotated[int, Query(ge=1, le=1 << 24, description="draws with replacement (with weight_by)")]
Int = Annotated[int, Query(ge=0, le=2**31 - 1)]
Positive = Annotated[int, Query(ge=1, le=2**31 - 1)]
Gamma = Annotated[float, Query(ge=0, le=1, description="discount in [0, 1]")]
WeightBy = Annotated[str | None, Query(pattern=NAME, description="a step or episodes column to draw by, "
                                                                 "with replacement")]
OrderSeed = Annotated[int, Query(ge=0, le=2**63 - 1, description="the loader's seed (seed= is the lineage "
                                                                "filter of episodes)")]
Resume = Annotated[str | None, Query(max_length=RESUME_CHARS, description="the JSON of a state_dict() to continue "
                                                                         "from (made with the same version=)")]


@router.get("/sequences", summary="Windows inside episodes as an Arrow IPC stream of training batches",
            responses={200: {"content": ARROW_CONTENT}})
def sequences(store: ReadStoreDep, flt: FilterDep, columns: ColumnsDep, length: Length,
              stride: Positive | None = None, pad: bool = False, gamma: Gamma | None = None,
              batch_size: Annotated[int, Query(ge=1, le=1_048_576)] = 256, shuffle: bool = False,
              order_seed: OrderSeed = 0, epoch: Int = 0, rank: Int = 0, world_size: Positive = 1,
              weight_by: WeightBy = None, num_samples: Samples | None = None, resume: Resume = None) -> Any:
    if batch_size * length > MAX_BATCH_STEPS:
        raise HTTPException(status_code=422, detail=f"batch_size: batch_size × length must be at most "
                                                    f"{MAX_BATCH_STEPS} steps, got {batch_size} × {length}")
    batches = store.sequences(length, columns=columns or None, stride=stride, pad=pad, gamma=gamma,
                              batch_size=batch_size, shuffle=shuffle, seed=order_seed, epoch=epoch, rank=rank,
                              world_size=world_size, format="arrow", resume=_resume(resume), weight_by=weight_by,
                              num_samples=num_samples, filter=flt)
    return _response(batches)


@router.get("/transitions", summary="n-step transitions as an Arrow IPC stream of training batches",
            responses={200: {"content": ARROW_CONTENT}})
def transitions(store: ReadStoreDep, flt: FilterDep, columns: ColumnsDep, n: Positive, gamma: Gamma,
                batch_size: Annotated[int, Query(ge=1, le=1_048_576)] = 256, shuffle: bool = False,
                order_seed: OrderSeed = 0, epoch: Int = 0, rank: Int = 0, world_size: Positive = 1,
                weight_by: WeightBy = None, num_samples: Samples | None = None, resume: Resume = None) -> Any:
    batches = store.transitions(n, gamma=gamma, columns=columns or None, batch_size=batch_size, shuffle=shuffle,
                                seed=order_seed, epoch=epoch, rank=rank, world_size=world_size, format="arrow",
                                resume=_resume(resume), weight_by=weight_by, num_samples=num_samples, filter=flt)
    return _response(batches)
