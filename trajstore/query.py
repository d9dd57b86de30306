"""DuckDB over one committed snapshot of the store: the ``steps`` and ``episodes`` views and the
statistics queries built on them.

``steps`` reads exactly the files listed by one version of the Delta log with DuckDB's native
``read_parquet`` (never a glob); ``episodes`` is built from ``schemas/episode.v1.json``.
"""

from __future__ import annotations

from typing import Any, Sequence

import duckdb
import pyarrow as pa

from trajstore import schema as sch
from trajstore.errors import InputError, QueryError
from trajstore.table import DataFile

STAT_KEYS = ("n_traj", "return_min", "return_mean", "return_std", "return_max",
             "len_min", "len_mean", "len_std", "len_max")
_EMPTY_STEPS = ("NULL::VARCHAR AS run_id, NULL::VARCHAR AS env_id, NULL::BIGINT AS episode_id, "
                "NULL::INTEGER AS step, NULL::FLOAT[] AS obs, NULL::BIGINT AS action, NULL::FLOAT AS reward, "
                "NULL::FLOAT[] AS next_obs, NULL::BOOLEAN AS terminated, NULL::BOOLEAN AS truncated, "
                "NULL::TIMESTAMPTZ AS wall_time")


_DUCKDB_TYPES = {"string": "VARCHAR", "int32": "INTEGER", "int64": "BIGINT", "float32": "FLOAT",
                 "float64": "DOUBLE", "bool": "BOOLEAN", "timestamp[us, UTC]": "TIMESTAMPTZ"}


def quote_literal(value: str) -> str:
    return "'" + value.replace("'", "''") + "'"


def quote_ident(name: str) -> str:
    return '"' + name.replace('"', '""') + '"'


def steps_sql(files: Sequence[DataFile]) -> str:
    """The SELECT behind the ``steps`` view for a committed file list."""
    if not files:
        return f"SELECT {_EMPTY_STEPS} WHERE false"
    paths = ", ".join(quote_literal(f.path) for f in files)
    return ("SELECT run_id, env_id, * EXCLUDE (run_id, env_id) FROM read_parquet("
            f"[{paths}], hive_partitioning = true, union_by_name = true, "
            "hive_types = {'run_id': VARCHAR, 'env_id': VARCHAR})")


def with_lineage_sql(stored: Sequence[str], source: str) -> str:
    """``source`` with every lineage column of ``step.v1.json`` it lacks added as a typed NULL, and the
    columns in one order: the schema's, then its lineage columns, then other extras by name.

    So ``steps`` and ``episodes`` have the same columns in every store, whatever its writers recorded,
    and in the same order whatever the order of the files (which compaction changes).
    """
    spec = sch.load(sch.STEP_SCHEMA_FILE)
    described = spec["columns"] + spec["lineage"]
    select = []
    for c in described:
        if c["name"] in stored:
            select.append(quote_ident(c["name"]))
        elif c.get("role") == "lineage" or c in spec["lineage"]:
            select.append(f"NULL::{_DUCKDB_TYPES[c['type']]} AS {quote_ident(c['name'])}")
    names = {c["name"] for c in described}
    select += [quote_ident(n) for n in sorted(n for n in stored if n not in names)]
    return f"SELECT {', '.join(select)} FROM {source}"


def episodes_sql(step_columns: Sequence[str], *, discounted: bool = False, source: str = "steps",
                 by_id: bool = False) -> str:
    """The SELECT behind the ``episodes`` view; with ``discounted`` it adds ``discounted_return`` for ``$gamma``.

    With ``by_id`` (only when :func:`ids_disjoint`) it groups by ``episode_id`` alone, the same episodes
    for less work: the other group keys are then constant within each episode.
    """
    spec = sch.load(sch.EPISODE_SCHEMA_FILE)
    keys = ["episode_id"] if by_id else spec["group_by"]
    cols = [f"{_in_group(c['sql'], keys, spec['group_by'])} AS {quote_ident(c['name'])}" for c in spec["columns"]]
    lineage = [c["name"] for c in sch.load(sch.STEP_SCHEMA_FILE)["lineage"] if c.get("in_episodes")]
    cols += [spec["lineage"]["sql"].format(name=quote_ident(n)) + f" AS {quote_ident(n)}"
             for n in lineage if n in step_columns]
    if discounted:
        cols.append("sum(reward::DOUBLE * pow($gamma::DOUBLE, step)) AS discounted_return")
    return f"SELECT {', '.join(cols)} FROM {source} GROUP BY {', '.join(keys)}"


def _in_group(sql: str, keys: Sequence[str], group_by: Sequence[str]) -> str:
    return f"any_value({sql})" if sql in group_by and sql not in keys else sql


def ids_disjoint(files: Sequence[DataFile]) -> bool:
    """Whether no ``episode_id`` can be in two ``(run_id, env_id)`` partitions, judged from the files'
    episode_id ranges in the commit log (each writer draws its ids from its own random block)."""
    spans: dict[tuple[str, str], list[tuple[int, int]]] = {}
    for f in files:
        if f.min_episode_id is None or f.max_episode_id is None:
            return False
        spans.setdefault((f.run_id, f.env_id), []).append((f.min_episode_id, f.max_episode_id))
    merged = sorted(span for part in spans.values() for span in _merge(part))
    return all(b[0] > a[1] for a, b in zip(merged, merged[1:]))


