"""Helpers shared by the tests: random time-major batches, a plain reference segmentation, reference returns,
and what a store holds per env."""

from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import trajstore
from trajstore.loaders.layout_store import LayoutStore
from trajstore.query.engine import Engine
from trajstore.storage.location import Location, locate
from trajstore.storage.table import StepsTable
from trajstore.store import plumbing


def make_batch(rng: np.random.Generator, T: int, B: int, *, obs_dim: int = 3, p_terminated: float = 0.1,
               p_truncated: float = 0.05, valid: np.ndarray | None = None,
               extras: dict[str, Any] | None = None) -> dict[str, Any]:
    """A random ``(T, B, …)`` batch: float32 obs/next_obs of ``obs_dim``, int actions, float32 rewards."""
    batch: dict[str, Any] = {
        "obs": rng.standard_normal((T, B, obs_dim)).astype(np.float32),
        "action": rng.integers(0, 4, (T, B)),
        "reward": rng.uniform(-1, 1, (T, B)).astype(np.float32),
        "next_obs": rng.standard_normal((T, B, obs_dim)).astype(np.float32),
        "terminated": rng.random((T, B)) < p_terminated,
        "truncated": rng.random((T, B)) < p_truncated,
    }
    if valid is not None:
        batch["valid"] = valid
    if extras:
        batch["extras"] = extras
    return batch


def slice_batch(batch: dict[str, Any], start: int, stop: int) -> dict[str, Any]:
    """Rows ``start:stop`` of the time axis of every array in ``batch`` (nested dicts too)."""
    return {k: slice_batch(v, start, stop) if isinstance(v, dict) else v[start:stop] for k, v in batch.items()}


@dataclass
class RefEpisode:
    """One episode of the reference segmentation: its env, the global time index of each step, and flags."""

    env: int
    t: list[int] = field(default_factory=list)
    rewards: list[float] = field(default_factory=list)
    terminated: list[bool] = field(default_factory=list)
    truncated: list[bool] = field(default_factory=list)

    @property
    def complete(self) -> bool:
        return bool(self.terminated[-1] or self.truncated[-1])


def reference_episodes(reward: np.ndarray, terminated: np.ndarray, truncated: np.ndarray,
                       valid: np.ndarray | None = None, *, autoreset: str = "same-step") -> list[RefEpisode]:
    """Plain-loop segmentation of a whole ``(T, B)`` stream, env by env in time order.

    same-step: an episode ends at a step with terminated or truncated; the next valid step starts
    a new one. next-step: in addition, the first valid step after an end is gymnasium's reset step
    and is not a transition.
    """
    T, B = reward.shape
    valid = np.ones((T, B), bool) if valid is None else valid
    out: list[RefEpisode] = []
    for b in range(B):
        current: RefEpisode | None = None
        just_ended = False
        for t in range(T):
            if not valid[t, b]:
                continue
            if autoreset == "next-step" and just_ended:
                just_ended = False
                continue
            if current is None:
                current = RefEpisode(b)
                out.append(current)
            current.t.append(t)
            current.rewards.append(float(reward[t, b]))
            current.terminated.append(bool(terminated[t, b]))
            current.truncated.append(bool(truncated[t, b]))
            if terminated[t, b] or truncated[t, b]:
                current, just_ended = None, True
    return out


def reference_return(rewards: Any, gamma: float) -> float:
    """``sum_t gamma**t r_t`` by the plain backward loop in float64."""
    g = 0.0
    for r in reversed([float(x) for x in rewards]):
        g = r + gamma * g
    return g


def assert_same_stats(got: Any, want: Any) -> None:
    """Two stats tables are the same statistics: equal counts, lengths and keys, and float aggregates equal up to
    summation order (DuckDB sums in parallel, and a cached episodes table is summed in another order than the
    view it caches)."""
    assert got.schema == want.schema
    for name in got.column_names:
        ours, theirs = got[name].to_pylist(), want[name].to_pylist()
        if got.schema.field(name).type == "double":
            assert ours == pytest.approx(theirs, rel=1e-12, abs=1e-12), name
        else:
            assert ours == theirs, name


