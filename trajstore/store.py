"""A trajstore store: a directory holding the ``steps`` Delta table, read through DuckDB.

>>> import trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> store.stats().column("n_traj").to_pylist()
[0]
"""

from __future__ import annotations

import json
import logging
import os
import threading
import uuid
from pathlib import Path
from typing import Any, Literal, Sequence

import duckdb
import numpy as np
import pyarrow as pa

from trajstore.errors import InputError, StoreExistsError, StoreNotFoundError
from trajstore.query import Snapshot, check_names, episodes_sql, quote_ident, quote_literal, stats_sql
from trajstore.returns import SortedReturns, check_gamma, sorted_return_to_go
from trajstore.scan import scan_steps
from trajstore.settings import Settings
from trajstore.table import DataFile, StepsTable
from trajstore.writer import Writer

log = logging.getLogger(__name__)

MARKER = "trajstore.json"
FORMAT_VERSION = 1


def open(uri: str | Path, create: bool = False, *, settings: Settings | None = None) -> Store:  # noqa: A001
    """Open the store at ``uri`` (a local directory); with ``create=True`` make it if absent."""
    if isinstance(uri, str) and "://" in uri and not uri.startswith("file://"):
        raise InputError(f"uri: only local directories are supported in this version, got {uri!r}")
    root = Path(str(uri).removeprefix("file://")).expanduser()
    marker = root / MARKER
    if not marker.is_file():
        if not create:
            raise StoreNotFoundError(f"no trajstore store at {root}; make one with trajstore.open(path, create=True) "
                                     "or by writing to it (trajstore rollout --store PATH …)")
        _create(root, marker)
    return Store(root, settings=settings)


def _create(root: Path, marker: Path) -> None:
    """Write the marker atomically; safe when several processes create the same store at once."""
    others = [p for p in root.iterdir() if not p.name.startswith(f".{MARKER}.")] if root.is_dir() else []
    if (root.exists() and not root.is_dir()) or (others and not marker.is_file()):
        raise StoreExistsError(f"{root} exists and is not a trajstore store (no {MARKER}); choose an empty "
                               "or new directory")
    root.mkdir(parents=True, exist_ok=True)
    tmp = root / f".{MARKER}.{os.getpid()}.{uuid.uuid4().hex}.tmp"  # one per process: no shared temp file
    tmp.write_text(json.dumps({"format": "trajstore", "version": FORMAT_VERSION}) + "\n")
    tmp.replace(marker)


