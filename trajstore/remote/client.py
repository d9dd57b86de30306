"""The Python client of a trajstore service: tables as Arrow, steps streamed into a training loop.

>>> client = Client("http://127.0.0.1:8321")                    # doctest: +SKIP
>>> client.stats(by=["run_id"], gamma=0.99)                       # doctest: +SKIP
>>> for batch in client.iter_batches(batch_size=4096, columns=["obs", "action", "reward"],
...                                  shuffle=True, seed=0, run_id="demo"):  # doctest: +SKIP
...     train_step(batch["obs"], batch["action"], batch["reward"])
"""

from __future__ import annotations

import contextlib
import functools
import http.client
import io
import json
import logging
import time
import uuid
from typing import Any, BinaryIO, Iterator, Literal, Mapping

import httpx
import pyarrow as pa

from trajstore.__about__ import __version__
from trajstore.errors import RemoteError
from trajstore.remote.wire import ARROW_STREAM, ipc_bytes
from trajstore.query.batches import BatchFormat, check_batching, training_batches
from trajstore.query.follow import Commit, check_follow
from trajstore.query.loader import check_format
from trajstore.remote.loader import RemoteBatches
from trajstore.remote.stream import HttpByteStream

log = logging.getLogger(__name__)

RETRY_STATUSES = (502, 503, 504)


