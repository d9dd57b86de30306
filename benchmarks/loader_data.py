"""Stores for the loader benchmark (issue 22): 200 envs running episodes of 50–1000 steps back to back, obs of 17
float32 (a MuJoCo Walker2d's size), actions of 6 float32, written by one writer in time-major batches.

Generated stores are kept under a data folder (by default ``.cache/bench-loaders/`` in the repository, which git
ignores) and reused by later runs: writing 50M steps takes minutes and ~8 GB. A store counts as generated once
``generated.json`` (its parameters) is written after its writer closed.
"""

from __future__ import annotations

import dataclasses
import json
import shutil
from pathlib import Path
from typing import Iterator

import numpy as np

ENVS = 200
MIN_EPISODE, MAX_EPISODE = 50, 1000
OBS_DIM, ACTION_DIM = 17, 6
HORIZON = 1000  # time steps per batch (x 200 envs)
FORMAT = 2  # bump to regenerate cached stores when what is written changes


def batches(steps: int, seed: int = 0) -> Iterator[dict[str, np.ndarray]]:
    """About ``steps`` steps (a multiple of ``ENVS``) as ``(T, ENVS, …)`` batches; every env's episodes have
    lengths drawn uniformly from [50, 1000]; one of 1000 steps is truncated, the others terminated."""
    rng = np.random.default_rng(seed)
    total_t = max(1, steps // ENVS)
    left = rng.integers(MIN_EPISODE, MAX_EPISODE + 1, ENVS)  # steps left in each env's current episode
    state = rng.standard_normal((ENVS, OBS_DIM), dtype=np.float32)
    for t0 in range(0, total_t, HORIZON):
        T = min(HORIZON, total_t - t0)
        terminated = np.zeros((T, ENVS), bool)
        truncated = np.zeros((T, ENVS), bool)
        for t in range(T):
            left -= 1
            ended = left == 0
            if ended.any():
                truncated[t] = ended & (rng.random(ENVS) < 0.1)
                terminated[t] = ended & ~truncated[t]
                left[ended] = rng.integers(MIN_EPISODE, MAX_EPISODE + 1, int(ended.sum()))
        states = rng.standard_normal((T + 1, ENVS, OBS_DIM), dtype=np.float32)
        states[0] = state
        state = states[-1]
        yield {"obs": states[:-1], "next_obs": states[1:],
               "action": rng.uniform(-1, 1, (T, ENVS, ACTION_DIM)).astype(np.float32),
               "reward": rng.standard_normal((T, ENVS), dtype=np.float32),
               "terminated": terminated, "truncated": truncated}


def ensure_store(folder: Path, steps: int, log: callable = print) -> Path:  # type: ignore[valid-type]
    """The store of ``steps`` steps under ``folder`` (``steps-<N>``), generated unless already there."""
    import trajstore
    from trajstore.settings import Settings

    path = folder / f"steps-{steps}"
    marker = path / "generated.json"
    params = {"steps": steps, "format": FORMAT, "envs": ENVS, "episodes": [MIN_EPISODE, MAX_EPISODE],
              "obs": OBS_DIM, "action": ACTION_DIM}
    if marker.exists() and json.loads(marker.read_text()) == params:
        return path
    if path.exists():
        shutil.rmtree(path)
    log(f"generating a store of {steps:,} steps in {path} (kept for later runs)")
    # its writer writes the loaders' array copies (not the default: there the first loader makes them), so that
    # the benchmark's first process over it reads no Parquet; bench_loaders.py measures the default apart
    settings = dataclasses.replace(Settings.from_env(), writer_arrays=True)
    store = trajstore.open(path, create=True, settings=settings)
    with store.writer(run_id="bench", env_id="Walker2d-v5") as w:
        for batch in batches(steps):
            w.add_batch(batch)
    marker.write_text(json.dumps(params))
    return path