def stored_episodes(store: trajstore.Store, run_id: str) -> dict[int, list[tuple[float, int]]]:
    """Complete episodes of ``run_id`` per env index, in the order they started: ``(return, length)``."""
    rows = store.sql("SELECT env_index, episode_return, episode_length FROM episodes "
                     f"WHERE run_id = '{run_id}' AND complete ORDER BY env_index, episode_id").to_pylist()
    out: dict[int, list[tuple[float, int]]] = {}
    for r in rows:
        out.setdefault(r["env_index"], []).append((r["episode_return"], r["episode_length"]))
    return out


# --- ways into the store's own files that the sandbox refuses (POST /sql and `trajstore sql`) ---------------

UNCOMMITTED = "steps/run_id=r/env_id=E/part-uncommitted.parquet"
INSIDE_ESCAPES = [  # each formatted with the store's root
    "SELECT * FROM read_text('{root}/steps/_delta_log/*.json')",
    "SELECT * FROM read_blob('{root}/steps/_delta_log/*.json')",
    "SELECT * FROM read_json_auto('{root}/steps/_delta_log/*.json')",
    "SELECT * FROM glob('{root}/steps/**')",
    "SELECT * FROM parquet_metadata('{root}/" + UNCOMMITTED + "')",
    "SELECT * FROM parquet_schema('{root}/steps/**/*.parquet')",
    "SELECT * FROM read_parquet('{root}/" + UNCOMMITTED + "')",
    "SELECT * FROM read_parquet('{root}/steps/**/*.parquet', union_by_name = true)",
    "SELECT * FROM read_text('{root}/" + UNCOMMITTED + "')",
    "SELECT * FROM '{root}/" + UNCOMMITTED + "'",
]
PATH_REVEALING = ["SELECT * EXCLUDE (typed_value) FROM duckdb_settings()", "SELECT * FROM duckdb_views()",
                  "SELECT * FROM duckdb_databases()"]


def fingerprint(root: Any) -> dict[str, str]:
    """Every file under the store (and beside it) with a hash of its bytes."""
    import hashlib

    return {str(p.relative_to(root.parent)): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.parent.rglob("*")) if p.is_file()}


def write_mixed_store(path: Any, *, seed: int, commits: int) -> trajstore.Store:
    """Two runs, two envs with different observation shapes, lineage and extras in some files only, ``commits``
    commits by the first writer."""
    store = trajstore.open(path, create=True)
    rng = np.random.default_rng(seed)
    with store.writer(run_id="a", env_id="Small-v0", policy_version=3, mode="train") as w:
        for _ in range(commits):
            w.add_batch(make_batch(rng, 40, 4, obs_dim=3))
            w.flush()
    with store.writer(run_id="a", env_id="Wide-v0", worker_id="w-2") as w:
        w.add_batch(make_batch(rng, 30, 3, obs_dim=8, extras={"value": rng.random((30, 3)).astype(np.float32)}))
    with store.writer(run_id="b", env_id="Small-v0", seed=np.arange(5)) as w:
        w.add_batch(make_batch(rng, 25, 5, obs_dim=3))
    return store


def write_planted_store(path: Any) -> Any:
    """A small store with a Parquet file under ``steps/`` that no commit lists (see :func:`plant_uncommitted`)."""
    with trajstore.open(path, create=True).writer(run_id="r", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(0), 50, 4))
    plant_uncommitted(path)
    return path


