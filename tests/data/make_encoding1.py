"""Writes the encoding-1 fixture stores with trajstore as it was before encoding 2 (main at that time): obs of
two shapes stored as the old writer widened them (uint8 -> int64), and a Dict store (float64 -> float32).

Run with that version first on the path (it is not collected by pytest; the committed stores are its output):
``git archive <commit before encoding 2> | tar -x -C /tmp/old && PYTHONPATH=/tmp/old python
tests/data/make_encoding1.py tests/data``."""
import shutil
import sys
from pathlib import Path

import numpy as np

import trajstore

root = Path(sys.argv[1])
rng = np.random.default_rng(21)
T, B = 12, 2
written = {}


def batch(obs, nxt):
    done = np.zeros((T, B), bool)
    done[5, 0] = done[9, 1] = True
    return {"obs": obs, "action": rng.integers(0, 3, (T, B)), "reward": rng.normal(size=(T, B)).astype(np.float32),
            "next_obs": nxt, "terminated": done, "truncated": np.zeros((T, B), bool)}


def fresh(name):
    shutil.rmtree(root / name, ignore_errors=True)
    return trajstore.open(root / name, create=True)


store = fresh("encoding1-store")
for env, shape in (("Pixels-v0", (3, 4)), ("Small-v0", (2, 5))):
    frames = rng.integers(0, 256, (T + 1, B, *shape), dtype=np.uint8)
    written[env] = frames
    with store.writer(run_id="old", env_id=env, worker_id="w") as w:
        w.add_batch(batch(frames[:-1], frames[1:]))
store = fresh("encoding1-dict")
d = {"mode": rng.integers(0, 3, (T + 1, B)), "pos": rng.uniform(-1, 1, (T + 1, B, 2))}
written["Dict-pos"], written["Dict-mode"] = d["pos"], d["mode"]
with store.writer(run_id="old", env_id="Dict-v0", worker_id="w") as w:
    w.add_batch(batch({k: v[:-1] for k, v in d.items()}, {k: v[1:] for k, v in d.items()}))
np.savez(root / "encoding1-written.npz", **written)
