"""Opening and creating a store: refusals, and several processes creating one store at the same moment."""

from __future__ import annotations

import multiprocessing as mp
from pathlib import Path

import pytest

import trajstore


def _open_new(path: str) -> str:
    trajstore.open(path, create=True)
    return "ok"


@pytest.mark.slow
def test_several_processes_create_one_store_at_once(tmp_path: Path) -> None:
    ctx = mp.get_context("spawn")
    with ctx.Pool(4) as pool:
        for i in range(3):
            path = str(tmp_path / f"s{i}")
            assert pool.map(_open_new, [path] * 8) == ["ok"] * 8
            assert (Path(path) / "trajstore.json").is_file()
            assert [p.name for p in Path(path).iterdir()] == ["trajstore.json"]


def test_a_creator_killed_before_the_marker_does_not_block_the_next(tmp_path: Path) -> None:
    root = tmp_path / "s"
    root.mkdir()
    (root / ".trajstore.json.123.abc.tmp").write_text("{")  # what a killed creator leaves
    assert trajstore.open(root, create=True).stats().column("n_traj")[0].as_py() == 0


def test_refusals(tmp_path: Path) -> None:
    with pytest.raises(trajstore.StoreNotFoundError, match="no trajstore store at"):
        trajstore.open(tmp_path / "missing")
    (tmp_path / "other").mkdir()
    (tmp_path / "other" / "notes.txt").write_text("mine")
    with pytest.raises(trajstore.StoreExistsError, match="is not a trajstore store"):
        trajstore.open(tmp_path / "other", create=True)
    assert (tmp_path / "other" / "notes.txt").read_text() == "mine"
    with pytest.raises(trajstore.InputError, match="scheme 'gs' is not supported"):
        trajstore.open("gs://bucket/store")
    with pytest.raises(trajstore.InputError, match="storage_options: only for s3:// stores"):
        trajstore.open(tmp_path / "x", create=True, storage_options={"AWS_REGION": "eu-west-1"})
