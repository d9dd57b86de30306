"""Steps for training: an Arrow IPC stream, batch by batch, in constant server memory."""

from __future__ import annotations

from typing import Annotated, Any, AsyncIterator, Iterator, Literal

from fastapi import APIRouter, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, StreamingResponse
from starlette.concurrency import iterate_in_threadpool

from api.arrow import ARROW_CONTENT, ipc_stream, json_rows
from api.deps import ARROW_STREAM, SettingsDep, StoreDep
from api.filters import ColumnsDep, FilterDep, select_list
from trajstore.filters import EpisodeFilter
from trajstore.query import Snapshot
from trajstore.store import Store

router = APIRouter(tags=["steps"])


def steps_query(snap: Snapshot, flt: EpisodeFilter, columns: list[str]) -> str:
    select = select_list(snap, columns)
    direct = EpisodeFilter(run_id=flt.run_id, env_id=flt.env_id, episode_id=flt.episode_id).conditions()
    rest = EpisodeFilter(**{**flt.__dict__, "run_id": None, "env_id": None, "episode_id": None}).conditions()
    if rest:
        direct.append(f"episode_id IN (SELECT episode_id FROM episodes WHERE {' AND '.join(rest)})")
    return f"SELECT {select} FROM steps" + (f" WHERE {' AND '.join(direct)}" if direct else "")


def _stream(store: Store, flt: EpisodeFilter, columns: list[str], batch_rows: int) -> Iterator[bytes]:
    snap = store.snapshot()
    try:
        reader = snap.reader(steps_query(snap, flt, columns), batch_size=batch_rows)
    except BaseException:
        snap.close()
        raise
    return _closing(ipc_stream(reader), snap)


def _closing(chunks: Iterator[bytes], snap: Snapshot) -> Iterator[bytes]:
    try:
        yield from chunks
    finally:
        snap.close()


async def _until_disconnect(chunks: Iterator[bytes]) -> AsyncIterator[bytes]:
    """Stop reading (and close the snapshot) as soon as the client goes away."""
    try:
        async for chunk in iterate_in_threadpool(chunks):
            yield chunk
    finally:
        close = getattr(chunks, "close", None)
        if close is not None:
            close()


@router.get("/steps", summary="Selected steps as an Arrow IPC stream (or a JSON page with format=json)",
            responses={200: {"content": {**ARROW_CONTENT, "application/json": {"schema": {"type": "object"}}}}})
def steps(request: Request, store: StoreDep, settings: SettingsDep, flt: FilterDep,
          columns: ColumnsDep,
          batch_rows: Annotated[int | None, Query(ge=1, le=1_048_576, description="rows per Arrow batch")] = None,
          format: Annotated[Literal["arrow", "json"], Query(description="arrow stream or a JSON page")] = "arrow",
          limit: Annotated[int, Query(ge=1, description="JSON only: rows per page, capped at max_page_size")] = 100,
          offset: Annotated[int, Query(ge=0, le=2**62, description="JSON only")] = 0,
          ) -> Any:
    if format == "json":
        limit = min(limit, settings.max_page_size)
        with store.snapshot() as snap:
            q = steps_query(snap, flt, columns) + f" ORDER BY episode_id, step LIMIT {limit} OFFSET {offset}"
            return JSONResponse(jsonable_encoder({"items": json_rows(snap.arrow(q)), "limit": limit,
                                                  "offset": offset}))
    chunks = _stream(store, flt, columns, batch_rows or settings.stream_batch_rows)
    return StreamingResponse(_until_disconnect(chunks), media_type=ARROW_STREAM)