def plant_uncommitted(root: Any) -> None:
    """A Parquet file under ``steps/`` that no commit lists (as a killed writer leaves one), holding a secret."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    path = root / UNCOMMITTED
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.table({"secret": ["uncommitted"]}), path)


def write_commits(store: trajstore.Store, commits: int, *, run_id: str = "live", seed: int = 0, steps: int = 6) -> None:
    """``commits`` commits of 8 envs x ``steps`` steps each (one flush per batch), for the tests that follow
    commits."""
    rng = np.random.default_rng(seed)
    with store.writer(run_id=run_id, env_id="Toy-v0") as w:
        for _ in range(commits):
            w.add_batch(make_batch(rng, steps, 8, p_terminated=0.3))
            w.flush()


def step_keys(table: Any) -> list[tuple[int, int]]:
    """The ``(episode_id, step)`` of each row, in order."""
    return list(zip(table["episode_id"].to_pylist(), table["step"].to_pylist()))


# --- image observations: frame stacks as gymnasium's FrameStackObservation makes them ----------------------

def stacked_stream(rng: np.random.Generator, T: int, B: int, *, k: int = 4, shape: tuple[int, ...] = (8, 8),
                   autoreset: str = "same-step", noise: bool = False, p_end: float = 0.08) -> dict[str, Any]:
    """A ``(T, B, …)`` stream of uint8 frame stacks ``(k, *shape)``, newest frame last, padded at each episode
    start by repeating its first frame, as a vector env under FrameStackObservation gives them in ``autoreset``
    mode (next-step: the step after an end is the reset step, obs the final stack, next_obs the new episode's
    first). Frames are a Breakout-like picture (a fixed wall, a moving ball and paddle) or, with ``noise``,
    random bytes; extras ``t`` holds each step's time index."""
    def frame(episode: int, i: int) -> np.ndarray:
        if noise:
            return rng.integers(0, 256, shape, dtype=np.uint8)
        f = np.zeros(shape, np.uint8)
        f[0] = 200  # the wall
        f[(episode + i) % (shape[0] - 1) + 1, (3 * i + episode) % shape[1]] = 255  # the ball
        f[-1, i % shape[1]] = 90  # the paddle
        return f

    obs = np.zeros((T, B, k, *shape), np.uint8)
    nxt = np.zeros_like(obs)
    term, trunc = np.zeros((T, B), bool), np.zeros((T, B), bool)
    for b in range(B):
        episode, i = b * 1000, 0
        stack = np.repeat(frame(episode, 0)[None], k, axis=0)
        reset_next = False
        for t in range(T):
            obs[t, b] = stack
            if reset_next:  # next-step autoreset: this step resets the env
                episode, i, reset_next = episode + 1, 0, False
                stack = np.repeat(frame(episode, 0)[None], k, axis=0)
                nxt[t, b] = stack
                continue
            i += 1
            stack = np.concatenate([stack[1:], frame(episode, i)[None]])
            nxt[t, b] = stack
            if rng.random() < p_end:
                (term if rng.random() < 0.7 else trunc)[t, b] = True
                if autoreset == "next-step":
                    reset_next = True
                else:
                    episode, i = episode + 1, 0
                    stack = np.repeat(frame(episode, 0)[None], k, axis=0)
    return {"obs": obs, "action": rng.integers(0, 4, (T, B)), "reward": rng.random((T, B)).astype(np.float32),
            "next_obs": nxt, "terminated": term, "truncated": trunc,
            "extras": {"t": np.repeat(np.arange(T)[:, None], B, axis=1)}}


def write_pixel_store(path: Any, *, T: int = 60, B: int = 2, seed: int = 0) -> trajstore.Store:
    """A store of image observations beside plain ones: run ``pixels`` holds env ``Stacks-v0`` (uint8 frame
    stacks ``(4, 24, 32)`` of random bytes, declared with ``frame_stack``) and env ``Rgb-v0`` (a Dict
    observation: an RGB picture ``pixels`` ``(16, 20, 3)`` and a float vector ``state``); run ``plain`` holds
    ``Vector-v0`` (float32 vectors, no picture)."""
    rng = np.random.default_rng(seed)
    store = trajstore.open(path, create=True)
    with store.writer(run_id="pixels", env_id="Stacks-v0", frame_stack={"obs": 4}) as w:
        w.add_batch(stacked_stream(rng, T, B, shape=(24, 32), noise=True, p_end=0.05))
    batch = make_batch(rng, T, B, p_terminated=0.05, p_truncated=0.0)
    pictures = rng.integers(0, 256, (T + 1, B, 16, 20, 3), dtype=np.uint8)
    state = rng.standard_normal((T + 1, B, 3)).astype(np.float32)
    batch["obs"] = {"pixels": pictures[:-1], "state": state[:-1]}
    batch["next_obs"] = {"pixels": pictures[1:], "state": state[1:]}
    with store.writer(run_id="pixels", env_id="Rgb-v0") as w:
        w.add_batch(batch)
    with store.writer(run_id="plain", env_id="Vector-v0") as w:
        w.add_batch(make_batch(rng, T, B, p_terminated=0.05, p_truncated=0.0))
    return store


