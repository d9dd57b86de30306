"""Steps for training: an Arrow IPC stream, batch by batch, in constant server memory."""

from __future__ import annotations

import contextlib
import dataclasses
import queue
import threading
from typing import Annotated, Any, AsyncIterator, Generator, Iterator, Literal

import anyio.to_thread
import pyarrow as pa
from fastapi import APIRouter, HTTPException, Query, Request
from fastapi.encoders import jsonable_encoder
from fastapi.responses import JSONResponse, StreamingResponse

from api.arrow import ARROW_CONTENT, ipc_stream, json_rows
from api.deps import ARROW_STREAM, SettingsDep, StoreDep
from api.filters import ColumnsDep, FilterDep, select_list
from trajstore.errors import InputError
from trajstore.filters import EpisodeFilter
from trajstore.query import Snapshot
from trajstore.store import Store

router = APIRouter(tags=["steps"])
PREFETCH_PIECES = 1  # pieces of a stream made ahead of the network


def steps_query(snap: Snapshot, flt: EpisodeFilter, columns: list[str]) -> str:
    select = select_list(snap, columns)
    direct = EpisodeFilter(run_id=flt.run_id, env_id=flt.env_id, episode_id=flt.episode_id).conditions()
    rest = _per_episode(flt).conditions()
    if rest:
        direct.append(f"episode_id IN (SELECT episode_id FROM episodes WHERE {' AND '.join(rest)})")
    return f"SELECT {select} FROM steps" + (f" WHERE {' AND '.join(direct)}" if direct else "")


def _per_episode(flt: EpisodeFilter) -> EpisodeFilter:
    """The conditions of ``flt`` that need the ``episodes`` view (run, env and episode ids select steps directly)."""
    return dataclasses.replace(flt, run_id=None, env_id=None, episode_id=None)


def _stream(store: Store, flt: EpisodeFilter, columns: list[str], batch_rows: int) -> Generator[bytes, None, None]:
    # Read straight from the committed files (Store.scan: the rows and types of steps_query, without a SQL
    # engine in the way); the episode-level conditions become a list of episode ids first.
    reader = store.scan(columns or None, run_id=flt.run_id or None, env_id=flt.env_id or None,
                        episode_id=flt.episode_id or None,
                        where=_per_episode(flt).where(), batch_size=batch_rows)
    return _closing(ipc_stream(reader), reader)


def _closing(chunks: Iterator[bytes], reader: pa.RecordBatchReader) -> Generator[bytes, None, None]:
    try:
        yield from chunks
    finally:
        reader.close()  # stops the scan's read-ahead


class Prefetch:
    """Runs a generator of byte pieces in a thread of its own, at most ``ahead`` pieces ahead of its reader.

    So the store is read (DuckDB and Arrow release the GIL) while earlier pieces are being sent, in memory
    bounded by ``ahead`` + 2 pieces. The thread closes ``pieces`` when they run out, fail or :meth:`stop` is
    called (then after the piece it is making); :meth:`get` re-raises a failure.
    """

    def __init__(self, pieces: Generator[bytes, None, None], ahead: int) -> None:
        self._queue: queue.Queue[bytes | BaseException | None] = queue.Queue(ahead)
        self._stopped = threading.Event()
        threading.Thread(target=self._run, args=(pieces,), name="trajstore-steps", daemon=True).start()

    def _run(self, pieces: Generator[bytes, None, None]) -> None:
        end: BaseException | None = None
        try:
            with contextlib.closing(pieces):
                for piece in pieces:
                    if not self._put(piece):
                        break
        except BaseException as exc:  # handed to the reader, which raises it
            end = exc
        self._put(end)

    def _put(self, item: bytes | BaseException | None) -> bool:
        while not self._stopped.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                pass
        return False

    def get(self) -> bytes | None:
        """The next piece (blocking), or ``None`` at the end or once stopped."""
        while True:
            try:
                item = self._queue.get(timeout=0.1)
            except queue.Empty:
                if self._stopped.is_set():
                    return None
                continue
            if isinstance(item, BaseException):
                raise item
            return item

    def stop(self) -> None:
        self._stopped.set()


async def _until_disconnect(chunks: Generator[bytes, None, None]) -> AsyncIterator[bytes]:
    """Send the pieces as a :class:`Prefetch` makes them; stop it (and so close the snapshot) as soon as
    the client goes away."""
    ahead = Prefetch(chunks, PREFETCH_PIECES)
    try:
        while True:
            piece = await anyio.to_thread.run_sync(ahead.get, abandon_on_cancel=True)
            if piece is None:
                return
            yield piece
    finally:
        ahead.stop()


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
    try:
        chunks = _stream(store, flt, columns, batch_rows or settings.stream_batch_rows)
    except InputError as exc:  # a column the store lacks, as for format=json
        raise HTTPException(status_code=404, detail=str(exc)) from exc
    return StreamingResponse(_until_disconnect(chunks), media_type=ARROW_STREAM)
