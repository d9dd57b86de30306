"""Loaders over the data files' array copies: made by the first loader that reads each file (or written with each
file where writers are asked to, ``TRAJSTORE_WRITER_ARRAYS=1``), then read by every later loader without reading
Parquet or building anything, and every batch is the one a layout built from Parquet gives; files that cannot have a
copy (another tool's rewrite, images) are laid out from Parquet as before; a copy cut short is made again, never
read; copies go with their files."""

from __future__ import annotations

import json
import logging
import mmap
import os
import shutil
import subprocess
import sys
import tempfile
import threading
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import trajstore
from tests.helpers import BUILT, layouts_built, make_batch, stacked_stream, steps_table
from trajstore.loaders import stitched
from trajstore.loaders.stitched import stitch
from trajstore.settings import Settings
from trajstore.storage.arrays import FOLDER, MANIFEST, MAX_STEP_BYTES, fragments_of


def chained(rng: np.random.Generator, T: int, B: int, **kw: Any) -> dict[str, Any]:
    """A batch whose ``next_obs`` is the next step's ``obs`` wherever the episode goes on (stored compactly, so the
    copies hold it decoded), and a Dict observation."""
    batch = make_batch(rng, T, B, **kw)
    states = rng.standard_normal((T + 1, B, 3)).astype(np.float32)
    ended = batch["terminated"] | batch["truncated"]
    batch["obs"] = {"pos": states[:-1], "flag": (states[:-1, :, :1] > 0)}
    nxt = states[1:].copy()
    nxt[ended] = rng.standard_normal((int(ended.sum()), 3)).astype(np.float32)  # a final observation of its own
    batch["next_obs"] = {"pos": nxt, "flag": nxt[:, :, :1] > 0}
    return batch


def fill(store: trajstore.Store, seed: int = 0, *, flushes: int = 6) -> None:
    rng = np.random.default_rng(seed)
    with store.writer(run_id="a", env_id="E") as w:
        for _ in range(flushes):  # every flush a file: episodes cut across files
            w.add_batch(chained(rng, 25, 6, p_terminated=0.04, p_truncated=0.02))
            w.flush()
    with store.writer(run_id="b", env_id="E") as w:
        w.add_batch(chained(rng, 20, 3))


def from_parquet(store: trajstore.Store) -> trajstore.Store:
    """The same store read with no array copies: every layout built from Parquet (the reference)."""
    return trajstore.Store(store.uri, settings=Settings(loader_arrays=False, store_layouts=False))


def laid_out_from(store: trajstore.Store) -> str:
    """Where a fresh store's first loader gathers from: the copies, or a layout built (or found built) from Parquet
    (a build says so in the log, ``trajstore.loaders.layout_store``)."""
    records = Records()
    logger = logging.getLogger("trajstore.loaders.layout_store")
    level = logger.level
    logger.addHandler(records)
    logger.setLevel(logging.INFO)
    try:
        next(iter(store.sequences(4, batch_size=8, columns=["obs", "reward"])))
    finally:
        logger.removeHandler(records)
        logger.setLevel(level)
    kept = list((store.root / "layouts").glob("*.json"))
    return "copies" if layouts_built(records.records) == 0 and not kept else "parquet"


class Records(logging.Handler):
    """The log records it is given."""

    def __init__(self) -> None:
        super().__init__(logging.INFO)
        self.records: list[logging.LogRecord] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.records.append(record)


def copy_folders(store: trajstore.Store) -> list[Path]:
    """The folders of the store's array copies (temporary ones too)."""
    folder = store.root / FOLDER
    return sorted(p for p in folder.iterdir() if p.is_dir()) if folder.exists() else []


def same(got: list[dict[str, Any]], want: list[dict[str, Any]]) -> None:
    assert len(got) == len(want) > 0
    for a, b in zip(got, want):
        assert list(a) == list(b)
        for k in b:
            if isinstance(b[k], dict):
                same([a[k]], [b[k]])
            else:
                np.testing.assert_array_equal(a[k], b[k], err_msg=k)