class Store:
    """Entry point for writing and querying one store. Every query reads one committed snapshot."""

    def __init__(self, root: Path, *, settings: Settings | None = None) -> None:
        self.root = Path(root)
        self.settings = settings or Settings.from_env()
        self.table = StepsTable(self.root / "steps", row_group_rows=self.settings.row_group_rows)
        self._duckdb: tuple[int, duckdb.DuckDBPyConnection] | None = None
        self._duckdb_lock = threading.Lock()
        self._episodes_cache: tuple[tuple[str, ...], pa.Table] | None = None
        self._episodes_lock = threading.Lock()
        self._schema_cache: tuple[tuple[str, ...], pa.Schema] | None = None

    def __repr__(self) -> str:
        return f"Store({str(self.root)!r})"

    # --- writing ------------------------------------------------------------------------------------

    def writer(self, *, run_id: str, env_id: str, **options: Any) -> Writer:
        """A :class:`Writer` appending to ``run_id``/``env_id``; extra keywords are writer options or lineage."""
        options.setdefault("flush_bytes", self.settings.flush_bytes)
        return Writer(self.table, run_id=run_id, env_id=env_id, **options)

    # --- reading ------------------------------------------------------------------------------------

    def files(self) -> list[DataFile]:
        """The committed Parquet files of the latest version."""
        return self.table.files()

    def snapshot(self, *, config: dict[str, Any] | None = None) -> Snapshot:
        """A DuckDB connection with ``steps`` and ``episodes`` views over the latest committed version."""
        return Snapshot(self.files(), config=config)

    def _query_snapshot(self, *, episodes: Literal["fill", "if-cached"] | None = None) -> Snapshot:
        """A snapshot on a cursor of this store's own DuckDB database, for the queries the store builds itself.

        Opening a DuckDB database costs ~20 ms, a cursor (a connection with its own views) next to nothing.
        :meth:`snapshot` and :meth:`sql` keep a database of their own, which callers may reconfigure.

        With ``episodes``, its ``episodes`` view reads the view's rows materialized once per committed
        version (the file list), so that the queries of one page (runs, episodes, curves, stats) aggregate
        the steps once, not each: ``"fill"`` materializes them when they are not yet, ``"if-cached"``
        only uses them when they are.
        """
        snap = Snapshot(self.files(), con=self._cursor())
        if episodes is not None:
            table = self._materialized_episodes(snap, fill=episodes == "fill")
            if table is not None:
                snap.use_episodes(table)
        return snap

    def _cursor(self) -> duckdb.DuckDBPyConnection:
        with self._duckdb_lock:
            if self._duckdb is None or self._duckdb[0] != os.getpid():  # never reuse one across a fork
                self._duckdb = (os.getpid(), duckdb.connect())
            return self._duckdb[1].cursor()

    def _steps_schema(self, files: list[DataFile], snap: Snapshot | None = None) -> pa.Schema:
        """The Arrow types of the ``steps`` view over ``files`` (asked of ``snap`` when it has them open),
        kept for the latest file list asked about."""
        key = tuple(f.path for f in files)
        cached = self._schema_cache
        if cached is not None and cached[0] == key:
            return cached[1]
        if snap is None:
            with Snapshot(files, con=self._cursor()) as own:
                schema = own.arrow("SELECT * FROM steps LIMIT 0").schema
        else:
            schema = snap.arrow("SELECT * FROM steps LIMIT 0").schema
        self._schema_cache = (key, schema)
        return schema

    def _materialized_episodes(self, snap: Snapshot, *, fill: bool) -> pa.Table | None:
        key = tuple(f.path for f in snap.files)  # committed files never change: the list names the version
        with self._episodes_lock:  # one materialization per version, even for concurrent requests
            cached = self._episodes_cache
            if cached is not None and cached[0] == key:
                return cached[1]
            if not fill:
                return None
            table = snap.arrow("SELECT * FROM episodes")
            self._episodes_cache = (key, table) if table.num_rows <= EPISODE_CACHE_ROWS else None
            return table

    def sql(self, query: str, params: dict[str, Any] | None = None) -> pa.Table:
        """Run SQL over the ``steps`` and ``episodes`` views; returns an Arrow table."""
        with self.snapshot() as snap:
            return snap.arrow(query, params)

    def episodes(self, *, run_id: str | Sequence[str] | None = None, env_id: str | Sequence[str] | None = None,
                 complete: bool | None = None, where: str | None = None, gamma: float | None = None,
                 order_by: str = "episode_id", limit: int | None = None, offset: int = 0) -> pa.Table:
        """One row per episode (the ``episodes`` view), filtered; with ``gamma`` adds ``discounted_return``."""
        return self._episodes(run_id=run_id, env_id=env_id, complete=complete, where=where, gamma=gamma,
                              order_by=order_by, limit=limit, offset=offset)

    def episode_page(self, *, where: str | None = None, gamma: float | None = None, order_by: str = "episode_id",
                     limit: int, offset: int = 0) -> tuple[pa.Table, int]:
        """One page of :meth:`episodes` and how many episodes the filter selects in all, in one query."""
        rows = self._episodes(where=where, gamma=gamma, order_by=order_by, limit=limit, offset=offset,
                              total="total_episodes")
        total = rows["total_episodes"][0].as_py() if rows.num_rows else None
        if total is None:  # an empty page says nothing about the rows before it
            total = self._episodes(where=where, total="total_episodes", limit=1)["total_episodes"]
            total = total[0].as_py() if len(total) else 0
        return rows.drop_columns(["total_episodes"]), total

    def _episodes(self, *, run_id: str | Sequence[str] | None = None, env_id: str | Sequence[str] | None = None,
                  complete: bool | None = None, where: str | None = None, gamma: float | None = None,
                  order_by: str = "episode_id", limit: int | None = None, offset: int = 0,
                  total: str | None = None) -> pa.Table:
        with self._query_snapshot(episodes="fill" if gamma is None else None) as snap:
            order = _order_clause(order_by, snap)
            conds = _filters(run_id=run_id, env_id=env_id, where=where)
            if complete is not None:
                conds.append("complete" if complete else "NOT complete")
            params = {"gamma": check_gamma(gamma)} if gamma is not None else {}
            src = "episodes" if gamma is None else \
                f"({episodes_sql(snap.step_columns, discounted=True, by_id=snap.by_id)})"
            count = f", count(*) OVER () AS {quote_ident(total)}" if total else ""
            q = f"SELECT *{count} FROM {src}{_where(conds)} ORDER BY {order}"
            if limit is not None:
                q += f" LIMIT {int(limit)} OFFSET {int(offset)}"
            return snap.arrow(q, params)

    def stats(self, *, by: str | Sequence[str] | None = None, gamma: float | None = None,
              where: str | None = None, run_id: str | Sequence[str] | None = None,
              env_id: str | Sequence[str] | None = None, include_incomplete: bool = False) -> pa.Table:
        """Episode statistics (``n_traj, return_*, len_*`` and ``discounted_return_*`` with ``gamma``).

        One row per group of ``by`` (one row overall without it). Complete episodes only unless
        ``include_incomplete``.
        """
        keys = [by] if isinstance(by, str) else list(by or [])
        with self._query_snapshot(episodes="if-cached" if gamma is None else None) as snap:
            if keys:
                snap.check_columns(keys)
            conds = _filters(run_id=run_id, env_id=env_id, where=where)
            q = stats_sql(keys, discounted=gamma is not None, where=" AND ".join(conds) or None,
                          include_incomplete=include_incomplete, step_columns=snap.step_columns, by_id=snap.by_id,
                          source="episodes" if snap.episodes_materialized else None)
            return snap.arrow(q, {"gamma": check_gamma(gamma)} if gamma is not None else {})

    def runs(self) -> pa.Table:
        """One row per ``(run_id, env_id)``: its episodes, complete episodes, steps and last write time."""
        with self._query_snapshot(episodes="fill") as snap:
            return snap.arrow(RUNS_SQL)

    def scan(self, columns: Sequence[str] | None = None, *, run_id: str | Sequence[str] | None = None,
             env_id: str | Sequence[str] | None = None, episode_id: int | Sequence[int] | None = None,
             where: str | None = None, batch_size: int = 65_536,
             max_batch_bytes: int | None = None) -> pa.RecordBatchReader:
        """The steps of the chosen episodes as a stream of record batches, in storage order, read straight
        from the committed files (see :mod:`trajstore.scan`).

        The same rows and types as ``SELECT columns FROM steps`` with these filters (every column without
        ``columns``); ``where`` is a condition on the ``episodes`` view, as for :meth:`episodes`. Batches have
        at most ``batch_size`` rows, and fewer when rows are so wide that a batch would pass ``max_batch_bytes``.
        """
        if batch_size < 1:
            raise InputError(f"batch_size: must be a positive number of rows, got {batch_size}")
        if max_batch_bytes is not None and max_batch_bytes < 1:
            raise InputError(f"max_batch_bytes: must be a positive number of bytes, got {max_batch_bytes}")
        ids = None if episode_id is None else np.atleast_1d(np.asarray(episode_id, dtype=np.int64))
        if where:  # episode-level conditions: the episode ids they select, on one snapshot
            with self._query_snapshot(episodes="if-cached") as snap:
                conds = _filters(run_id=run_id, env_id=env_id, where=where, episode_id=episode_id)
                ids = snap.arrow(f"SELECT episode_id FROM episodes{_where(conds)}")["episode_id"].to_numpy()
                committed = snap.files
                schema = self._steps_schema(committed, snap)
        else:  # no SQL at all once the view's types are known for this version
            committed = self.files()
            schema = self._steps_schema(committed)
        names = list(dict.fromkeys(columns)) if columns else schema.names
        check_names(names, schema.names, view="steps", field="columns")
        files = [f for f in committed if _selected(f.run_id, run_id) and _selected(f.env_id, env_id)]
        return scan_steps(files, schema, names, episode_ids=ids, batch_size=batch_size,
                          max_batch_bytes=max_batch_bytes)

    def returns(self, *, gamma: float, per: Literal["episode", "step"] = "episode",
                run_id: str | Sequence[str] | None = None, env_id: str | Sequence[str] | None = None,
                episode_id: int | Sequence[int] | None = None, where: str | None = None,
                limit: int | None = None) -> pa.Table:
        """Discounted return per episode, or return-to-go ``G_t = r_t + gamma G_{t+1}`` per step.

        Rows come sorted by ``episode_id`` (per step by ``(episode_id, step)``, with ``run_id`` and ``env_id``
        dictionary-encoded: the same values, a byte per row). With ``limit``, the first ``limit`` rows;
        per step, only the episodes they reach are read.
        """
        if limit is not None and limit < 0:
            raise InputError(f"limit: must be a number of rows >= 0, got {limit}")
        g = check_gamma(gamma)
        if per not in ("episode", "step"):
            raise InputError(f"per must be 'episode' or 'step', got {per!r}")
        conds = _filters(run_id=run_id, env_id=env_id, where=where, episode_id=episode_id)
        with self._query_snapshot() as snap:
            if per == "episode":
                q = (f"SELECT run_id, env_id, episode_id, episode_length, episode_return, discounted_return, "
                     f"complete FROM ({episodes_sql(snap.step_columns, discounted=True, by_id=snap.by_id)})"
                     f"{_where(conds)} "
                     "ORDER BY episode_id" + (f" LIMIT {int(limit)}" if limit is not None else ""))
                return snap.arrow(q, {"gamma": g})
            if limit is not None:
                conds.append(_first_episodes(snap, conds, limit))
            rows = snap.arrow(f"SELECT {_partition_enums(snap.files)}, episode_id, step, reward "
                              f"FROM steps{_where(conds)}")
        out = _with_return_to_go(rows, g)
        return out if limit is None else out.slice(0, limit)


