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
import ssl
import time
import uuid
import warnings
from typing import Any, BinaryIO, Iterator, Literal, Mapping, Sequence

import pyarrow as pa

from trajstore.__about__ import __version__
from trajstore.errors import InputError, RemoteError, RunNotFoundError, StoreDamagedError, UnsupportedTableError
from trajstore.extras import needed
from trajstore.loaders.loader import BatchStream, check_format
from trajstore.query.batches import BatchFormat, check_batching, training_batches
from trajstore.query.filters import Names, filtered
from trajstore.query.follow import Commit, check_follow
from trajstore.remote.loader import RemoteBatches
from trajstore.remote.replay import RemoteReplay
from trajstore.remote.stream import HttpByteStream
from trajstore.remote.wire import ARROW_STREAM, ipc_bytes

with needed("client", "trajstore.Client (and a remote writer)"):
    import httpx

log = logging.getLogger(__name__)

RETRY_STATUSES = (429, 502, 503, 504)  # busy (a place of its kind taken), or the store or a worker failing
PAGE_ROWS = 10_000  # episodes asked for per page when walking every match (the server may cap it lower)
TOTAL_HEADER, CURSOR_HEADER, VERSION_HEADER = "X-Total-Count", "X-Next-Cursor", "X-Trajstore-Version"
ERROR_TYPE = "urn:trajstore:error:"  # a problem's type for an error of trajstore.errors (see api/problems.py)


class RunNotFoundRemoteError(RemoteError, RunNotFoundError):
    """The service's store does not hold a run the request named (404): caught as a
    :class:`~trajstore.errors.RemoteError` (``status``, ``detail``) and, as from a Store, as a
    :class:`~trajstore.errors.RunNotFoundError`."""


class StoreDamagedRemoteError(RemoteError, StoreDamagedError):
    """The service's store cannot be read (503 from ``GET /ready``): caught as a
    :class:`~trajstore.errors.RemoteError` and, as from :meth:`Store.health <trajstore.store.Store.health>`, as a
    :class:`~trajstore.errors.StoreDamagedError`."""

    path: str | None = None


class UnsupportedTableRemoteError(RemoteError, UnsupportedTableError):
    """The service's store, at the version read, needs a Delta reader feature trajstore does not implement (409):
    caught as a :class:`~trajstore.errors.RemoteError` and, as from a Store, as an
    :class:`~trajstore.errors.UnsupportedTableError` (its message names the feature, the version and what to do)."""

    features: tuple[str, ...] = ()
    version: int | None = None


PROBLEMS = {"RunNotFoundError": RunNotFoundRemoteError, "StoreDamagedError": StoreDamagedRemoteError,
            "UnsupportedTableError": UnsupportedTableRemoteError}


_filtered = filtered(expand=True)  # the Store's filter keywords, sent as the REST service's query parameters


MAX_RETRY_WAIT_S = 30.0  # the longest wait before one retry, whatever Retry-After asks