READS = [
    ("sequences", dict(length=7, shuffle=True, seed=3)),
    ("sequences", dict(length=7, pad=True, shuffle=True)),
    ("sequences", dict(length=5, stride=1, pad=True, columns=["obs", "next_obs", "action", "reward", "terminated"])),
    ("sequences", dict(length=3, stride=2, run_id="a", where="episode_return > 0")),
    ("transitions", dict(n=3, gamma=0.9, shuffle=True, columns=["obs", "action", "reward", "next_obs"])),
    ("transitions", dict(n=1, gamma=1.0, run_id="b")),
]


@pytest.fixture(params=["writers", "loaders"])
def copied(request: pytest.FixtureRequest, store: trajstore.Store,
           monkeypatch: pytest.MonkeyPatch) -> trajstore.Store:
    """A store whose every file has its copy: written by its writers (``TRAJSTORE_WRITER_ARRAYS=1``), or made by
    the first loader that read it (the default)."""
    if request.param == "writers":
        monkeypatch.setenv("TRAJSTORE_WRITER_ARRAYS", "1")
        store = trajstore.open(store.root)
    fill(store)
    assert (store.root / FOLDER).exists() == (request.param == "writers")
    if request.param == "loaders":
        assert laid_out_from(store) == "copies"
    return trajstore.open(store.root)


@pytest.mark.parametrize(("kind", "kwargs"), READS)
def test_batches_from_the_copies_are_those_of_a_layout_built_from_parquet(copied: trajstore.Store, kind: str,
                                                                          kwargs: dict[str, Any],
                                                                          built: Callable[[], int]) -> None:
    assert len(steps_table(copied).files()) == 7
    assert len(copy_folders(copied)) == 7  # one copy per file
    got = list(getattr(copied, kind)(batch_size=16, **kwargs))
    assert built() == 0 and not (copied.root / "layouts").exists()  # nothing read or built
    want = list(getattr(from_parquet(copied), kind)(batch_size=16, **kwargs))
    same(got, want)


def test_a_fresh_process_gives_its_first_batch_from_the_copies_alone(copied: trajstore.Store,
                                                                     built: Callable[[], int]) -> None:
    assert laid_out_from(trajstore.open(copied.root)) == "copies"
    store = trajstore.open(copied.root)
    first = next(iter(store.sequences(4, batch_size=8, columns=["obs", "reward"])))
    assert first["obs"]["pos"].shape == (8, 4, 3) and first["obs"]["flag"].dtype == bool
    assert built() == 0


def test_a_store_nobody_trains_from_holds_no_copies_and_the_first_loader_makes_them(
        store: trajstore.Store, built: Callable[[], int]) -> None:
    fill(store)
    assert not (store.root / FOLDER).exists()  # the writers wrote none
    want = list(from_parquet(store).sequences(5, batch_size=16, columns=["obs", "reward"], shuffle=True))
    assert not (store.root / FOLDER).exists()  # nor does a loader told not to use them
    before = built()  # the reference's layout
    first = trajstore.open(store.root)
    same(list(first.sequences(5, batch_size=16, columns=["obs", "reward"], shuffle=True)), want)
    assert built() == before  # made from each file, nothing laid out
    assert len(copy_folders(first)) == 7
    made = {p: p.stat().st_mtime_ns for f in copy_folders(first) for p in f.iterdir()}
    with first.writer(run_id="b", env_id="E") as w:  # one more file: the next loader makes its copy alone
        w.add_batch(chained(np.random.default_rng(9), 10, 2))
    later = trajstore.open(store.root)
    got = list(later.transitions(2, gamma=0.9, batch_size=16, columns=["obs", "action", "reward", "next_obs"]))
    assert built() == before and len(copy_folders(later)) == 8
    same(got, list(from_parquet(store).transitions(2, gamma=0.9, batch_size=16,
                                                    columns=["obs", "action", "reward", "next_obs"])))
    assert {p: p.stat().st_mtime_ns for p in made} == made  # the copies made before: read, not made again