class Client:
    """A connection to a trajstore service at ``url``; ``api_key`` is needed only to write.

    Reads are retried (``retries`` times, exponential back-off) on connection errors and 502/503/504;
    so are writes that carry an idempotency key. Errors the server reports are raised as
    :class:`~trajstore.errors.RemoteError` with the problem's ``status`` and ``detail``.

    Every read takes ``version=N``: the store as it was at version N (``?version=``, see ``GET /history``), as
    ``trajstore.open(uri, version=N)`` reads it; by default the latest version.
    """

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 30.0, retries: int = 3,
                 backoff: float = 0.2, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.retries, self.backoff = retries, backoff
        self._timeout, self._transport, self._headers = timeout, transport, headers

    @functools.cached_property
    def _http(self) -> httpx.Client:
        # made on first use: an httpx client costs ~40 ms (its TLS context), which a script that only
        # streams (through http.client) never needs to pay
        return httpx.Client(base_url=self.url, headers=self._headers, timeout=self._timeout,
                            transport=self._transport)

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def close(self) -> None:
        if "_http" in self.__dict__:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reads -------------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        return self._request("GET", "/ready").json()

    def runs(self, *, version: int | None = None) -> list[dict[str, Any]]:
        """Every run with its envs, episode and step counts and last write time."""
        return self._request("GET", "/runs", params={"version": version}).json()

    def episodes(self, *, order_by: str = "episode_id", limit: int = 100, offset: int = 0,
                 gamma: float | None = None, version: int | None = None, **filters: Any) -> pa.Table:
        """One page of episodes; filters as in the REST API (``run_id``, ``complete``, ``min_return``, …)."""
        params = {"order_by": order_by, "limit": limit, "offset": offset, "gamma": gamma, "version": version,
                  **filters}
        return self._table("GET", "/episodes", params=params)

    def episode_steps(self, episode_id: int, columns: list[str] | None = None, *,
                      version: int | None = None) -> pa.Table:
        return self._table("GET", f"/episodes/{int(episode_id)}/steps", params={"columns": columns,
                                                                                 "version": version})

    def stats(self, *, by: str | list[str] | None = None, gamma: float | None = None,
              include_incomplete: bool = False, version: int | None = None, **filters: Any) -> pa.Table:
        """Episode statistics with the keys of ``imitation``'s ``rollout_stats``, one row per group of ``by``."""
        params = {"by": [by] if isinstance(by, str) else by, "gamma": gamma,
                  "include_incomplete": include_incomplete, "version": version, **filters}
        return self._table("GET", "/stats", params=params)

    def returns(self, *, gamma: float, per: Literal["episode", "step"] = "episode", limit: int = 10_000,
                version: int | None = None, **filters: Any) -> pa.Table:
        return self._table("GET", "/returns", params={"gamma": gamma, "per": per, "limit": limit, "version": version,
                                                      **filters})

    def sql(self, query: str, *, max_rows: int | None = None, as_: Literal["arrow", "dicts"] = "arrow",
            run_id: str | list[str] | None = None, env_id: str | list[str] | None = None,
            version: int | None = None) -> pa.Table | list[dict[str, Any]]:
        """Run one read-only SELECT on the server; an Arrow table, or a list of dicts with ``as_="dicts"``. With
        ``run_id``/``env_id``, the views hold only those runs' or environments' steps (as for ``Store.sql``)."""
        body: dict[str, Any] = {"query": query, "max_rows": max_rows}
        for name, value in (("run_id", run_id), ("env_id", env_id)):
            if value is not None:
                body[name] = [value] if isinstance(value, str) else list(value)
        table = self._table("POST", "/sql", json=body, params={"version": version})
        return table.to_pylist() if as_ == "dicts" else table

    def schema(self, env_id: str | None = None, *, version: int | None = None) -> pa.Schema:
        """The Arrow types of the store's ``steps`` columns (of one environment's files with ``env_id``)."""
        return self._table("GET", "/schema", params={"env_id": env_id, "version": version}).schema

    # --- following ---------------------------------------------------------------------------------------

    def follow(self, columns: list[str] | None = None, *, run_id: str | list[str] | None = None,
               env_id: str | list[str] | None = None, since: int | None = None, episodes: bool = False,
               timeout: float | None = None) -> Iterator[Commit]:
        """What :meth:`Store.follow <trajstore.store.Store.follow>` yields, from the service: the rows of each new
        commit in commit order, exactly once (``since``: the last version seen; None: from now on).

        Listens to ``GET /events`` and fetches each version after the last one delivered from
        ``GET /commits/{version}`` (so a burst of commits, or a listener that fell behind, misses none);
        stops after ``timeout`` seconds without an event (None: never).
        """
        check_follow(since, 1.0, timeout)
        params = {"columns": columns, "run_id": run_id, "env_id": env_id, "episodes": episodes}
        read = httpx.Timeout(self._timeout, read=timeout)
        try:
            with self._http.stream("GET", "/events", timeout=read) as response:
                _raise_for_problem(response, streamed=True)
                last = since
                for _name, data in _sse(response.iter_lines()):  # a hello, then one event per commit
                    last = data["version"] if last is None else last
                    for version in range(last + 1, data["version"] + 1):
                        found = self._commit(version, params)
                        if found is not None:
                            yield found
                    last = max(last, data["version"])
        except httpx.ReadTimeout:
            return

    def _commit(self, version: int, params: Mapping[str, Any]) -> Commit | None:
        rows = self._table("GET", f"/commits/{version}", params=params)
        if rows.num_rows == 0:
            return None
        runs = sorted(set(rows["run_id"].to_pylist())) if "run_id" in rows.column_names else []
        return Commit(version, rows, runs)

    # --- streaming ---------------------------------------------------------------------------------------

    def iter_batches(self, *, batch_size: int = 4096, columns: list[str] | None = None, shuffle: bool = False,
                     seed: int | None = None, shuffle_buffer: int = 65_536, drop_last: bool = False,
                     format: BatchFormat = "numpy", version: int | None = None,  # noqa: A002
                     **filters: Any) -> Iterator[Any]:
        """Yield batches of ``batch_size`` steps while the stream is still arriving.

        ``format`` is ``"numpy"`` (dict of arrays, ``(n, …)``), ``"jax"`` (dict of JAX arrays) or
        ``"arrow"`` (record batches). With ``shuffle``, rows are drawn at random from a buffer of
        ``shuffle_buffer`` rows, reproducibly for a given ``seed``; memory stays bounded by that buffer.
        """
        check_batching(batch_size, shuffle_buffer, format)
        params = {"columns": columns, "batch_rows": max(batch_size, 8192), "version": version, **filters}
        with self._stream("/steps", params) as body:
            yield from training_batches(pa.ipc.open_stream(body), batch_size=batch_size, shuffle=shuffle, seed=seed,
                                        shuffle_buffer=shuffle_buffer, drop_last=drop_last, format=format)

    def iter_sequences(self, length: int, *, columns: list[str] | None = None, stride: int | None = None,
                       pad: bool = False, gamma: float | None = None, batch_size: int = 256, shuffle: bool = False,
                       seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
                       format: str = "numpy", resume: Mapping[str, Any] | None = None,  # noqa: A002
                       weight_by: str | None = None, num_samples: int | None = None, version: int | None = None,
                       **filters: Any) -> RemoteBatches:
        """The batches of :meth:`Store.sequences <trajstore.store.Store.sequences>` with these arguments, from
        the service's ``/sequences`` stream (filters as in the REST API: ``run_id``, ``complete``, …); the
        iterator's ``state_dict()`` passed back as ``resume`` continues after its last batch."""
        check_format(format)
        params = {"length": length, "columns": columns, "stride": stride, "pad": pad, "gamma": gamma,
                  "batch_size": batch_size, "shuffle": shuffle, "order_seed": seed, "epoch": epoch, "rank": rank,
                  "world_size": world_size, "weight_by": weight_by, "num_samples": num_samples,
                  "resume": None if resume is None else json.dumps(dict(resume)), "version": version, **filters}
        return RemoteBatches(self._stream("/sequences", params), format)

    def transitions(self, n: int, *, gamma: float, columns: list[str] | None = None, batch_size: int = 256,
                    shuffle: bool = False, seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
                    format: str = "numpy", resume: Mapping[str, Any] | None = None,  # noqa: A002
                    weight_by: str | None = None, num_samples: int | None = None, version: int | None = None,
                    **filters: Any) -> RemoteBatches:
        """The batches of :meth:`Store.transitions <trajstore.store.Store.transitions>` from ``/transitions``."""
        check_format(format)
        params = {"n": n, "gamma": gamma, "columns": columns, "batch_size": batch_size, "shuffle": shuffle,
                  "order_seed": seed, "epoch": epoch, "rank": rank, "world_size": world_size, "weight_by": weight_by,
                  "num_samples": num_samples, "resume": None if resume is None else json.dumps(dict(resume)),
                  "version": version, **filters}
        return RemoteBatches(self._stream("/transitions", params), format)

    @contextlib.contextmanager
    def _stream(self, path: str, params: Mapping[str, Any]) -> Iterator[BinaryIO]:
        """The body of ``GET path`` (an Arrow IPC stream) as a file, read as it arrives.

        Read with the standard library's ``http.client``, whose chunked reads hand each IPC message over in
        one piece: a third of the CPU of httpx's 64 KiB reads, which is most of a fast stream's cost on this
        side. Retried like any GET until the body starts. With a custom ``transport``, or a proxy set in
        the environment for this URL (``http.client`` ignores proxies), httpx carries it.
        """
        headers = {"Accept": ARROW_STREAM, "Accept-Encoding": "identity"}
        url = httpx.URL(self.url + path, params=_params(params))
        if self._transport is not None or _proxied(url):
            response = self._http.send(self._http.build_request("GET", url, headers=headers), stream=True)
            try:
                _raise_for_problem(response, streamed=True)
                yield io.BufferedReader(HttpByteStream(response.iter_raw()), 1 << 20)
            finally:
                response.close()
            return
        headers = {**self._headers, **headers, "User-Agent": f"trajstore/{__version__}"}
        conn_type = http.client.HTTPSConnection if url.scheme == "https" else http.client.HTTPConnection
        for attempt in range(self.retries + 1):
            conn = conn_type(url.host, url.port, timeout=self._timeout)
            try:
                conn.request("GET", url.raw_path.decode("ascii"), headers=headers)
                response = conn.getresponse()
            except (OSError, http.client.HTTPException) as exc:
                conn.close()
                if attempt == self.retries:
                    raise RemoteError(0, "Connection failed", f"GET {url}: {exc}") from exc
            else:
                if response.status not in RETRY_STATUSES or attempt == self.retries:
                    break
                conn.close()
            time.sleep(self.backoff * 2 ** attempt)
        try:
            if response.status >= 400:
                raise _problem(response.status, response.reason, response.read())
            yield response
        finally:
            conn.close()

    # --- writes -----------------------------------------------------------------------------------------

    def check_ingest(self) -> dict[str, Any]:
        """Ask the service whether this client's API key may append rows (``GET /ingest``): cheap, and before
        any work that would be lost. Raises :class:`~trajstore.errors.RemoteError`: 401 for a missing or wrong
        key, 403 when the server takes no writes, status 0 when it cannot be reached."""
        return self._request("GET", "/ingest").json()

    def post_rows(self, run_id: str, env_id: str, rows: pa.Table, *, idempotency_key: str | None = None) -> dict:
        """Append rows already cut into episodes (see :class:`~trajstore.remote.writer.RemoteWriter`); retried safely."""
        return self.post_body(run_id, env_id, ipc_bytes(rows), idempotency_key=idempotency_key)

    def post_body(self, run_id: str, env_id: str, body: bytes, *, idempotency_key: str | None = None) -> dict:
        """:meth:`post_rows` with the rows already encoded as an Arrow IPC stream."""
        key = idempotency_key or uuid.uuid4().hex
        response = self._request("POST", f"/runs/{run_id}/batches", params={"env_id": env_id}, retry=True,
                                 content=body, headers={"Content-Type": ARROW_STREAM, "Idempotency-Key": key})
        return response.json()

    # --- plumbing ----------------------------------------------------------------------------------------

    def _table(self, method: str, path: str, **kwargs: Any) -> pa.Table:
        response = self._request(method, path, headers={"Accept": ARROW_STREAM}, **kwargs)
        return pa.ipc.open_stream(response.content).read_all()

    def _request(self, method: str, path: str, *, params: Mapping[str, Any] | None = None,
                 retry: bool | None = None, **kwargs: Any) -> httpx.Response:
        retry = method in ("GET", "HEAD") or path == "/sql" if retry is None else retry
        attempts = self.retries + 1 if retry else 1
        for attempt in range(attempts):
            try:
                response = self._http.request(method, path, params=_params(params or {}), **kwargs)
            except httpx.TransportError as exc:
                if attempt + 1 == attempts:
                    raise RemoteError(0, "Connection failed", f"{method} {self.url}{path}: {exc}") from exc
            else:
                if response.status_code not in RETRY_STATUSES or attempt + 1 == attempts:
                    _raise_for_problem(response)
                    return response
            time.sleep(self.backoff * 2 ** attempt)
        raise AssertionError("unreachable")



