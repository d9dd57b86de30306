"""Loader layouts kept in the store: a fresh process finds what another built; concurrent builders leave one
layout; a killed build leaves nothing a reader uses; a damaged layout is built again; vacuum removes the layouts
no retained version needs and nothing else; on s3:// the layout lives in the bucket and another machine copies
it instead of building it."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.settings import Settings

REPO = Path(__file__).resolve().parents[2]
ARGS: dict[str, Any] = {"columns": ["obs", "reward", "return_to_go"], "gamma": 0.9, "pad": True, "batch_size": 32,
                        "shuffle": True, "seed": 3}
CHILD = """
import hashlib, json, logging, sys
import trajstore
from trajstore.loaders import layout_store
class Builds(logging.Handler):  # each layout built says so in the log
    n = 0
    def emit(self, record):
        Builds.n += record.getMessage().startswith("built loader layout")
logging.getLogger(layout_store.__name__).addHandler(Builds())
logging.getLogger(layout_store.__name__).setLevel(logging.INFO)
mode, uri, args = sys.argv[1], sys.argv[2], json.loads(sys.argv[3])
if mode == "stop-before-manifest":  # a build killed after its files were written, before its manifest
    def stop(*a, **k):
        print("ready", flush=True)
        import time
        time.sleep(600)
    layout_store.LayoutStore._keep_manifest = stop
store = trajstore.open(uri)
digest = hashlib.sha256()
for batch in store.sequences(4, **args):
    for k in sorted(batch):
        digest.update(batch[k].tobytes())
