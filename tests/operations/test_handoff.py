"""One committer for many writer processes (issue 49): each process writes its files itself and hands them to one
:class:`trajstore.Committer` at its address; N processes that would make N commits per flush make about one. A
writer killed after writing and before its files were committed leaves files nothing reads, which vacuum removes."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.errors import CommitError, InputError

WRITER = """
import sys, numpy as np, trajstore
from tests.helpers import make_batch
root, address, i = sys.argv[1], sys.argv[2], int(sys.argv[3])
rng = np.random.default_rng(i)
with trajstore.open(root).writer(run_id="r", env_id="E", worker_id=f"p{i}", committer=address) as w:
    for _ in range(3):
        w.add_batch(make_batch(rng, 8, 2))
        w.flush()
"""

KILLED = """
import os, signal, sys, numpy as np, trajstore
from tests.helpers import make_batch
store = trajstore.open(sys.argv[1])
w = store.writer(run_id="dead", env_id="E", committer=sys.argv[2])
w.add_batch(make_batch(np.random.default_rng(9), 8, 2))
w.sink.commit = lambda written: os.kill(os.getpid(), signal.SIGKILL)  # killed once its file is written
w.flush()
"""


def python(*args: str) -> subprocess.Popen[str]:
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(Path.cwd()), os.environ.get("PYTHONPATH", "")])}
    return subprocess.Popen([sys.executable, *args], env=env, text=True, stderr=subprocess.PIPE)


def test_writer_processes_hand_their_files_to_one_committer(store: trajstore.Store) -> None:
    with trajstore.Committer(store, interval="1s") as committer:
        assert committer.address.startswith("trajstore+committer://127.0.0.1:")
        procs = [python("-c", WRITER, str(store.root), committer.address, str(i)) for i in range(4)]
        for p in procs:
            assert p.wait(300) == 0, p.stderr.read() if p.stderr else ""
        commits, groups = committer.commits, committer.groups
    assert sum(groups) == 12 and commits <= 7  # 12 flushes; about one commit per round of flushes (not 12)
    assert len([r for r in store.history().to_pylist() if r["operation"] == "append"]) == commits
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 4 * 3 * 16
    assert trajstore.check(store).ok


def test_a_writer_killed_before_its_files_are_committed_leaves_files_vacuum_removes(store: trajstore.Store) -> None:
    with trajstore.Committer(store, interval="100ms") as committer:
        killed = python("-c", KILLED, str(store.root), committer.address)
        assert killed.wait(300) == -9
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 0  # nothing reads its file
    report = trajstore.check(store)
    assert report.ok and len(report.orphans) == 1
    orphan = next(Path(store.root).rglob("run_id=dead/**/*.parquet"))
    old = time.time() - 2 * 3600  # past vacuum's grace for files a writer may be about to commit
    os.utime(orphan, (old, old))
    store.maintain.vacuum(older_than="0s")
    assert not orphan.exists() and trajstore.check(store).orphans == []


def test_a_writer_whose_committer_is_gone_is_told_its_files_may_not_be_committed(store: trajstore.Store) -> None:
    committer = trajstore.Committer(store, interval="100ms")
    address = committer.address
    committer.close()
    w = store.writer(run_id="r", env_id="E", committer=address)
    w.add_batch(make_batch(np.random.default_rng(0), 4, 2))
    with pytest.raises(CommitError, match=r"committer at 127.0.0.1:\d+: .*may not be committed .*trajstore vacuum"):
        w.flush()
    with pytest.raises(InputError, match="committer: expected an address trajstore\\+committer://HOST:PORT/KEY"):
        store.writer(run_id="r", env_id="E", committer="localhost:5000")