def _merge(spans: list[tuple[int, int]]) -> list[tuple[int, int]]:
    """Overlapping ``(lo, hi)`` spans merged (within one partition)."""
    out: list[tuple[int, int]] = []
    for lo, hi in sorted(spans):
        if out and lo <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], hi))
        else:
            out.append((lo, hi))
    return out


def stats_sql(by: Sequence[str], *, discounted: bool, where: str | None, include_incomplete: bool,
              step_columns: Sequence[str], by_id: bool = False, source: str | None = None) -> str:
    """Episode statistics with the keys of ``imitation.data.rollout.rollout_stats`` (std as ``numpy.std``).

    Over ``source`` (a relation with the ``episodes`` view's columns) when given, else over the
    episodes aggregated from ``steps`` in the query itself.
    """
    metrics = [("return", "episode_return"), ("len", "episode_length")]
    if discounted:
        metrics.append(("discounted_return", "discounted_return"))
    aggs = ["count(*) AS n_traj"]
    for key, col in metrics:
        aggs += [f"min({col})::DOUBLE AS {key}_min", f"avg({col})::DOUBLE AS {key}_mean",
                 f"coalesce(stddev_pop({col}), 0)::DOUBLE AS {key}_std", f"max({col})::DOUBLE AS {key}_max"]
    conds = [] if include_incomplete else ["complete"]
    if where:
        conds.append(f"({where})")
    keys = ", ".join(quote_ident(b) for b in by)
    select = (keys + ", " if keys else "") + ", ".join(aggs)
    tail = f" GROUP BY {keys} ORDER BY {keys}" if keys else ""
    filt = f" WHERE {' AND '.join(conds)}" if conds else ""
    if source is None:
        source = f"({episodes_sql(step_columns, discounted=discounted, by_id=by_id)})"
    return f"SELECT {select} FROM {source}{filt}{tail}"


def check_names(names: Sequence[str], known: Sequence[str], *, view: str, field: str) -> None:
    """Raise an :class:`InputError` naming ``field`` when a name is not one of ``known`` (columns of ``view``)."""
    unknown = [n for n in names if n not in known]
    if unknown:
        raise InputError(f"{field}: unknown column(s) {unknown} of {view}; expected some of {list(known)}")


class Snapshot:
    """A DuckDB connection whose ``steps``/``episodes`` views read one committed version of the store."""

    def __init__(self, files: Sequence[DataFile], *, config: dict[str, Any] | None = None,
                 con: duckdb.DuckDBPyConnection | None = None) -> None:
        self.files = list(files)
        self.con = con if con is not None else duckdb.connect(config=config or {})
        self.con.execute(f"CREATE OR REPLACE TEMP VIEW committed_steps AS {steps_sql(self.files)}")
        stored = [r[0] for r in self.con.execute("DESCRIBE committed_steps").fetchall()]
        self.con.execute(f"CREATE OR REPLACE TEMP VIEW steps AS {with_lineage_sql(stored, 'committed_steps')}")
        self.step_columns = [r[0] for r in self.con.execute("DESCRIBE steps").fetchall()]
        self.by_id = ids_disjoint(self.files)
        self.con.execute(f"CREATE OR REPLACE TEMP VIEW episodes AS {episodes_sql(self.step_columns, by_id=self.by_id)}")
        self.episodes_materialized = False

    def use_episodes(self, table: pa.Table) -> None:
        """Make the ``episodes`` view read ``table``: the rows of this very view, materialized earlier."""
        self.con.register("materialized_episodes", table)
        self.con.execute("CREATE OR REPLACE TEMP VIEW episodes AS SELECT * FROM materialized_episodes")
        self.episodes_materialized = True

    def arrow(self, query: str, params: dict[str, Any] | None = None) -> pa.Table:
        try:
            return self.con.sql(query, params=params or None).to_arrow_table()
        except duckdb.Error as exc:
            raise QueryError(f"query failed: {exc}") from exc

    def reader(self, query: str, params: dict[str, Any] | None = None,
               batch_size: int = 65_536) -> pa.RecordBatchReader:
        try:
            return self.con.sql(query, params=params or None).to_arrow_reader(batch_size)
        except duckdb.Error as exc:
            raise QueryError(f"query failed: {exc}") from exc

    def check_columns(self, names: Sequence[str], *, view: str = "episodes", field: str = "by") -> None:
        """Raise an :class:`InputError` naming ``field`` when a name is not a column of ``view``."""
        known = self.step_columns if view == "steps" else \
            [r[0] for r in self.con.execute(f"DESCRIBE {view}").fetchall()]
        check_names(names, known, view=view, field=field)

    def close(self) -> None:
        self.con.close()

    def __enter__(self) -> Snapshot:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
