"""What the loaders' array copies cost on disk, measured on a store like the one `make demo` writes (CartPole rolled
out by gymnasium and by JAX), and the README's figure checked against it: none before a loader reads the store, then
about 3.5 times the bytes of its Parquet files."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

import trajstore
from tests.helpers import steps_table
from trajstore.storage.arrays import FOLDER

ROOT = Path(__file__).resolve().parents[2]
# the README's figure of the copies' size: "about N times the bytes of the Parquet files" ("~Nx the Parquet")
STATED = re.compile(r"(?:about\s+|~)([\d.]+)\s*(?:x|×|\s+times)\s+the\s+(?:bytes\s+of\s+the\s+)?Parquet")


def bytes_under(folder: Path) -> int:
    return sum(p.stat().st_size for p in folder.rglob("*") if p.is_file())


@pytest.fixture(scope="module")
def demo_like(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    """`make demo`'s two rollouts (its JAX one a fifth as long), through the library."""
    pytest.importorskip("jax")
    pytest.importorskip("gymnasium")
    from trajstore.rollout import gym_rollout, jax_rollout

    store = trajstore.open(tmp_path_factory.mktemp("arrays") / "store", create=True)
    gym_rollout(store, "CartPole-v1", run_id="demo-gym", num_envs=8, episodes=500, seed=0, progress=False)
    jax_rollout(store, "cartpole", run_id="demo-jax", num_envs=1024, steps=100_000, seed=0, progress=False)
    return store


def test_the_copies_cost_what_the_readme_says_and_only_once_a_loader_reads(demo_like: trajstore.Store) -> None:
    assert not (demo_like.root / FOLDER).exists()  # rolled out, not trained from: no copies
    parquet = sum(f.size for f in steps_table(demo_like).files())
    next(iter(demo_like.sequences(16, batch_size=256, shuffle=True)))
    copies = bytes_under(demo_like.root / FOLDER)
    ratio = copies / parquet
    stated = [float(m.group(1)) for m in STATED.finditer(" ".join((ROOT / "README.md").read_text().split()))]
    assert stated, "README.md no longer says how many times the Parquet's bytes the array copies take"
    for figure in stated:
        assert figure == pytest.approx(ratio, rel=0.15), f"README: about {figure}x; measured {ratio:.2f}x " \
                                                         f"({copies:,} bytes of copies, {parquet:,} of Parquet)"