def test_copies_made_by_a_loader_are_those_a_writer_writes(store: trajstore.Store,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("TRAJSTORE_WRITER_ARRAYS", "1")
    fill(trajstore.open(store.root))
    written = {f.name: {p.name: p.read_bytes() for p in f.iterdir()} for f in copy_folders(store)}
    shutil.rmtree(store.root / FOLDER)
    monkeypatch.delenv("TRAJSTORE_WRITER_ARRAYS")
    assert laid_out_from(trajstore.open(store.root)) == "copies"
    assert {f.name: {p.name: p.read_bytes() for p in f.iterdir()} for f in copy_folders(store)} == written


def test_loaders_of_one_machine_make_each_copy_once(store: trajstore.Store) -> None:
    """DataLoader workers (processes of one job) reading a store at once: the first makes the copies, the others
    wait for it and read them."""
    fill(store)
    assert not copy_folders(store)
    script = ("import logging, sys, trajstore\n"
              "records = []\n"
              "handler = logging.Handler(logging.INFO)\n"
              "handler.emit = records.append\n"
              "logger = logging.getLogger('trajstore.loaders.layout_store')\n"
              "logger.addHandler(handler)\n"
              "logger.setLevel(logging.INFO)\n"
              "s = trajstore.open(sys.argv[1])\n"
              "next(iter(s.sequences(4, batch_size=8, columns=['obs', 'reward'])))\n"
              f"print(sum(r.getMessage().startswith({BUILT!r}) for r in records))\n")
    procs = [subprocess.Popen([sys.executable, "-c", script, str(store.root)], stdout=subprocess.PIPE, text=True)
             for _ in range(3)]
    assert [p.communicate(timeout=300)[0].strip() for p in procs] == ["0"] * 3
    assert all(p.returncode == 0 for p in procs)
    assert len(copy_folders(store)) == 7 and not [p for p in copy_folders(store) if p.name.startswith(".tmp-")]


def test_windows_cut_across_many_files_are_whole(store: trajstore.Store) -> None:
    rng = np.random.default_rng(5)
    with store.writer(run_id="a", env_id="E") as w:
        for _ in range(12):  # 2 steps a file: every window of 6 crosses files
            w.add_batch(chained(rng, 2, 2, p_terminated=0.0, p_truncated=0.0))
            w.flush()
    got = list(store.sequences(6, stride=1, batch_size=4, columns=["obs", "reward"]))
    same(got, list(from_parquet(store).sequences(6, stride=1, batch_size=4, columns=["obs", "reward"])))
    rows = store.sql("SELECT episode_id, step, reward FROM steps ORDER BY episode_id, step").to_pydict()
    first = got[0]
    ep = first["episode_id"][0]
    want = [r for e, r in zip(rows["episode_id"], rows["reward"]) if e == ep][:6]
    np.testing.assert_array_equal(first["reward"][0], np.asarray(want, np.float32))


def test_files_without_a_copy_are_laid_out_from_parquet(copied: trajstore.Store, built: Callable[[], int]) -> None:
    from deltalake import DeltaTable

    want = list(from_parquet(copied).sequences(5, batch_size=16, columns=["obs", "reward"]))
    DeltaTable(str(copied.root / "steps")).optimize.compact()  # another tool's rewrite: files without copies
    store = trajstore.open(copied.root)
    before = built()  # the reference's layout
    assert laid_out_from(store) == "parquet"
    same(list(store.sequences(5, batch_size=16, columns=["obs", "reward"])), want)
    assert built() == before + 1


def test_after_trajstore_s_own_compaction_loaders_gather_from_copies(copied: trajstore.Store) -> None:
    want = list(from_parquet(copied).sequences(5, batch_size=16, columns=["obs", "reward"]))
    trajstore.compact(copied, progress=False)
    store = trajstore.open(copied.root)
    assert len(steps_table(store).files()) < 7 and laid_out_from(store) == "copies"
    same(list(store.sequences(5, batch_size=16, columns=["obs", "reward"])), want)


def test_a_copy_cut_short_or_of_another_file_is_never_read(copied: trajstore.Store) -> None:
    want = list(from_parquet(copied).sequences(5, batch_size=16, columns=["obs", "reward"]))
    folder = copy_folders(copied)[0]
    manifest = json.loads((folder / MANIFEST).read_text())
    column = folder / manifest["columns"]["reward"]["file"]
    os.truncate(column, column.stat().st_size - 4)
    cut = column.stat().st_size
    store = trajstore.open(copied.root)
    assert laid_out_from(store) == "copies"  # made again from its file, whole, before anything read it
    assert column.stat().st_size == cut + 4
    same(list(store.sequences(5, batch_size=16, columns=["obs", "reward"])), want)
    other = copy_folders(copied)[1]
    (other / MANIFEST).write_text((folder / MANIFEST).read_text())  # a copy that says it is another file's
    store = trajstore.open(copied.root)
    assert laid_out_from(store) == "copies"
    same(list(store.sequences(5, batch_size=16, columns=["obs", "reward"])), want)


def test_wide_steps_get_no_copy_and_are_laid_out_from_parquet(store: trajstore.Store, built: Callable[[], int]) -> None:
    rng = np.random.default_rng(2)
    frames = rng.integers(0, 255, (9, 2, 48, 48), dtype=np.uint8)  # 2.25 KiB a frame, 4.5 KiB with next_obs
    batch = {"obs": frames[:-1], "next_obs": frames[1:], "action": rng.integers(0, 3, (8, 2)),
             "reward": rng.random((8, 2)).astype(np.float32), "terminated": np.zeros((8, 2), bool),
             "truncated": np.zeros((8, 2), bool)}
    assert 2 * frames[0, 0].nbytes > MAX_STEP_BYTES
    with store.writer(run_id="a", env_id="E") as w:
        w.add_batch(batch)
    assert not (store.root / FOLDER).exists() or not any((store.root / FOLDER).iterdir())
    got = list(store.sequences(4, batch_size=4, columns=["obs"]))
    np.testing.assert_array_equal(got[0]["obs"][0], frames[:4, 0])
    assert built() == 1


def test_copies_of_frame_stacks_and_pictures_hold_next_obs_as_readers_decode_it(
        store: trajstore.Store, built: Callable[[], int]) -> None:
    rng = np.random.default_rng(5)
    with store.writer(run_id="a", env_id="Stacks", frame_stack={"obs": 4}) as w:  # 4 x 6 x 8 bytes a stack
        for _ in range(3):
            w.add_batch(stacked_stream(rng, 30, 2, shape=(6, 8), noise=True, p_end=0.1))
            w.flush()
    batch = make_batch(rng, 40, 2, p_terminated=0.05, p_truncated=0.05)
    pictures = rng.integers(0, 256, (41, 2, 5, 6, 3), dtype=np.uint8)
    batch["obs"] = {"pixels": pictures[:-1], "v": pictures[:-1, :, 0, 0].astype(np.float32)}
    batch["next_obs"] = {"pixels": pictures[1:], "v": pictures[1:, :, 0, 0].astype(np.float32)}
    with store.writer(run_id="b", env_id="Rgb") as w:
        w.add_batch(batch)
    for run in ("a", "b"):
        kwargs = dict(run_id=run, batch_size=8, columns=["obs", "next_obs", "reward"], shuffle=True, seed=1)
        before = built()
        got = list(store.sequences(5, **kwargs))
        assert built() == before  # from the copies (the references' layouts are built after)
        same(got, list(from_parquet(store).sequences(5, **kwargs)))
    assert len(copy_folders(store)) == 4


def test_copies_go_with_their_files(copied: trajstore.Store) -> None:
    folder = copied.root / FOLDER
    (folder / ".tmp-killed").mkdir()  # a process killed while writing a copy
    os.utime(folder / ".tmp-killed", (0, 0))
    trajstore.compact(copied, progress=False)
    assert laid_out_from(trajstore.open(copied.root)) == "copies"
    assert len(copy_folders(copied)) == 7 + 1 + 1  # the compacted file's copy beside the old ones (time travel)
    copied.maintain.vacuum(older_than=0)
    left = [p.name for p in copy_folders(copied)]
    assert len(left) == len(steps_table(copied).files())
    rels = {json.loads((folder / name / MANIFEST).read_text())["file"] for name in left}
    assert rels == {steps_table(copied).location.relative(f.path) for f in steps_table(copied).files()}


def test_a_failed_write_leaves_no_copy(store: trajstore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    from trajstore.storage.log import Log

    def refuse(*args: Any, **kwargs: Any) -> None:
        raise RuntimeError("no commit")

    monkeypatch.setenv("TRAJSTORE_WRITER_ARRAYS", "1")  # writers that write copies
    store = trajstore.open(store.root)
    monkeypatch.setattr(Log, "append", refuse)
    w = store.writer(run_id="a", env_id="E")
    w.add_batch(chained(np.random.default_rng(0), 5, 2))
    with pytest.raises(RuntimeError):
        w.flush()
    monkeypatch.undo()
    w.close()  # stored now, with one copy for the one file
    assert len(steps_table(store).files()) == 1 and len(copy_folders(store)) == 1


def test_fragments_are_the_runs_of_one_episode_s_steps() -> None:
    eid = np.array([5, 5, 5, 9, 9, 5, 5, 7])
    step = np.array([0, 1, 2, 4, 5, 3, 4, 0])
    got = fragments_of(eid, step)
    np.testing.assert_array_equal(got, [[5, 0, 0, 3], [9, 4, 3, 2], [5, 3, 5, 2], [7, 0, 7, 1]])
    assert fragments_of(np.zeros(0, np.int64), np.zeros(0, np.int64)).shape == (0, 4)


# --- 2 MiB pages ---------------------------------------------------------------------------------------------------


def huge_bytes(under: Path) -> int:
    """Bytes of files under ``under`` this process maps 2 MiB at a time (``FilePmdMapped`` in /proc/self/smaps)."""
    total, inside = 0, False
    for line in Path("/proc/self/smaps").read_text().splitlines():
        if line[0] in "0123456789abcdef":
            inside = str(under) in line
        elif inside and line.startswith("FilePmdMapped:"):
            total += int(line.split()[1]) << 10
    return total


def cached_small(path: Path) -> None:
    """Put ``path`` in the page cache in 4 KiB folios, as a program reading it without readahead does."""
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_RANDOM)
        while os.read(fd, 4096):
            pass
    finally:
        os.close(fd)


def mapped_huge(path: Path, hint: bool) -> int:
    """Bytes of ``path`` a fresh mapping of it maps 2 MiB at a time once read (``hint``: with MADV_HUGEPAGE)."""
    with open(path, "rb") as f, mmap.mmap(f.fileno(), 0, prot=mmap.PROT_READ) as m:
        if hint:
            m.madvise(stitched.MADV_HUGEPAGE)
        np.frombuffer(m, np.uint8)[::4096].sum()
        got = huge_bytes(path)
        del f
    return got


def machine_maps_files_huge(folder: Path) -> bool:
    """Whether this kernel and the file system of ``folder`` map a file's page cache 2 MiB at a time."""
    probe = folder / "probe"
    np.zeros(8 << 20, np.uint8).tofile(probe)
    cached_small(probe)
    os.posix_fadvise(os.open(probe, os.O_RDONLY), 0, 0, os.POSIX_FADV_DONTNEED)
    try:
        return mapped_huge(probe, hint=True) > 0
    finally:
        probe.unlink()


def wide(store: trajstore.Store, steps: int = 40_000) -> None:
    """A store whose copies of obs fill several 2 MiB blocks (one file, obs float32[64]: 10 MiB)."""
    rng = np.random.default_rng(5)
    with store.writer(run_id="a", env_id="E") as w:
        w.add_batch(make_batch(rng, steps // 8, 8, obs_dim=64, p_terminated=0.005, p_truncated=0.0))


def copies_of(store: trajstore.Store) -> list[Any]:
    """The copies of the store's files (made now where missing, as a loader makes them)."""
    table = steps_table(store)
    return table.array_copies(table.files())


needs_linux = pytest.mark.skipif(not Path("/proc/self/smaps").exists() or not hasattr(os, "posix_fadvise"),
                                 reason="2 MiB mappings of files are Linux's")


@needs_linux
def test_files_cached_in_small_pages_are_read_again_in_2_mib_pages(store: trajstore.Store) -> None:
    if not machine_maps_files_huge(store.root):
        pytest.skip("this kernel or file system caches files in small folios only")
    wide(store)
    copies = [c.file("obs")[0] for c in copies_of(store)]
    assert copies and sum(p.stat().st_size for p in copies) >= 8 << 20
    for path in copies:
        cached_small(path)
    assert sum(mapped_huge(p, hint=False) for p in copies) == 0  # another program's reads left small folios
    kw = dict(columns=["obs", "reward"], batch_size=64, shuffle=True, seed=1)
    got = list(store.sequences(16, **kw))  # the fold runs beside these batches
    for thread in threading.enumerate():
        if thread.name == "trajstore-populate":
            thread.join()
    same(got, list(from_parquet(store).sequences(16, **kw)))
    whole = sum(p.stat().st_size // stitched.HUGE * stitched.HUGE for p in copies)
    assert huge_bytes(store.root / FOLDER) >= whole * stitched.FOLD_BELOW  # this process: 2 MiB entries
    assert sum(mapped_huge(p, hint=False) for p in copies) >= whole * stitched.FOLD_BELOW  # and the page cache's
    again = list(store.sequences(16, **kw))  # the layout kept: its batches are still the same
    same(again, got)


@needs_linux
def test_a_file_system_without_large_folios_is_folded_once(tmp_path: Path) -> None:
    shm = Path("/dev/shm")
    if not shm.is_dir():
        pytest.skip("no /dev/shm")
    with tempfile.TemporaryDirectory(dir=shm) as folder:
        if machine_maps_files_huge(Path(folder)):
            pytest.skip("this machine's tmpfs has large folios")
        store = trajstore.open(Path(folder) / "store", create=True)
        wide(store)
        layout = stitch(copies_of(store),
                        {"obs": (np.dtype(np.float32), (64,))}, None)
        assert layout is not None
        region = layout.regions["obs"]
        try:
            device = os.stat(folder).st_dev
            stitched._unfoldable.discard(device)
            region.populate()
            assert device in stitched._unfoldable  # tried once, found small: never again in this process
            assert region.fold() == []
            path, _ = copies_of(store)[0].file("obs")
            on_disk = np.fromfile(path, np.float32).reshape(-1, 64)
            np.testing.assert_array_equal(region.array[region.first_row[0]:][:len(on_disk)], on_disk)
        finally:
            layout.close()
            stitched._unfoldable.discard(device)


def test_a_closed_region_is_neither_mapped_in_nor_folded(copied: trajstore.Store) -> None:
    layout = stitch(copies_of(copied), {"reward": (np.dtype(np.float32), ())}, None)
    assert layout is not None
    region = layout.regions["reward"]
    layout.close()
    region.populate()  # a thread still running after its loader closed: nothing happens, nothing fails
    assert region.fold() == []