def wait_for(condition: Callable[[], object], what: str, seconds: float = 60.0) -> None:
    """Until ``condition()`` is true (checked every 20 ms): the event a test awaits instead of a fixed sleep;
    after ``seconds`` an AssertionError saying ``what`` did not happen."""
    deadline = time.monotonic() + seconds
    while not condition():
        if time.monotonic() > deadline:
            raise AssertionError(f"{what} did not happen within {seconds:g} s")
        time.sleep(0.02)


# --- the layers below the Store, for the tests of those layers ---------------------------------------------------
# A Store keeps its table, engine and loader layouts private; a test of the storage layer, the query layer or the
# loaders opens its own over the same store (as another process would), never the Store's.

def store_location(store: trajstore.Store) -> Location:
    """Where ``store`` is, with its storage options and settings."""
    served = plumbing(store)
    return locate(store.uri, served.storage_options or None, settings=served.settings)


def steps_table(store: trajstore.Store, *, pinned: int | None = None) -> StepsTable:
    """The ``steps`` table of ``store`` (its files and its log) as the storage layer opens it, at ``pinned`` (default:
    the version a read-only store is pinned to, else the latest)."""
    served = plumbing(store)
    return StepsTable.of_store(store_location(store), served.settings,
                               pinned=served.pinned if pinned is None else pinned)


def engine_of(store: trajstore.Store) -> Engine:
    """A read engine over ``store``'s table, as a Store builds one (its caches its own)."""
    return Engine(steps_table(store), store_location(store), plumbing(store).settings)


def layouts_of(store: trajstore.Store) -> LayoutStore:
    """Where ``store``'s loader layouts are kept, as a Store opens it."""
    settings = plumbing(store).settings
    return LayoutStore(store_location(store), cache=settings.layout_cache, shared=settings.store_layouts,
                       keep=settings.loader_layouts)


BUILT = "built loader layout"  # the log line of every layout built (loaders/layout_store.py), found or kept


def layouts_built(records: list[logging.LogRecord]) -> int:
    """How many loader layouts were built among log ``records`` (what ``caplog.records`` held)."""
    return sum(1 for r in records if r.name == "trajstore.loaders.layout_store" and r.getMessage().startswith(BUILT))


HUGE = float(np.float32(1e17))  # a float32 reward; ~1e17 + 16 is the next double, and 1e17 + 5 == 1e17


def write_huge_returns(path: Path) -> trajstore.Store:
    """40 complete episodes whose returns alternate between ~1e17 and the next double above it (+16)."""
    store = trajstore.open(path, create=True)
    lengths = [1, 2] * 20
    T = sum(lengths)
    reward, terminated = np.zeros((T, 1), np.float32), np.zeros((T, 1), bool)
    ends = np.cumsum(lengths) - 1
    reward[ends - np.array(lengths) + 1, 0] = HUGE
    reward[ends[np.array(lengths) == 2], 0] = 16
    terminated[ends, 0] = True
    obs = np.zeros((T, 1, 2), np.float32)
    with store.writer(run_id="huge", env_id="Huge-v0") as writer:
        writer.add_batch({"obs": obs, "next_obs": obs, "action": np.zeros((T, 1), np.int64), "reward": reward,
                          "terminated": terminated, "truncated": np.zeros((T, 1), bool)})
    return store
