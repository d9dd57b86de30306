"""What trajstore is measured against: plain ways of doing the same work without it."""

from __future__ import annotations

from pathlib import Path
from typing import Sequence

import duckdb
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
from scipy.signal import lfilter

STAT_NAMES = ("min", "mean", "std", "max")
# The store's files use dictionary encoding on these columns only (FACTS: floats with dictionaries halve speed).
LOW_CARDINALITY = ("action", "terminated", "truncated", "env_index", "worker_id")


# --- writing -------------------------------------------------------------------------------------------------

def write_table_tuned(rows: pa.Table, path: Path, *, row_group_rows: int = 1024 * 1024) -> None:
    """Bare ``pq.write_table``: zstd, dictionaries only on low-cardinality columns, 1Mi-row groups."""
    dictionary = [c for c in LOW_CARDINALITY if c in rows.column_names]
    pq.write_table(rows, path, compression="zstd", use_dictionary=dictionary, row_group_size=row_group_rows)


# The columns a user hands the writer (``extras`` aside): what a user writing by hand has to store, and all of it.
USER_COLUMNS = ("episode_id", "step", "obs", "action", "reward", "next_obs", "terminated", "truncated")
USER_DICTIONARY = ("action", "terminated", "truncated")  # few values each: a dictionary shrinks them (FACTS)


def write_user_rows(rows: pa.Table, path: Path, *, dictionary: bool = True,
                    row_group_rows: int = 1024 * 1024) -> None:
    """Bare ``pq.write_table`` of a user's own columns (``rows`` holds them and nothing else), tuned as a user would
    tune it: zstd, 1Mi-row groups, and dictionaries only on the few-valued columns (``dictionary``) or none."""
    used = [c for c in USER_DICTIONARY if c in rows.column_names] if dictionary else False
    pq.write_table(rows, path, compression="zstd", use_dictionary=used, row_group_size=row_group_rows)


def write_table_default(rows: pa.Table, path: Path) -> None:
    """Bare ``pq.write_table`` with pyarrow's defaults except zstd (dictionary on every column)."""
    pq.write_table(rows, path, compression="zstd")


class HandWrittenEpisodes:
    """The route a user writes by hand from time-major ``(T, B, …)`` batches to Parquet: episode ids and steps
    carried across batches with numpy (an episode ends where ``terminated | truncated``; same-step autoreset), the
    full rows (every ``next_obs`` whole, and the batch's scalar ``extras``) in time-major order, written with the
    tuned settings in row groups of about 1Mi rows. No validation, no fsync, no commit."""

    def __init__(self, path: Path, num_envs: int, *, row_group_rows: int = 1024 * 1024) -> None:
        self.path, self.row_group_rows = path, row_group_rows
        self.started = np.zeros(num_envs, np.int64)  # episodes each env started before its open one
        self.step = np.zeros(num_envs, np.int64)  # each env's next step
        self.pending: list[pa.Table] = []
        self.writer: pq.ParquetWriter | None = None

    def add(self, batch: dict[str, np.ndarray]) -> None:
        done = np.asarray(batch["terminated"]) | np.asarray(batch["truncated"])
        T, B = done.shape
        k = np.cumsum(done, axis=0) - done  # episodes each env ended before t in this batch
        ids = (self.started + k) * B + np.arange(B)  # env b's i-th episode: i * B + b
        t = np.arange(T)[:, None]
        after_done = np.r_[np.zeros((1, B), bool), done[:-1]]
        start = np.maximum.accumulate(np.where(after_done, t, -1), axis=0)  # first step of the episode, if here
        steps = np.where(start < 0, self.step + t, t - start)
        self.started += done.sum(axis=0)
        self.step = np.where(done[-1], 0, steps[-1] + 1)
        n = T * B
        obs = np.ascontiguousarray(batch["obs"]).reshape(n, -1)
        nxt = np.ascontiguousarray(batch["next_obs"]).reshape(n, -1)
        self.pending.append(pa.table({
            "episode_id": ids.reshape(n), "step": steps.reshape(n).astype(np.int32),
            "obs": pa.FixedSizeListArray.from_arrays(obs.reshape(-1), obs.shape[1]),
            "action": np.asarray(batch["action"]).reshape(n), "reward": np.asarray(batch["reward"]).reshape(n),
            "next_obs": pa.FixedSizeListArray.from_arrays(nxt.reshape(-1), nxt.shape[1]),
            "terminated": np.asarray(batch["terminated"]).reshape(n),
            "truncated": np.asarray(batch["truncated"]).reshape(n),
            **{k: np.asarray(v).reshape(n) for k, v in (batch.get("extras") or {}).items()}}))
        if sum(p.num_rows for p in self.pending) >= self.row_group_rows:
            self._write()

    def close(self) -> None:
        self._write()
        if self.writer is not None:
            self.writer.close()

    def _write(self) -> None:
        if not self.pending:
            return
        table = pa.concat_tables(self.pending)
        self.pending = []
        if self.writer is None:
            dictionary = [c for c in LOW_CARDINALITY if c in table.column_names]
            self.writer = pq.ParquetWriter(self.path, table.schema, compression="zstd", use_dictionary=dictionary)
        self.writer.write_table(table, row_group_size=self.row_group_rows)


def read_rows(paths: Sequence[str], columns: Sequence[str] | None = None) -> pa.Table:
    """The committed files' rows (without the Hive partition columns) as one Arrow table."""
    tables = [pq.ParquetFile(p).read(columns=list(columns) if columns else None) for p in paths]
    return pa.concat_tables(tables)


# --- statistics ----------------------------------------------------------------------------------------------

