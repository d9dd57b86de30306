"""trajstore.torch: an IterableDataset whose DataLoader workers (num_workers=2) and ranks together cover every
window exactly once, with the tensors of Store.sequences; format="torch"; skipped cleanly without PyTorch."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import trajstore  # noqa: E402
import trajstore.torch as ttorch  # noqa: E402
from tests.helpers import make_batch  # noqa: E402


@pytest.fixture
def uri(tmp_path: Path) -> str:
    store = trajstore.open(tmp_path / "store", create=True)
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(3), 60, 4, p_terminated=0.05))
    return str(tmp_path / "store")


def windows(batches: object) -> list[tuple[int, int]]:
    return [(int(e), int(s)) for b in batches for e, s in zip(b["episode_id"], b["start"])]


def test_workers_and_ranks_cover_every_window_once(uri: str) -> None:
    everything = sorted(windows(trajstore.open(uri).sequences(4, pad=True)))
    seen = []
    for rank in range(2):
        data = ttorch.Sequences(uri, 4, pad=True, shuffle=True, seed=1, batch_size=8, rank=rank, world_size=2)
        loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="spawn")
        got = windows(loader)
        assert len(got) > 0
        seen += got
    assert sorted(seen) == everything and len(set(seen)) == len(seen)


def test_batches_are_tensors_of_the_local_batches(uri: str) -> None:
    local = list(trajstore.open(uri).sequences(4, batch_size=16, shuffle=True, epoch=2))
    data = ttorch.Sequences(uri, 4, batch_size=16, shuffle=True)
    data.set_epoch(2)
    got = list(torch.utils.data.DataLoader(data, batch_size=None))
    assert len(got) == len(local)
    for g, l in zip(got, local):
        assert isinstance(g["obs"], torch.Tensor) and g["obs"].dtype == torch.float32
        for k in l:
            np.testing.assert_array_equal(g[k].numpy(), l[k])
    step = next(iter(ttorch.Transitions(uri, 3, gamma=0.9, batch_size=5)))
    assert step["discount"].shape == (5,)
    torch_batch = next(trajstore.open(uri).transitions(3, gamma=0.9, batch_size=5, format="torch"))
    assert torch.equal(torch_batch["reward"], step["reward"])