RUNS_SQL = """
SELECT run_id, env_id, count(*) AS episodes, count(*) FILTER (WHERE complete) AS complete_episodes,
       sum(episode_length)::BIGINT AS steps, max(ended_at) AS last_write
FROM episodes GROUP BY run_id, env_id ORDER BY run_id, env_id
"""
EPISODE_CACHE_ROWS = 2_000_000  # larger episodes views are aggregated per query instead of kept in memory


def _first_episodes(snap: Snapshot, conds: list[str], rows: int) -> str:
    """A condition keeping the selected steps of the lowest episode ids that together hold ``rows`` steps."""
    counts = snap.arrow(f"SELECT episode_id, count(*) AS n FROM steps{_where(conds)} GROUP BY episode_id "
                        "ORDER BY episode_id")
    reached = np.searchsorted(np.cumsum(counts["n"].to_numpy()), rows)
    if reached >= counts.num_rows:
        return "true"
    return f"episode_id <= {int(counts['episode_id'][int(reached)].as_py())}"


def _partition_enums(files: Sequence[DataFile]) -> str:
    """``run_id, env_id`` cast to DuckDB ENUMs of the committed partitions' values: Arrow receives them
    dictionary-encoded (a byte per row) instead of one string per row."""
    cols = []
    for name in ("run_id", "env_id"):
        values = sorted({getattr(f, name) for f in files})
        cols.append(f"{name}::ENUM({', '.join(map(quote_literal, values))}) AS {name}" if values else name)
    return ", ".join(cols)