def _proxied(url: httpx.URL) -> bool:
    """Whether the environment routes ``url`` through a proxy (``HTTP_PROXY`` and the like, ``NO_PROXY``)."""
    import urllib.request

    proxies = urllib.request.getproxies()
    return bool(proxies.get(url.scheme) or proxies.get("all")) and not urllib.request.proxy_bypass(url.host)


def _params(params: Mapping[str, Any]) -> dict[str, Any]:
    """Query parameters without ``None`` values; booleans as ``true``/``false``."""
    out: dict[str, Any] = {}
    for k, v in params.items():
        if v is None:
            continue
        out[k] = str(v).lower() if isinstance(v, bool) else v
    return out


def _raise_for_problem(response: httpx.Response, *, streamed: bool = False) -> None:
    if response.status_code < 400:
        return
    if streamed:
        response.read()
    raise _problem(response.status_code, response.reason_phrase, response.content)


def _problem(status: int, reason: str, body: bytes) -> RemoteError:
    """The error for a problem+json response (or any error response: then with its reason alone)."""
    try:
        problem = json.loads(body)
    except ValueError:
        problem = None
    if not isinstance(problem, dict):
        problem = {}
    return RemoteError(status, problem.get("title") or reason, problem.get("detail"))


def _sse(lines: Iterator[str]) -> Iterator[tuple[str, dict[str, Any]]]:
    """``(event name, data)`` of each Server-Sent Event with JSON data among ``lines``."""
    name = "message"
    for line in lines:
        if line.startswith("event:"):
            name = line[len("event:"):].strip()
        elif line.startswith("data:"):
            yield name, json.loads(line[len("data:"):])
        elif not line:
            name = "message"
