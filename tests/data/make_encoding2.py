"""Writes the encoding-2 fixture store with trajstore as it was before encoding 3 (main at 277dd07): float
observations (next_obs stored only where it is not the next step's obs, under the name ``next_obs``), uint8 frame
stacks (each frame once, in a ``list<binary>`` under the name ``obs``), a Dict observation with a stacked leaf, and
an env whose action is a float vector (a typed physical name); every file's meaning is in its Parquet footer only.
What trajstore's ``scan`` returned for it then is saved beside it (``encoding2-scan-<env>.arrow``).

Run with that version first on the path (it is not collected by pytest; the committed store is its output):
``git archive 277dd07 | tar -x -C /tmp/old && PYTHONPATH=/tmp/old python tests/data/make_encoding2.py tests/data``."""
import shutil
import sys
from pathlib import Path

import numpy as np
import pyarrow as pa

import trajstore

root = Path(sys.argv[1])
rng = np.random.default_rng(22)
T, B, K = 12, 2, 4


def flags(ends):
    done = np.zeros((T, B), bool)
    for t, b in ends:
        done[t, b] = True
    return done


def batch(obs, nxt, action=None):
    return {"obs": obs, "next_obs": nxt, "action": rng.integers(0, 3, (T, B)) if action is None else action,
            "reward": rng.normal(size=(T, B)).astype(np.float32), "terminated": flags([(5, 0), (9, 1)]),
            "truncated": flags([(10, 0)])}


def stacks(frames):
    """FrameStackObservation's stacks of ``frames`` (T + K, B, ...): obs and next obs of T steps."""
    obs = np.stack([frames[i:i + T] for i in range(K)], axis=2)
    nxt = np.stack([frames[i + 1:i + 1 + T] for i in range(K)], axis=2)
    return obs, nxt


shutil.rmtree(root / "encoding2-store", ignore_errors=True)
store = trajstore.open(root / "encoding2-store", create=True)
for _ in range(2):  # episodes cross the two commits
    v = rng.normal(size=(T + 1, B, 3)).astype(np.float32)
    with store.writer(run_id="old", env_id="Vec-v0", worker_id="w") as w:
        w.add_batch(batch(v[:-1], v[1:]))
    obs, nxt = stacks(rng.integers(0, 256, (T + K, B, 6, 5), dtype=np.uint8))
    with store.writer(run_id="old", env_id="Pix-v0", frame_stack={"obs": K}) as w:
        w.add_batch(batch(obs, nxt))
    pix, nxt_pix = stacks(rng.integers(0, 256, (T + K, B, 3, 2), dtype=np.uint8))
    pos = rng.uniform(-1, 1, (T + 1, B, 2))
    with store.writer(run_id="old", env_id="Dict-v0", frame_stack={"obs.pixels": K}) as w:
        w.add_batch(batch({"pixels": pix, "pos": pos[:-1]}, {"pixels": nxt_pix, "pos": pos[1:]}))
    m = rng.normal(size=(T + 1, B, 2))
    with store.writer(run_id="old", env_id="Motor-v0") as w:
        w.add_batch(batch(m[:-1], m[1:], action=rng.normal(size=(T, B, 1)).astype(np.float32)))
for env in ("Vec-v0", "Pix-v0", "Dict-v0", "Motor-v0"):
    got = store.scan(env_id=env).read_all().sort_by([("episode_id", "ascending"), ("step", "ascending")])
    with pa.OSFile(str(root / f"encoding2-scan-{env}.arrow"), "wb") as sink, pa.ipc.new_file(sink, got.schema) as f:
        f.write_table(got)