def _with_return_to_go(rows: pa.Table, gamma: float) -> pa.Table:
    """``rows`` sorted by ``(episode_id, step)`` with their ``return_to_go``; run_id/env_id stay dictionary-encoded."""
    s = sorted_return_to_go(rows["episode_id"].to_numpy(), rows["step"].to_numpy(), rows["reward"].to_numpy(),
                            gamma)
    return pa.table({"run_id": _reordered(rows["run_id"], s), "env_id": _reordered(rows["env_id"], s),
                     "episode_id": s.episode_id, "step": s.step, "reward": s.reward, "return_to_go": s.return_to_go})


def _reordered(column: pa.ChunkedArray, s: SortedReturns) -> pa.Array:
    """``column`` sorted like ``s``; for a dictionary column only its indices move (if they differ at all)."""
    arr = column.combine_chunks()
    if pa.types.is_dictionary(arr.type) and arr.null_count == 0:
        idx = arr.indices.to_numpy()
        if len(idx) == 0 or idx.min() == idx.max():  # one value throughout: sorting changes nothing
            return arr
        return pa.DictionaryArray.from_arrays(s.reorder(idx), arr.dictionary)
    return arr.take(pa.array(s.reorder(np.arange(len(arr)))))


def _in(column: str, values: Any) -> str:
    if isinstance(values, (str, int, np.integer)):
        values = [values]
    items = ", ".join(quote_literal(v) if isinstance(v, str) else str(int(v)) for v in values)
    return f"{column} IN ({items})" if items else "false"


def _filters(*, run_id: Any = None, env_id: Any = None, where: str | None = None,
             episode_id: Any = None) -> list[str]:
    conds = []
    if run_id is not None:
        conds.append(_in("run_id", run_id))
    if env_id is not None:
        conds.append(_in("env_id", env_id))
    if episode_id is not None:
        conds.append(_in("episode_id", episode_id))
    if where:
        conds.append(f"({where})")
    return conds


def _selected(value: str, wanted: str | Sequence[str] | None) -> bool:
    if wanted is None:
        return True
    return value == wanted if isinstance(wanted, str) else value in wanted


def _where(conds: list[str]) -> str:
    return f" WHERE {' AND '.join(conds)}" if conds else ""


def _order_clause(order_by: str, snap: Snapshot) -> str:
    desc = order_by.startswith("-")
    name = order_by.lstrip("-")
    cols = [r[0] for r in snap.con.execute("DESCRIBE episodes").fetchall()] + ["discounted_return"]
    if name not in cols:
        raise InputError(f"order_by: unknown column {name!r}; expected one of {cols} (prefix - for descending)")
    return f"{quote_ident(name)} {'DESC' if desc else 'ASC'}, episode_id"
