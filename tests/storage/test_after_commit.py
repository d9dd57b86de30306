"""A failure after the commit is not a failed commit (storage/landing.py), with the real fault: the log of a local
store on a tmpfs of its own that is full but for two pages, so that each commit's log entry (one page) is written
and deltalake's own checkpoint, which it writes inside the same call (here after every commit), is not
(ENOSPC). Every commit path — a writer's append, its background compaction, ``compact``, ``delete``,
``add_column``, ``ingest`` — reports its change as done, deletes none of the files the new version lists, and the
checkpoint is written later. The tmpfs is mounted in a mount namespace of its own (``unshare -rm``); where the
machine does not allow that, these tests are skipped."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import trajstore
from tests import seaweed
from tests.helpers import make_batch

pytestmark = pytest.mark.skipif(not seaweed.can_mount(), reason="no tmpfs mounts here (unshare -rm refused)")

REPO = Path(__file__).parents[2]

ON_A_FULL_LOG = """
import json, logging, os, shutil, sys
sys.path.insert(0, sys.argv[4])
import numpy as np, trajstore
from deltalake import DeltaTable
from tests.helpers import make_batch, steps_table
from tests.storage.helpers import episode
from trajstore.store import plumbing
from trajstore.operations.upkeep import CompactionPolicy, Upkeep

log_dir, saved, operation = sys.argv[1], sys.argv[2], sys.argv[3]
for name in os.listdir(saved):  # the log as it was, now on the small disk
    shutil.copy(os.path.join(saved, name), log_dir)
root = os.path.dirname(os.path.dirname(log_dir))
store = trajstore.open(root)
DeltaTable(steps_table(store).uri).alter.set_table_properties({"delta.checkpointInterval": "1"})  # one per commit
warnings = []
logging.getLogger("trajstore").addHandler(type("H", (logging.Handler,), {"emit": lambda s, r: warnings.append(
    r.getMessage()) if r.levelno >= logging.WARNING else None})())
before = store.version
# everything left, taken, then two pages given back
with open(os.path.join(log_dir, "filler"), "wb", buffering=0) as filler:
    try:
        while True:
            filler.write(b"\\0" * 4096)
    except OSError:
        pass
os.truncate(os.path.join(log_dir, "filler"), max(0, os.path.getsize(os.path.join(log_dir, "filler")) - 8192))

out = {"steps": 4 * 32}
rng = np.random.default_rng(1)
try:
    if operation == "append":
        with store.writer(run_id="r", env_id="E", upkeep=None) as w:
            w.add_batch(make_batch(rng, 16, 2))
            w.flush()
        out["steps"] += 32
    elif operation == "upkeep":
        upkeep = Upkeep(steps_table(store), CompactionPolicy(small_files=3, checkpoint_interval=0))
        with store.writer(run_id="r", env_id="E", upkeep=upkeep) as w:
            w.add_batch(make_batch(rng, 16, 2))
        upkeep.close()
        out["steps"] += 32
        out["said"] = [(c.files_removed, c.files_added) for c in upkeep.compactions] + list(upkeep.errors)
    elif operation == "compact":
        out["said"] = str(trajstore.compact(store, progress=False))
    elif operation == "delete":
        out["said"] = str(store.maintain.delete(run_id="gone"))
        out["steps"] -= 32
    elif operation == "add_column":
        out["said"] = str(store.maintain.add_column("shaped", "reward * 2"))
    elif operation == "ingest":
        plumbing(store).ingest(episode([0, 1, 2], episode_id=5, end=True), run_id="remote", env_id="Remote-v0")
        out["steps"] += 3
    out["raised"] = None
except Exception as exc:
    out["raised"] = f"{type(exc).__name__}: {exc}"
out["warnings"] = warnings
out["before"] = before
out["versions"] = store.version - before
out["history"] = store.history()["operation"].to_pylist()[-3:]
out["checkpoint_before_room"] = steps_table(store).log.last_checkpoint()
os.remove(os.path.join(log_dir, "filler"))  # room again
fresh = trajstore.open(root)
out["counts"] = fresh.sql("SELECT count(*) AS n, count(DISTINCT (run_id, episode_id, step)) AS d "
                          "FROM steps").to_pylist()
out["missing"] = [f.uri for f in fresh.maintain.files() if not os.path.exists(f.path)]
out["check"] = trajstore.check(fresh).ok
out["checkpointed"] = steps_table(fresh).log.checkpoint_if_due(1)
out["latest"] = fresh.version
print(json.dumps(out))
"""


def written(root: Path) -> None:
    """A store of two runs: ``r`` in three files, ``gone`` in one (4 x 32 steps)."""
    store = trajstore.open(root, create=True)
    rng = np.random.default_rng(0)
    for run in ("r", "r", "r", "gone"):
        with store.writer(run_id=run, env_id="E", upkeep=None) as w:
            w.add_batch(make_batch(rng, 16, 2))


@pytest.mark.slow
@pytest.mark.parametrize("operation", ["append", "upkeep", "compact", "delete", "add_column", "ingest"])
def test_a_commit_whose_checkpoint_meets_a_full_disk_is_done(tmp_path: Path, operation: str) -> None:
    root = tmp_path / "store"
    written(root)
    log_dir = root / "steps" / "_delta_log"
    saved = tmp_path / "saved-log"
    shutil.copytree(log_dir, saved)
    command = [sys.executable, "-c", ON_A_FULL_LOG, str(log_dir), str(saved), operation, str(REPO)]
    run = subprocess.run(seaweed.on_small_disk(command, log_dir, 1), capture_output=True, text=True, timeout=300)
    assert run.returncode == 0, run.stderr[-3000:]
    out = json.loads(run.stdout.strip().splitlines()[-1])
    assert out["raised"] is None, out
    assert any("was committed as version" in w and "No space left" in w for w in out["warnings"]), out["warnings"]
    assert out["checkpoint_before_room"] == out["before"] < out["latest"]  # the change's checkpoints all failed
    want = out["steps"]
    assert out["counts"] == [{"n": want, "d": want}]
    assert out["missing"] == [] and out["check"] is True
    assert out["checkpointed"] == out["latest"]  # written once there is room
    expected = {"append": "append", "upkeep": "compact", "compact": "compact", "delete": "delete",
                "add_column": "add_column", "ingest": "append"}[operation]
    assert out["history"][-1] == expected
    if operation == "upkeep":
        assert out["said"] == [[4, 1]]
    if operation == "compact":
        assert out["said"].startswith("compacted 1 partition(s): 3 files into 1")