class Client:
    """A connection to a trajstore service (``trajstore serve``): the Store's reads, over HTTP.

    The readers have the Store's names, filters (``run_id=``, ``min_return=``, ``mode=``, …, ``filter=``) and
    return types, so code moves from a local store to a served one by changing how it is opened. Every read takes
    ``version=N``: the store as it was at version N (``?version=``, see ``GET /history``), as
    ``trajstore.open(uri, version=N)`` reads it; by default the latest version.

    Reads are retried (``retries`` times) on connection errors and 429/502/503/504, after ``backoff`` seconds
    doubled at each attempt, or after the server's ``Retry-After`` if it asks for longer (at most
    :data:`MAX_RETRY_WAIT_S`); so are writes that carry an idempotency key. A 503 is what the service answers
    while its object store fails or does not answer. ``where`` is a condition over ``episodes``, which the
    service parses: comparisons, ``AND``/``OR``/``NOT``, ``IN``, ``BETWEEN``, ``IS NULL``, ``LIKE`` and a few
    pure functions (:mod:`trajstore.query.condition`). ``tests/test_readers.py`` compares the readers'
    signatures with the Store's.

    Args:
        url: The service's address, ``http://host:port``.
        api_key: The key the service was started with (``TRAJSTORE_API_KEY``); needed only to write.
        timeout: Seconds to wait for a connection or an answer.
        retries: How many times a failed read is sent again.
        backoff: Seconds before the first retry, doubled at each one.
        transport: An httpx transport to send requests through instead of the network (tests).

    Raises:
        RemoteError: From every call, for an error the server reports (``status`` and ``detail`` from its problem
            document; ``status`` 0 when no server answered).
        RunNotFoundError: From every read, for a run the store does not hold (as
            :class:`RunNotFoundRemoteError`, also a ``RemoteError`` with ``status`` 404), with the Store's message.

    Examples:
        A service must be running at the address (``trajstore serve --store ./trajdata``), here with a run ``demo``:

        >>> client = trajstore.Client("http://127.0.0.1:8321")
        >>> client.stats(run_id="demo")["n_traj"].to_pylist()
        [10]
        >>> client.close()
    """

    def __init__(self, url: str, api_key: str | None = None, *, timeout: float = 30.0, retries: int = 3,
                 backoff: float = 0.2, transport: httpx.BaseTransport | None = None) -> None:
        headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.url = url.rstrip("/")
        self.retries, self.backoff = retries, backoff
        self._timeout, self._transport, self._headers = timeout, transport, headers

    @functools.cached_property
    def _http(self) -> httpx.Client:
        # made on first use, with the process's one TLS context: each client's own cost ~20 ms of CPU to load the
        # certificates (1,000 actors' RemoteWriters in one process: 20 s), which a script that only streams
        # (through http.client) never needs to pay
        return httpx.Client(base_url=self.url, headers=self._headers, timeout=self._timeout,
                            transport=self._transport, verify=_tls())

    def __repr__(self) -> str:
        return f"Client({self.url!r})"

    def close(self) -> None:
        """Close the client's connections; a client is also a context manager that closes on exit."""
        if "_http" in self.__dict__:
            self._http.close()

    def __enter__(self) -> Client:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    # --- reads -------------------------------------------------------------------------------------------

    def health(self) -> dict[str, Any]:
        """Whether the service can serve its store (``GET /ready``): :meth:`Store.health
        <trajstore.store.Store.health>` of the service's store, ``{"status": "ready", "store", "version", "files"}``.

        Raises:
            StoreDamagedRemoteError: 503 (after the retries) while the store's latest version cannot be read, naming
                why; also a :class:`~trajstore.errors.StoreDamagedError`, as :meth:`Store.health
                <trajstore.store.Store.health>` raises.
        """
        return self._request("GET", "/ready").json()

    def runs(self, *, last: int | None = None, gamma: float | None = None,
             version: int | None = None) -> pa.Table:
        """:meth:`Store.runs <trajstore.store.Store.runs>`: one row per ``(run_id, env_id)``, its episodes, complete
        episodes, steps and last write time; with ``last``, the statistics of its ``last`` complete episodes to end
        too (``GET /runs`` as Arrow)."""
        return self._table("GET", "/runs", params={"last": last, "gamma": gamma, "version": version})

    def run_info(self, run_id: str, *, version: int | None = None) -> dict[str, Any]:
        """One run as ``GET /runs/{run_id}`` gives it: its envs and counts, ``config``, ``tags``, ``notes``,
        ``created`` and the program that first described it (see :meth:`Store.run_info
        <trajstore.store.Store.run_info>`)."""
        return self._request("GET", f"/runs/{run_id}", params={"version": version}).json()

    def set_run(self, run_id: str, *, config: Mapping[str, Any] | None = None, tags: Sequence[str] | None = None,
                notes: str | None = None, replace: bool = True,
                provenance: Mapping[str, str | None] | None = None) -> dict[str, Any]:
        """Describe ``run_id`` (``PATCH /runs/{run_id}``, with the API key), a run the served store holds (else
        :class:`~trajstore.errors.RunNotFoundError`): as :meth:`Store.set_run <trajstore.store.Store.set_run>`, or
        with ``replace=False`` as a writer opening the run (``provenance``: the writing program's version, git commit
        and host, recorded if the run was never described); returns what describes it now."""
        body = {"config": config, "tags": None if tags is None else list(tags), "notes": notes, "replace": replace,
                **({} if provenance is None else {"provenance": dict(provenance)})}
        return self._request("PATCH", f"/runs/{run_id}", json=body, retry=True).json()

    @_filtered
    def episodes(self, *, where: str | None = None, order_by: str = "episode_id", limit: int | None = None,
                 offset: int = 0, gamma: float | None = None, version: int | None = None,
                 **filters: Any) -> pa.Table:
        """Every episode the filters select (with ``limit``, the first ``limit`` of them after ``offset``), in
        ``order_by`` order, as :meth:`Store.episodes <trajstore.store.Store.episodes>` gives them.

        The service answers in pages (``max_page_size`` rows at most); this walks them, with the keyset cursor in
        ``episode_id`` order and by offset otherwise, every page read at one version: ``version``, or the
        version of the first page when the answer takes more than one.

        Args:
            order_by: A column of ``episodes``, ``-`` prefixed for descending; several comma-separated.
            limit: At most this many episodes; every match without it.
            offset: Skip this many first.
            gamma: Add ``discounted_return`` for this discount.
            version: Read the store as it was at this version.
            **filters: The Store's filter keywords (``run_id=``, ``complete=``, ``min_return=``, …, ``filter=``).

        Returns:
            An Arrow table, one row per episode.

        Raises:
            InputError: A ``limit`` or ``offset`` that is not a whole number >= 0.
            RunNotFoundError: A ``run_id`` the store does not hold.
            RemoteError: Any other error the service reports.

        Examples:
            >>> client = trajstore.Client("http://127.0.0.1:8321")
            >>> client.episodes(run_id="demo", complete=True, order_by="-episode_return", limit=3).num_rows
            3
        """
        for name, value in (("limit", limit), ("offset", offset)):
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 0):
                raise InputError(f"{name}: must be a whole number >= 0, got {value!r}")
        params = {"where": where, "order_by": order_by, "gamma": gamma, **filters}
        first, headers = self._episode_page(params, rows=_page_rows(limit, 0), offset=offset, version=version)
        needed = _needed(int(headers[TOTAL_HEADER]), offset, limit)
        if first.num_rows >= needed:
            return first.slice(0, needed)
        if version is None:  # more pages to come: all of them, the first again too, at the version it read
            version = int(headers[VERSION_HEADER])
            first, headers = self._episode_page(params, rows=_page_rows(limit, 0), offset=offset, version=version)
            needed = _needed(int(headers[TOTAL_HEADER]), offset, limit)
        pages, got = [first], first.num_rows
        while got < needed and pages[-1].num_rows:
            page, headers = self._episode_page(params, rows=_page_rows(limit, got), offset=offset + got,
                                               version=version, cursor=headers.get(CURSOR_HEADER))
            pages.append(page)
            got += page.num_rows
        return pa.concat_tables(pages).slice(0, needed)

    def _episode_page(self, params: Mapping[str, Any], *, rows: int, offset: int, version: int | None,
                      cursor: str | None = None) -> tuple[pa.Table, httpx.Headers]:
        """One Arrow page of ``GET /episodes`` and its headers (total, next cursor, version read)."""
        where = {"cursor": cursor} if cursor else {"offset": offset}
        response = self._request("GET", "/episodes", params={**params, "limit": rows, "version": version, **where},
                                 headers={"Accept": ARROW_STREAM})
        return pa.ipc.open_stream(response.content).read_all(), response.headers

    def episode_steps(self, episode_id: int, columns: Sequence[str] | None = None, *, limit: int | None = None,
                      agent_id: Names = None, version: int | None = None) -> pa.Table:
        """Every step of one episode in order (the first ``limit`` with ``limit``); of a multi-agent episode, one row
        per agent and step (``agent_id``: those agents' rows only)."""
        agents = [agent_id] if isinstance(agent_id, str) else agent_id
        return self._table("GET", f"/episodes/{int(episode_id)}/steps", params={
            "columns": None if columns is None else list(columns), "limit": limit, "version": version,
            "agent_id": None if agents is None else list(agents)})

    @_filtered
    def stats(self, *, by: Names = None, gamma: float | None = None, where: str | None = None,
              include_incomplete: bool = False, metric: str | None = None, version: int | None = None,
              **filters: Any) -> pa.Table:
        """Episode statistics, one row per group of ``by``: :meth:`Store.stats <trajstore.store.Store.stats>`,
        computed by the service (``GET /stats``).

        Args:
            by: Group by these columns of ``episodes``, or by a run's config (``"config.lr"``).
            gamma: Add ``discounted_return_*`` for this discount in [0, 1].
            where: A condition over the ``episodes`` view, which the service parses.
            include_incomplete: Count unfinished episodes too.
            metric: Also the statistics of this per-episode metric (``metric_n``, ``metric_*``).
            version: Read the store as it was at this version.
            **filters: The Store's filter keywords (``run_id=``, ``min_return=``, …, ``filter=``).

        Returns:
            An Arrow table, as the Store's.

        Raises:
            RunNotFoundError: A ``run_id`` the store does not hold.
            RemoteError: Any other error the service reports (422 naming a bad argument).

        Examples:
            >>> client = trajstore.Client("http://127.0.0.1:8321")
            >>> client.stats(by="run_id", gamma=0.99)["run_id"].to_pylist()
            ['demo']
        """
        params = {"by": [by] if isinstance(by, str) else None if by is None else list(by), "gamma": gamma,
                  "where": where, "include_incomplete": include_incomplete, "metric": metric, "version": version,
                  **filters}
        return self._table("GET", "/stats", params=params)

    def compare(self, by: Names, *, metric: str = "episode_return", task: str = "env_id",
                last: int = 100, mode: str | None = None, normalize: Mapping[str, Sequence[float]] | None = None,
                statistics: Sequence[str] | None = None, ci: float = 0.95, reps: int = 2000, seed: int = 0,
                run_id: Names = None, where: str | None = None, version: int | None = None) -> pa.Table:
        """:meth:`Store.compare <trajstore.store.Store.compare>` computed by the service (``GET /compare``).

        ``where`` is a condition over the columns of ``episodes`` that the service parses (never runs as SQL text):
        comparisons, ``AND``/``OR``/``NOT``, ``IN (…)``, ``BETWEEN``, ``IS [NOT] NULL``, ``[I]LIKE``, arithmetic and
        a few pure functions (:mod:`trajstore.query.condition`), e.g. ``"env_id = 'Hopper-v4' AND episode_length >
        100"``; anything else is an :class:`~trajstore.errors.InputError` naming ``where``. Comparisons run a few
        at a time on a service (``compute_max_concurrent``): a busy one is asked again after its ``Retry-After``."""
        return self._table("GET", "/compare", params={
            **self._comparing(by, metric, task, last, mode, normalize, ci, reps, seed, run_id, where, version),
            "statistic": None if statistics is None else list(statistics)})

    def probability_of_improvement(self, x: str, y: str, *, by: Names, metric: str = "episode_return",
                                   task: str = "env_id", last: int = 100, mode: str | None = None,
                                   normalize: Mapping[str, Sequence[float]] | None = None, ci: float = 0.95,
                                   reps: int = 2000, seed: int = 0, run_id: Names = None,
                                   where: str | None = None, version: int | None = None) -> dict[str, Any]:
        """:meth:`Store.probability_of_improvement <trajstore.store.Store.probability_of_improvement>` computed by
        the service."""
        params = {**self._comparing(by, metric, task, last, mode, normalize, ci, reps, seed, run_id, where, version),
                  "x": x, "y": y}
        return self._request("GET", "/compare/improvement", params=params).json()

    def performance_profile(self, by: Names, *, thresholds: Sequence[float], metric: str = "episode_return",
                            task: str = "env_id", last: int = 100, mode: str | None = None,
                            normalize: Mapping[str, Sequence[float]] | None = None, ci: float = 0.95,
                            reps: int = 2000, seed: int = 0, run_id: Names = None, where: str | None = None,
                            version: int | None = None) -> pa.Table:
        """:meth:`Store.performance_profile <trajstore.store.Store.performance_profile>` computed by the
        service."""
        params = {**self._comparing(by, metric, task, last, mode, normalize, ci, reps, seed, run_id, where, version),
                  "threshold": [float(t) for t in thresholds]}
        return self._table("GET", "/compare/profile", params=params)

    def scores(self, by: Names, *, metric: str = "episode_return", task: str = "env_id",
               last: int = 100, mode: str | None = None, normalize: Mapping[str, Sequence[float]] | None = None,
               run_id: Names = None, where: str | None = None, version: int | None = None) -> pa.Table:
        """:meth:`Store.scores <trajstore.store.Store.scores>` computed by the service."""
        params = self._comparing(by, metric, task, last, mode, normalize, 0.95, 1, 0, run_id, where, version)
        for unused in ("ci", "reps", "seed"):
            params.pop(unused)
        return self._table("GET", "/compare/scores", params=params)

    @_filtered
    def curves(self, *, by: Names = None, run_id: Names = None, env_id: Names = None, where: str | None = None,
               gamma: float | None = None, metric: str | None = None, task: str | None = None,
               bins: int | None = None, aggregate: str | None = None, ci: float | None = None,
               reps: int | None = None, seed: int | None = None, mode: str | None = None,
               version: int | None = None, **filters: Any) -> pa.Table:
        """:meth:`Store.curves <trajstore.store.Store.curves>` from the service (``GET /curves`` as Arrow): each
        run's complete episodes in the order they ended, or with ``by`` each group's learning curve across seeds
        (computed a few at a time on a service, as comparisons are)."""
        params = {"by": [by] if isinstance(by, str) else None if by is None else list(by),
                  "run_id": [run_id] if isinstance(run_id, str) else run_id,
                  "env_id": [env_id] if isinstance(env_id, str) else env_id, "where": where, "gamma": gamma,
                  "metric": metric, "task": task, "bins": bins, "aggregate": aggregate, "ci": ci, "reps": reps,
                  "seed": seed, "mode": mode, "version": version, **filters}
        return self._table("GET", "/curves", params=params)

    def group_curves(self, by: Names, **kwargs: Any) -> pa.Table:
        """Deprecated: :meth:`curves` with ``by`` (the same answer); goes in the next release."""
        warnings.warn("Client.group_curves is deprecated and goes in the next release: use client.curves(by=…)",
                      DeprecationWarning, stacklevel=2)
        return self.curves(by=by, **kwargs)

    @staticmethod
    def _comparing(by: Any, metric: str, task: str, last: int, mode: str | None, normalize: Any, ci: float,
                   reps: int, seed: int, run_id: Any, where: str | None, version: int | None) -> dict[str, Any]:
        return {"by": [by] if isinstance(by, str) else list(by), "metric": metric, "task": task, "last": last,
                "mode": mode, "normalize": None if normalize is None else json.dumps(
                    {k: list(v) for k, v in normalize.items()}),
                "ci": ci, "reps": reps, "seed": seed, "run_id": [run_id] if isinstance(run_id, str) else run_id,
                "where": where, "version": version}

    @_filtered
    def returns(self, *, gamma: float, per: Literal["episode", "step"] = "episode", where: str | None = None,
                limit: int | None = None, version: int | None = None, **filters: Any) -> pa.Table:
        """:meth:`Store.returns <trajstore.store.Store.returns>` from the service (at most its limit, 10,000 rows
        unless ``limit`` asks for fewer or up to 100,000)."""
        return self._table("GET", "/returns", params={"gamma": gamma, "per": per, "where": where, "limit": limit,
                                                      "version": version, **filters})

    def sql(self, query: str, *, run_id: Names = None, env_id: Names = None, max_rows: int | None = None,
            version: int | None = None, as_: Literal["arrow", "dicts"] | None = None) -> pa.Table:
        """Run one read-only SELECT in the service's sandbox (``POST /sql``) over the ``steps``, ``episodes`` and
        ``runs`` views.

        The sandbox reads no file and writes nothing, and bounds the query's time, rows, bytes and memory (see the
        service's ``TRAJSTORE_SQL_*`` settings).

        Args:
            query: One DuckDB SELECT.
            max_rows: At most this many rows (the service caps it too).
            as_: Deprecated: call ``.to_pylist()`` on the table for a list of dicts.
            run_id: Only these runs' steps in the views (as for ``Store.sql``).
            env_id: Only these environments' steps in the views; each column then has its own type.
            version: Read the store as it was at this version.

        Returns:
            The result as an Arrow table, as :meth:`Store.sql <trajstore.store.Store.sql>` gives it.

        Raises:
            RemoteError: The query was refused (403: not one SELECT, or reaching outside the store), failed (400),
                ran out of time (408), answered too much or took too much memory (413), or found every place taken
                (429, after the retries).

        Examples:
            >>> client = trajstore.Client("http://127.0.0.1:8321")
            >>> client.sql("SELECT count(DISTINCT run_id) AS runs FROM steps").to_pylist()
            [{'runs': 1}]
        """
        body: dict[str, Any] = {"query": query, "max_rows": max_rows}
        for name, value in (("run_id", run_id), ("env_id", env_id)):
            if value is not None:
                body[name] = [value] if isinstance(value, str) else list(value)
        table = self._table("POST", "/sql", json=body, params={"version": version})
        if as_ is None or as_ == "arrow":
            return table
        warnings.warn("Client.sql(as_=...) is deprecated and goes in the next release: Client.sql gives an Arrow "
                      "table, as Store.sql does; call .to_pylist() on it for a list of dicts", DeprecationWarning,
                      stacklevel=2)
        rows: Any = table.to_pylist()
        return rows

    def schema(self, env_id: str | None = None, *, version: int | None = None) -> pa.Schema:
        """The Arrow types of the store's ``steps`` columns (of one environment's files with ``env_id``)."""
        return self._table("GET", "/schema", params={"env_id": env_id, "version": version}).schema

    # --- following ---------------------------------------------------------------------------------------

    def follow(self, columns: Sequence[str] | None = None, *, run_id: Names = None, env_id: Names = None,
               since: int | None = None, episodes: bool = False, timeout: float | None = None) -> Iterator[Commit]:
        """What :meth:`Store.follow <trajstore.store.Store.follow>` yields, from the service: the rows of each new
        commit in commit order, exactly once (``since``: the last version seen; None: from now on).

        Listens to ``GET /events`` and fetches each version after the last one delivered from
        ``GET /commits/{version}`` (so a burst of commits, or a listener that fell behind, misses none);
        stops after ``timeout`` seconds without an event (None: never). A stream the server ends (a restart,
        its store failing) is opened again, with the client's retries, and goes on after the last version
        delivered; a server that stays unable raises :class:`~trajstore.errors.RemoteError`.
        """
        check_follow(since, 1.0, timeout)
        params = {"columns": None if columns is None else list(columns),
                  "run_id": [run_id] if isinstance(run_id, str) else run_id,
                  "env_id": [env_id] if isinstance(env_id, str) else env_id, "episodes": episodes}
        read = httpx.Timeout(self._timeout, read=timeout)
        last, failures = since, 0
        while True:
            try:
                with self._events(read) as response:
                    for _name, data in _sse(response.iter_lines()):  # a hello, then one event per commit
                        failures = 0
                        last = data["version"] if last is None else last
                        for version in range(last + 1, data["version"] + 1):
                            found = self._commit(version, params)
                            if found is not None:
                                yield found
                        last = max(last, data["version"])
            except httpx.ReadTimeout:
                return
            except httpx.TransportError as exc:
                if failures == self.retries:
                    raise unreachable("GET", f"{self.url}/events", exc) from exc
            else:
                if failures == self.retries:
                    raise RemoteError(0, "Stream ended", f"GET {self.url}/events: the server ended the stream "
                                      f"{failures + 1} times in a row; follow again with since={last}")
            time.sleep(self._wait(failures))
            failures += 1

    @contextlib.contextmanager
    def _events(self, timeout: httpx.Timeout) -> Iterator[httpx.Response]:
        """The ``GET /events`` stream, its opening retried like any read (503 while the store fails)."""
        for attempt in range(self.retries + 1):
            with self._http.stream("GET", "/events", timeout=timeout) as response:
                if response.status_code not in RETRY_STATUSES or attempt == self.retries:
                    _raise_for_problem(response, streamed=True)
                    yield response
                    return
                retry_after = response.headers.get("Retry-After")
            time.sleep(self._wait(attempt, retry_after))

    def _commit(self, version: int, params: Mapping[str, Any]) -> Commit | None:
        rows = self._table("GET", f"/commits/{version}", params=params)
        if rows.num_rows == 0:
            return None
        runs = sorted(set(rows["run_id"].to_pylist())) if "run_id" in rows.column_names else []
        return Commit(version, rows, runs)

    # --- streaming ---------------------------------------------------------------------------------------

    @_filtered
    def iter_batches(self, *, batch_size: int = 4096, columns: Sequence[str] | None = None, shuffle: bool = False,
                     seed: int | None = None, shuffle_buffer: int = 65_536, drop_last: bool = False,
                     format: BatchFormat = "numpy", where: str | None = None,  # noqa: A002
                     version: int | None = None, **filters: Any) -> Iterator[Any]:
        """Batches of ``batch_size`` steps for a training loop, streamed from ``GET /steps`` and yielded while the
        stream is still arriving: the batches of :meth:`Store.iter_batches <trajstore.store.Store.iter_batches>`.

        With ``shuffle``, rows are drawn at random from a buffer of ``shuffle_buffer`` rows, reproducibly for a
        given ``seed``; memory stays bounded by that buffer.

        Args:
            batch_size: Steps per batch.
            columns: The columns to read; all without it.
            shuffle: Draw rows at random from a buffer.
            seed: The shuffle's seed.
            shuffle_buffer: Rows in the shuffle's buffer.
            drop_last: Leave out a last batch shorter than ``batch_size``.
            format: ``"numpy"`` (dict of ``(n, …)`` arrays), ``"jax"``, ``"torch"`` (CPU tensors; text columns stay
                numpy) or ``"arrow"`` (record batches).
            version: Read the store as it was at this version.
            **filters: The Store's filter keywords (``run_id=``, ``complete=``, …, ``filter=``).

        Yields:
            One batch at a time, in ``format``.

        Raises:
            InputError: A ``batch_size``, ``shuffle_buffer`` or ``format`` out of range.
            RunNotFoundError: A ``run_id`` the store does not hold.
            RemoteError: Any other error the service reports, or a service that cannot be reached.

        Examples:
            >>> client = trajstore.Client("http://127.0.0.1:8321")
            >>> batch = next(client.iter_batches(batch_size=32, columns=["obs", "reward"], run_id="demo"))
            >>> batch["obs"].shape
            (32, 4)
        """
        check_batching(batch_size, shuffle_buffer, format)
        params = {"columns": None if columns is None else list(columns), "batch_rows": max(batch_size, 8192),
                  "where": where, "version": version, **filters}
        with self._stream("/steps", params) as body:
            yield from training_batches(pa.ipc.open_stream(body), batch_size=batch_size, shuffle=shuffle, seed=seed,
                                        shuffle_buffer=shuffle_buffer, drop_last=drop_last, format=format)

    @_filtered
    def sequences(self, length: int, *, columns: Sequence[str] | None = None, stride: int | None = None,
                  pad: bool = False, gamma: float | None = None, batch_size: int = 256, shuffle: bool = False,
                  seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1, run_id: Names = None,
                  where: str | None = None, format: BatchFormat = "numpy",  # noqa: A002
                  resume: Mapping[str, Any] | None = None, weight_by: str | None = None,
                  num_samples: int | None = None, agent_id: Names = None, version: int | None = None,
                  **filters: Any) -> BatchStream:
        """The batches of :meth:`Store.sequences <trajstore.store.Store.sequences>` with these arguments, from
        the service's ``/sequences`` stream; the iterator's ``state_dict()`` passed back as ``resume`` continues
        after its last batch (here or on a Store over the same version)."""
        check_format(format)
        params = {"length": length, "stride": stride, "pad": pad, "gamma": gamma,
                  **self._loading(columns, batch_size, shuffle, seed, epoch, rank, world_size, run_id, where, resume,
                                  weight_by, num_samples, agent_id, version), **filters}
        return RemoteBatches(self._stream("/sequences", params), format)

    def iter_sequences(self, length: int, **kwargs: Any) -> BatchStream:
        """Deprecated: :meth:`sequences` (the Store's name); goes in the next release."""
        warnings.warn("Client.iter_sequences is deprecated and goes in the next release: use client.sequences "
                      "(the same arguments and batches, under the Store's name)", DeprecationWarning, stacklevel=2)
        return self.sequences(length, **kwargs)

    @_filtered
    def transitions(self, n: int, *, gamma: float, columns: Sequence[str] | None = None, batch_size: int = 256,
                    shuffle: bool = False, seed: int = 0, epoch: int = 0, rank: int = 0, world_size: int = 1,
                    run_id: Names = None, where: str | None = None, format: BatchFormat = "numpy",  # noqa: A002
                    resume: Mapping[str, Any] | None = None, weight_by: str | None = None,
                    num_samples: int | None = None, agent_id: Names = None, version: int | None = None,
                    **filters: Any) -> BatchStream:
        """The batches of :meth:`Store.transitions <trajstore.store.Store.transitions>` from ``/transitions``."""
        check_format(format)
        params = {"n": n, "gamma": gamma, **self._loading(columns, batch_size, shuffle, seed, epoch, rank, world_size,
                                                          run_id, where, resume, weight_by, num_samples, agent_id,
                                                          version), **filters}
        return RemoteBatches(self._stream("/transitions", params), format)

    @staticmethod
    def _loading(columns: Sequence[str] | None, batch_size: int, shuffle: bool, seed: int, epoch: int, rank: int,
                 world_size: int, run_id: Names, where: str | None, resume: Mapping[str, Any] | None,
                 weight_by: str | None, num_samples: int | None, agent_id: Names,
                 version: int | None) -> dict[str, Any]:
        """The query parameters the two loaders' streams share."""
        return {"columns": None if columns is None else list(columns), "batch_size": batch_size, "shuffle": shuffle,
                "order_seed": seed, "epoch": epoch, "rank": rank, "world_size": world_size,
                "run_id": [run_id] if isinstance(run_id, str) else run_id, "where": where, "weight_by": weight_by,
                "num_samples": num_samples, "resume": None if resume is None else json.dumps(dict(resume)),
                "version": version, "agent_id": [agent_id] if isinstance(agent_id, str) else agent_id}

    @_filtered
    def replay(self, columns: list[str] | None = None, *, length: int | None = None, n: int | None = None,
               gamma: float | None = None, where: str | None = None, agent_id: str | list[str] | None = None,
               priorities: str | None = "default", alpha: float = 0.6, beta: float = 0.4, eps: float = 1e-6,
               capacity: int | None = None, follow: bool = False, seed: int = 0, stride: int | None = None,
               pad: bool = False, version: int | None = None, poll: float = 1.0,
               format: str = "numpy", replay_id: str | None = None, **filters: Any) -> RemoteReplay:  # noqa: A002
        """:meth:`Store.replay <trajstore.store.Store.replay>` over the service (``POST /replays``; the API key
        needed): a replay held open by the service, sampled and updated by this learner and any other given its
        :attr:`~trajstore.remote.replay.RemoteReplay.replay_id` (``replay_id=``: use that open replay; the other
        arguments are then its own). ``version`` resumes from the priorities table as it was then; ``format`` is
        the batches' (``numpy``, ``torch``, ``jax``)."""
        check_format(format)
        if replay_id is not None:
            described = self._request("GET", f"/replays/{replay_id}").json()
            return RemoteReplay(self, described, format)
        params = {"columns": columns, "length": length, "n": n, "gamma": gamma, "where": where,
                  "agent_id": [agent_id] if isinstance(agent_id, str) else agent_id,
                  "priorities": priorities or "default", "commit": priorities is not None, "alpha": alpha,
                  "beta": beta, "eps": eps, "capacity": capacity, "follow": follow, "draw_seed": seed,
                  "stride": stride, "pad": pad, "priorities_version": version, "poll": poll, **filters}
        return RemoteReplay(self, self._request("POST", "/replays", params=params).json(), format)

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
        response: Any  # httpx's, or http.client's (a file of the body)
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
                    raise unreachable("GET", url, exc) from exc
            else:
                if response.status not in RETRY_STATUSES or attempt == self.retries:
                    break
                retry_after = response.getheader("Retry-After")
                conn.close()
                time.sleep(self._wait(attempt, retry_after))
                continue
            time.sleep(self._wait(attempt))
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

    def post_rows(self, run_id: str, env_id: str, rows: pa.Table, *, idempotency_key: str | None = None,
                  idempotency_sequence: int | None = None) -> dict:
        """Append rows already cut into episodes (see :class:`~trajstore.remote.writer.RemoteWriter`); retried
        safely under ``idempotency_key`` (a new one per call by default). With ``idempotency_sequence``, the key
        names a writer and the number this request among its requests, which it sends in order: the store then
        keeps one key per writer rather than one per request."""
        return self.post_body(run_id, env_id, ipc_bytes(rows), idempotency_key=idempotency_key,
                              idempotency_sequence=idempotency_sequence)

    def post_body(self, run_id: str, env_id: str, body: bytes, *, idempotency_key: str | None = None,
                  idempotency_sequence: int | None = None) -> dict:
        """:meth:`post_rows` with the rows already encoded as an Arrow IPC stream."""
        if idempotency_sequence is not None and idempotency_key is None:
            raise InputError("idempotency_sequence: numbers a writer's requests, so it needs the idempotency_key "
                             "that names the writer")
        headers = {"Content-Type": ARROW_STREAM, "Idempotency-Key": idempotency_key or uuid.uuid4().hex}
        if idempotency_sequence is not None:
            headers["Idempotency-Sequence"] = str(idempotency_sequence)
        response = self._request("POST", f"/runs/{run_id}/batches", params={"env_id": env_id}, retry=True,
                                 content=body, headers=headers)
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
            retry_after = None
            try:
                response = self._http.request(method, path, params=_params(params or {}), **kwargs)
            except httpx.TransportError as exc:
                if attempt + 1 == attempts:
                    raise unreachable(method, f"{self.url}{path}", exc) from exc
            else:
                if response.status_code not in RETRY_STATUSES or attempt + 1 == attempts:
                    _raise_for_problem(response)
                    return response
                retry_after = response.headers.get("Retry-After")
                log.info("%s %s answered %d; retrying", method, path, response.status_code)
            time.sleep(self._wait(attempt, retry_after))
        raise AssertionError("unreachable")

    def _wait(self, attempt: int, retry_after: str | None = None) -> float:
        """Seconds to wait before retry ``attempt + 1``: the back-off, or the server's Retry-After (seconds) if
        longer; never more than :data:`MAX_RETRY_WAIT_S`."""
        try:
            asked = float(retry_after) if retry_after else 0.0
        except ValueError:  # an HTTP date: rare from a trajstore service; the back-off does
            asked = 0.0
        return min(MAX_RETRY_WAIT_S, max(self.backoff * 2 ** attempt, asked))


