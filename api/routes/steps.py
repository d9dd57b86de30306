"""Steps for training: an Arrow IPC stream, batch by batch, in constant server memory."""

from __future__ import annotations

import asyncio
import contextlib
import threading
from typing import Annotated, Any, AsyncIterator, Generator, Iterator, Literal

import pyarrow as pa
from fastapi import APIRouter, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, StreamingResponse

from trajstore.api import pages
from trajstore.api.arrow import ARROW_CONTENT, json_rows
from trajstore.api.cursor import CursorQuery, decode, encode
from trajstore.api.deps import ReadStoreDep, SettingsDep
from trajstore.api.ints import ROWS_SCHEMA
from trajstore.api.params import ColumnsDep, FilterDep, WhereDep
from trajstore.query.condition import Condition
from trajstore.query.filters import EpisodeFilter
from trajstore.remote.wire import ARROW_STREAM, ipc_pieces
from trajstore.store import Store, plumbing

router = APIRouter(tags=["steps"])
JSON_PAGE = {"type": "object", "required": ["items", "limit", "offset", "next_cursor"], "properties": {
    "items": {**ROWS_SCHEMA, "description": "one object per step, in (episode_id, step) order"},
    "limit": {"type": "integer"}, "offset": {"type": "integer"},
    "next_cursor": {"anyOf": [{"type": "string"}, {"type": "null"}],
                    "description": "pass as cursor= for the next page; null after the last"}}}
PREFETCH_PIECES = 1  # pieces of a stream made ahead of the network


def _stream(store: Store, flt: EpisodeFilter, where: Condition | None, columns: list[str], batch_rows: int,
            batch_bytes: int) -> Generator[bytes, None, None]:
    # Read straight from the committed files (Store.scan), without a SQL engine in the way; the episode-level
    # conditions become a list of episode ids first.
    reader = store.scan(columns or None, filter=flt, where=where, batch_size=batch_rows, max_batch_bytes=batch_bytes)
    return _closing(ipc_pieces(reader), reader)


def _closing(chunks: Iterator[bytes], reader: pa.RecordBatchReader) -> Generator[bytes, None, None]:
    try:
        yield from chunks
    finally:
        reader.close()  # stops the scan's read-ahead


class Prefetch:
    """Runs a generator of byte pieces in a thread of its own, at most ``ahead`` pieces ahead of the event
    loop that sends them.

    So the store is read (Arrow releases the GIL) while earlier pieces are being sent, in memory bounded by
    ``ahead`` + 2 pieces. Each piece is handed to the loop with ``call_soon_threadsafe`` (no worker thread
    per piece). The thread closes ``pieces`` when they run out, fail or :meth:`stop` is called (then after
    the piece it is making); :meth:`get` re-raises a failure.
    """

    def __init__(self, pieces: Generator[bytes, None, None], ahead: int) -> None:
        self._loop = asyncio.get_running_loop()
        self._queue: asyncio.Queue[bytes | BaseException | None] = asyncio.Queue()
        self._room = threading.Semaphore(ahead)
        self._stopped = threading.Event()
        threading.Thread(target=self._run, args=(pieces,), name="trajstore-steps", daemon=True).start()

    def _run(self, pieces: Generator[bytes, None, None]) -> None:
        end: BaseException | None = None
        try:
            with contextlib.closing(pieces):
                for piece in pieces:
                    if not self._put(piece):
                        return
        except BaseException as exc:  # noqa: BLE001 - handed to the reader, which raises it
            end = exc
        self._put(end, wait=False)

    def _put(self, item: bytes | BaseException | None, *, wait: bool = True) -> bool:
        while wait and not self._room.acquire(timeout=0.1):
            if self._stopped.is_set():
                return False
        if self._stopped.is_set():
            return False
        try:
            self._loop.call_soon_threadsafe(self._queue.put_nowait, item)
        except RuntimeError:  # the loop is closed: the server is shutting down
            return False
        return True

    async def get(self) -> bytes | None:
        """The next piece, or ``None`` at the end."""
        item = await self._queue.get()
        if isinstance(item, BaseException):
            raise item
        if item is not None:
            self._room.release()
        return item

    def stop(self) -> None:
        self._stopped.set()


async def _until_disconnect(chunks: Generator[bytes, None, None]) -> AsyncIterator[bytes]:
    """Send the pieces as a :class:`Prefetch` makes them; stop it (and so the read) as soon as the client
    goes away."""
    ahead = Prefetch(chunks, PREFETCH_PIECES)
    try:
        while (piece := await ahead.get()) is not None:
            yield piece
    finally:
        ahead.stop()


@router.get("/steps", summary="Selected steps as an Arrow IPC stream (or a JSON page with format=json)",
            responses={200: {"content": {**ARROW_CONTENT, "application/json": {"schema": JSON_PAGE}}}})
def steps(request: Request, store: ReadStoreDep, settings: SettingsDep, flt: FilterDep, where: WhereDep,
          columns: ColumnsDep,
          batch_rows: Annotated[int | None, Query(ge=1, le=1_048_576, description="rows per Arrow batch (at most: "
                                                                               "fewer when rows are wide)")] = None,
          format: Annotated[Literal["arrow", "json"],  # noqa: A002 - the query parameter's name
                            Query(description="arrow stream or a JSON page")] = "arrow",
          limit: Annotated[int, Query(ge=1, description="JSON only: rows per page, capped at max_page_size and "
                                                        "at the rows that fit in max_page_bytes (the page says "
                                                        "which limit applied)")] = 100,
          offset: Annotated[int, Query(ge=0, le=2**62, description="JSON only")] = 0,
          cursor: CursorQuery = None,
          ) -> Any:
    if format == "json":  # wide rows (images): fewer rows, so that the page stays within max_page_bytes
        limit = min(limit, settings.max_page_size, pages.page_rows(store, columns, settings.max_page_bytes))
        return _json_page(store, flt, where, columns, limit, offset, cursor)
    chunks = _stream(store, flt, where, columns, batch_rows or settings.stream_batch_rows,
                     plumbing(store).settings.stream_batch_bytes)
    return StreamingResponse(_until_disconnect(chunks), media_type=ARROW_STREAM)


KEY = ["episode_id", "step"]  # and agent_id, where the rows are agents'


def _json_page(store: Store, flt: EpisodeFilter, where: Condition | None, columns: list[str], limit: int,
               offset: int, cursor: str | None) -> JSONResponse:
    """One JSON page in ``(episode_id, step, agent_id)`` order, by offset or after a cursor, with the cursor of
    the next (the last row's key; an agent's row's names its agent, so that a step's other agents follow)."""
    after = decode(cursor, 2, agent=True) if cursor else None
    asked = list(dict.fromkeys(columns))
    names = asked + [k for k in KEY if k not in asked] if asked else []
    rows = plumbing(store).steps_page(names, filter=flt, where=where, limit=limit, offset=0 if after else offset,
                                      after=after)
    following = None
    if rows.num_rows == limit:
        last = rows.slice(rows.num_rows - 1).to_pylist()[0]
        agent = [last["agent_id"]] if last.get("agent_id") is not None else []
        following = encode([last["episode_id"], last["step"], *agent])
    if asked:
        rows = rows.select(asked)
    return JSONResponse(jsonable_encoder({"items": json_rows(rows), "limit": limit, "offset": offset,
                                          "next_cursor": following}))
