"""Run by tests/test_core_install.py inside the virtualenv of trajstore's core alone (`make core-venv`: no extra
installed): writes a store through a Writer, reads it back every way the core offers (stats, episodes, SQL, returns,
sequences, transitions, scans, compaction, check), asks for what each extra brings, and prints one JSON line: what it
read, the error each extra's feature raised, and the extras' packages the interpreter imported (none).

    python -m tests.core_install_check STORE_DIR
"""

from __future__ import annotations

import json
import sys
from typing import Any, Callable

import numpy as np

import trajstore

OPTIONAL = ["fastapi", "uvicorn", "starlette", "pydantic", "httpx", "gymnasium", "PIL", "yaml", "tqdm", "polars",
            "jax", "torch"]
T, B = 64, 4


def batch(rng: np.random.Generator, obs: np.ndarray) -> dict[str, Any]:
    return {"obs": obs, "next_obs": obs, "action": rng.integers(0, 2, (T, B)),
            "reward": rng.random((T, B), dtype=np.float32), "terminated": rng.random((T, B)) < 0.05,
            "truncated": np.zeros((T, B), bool)}


def written(store: trajstore.Store) -> dict[str, Any]:
    """Three batches of four envs into run ``core``, a file each; what the done flags say was stored."""
    rng = np.random.default_rng(0)
    batches = [batch(rng, rng.random((T, B, 3), dtype=np.float32)) for _ in range(3)]
    with store.writer(run_id="core", env_id="Core-v0") as w:
        for b in batches:
            w.add_batch(b)
            w.flush()
    done = np.concatenate([b["terminated"] for b in batches])
    reward = np.concatenate([b["reward"] for b in batches])
    return {"steps": 3 * T * B, "complete": int(done.sum()), "reward": float(reward.astype(np.float64).sum())}


def read(store: trajstore.Store) -> dict[str, Any]:
    """The store read back by each reader of the core."""
    stats = store.stats().to_pylist()[0]
    windows = next(store.sequences(8, columns=["obs", "reward"], pad=True, batch_size=16, shuffle=True))
    steps = next(store.transitions(3, gamma=0.9, batch_size=16))
    return {
        "sql_steps": store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py(),
        "sql_reward": store.sql("SELECT sum(reward::DOUBLE) AS r FROM steps")["r"][0].as_py(),
        "n_traj": stats["n_traj"],
        "episodes": store.episodes(complete=True).num_rows,
        "return_to_go_rows": store.returns(gamma=0.99, per="step").num_rows,
        "window_obs": list(windows["obs"].shape),
        "transition_reward": list(steps["reward"].shape),
        "scanned": sum(len(b["reward"]) for b in store.iter_batches(batch_size=100, columns=["reward"])),
        "compact": trajstore.compact(store).format(),
        "check": trajstore.check(store).ok,
        "pictures": pictures(store),
    }


def pictures(store: trajstore.Store) -> str:
    """A run of 8x8 gray frames, stored and read back (their export needs Pillow: see :func:`missing`)."""
    rng = np.random.default_rng(1)
    with store.writer(run_id="frames", env_id="Frames-v0") as w:
        w.add_batch(batch(rng, rng.integers(0, 255, (T, B, 8, 8), dtype=np.uint8)))
    return str(store.sql("SELECT obs FROM steps WHERE run_id = 'frames' LIMIT 1", run_id="frames")["obs"].type)


def missing(store: trajstore.Store, root: str) -> dict[str, str]:
    """What each feature of an extra raises here: ``"<error type>: <message>"``."""
    def gym() -> None:
        from trajstore.rollout import gym_rollout  # noqa: F401

    def jax() -> None:
        from trajstore.rollout import jax_rollout  # noqa: F401

    def service() -> None:
        from trajstore.api.app import create_app  # noqa: F401

    def torch() -> None:
        store.sequences(8, format="torch")

    def lerobot() -> None:
        trajstore.export_lerobot(store, f"{root}-lerobot", run_id="frames")

    features: dict[str, Callable[[], Any]] = {
        "client": lambda: trajstore.Client("http://127.0.0.1:9"), "gym": gym, "jax": jax, "serve": service,
        "torch": torch, "lerobot": lerobot}
    out = {}
    for extra, feature in features.items():
        try:
            feature()
            out[extra] = "no error"
        except ImportError as exc:
            out[extra] = f"{type(exc).__name__}: {exc}"
    return out


def main(root: str) -> None:
    store = trajstore.open(root, create=True)
    result = {"written": written(store), "read": read(store)}
    result["missing"] = missing(store, root)
    result["imported"] = [m for m in OPTIONAL if m in sys.modules]
    print(json.dumps(result))


if __name__ == "__main__":
    main(sys.argv[1])