print(json.dumps({"built": Builds.n, "digest": digest.hexdigest()}), flush=True)
"""

pytestmark = pytest.mark.usefixtures("built_layouts")


def fill(store: trajstore.Store, run: str = "a", seed: int = 0) -> None:
    with store.writer(run_id=run, env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(seed), 60, 6, p_terminated=0.05))


def run_child(uri: str, mode: str = "read", **overrides: Any) -> subprocess.Popen[str]:
    return subprocess.Popen([sys.executable, "-c", CHILD, mode, uri, json.dumps({**ARGS, **overrides})],
                            stdout=subprocess.PIPE, text=True, cwd=REPO)


def result(proc: subprocess.Popen[str]) -> dict[str, Any]:
    out, _ = proc.communicate(timeout=120)
    assert proc.returncode == 0, out
    return json.loads(out.strip().splitlines()[-1])


def reference(store: trajstore.Store, **overrides: Any) -> str:
    """The digest of the batches a layout built for this call alone gives."""
    import hashlib

    private = trajstore.Store(store.uri, settings=Settings(loader_layouts=0, store_layouts=False))
    digest = hashlib.sha256()
    for batch in private.sequences(4, **{**ARGS, **overrides}):
        for k in sorted(batch):
            digest.update(batch[k].tobytes())
    return digest.hexdigest()


def layout_files(root: Path) -> tuple[list[str], list[str]]:
    """The manifests and the data folders under ``layouts/``."""
    folder = root / "layouts"
    return sorted(p.name for p in folder.glob("*.json")), sorted(p.name for p in (folder / "data").glob("*"))


@pytest.mark.slow
def test_a_fresh_process_finds_the_layout_another_built(store: trajstore.Store) -> None:
    fill(store)
    first = result(run_child(store.uri))
    manifests, data = layout_files(store.root)
    second = result(run_child(store.uri))
    assert first["built"] == 1 and second["built"] == 0
    assert first["digest"] == second["digest"] == reference(store)
    assert layout_files(store.root) == (manifests, data) and len(manifests) == len(data) == 1


@pytest.mark.slow
def test_concurrent_builders_leave_one_layout_and_the_same_batches(store: trajstore.Store) -> None:
    fill(store)
    procs = [run_child(store.uri) for _ in range(3)]
    results = [result(p) for p in procs]
    assert sum(r["built"] for r in results) == 1  # the others waited for it and found it
    assert {r["digest"] for r in results} == {reference(store)}
    manifests, data = layout_files(store.root)
    assert len(manifests) == len(data) == 1


@pytest.mark.slow
def test_a_killed_build_leaves_nothing_a_reader_uses_and_vacuum_removes_it(store: trajstore.Store) -> None:
    fill(store)
    proc = run_child(store.uri, "stop-before-manifest")
    assert proc.stdout is not None and proc.stdout.readline().strip() == "ready"
    proc.kill()
    proc.wait()
    manifests, (killed,) = layout_files(store.root)
    assert manifests == []  # its files are complete, but no manifest names them
    after = result(run_child(store.uri))
    assert after["built"] == 1 and after["digest"] == reference(store)
    manifests, data = layout_files(store.root)
    assert len(manifests) == 1 and len(data) == 2 and killed in data
    assert store.maintain.vacuum(older_than=0).files == []  # a young folder may be a build in progress
    old = time.time() - 2 * 3600
    for path in (store.root / "layouts" / "data" / killed).iterdir():
        os.utime(path, (old, old))
    removed = store.maintain.vacuum(older_than=0).files
    assert removed and all(f"/data/{killed}/" in f for f in removed)
    assert layout_files(store.root) == (manifests, [d for d in data if d != killed])
    assert result(run_child(store.uri))["built"] == 0


@pytest.mark.slow
def test_a_damaged_layout_is_built_again(store: trajstore.Store) -> None:
    fill(store)
    assert result(run_child(store.uri))["built"] == 1
    (_, (data,)) = layout_files(store.root)
    column = next((store.root / "layouts" / "data" / data).glob("*.bin"))
    with open(column, "r+b") as f:
        f.truncate(column.stat().st_size // 2)  # a copy cut short, a disk that lost a file's end
    again = result(run_child(store.uri))
    assert again["built"] == 1 and again["digest"] == reference(store)


def test_vacuum_removes_the_layouts_no_retained_version_needs(store: trajstore.Store,
                                                              built: Callable[[], int]) -> None:
    fill(store, "a", 0)
    fill(store, "b", 1)
    for run_id in (None, "a", "b"):  # every run (its files change with any commit), run a alone, run b alone
        list(store.sequences(4, run_id=run_id, **ARGS))
    pinned = trajstore.open(store.uri, version=store.version - 1)
    list(pinned.sequences(4, **ARGS))  # version 1 held run a alone: the same files as run a's layout
    assert built() == 3  # the store's three; the store at the older version built none
    fill(store, "b", 2)
    assert store.maintain.vacuum(older_than="1h").files == []  # the versions of the last hour read all of them
    store.maintain.delete(run_id="b")
    assert len(layout_files(store.root)[0]) == 3
    report = store.maintain.vacuum(older_than=0)
    assert report.bytes > 0 and any(f.endswith(".json") for f in report.files)
    manifests, data = layout_files(store.root)
    assert len(manifests) == len(data) == 1  # run a's: the latest version still reads its files
    fresh = trajstore.open(store.uri)
    for run_id in ("a", None):  # every run is run a now: the same files, the same layout
        list(fresh.sequences(4, run_id=run_id, **ARGS))
    assert built() == 3  # found, not built


def test_a_later_version_supersedes_the_layout_of_the_same_selection(store: trajstore.Store) -> None:
    fill(store, "a", 0)
    fill(store, "b", 0)
    list(store.sequences(4, **ARGS))
    list(store.sequences(4, run_id="a", **ARGS))
    assert len(layout_files(store.root)[0]) == 2
    for seed in (1, 2, 3):  # a learner reading every new version: one layout of each selection, not one per version
        fill(store, "b", seed)
        list(trajstore.open(store.uri).sequences(4, **ARGS))
    manifests, data = layout_files(store.root)
    assert len(manifests) == len(data) == 2  # the latest version's, and run a's (untouched by run b's commits)
    assert result(run_child(store.uri))["built"] == 0


@pytest.mark.s3
def test_an_s3_store_keeps_its_layouts_in_the_bucket(s3: Any, tmp_path: Path, built: Callable[[], int]) -> None:
    uri = f"s3://{s3.bucket()}/layouts-test"
    machine_a = trajstore.open(uri, create=True, storage_options=s3.storage_options,
                               settings=Settings(layout_cache=str(tmp_path / "a")))
    fill(machine_a)
    got = list(machine_a.sequences(4, **ARGS))
    fs, root = s3.filesystem(), uri.removeprefix("s3://")
    import pyarrow.fs as pafs

    def bucket_files() -> list[str]:
        return sorted(i.path for i in fs.get_file_info(pafs.FileSelector(f"{root}/layouts", recursive=True,
                                                                          allow_not_found=True))
                      if i.type == pafs.FileType.File)

    stored = bucket_files()
    assert any(p.endswith(".json") for p in stored) and any("/data/" in p and p.endswith(".bin") for p in stored)
    machine_b = trajstore.open(uri, storage_options=s3.storage_options,
                               settings=Settings(layout_cache=str(tmp_path / "b")))
    copied = list(machine_b.sequences(4, **ARGS))
    assert built() == 1  # machine a's: machine b copied it from the bucket
    assert bucket_files() == stored and len(got) == len(copied) > 0
    for x, y in zip(got, copied):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    column = next((tmp_path / "b").rglob("0.bin"))
    with open(column, "r+b") as f:
        f.truncate(column.stat().st_size // 2)  # this machine's copy cut short: copied again, not built
    again = trajstore.open(uri, storage_options=s3.storage_options,
                           settings=Settings(layout_cache=str(tmp_path / "b")))
    for x, y in zip(got, list(again.sequences(4, **ARGS)), strict=True):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    assert built() == 1 and bucket_files() == stored
    column = next((tmp_path / "b").rglob("0.bin"))
    column.write_bytes(bytes(column.stat().st_size))  # a copy killed before its manifest: whole size, wrong bytes
    for manifest in (tmp_path / "b").rglob("*.json"):
        manifest.unlink()
    third = trajstore.open(uri, storage_options=s3.storage_options,
                           settings=Settings(layout_cache=str(tmp_path / "b")))
    for x, y in zip(got, list(third.sequences(4, **ARGS)), strict=True):
        for k in x:
            np.testing.assert_array_equal(x[k], y[k])
    assert built() == 1 and not list((tmp_path / "b").rglob(".download-*"))
    fill(machine_a, "a", 5)  # a new version of the same selection
    machine_a.maintain.vacuum(older_than=0)
    assert bucket_files() == []
    assert not list((tmp_path / "a").rglob("*.json"))  # this machine's copies of removed layouts go too