def duckdb_stats_sql(paths: Sequence[str]) -> str:
    """Hand-written DuckDB: GROUP BY episode_id over the file list, then the rollout_stats aggregates."""
    files = ", ".join("'" + p.replace("'", "''") + "'" for p in paths)
    per_episode = ("SELECT episode_id, count(*) AS len, sum(reward::DOUBLE) AS ret, "
                   "bool_or(terminated OR truncated) AS done "
                   f"FROM read_parquet([{files}]) GROUP BY episode_id")
    aggs = ["count(*) AS n_traj"]
    for key, col in (("return", "ret"), ("len", "len")):
        aggs += [f"min({col})::DOUBLE AS {key}_min", f"avg({col})::DOUBLE AS {key}_mean",
                 f"stddev_pop({col})::DOUBLE AS {key}_std", f"max({col})::DOUBLE AS {key}_max"]
    return f"SELECT {', '.join(aggs)} FROM ({per_episode}) WHERE done"


def duckdb_stats(con: duckdb.DuckDBPyConnection, sql: str) -> dict[str, float]:
    return con.sql(sql).to_arrow_table().to_pylist()[0]


def _rollout_stats(trajectory_rewards: list[np.ndarray]) -> dict[str, float]:
    """``imitation.data.rollout.rollout_stats`` restated: builtin ``sum`` per trajectory, numpy over them."""
    descriptors = {"return": np.asarray([sum(rews) for rews in trajectory_rewards]),
                   "len": np.asarray([len(rews) for rews in trajectory_rewards])}
    out: dict[str, float] = {"n_traj": len(trajectory_rewards)}
    for name, values in descriptors.items():
        for stat, fn in zip(STAT_NAMES, (np.min, np.mean, np.std, np.max)):
            out[f"{name}_{stat}"] = fn(values).item()
    return out


def imitation_style_stats(episode_id: np.ndarray, reward: np.ndarray, done: np.ndarray) -> dict[str, float]:
    """Like imitation's ``TrajectoryAccumulator`` + ``rollout_stats``: rows appended one by one in Python
    to their episode's list, an array made when the episode finishes, then a loop over the episodes."""
    open_episodes: dict[int, list[float]] = {}
    finished: list[np.ndarray] = []
    for eid, r, d in zip(episode_id.tolist(), reward.tolist(), done.tolist()):
        rews = open_episodes.get(eid)
        if rews is None:
            rews = open_episodes[eid] = []
        rews.append(r)
        if d:
            finished.append(np.asarray(open_episodes.pop(eid), np.float32))
    return _rollout_stats(finished)


def grouped_loop_stats(episode_id: np.ndarray, reward: np.ndarray, done: np.ndarray) -> dict[str, float]:
    """A stronger Python baseline: numpy sorts and splits the rows into per-episode arrays, then a Python
    loop over episodes computes returns and lengths."""
    order = np.argsort(episode_id, kind="stable")
    ids = episode_id[order]
    cuts = np.flatnonzero(ids[1:] != ids[:-1]) + 1
    returns, lengths = [], []
    for rews, dones in zip(np.split(reward[order], cuts), np.split(done[order], cuts)):
        if dones.any():
            returns.append(float(rews.sum(dtype=np.float64)))
            lengths.append(len(rews))
    out: dict[str, float] = {"n_traj": len(returns)}
    for name, values in (("return", np.asarray(returns)), ("len", np.asarray(lengths))):
        for stat, fn in zip(STAT_NAMES, (np.min, np.mean, np.std, np.max)):
            out[f"{name}_{stat}"] = fn(values).item()
    return out


# --- return-to-go --------------------------------------------------------------------------------------------

def _sorted_episodes(episode_id: np.ndarray, step: np.ndarray,
                     reward: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    order = np.lexsort((step, episode_id))
    ids = episode_id[order]
    starts = np.flatnonzero(np.r_[True, ids[1:] != ids[:-1]])
    return order, reward[order].astype(np.float64), starts


def rtg_lfilter_per_episode(episode_id: np.ndarray, step: np.ndarray, reward: np.ndarray,
                            gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Looped numpy/scipy in float64: sort, then ``lfilter`` over each episode's reversed rewards.

    This is also the float64 reference: ``lfilter([1], [1, -gamma], x)`` is exactly the recursion
    ``y_t = x_t + gamma * y_{t-1}``.
    """
    order, r, starts = _sorted_episodes(episode_id, step, reward)
    out = np.empty_like(r)
    bounds = np.r_[starts, len(r)]
    for a, b in zip(bounds[:-1].tolist(), bounds[1:].tolist()):
        out[a:b] = lfilter([1.0], [1.0, -gamma], r[a:b][::-1])[::-1]
    return order, out


def rtg_lfilter_global(episode_id: np.ndarray, step: np.ndarray, reward: np.ndarray,
                       gamma: float) -> tuple[np.ndarray, np.ndarray]:
    """Vectorised numpy/scipy in float64: one ``lfilter`` over all sorted rewards, then the carry from the
    following episodes subtracted (``gamma**k * G[next episode start]``)."""
    order, r, starts = _sorted_episodes(episode_id, step, reward)
    n = len(r)
    total = lfilter([1.0], [1.0, -gamma], r[::-1])[::-1]
    ends = np.r_[starts[1:], n]
    carry = np.r_[total, 0.0][ends]
    episode = np.repeat(np.arange(len(starts)), np.diff(np.r_[starts, n]))
    k = ends[episode] - np.arange(n)
    return order, total - np.power(gamma, k) * carry[episode]


def max_relative_error(values: np.ndarray, reference: np.ndarray) -> float:
    if len(reference) == 0:
        return 0.0
    scale = np.maximum(np.abs(reference), np.finfo(np.float64).tiny)
    return float(np.max(np.abs(np.asarray(values, np.float64) - reference) / scale))