def _page_rows(limit: int | None, got: int) -> int:
    """Rows to ask for in the next page, ``got`` rows of ``limit`` (None: every match) in."""
    return PAGE_ROWS if limit is None else max(1, min(PAGE_ROWS, limit - got))


def _needed(total: int, offset: int, limit: int | None) -> int:
    """Rows the answer has: the ``total`` matches after ``offset``, at most ``limit``."""
    after = max(0, total - offset)
    return after if limit is None else min(after, limit)


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
    kind = PROBLEMS.get(str(problem.get("type", "")).removeprefix(ERROR_TYPE), RemoteError) \
        if str(problem.get("type", "")).startswith(ERROR_TYPE) else RemoteError
    return kind(status, problem.get("title") or reason, problem.get("detail"))


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


def unreachable(method: str, url: str | httpx.URL, exc: Exception) -> RemoteError:
    """The error for a request that reached no server: the URL, what went wrong, and what to do."""
    reason = str(exc) or type(exc).__name__
    return RemoteError(0, "Connection failed", f"cannot reach {url} ({method}): {reason}; check the service's URL "
                                               "(--url) and that `trajstore serve` is running there")


@functools.cache
def _tls() -> ssl.SSLContext:
    """The TLS context of every client of the process, as httpx makes it (certifi's certificates, or
    ``SSL_CERT_FILE``/``SSL_CERT_DIR`` as set when the first client was made); a context is safe to share."""
    return httpx.create_ssl_context()
