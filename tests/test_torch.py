"""trajstore.torch: IterableDatasets whose DataLoader workers and ranks together cover every window exactly once,
with the tensors of Store.sequences; set_epoch reaching persistent workers; DataLoader's default start method
(fork on Linux) after the parent opened and read the store; workers sharing the one layout kept in the store; a
Store (local or s3://) or a path; resume after n batches. Skipped cleanly without PyTorch."""

from __future__ import annotations

import gc
import logging
import multiprocessing
import pickle
import sys
from pathlib import Path
from typing import Any

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import trajstore  # noqa: E402
import trajstore.torch as ttorch  # noqa: E402
from tests import seaweed  # noqa: E402
from tests.helpers import layouts_built, make_batch  # noqa: E402
from trajstore.errors import InputError  # noqa: E402

WINDOWS = {"length": 4, "pad": True, "shuffle": True, "seed": 1, "batch_size": 8}


def fill(store: trajstore.Store, seed: int = 3) -> None:
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(seed), 60, 4, p_terminated=0.05))


@pytest.fixture
def uri(tmp_path: Path) -> str:
    fill(trajstore.open(tmp_path / "store", create=True))
    return str(tmp_path / "store")


def windows(batches: Any) -> list[tuple[int, int]]:
    return [(int(e), int(s)) for b in batches for e, s in zip(b["episode_id"], b["start"])]


def delivered(store: trajstore.Store, epoch: int, workers: int, **kwargs: Any) -> list[tuple[int, int]]:
    """The windows a DataLoader with ``workers`` workers gives in one epoch, from the store's own shards: each
    worker's batches, taken round robin (the DataLoader's in-order delivery)."""
    shards = [list(store.sequences(**{**WINDOWS, **kwargs}, epoch=epoch, rank=w, world_size=workers))
              for w in range(workers)]
    out = []
    for i in range(max(map(len, shards))):
        out += [windows([s[i]]) for s in shards if i < len(s)]
    return [w for batch in out for w in batch]


@pytest.mark.slow
def test_workers_and_ranks_cover_every_window_once(uri: str) -> None:
    everything = sorted(windows(trajstore.open(uri).sequences(4, pad=True)))
    seen = []
    for rank, context in enumerate(["spawn", None]):  # None: DataLoader's default (fork on Linux)
        data = ttorch.Sequences(uri, **WINDOWS, rank=rank, world_size=2)
        loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context=context)
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
    for g, want in zip(got, local):
        assert isinstance(g["obs"], torch.Tensor) and g["obs"].dtype == torch.float32
        for k in want:
            np.testing.assert_array_equal(g[k].numpy(), want[k])
    step = next(iter(ttorch.Transitions(uri, 3, gamma=0.9, batch_size=5)))
    assert step["discount"].shape == (5,)
    torch_batch = next(trajstore.open(uri).transitions(3, gamma=0.9, batch_size=5, format="torch"))
    assert torch.equal(torch_batch["reward"], step["reward"])


@pytest.mark.slow
@pytest.mark.parametrize("context", [None, "spawn"])
def test_set_epoch_reaches_persistent_workers(uri: str, context: str | None) -> None:
    store = trajstore.open(uri)
    data = ttorch.Sequences(store, **WINDOWS)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True,
                                         multiprocessing_context=context)
    orders = []
    for epoch in range(3):
        data.set_epoch(epoch)
        orders.append(windows(loader))
        assert orders[-1] == delivered(store, epoch, 2)  # this epoch's order, not the first one's again
    assert orders[0] != orders[1] != orders[2]


@pytest.mark.slow
@pytest.mark.parametrize("context", [None, "spawn"])
def test_workers_share_one_layout_kept_in_the_store(uri: str, context: str | None, monkeypatch: pytest.MonkeyPatch,
                                                    caplog: pytest.LogCaptureFixture) -> None:
    monkeypatch.setenv("TRAJSTORE_LOADER_ARRAYS", "0")  # the store read without its array copies: layouts are built
    data = ttorch.Sequences(uri, **WINDOWS)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, persistent_workers=True,
                                         multiprocessing_context=context)
    for epoch in range(2):
        data.set_epoch(epoch)
        assert windows(loader) == delivered(trajstore.open(uri), epoch, 2)
    layouts = Path(uri) / "layouts"
    assert len(list(layouts.glob("*.json"))) == 1 and len(list((layouts / "data").iterdir())) == 1  # built once
    fresh = trajstore.open(uri)
    caplog.set_level(logging.INFO, logger="trajstore.loaders.layout_store")
    assert sorted(windows(fresh.sequences(**WINDOWS))) == sorted(windows(loader))
    assert layouts_built(caplog.records) == 0  # a later process finds what the workers built


@pytest.mark.slow
def test_workers_gather_from_the_array_copies_and_build_nothing(uri: str) -> None:
    data = ttorch.Sequences(uri, **WINDOWS)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=2, multiprocessing_context="spawn")
    assert windows(loader) == delivered(trajstore.open(uri), 0, 2)
    assert not list((Path(uri) / "layouts").glob("*.json"))  # nothing built: every worker mapped the copies


@pytest.mark.slow
@pytest.mark.skipif(sys.platform != "linux", reason="fork is DataLoader's default start method on Linux only")
def test_the_default_start_method_after_the_parent_opened_and_read_the_store(uri: str) -> None:
    assert multiprocessing.get_start_method() == "fork"  # what DataLoader uses when given no context
    store = trajstore.open(uri)
    assert store.stats()["n_traj"][0].as_py() > 0  # deltalake's runtime now exists in this process
    data = ttorch.Sequences(store, **WINDOWS)
    got = windows(torch.utils.data.DataLoader(data, batch_size=None, num_workers=2))
    assert got == delivered(store, 0, 2)
    steps = ttorch.Transitions(uri, 3, gamma=0.9, batch_size=64)
    rewards = [b["reward"] for b in torch.utils.data.DataLoader(steps, batch_size=None, num_workers=2)]
    assert sum(len(r) for r in rewards) == store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()


@pytest.mark.slow
def test_a_store_or_a_path(uri: str, tmp_path: Path) -> None:
    pinned = trajstore.open(uri, version=trajstore.open(uri).version)
    everything = sorted(windows(pinned.sequences(4, pad=True)))
    fill(trajstore.open(uri), seed=4)  # more data after the version the pinned store reads
    data = ttorch.Sequences(pinned, 4, pad=True)
    assert sorted(windows(torch.utils.data.DataLoader(data, batch_size=None, num_workers=2))) == everything
    data.set_epoch(1)  # a store opened at a version stays there
    assert data.version == pinned.version
    by_path = ttorch.Sequences(Path(uri), 4, pad=True)
    assert len(windows(by_path)) > len(everything)  # the latest version
    assert windows(pickle.loads(pickle.dumps(by_path))) == windows(by_path)
    with pytest.raises(InputError, match="store: expected a trajstore.Store or its URI"):
        ttorch.Sequences(42, 4)  # type: ignore[arg-type]
    with pytest.raises(trajstore.errors.StoreNotFoundError):
        ttorch.Sequences(tmp_path / "nothing", 4)


@pytest.mark.s3
def test_a_store_on_s3_reaches_the_workers_with_its_options(s3: seaweed.SeaweedFS) -> None:
    store = trajstore.open(f"s3://{s3.bucket()}/torch", create=True, storage_options=s3.storage_options)
    fill(store)
    data = ttorch.Sequences(store, **WINDOWS)
    got = windows(torch.utils.data.DataLoader(data, batch_size=None, num_workers=2))
    assert got == delivered(store, 0, 2)


@pytest.mark.slow
@pytest.mark.filterwarnings("ignore:This DataLoader will create 3 worker processes")  # more than this machine's cores
@pytest.mark.parametrize(("workers", "stop"), [(0, 5), (2, 5), (3, -2)])
def test_resume_after_n_batches_gives_the_rest_of_the_epoch(uri: str, workers: int, stop: int) -> None:
    data = ttorch.Sequences(uri, **WINDOWS)
    data.set_epoch(1)
    loader = torch.utils.data.DataLoader(data, batch_size=None, num_workers=workers,
                                         persistent_workers=workers > 0)
    whole = [windows([b]) for b in loader]
    stop = stop % len(whole)  # 5 batches in, or in the last round, where shards run out one after another
    taken = 0
    for _ in loader:  # a preempted run
        taken += 1
        if taken == stop:
            break
    state = data.state_dict(batches=taken)
    fill(trajstore.open(uri), seed=5)  # written meanwhile: the resumed run still reads the version it had read

    again = ttorch.Sequences(uri, **WINDOWS, resume=state)
    rest = [windows([b]) for b in torch.utils.data.DataLoader(again, batch_size=None, num_workers=workers)]
    assert whole[:stop] + rest == whole and len(rest) > 0
    again.set_epoch(2)  # the next epoch from its beginning, over the latest version
    latest = windows(trajstore.open(uri).sequences(**WINDOWS, epoch=2))
    assert windows(again) == latest and len(latest) > sum(map(len, whole))


@pytest.mark.slow
def test_resume_mistakes_are_named(uri: str) -> None:
    data = ttorch.Sequences(uri, **WINDOWS)
    state = data.state_dict(batches=3)
    with pytest.raises(InputError, match="resume: the state was made by a dataset with other arguments"):
        ttorch.Sequences(uri, **{**WINDOWS, "seed": 2}, resume=state)
    with pytest.raises(InputError, match="resume: a state of rank 0 of 1"):
        ttorch.Sequences(uri, **WINDOWS, rank=1, world_size=2, resume=state)
    with pytest.raises(InputError, match="resume: a state of epoch 0, but epoch=1"):
        ttorch.Sequences(uri, **WINDOWS, epoch=1, resume=state)
    with pytest.raises(InputError, match="resume: expected the dict"):
        ttorch.Sequences(uri, **WINDOWS, resume={"position": 3})
    two = ttorch.Sequences(uri, **WINDOWS, resume=state)  # made without workers, used with two
    with pytest.raises(Exception, match="resume: a state made with 1 DataLoader worker"):
        list(torch.utils.data.DataLoader(two, batch_size=None, num_workers=2))
    # the error's traceback holds the DataLoader's forked workers, and with them every pipe this process had open
    # when they forked (pytest's browser driver's too: its end would wait on them), until collected
    gc.collect()
    too_far = ttorch.Sequences(uri, **WINDOWS, resume={**state, "batches": 10_000})
    with pytest.raises(InputError, match="resume: 10000 batches taken, but epoch 0 of rank 0 has only"):
        list(too_far)


@pytest.mark.server
def test_iter_batches_gives_tensors_like_sequences_and_transitions(tmp_path: Path) -> None:
    """``iter_batches(format="torch")``, from the store and over REST, holds the numpy batches' values as CPU tensors
    (text columns stay numpy), as ``sequences`` and ``transitions`` do."""
    from tests.api.helpers import API_KEY, serve, settings_for
    from trajstore.api.app import create_app

    store = trajstore.open(tmp_path / "s", create=True)
    fill(store)
    columns = ["run_id", "episode_id", "step", "obs", "reward", "terminated"]
    plain = list(store.iter_batches(batch_size=64, columns=columns))
    for live in serve(create_app(settings_for(tmp_path / "s"))):
        with trajstore.Client(live.url, api_key=API_KEY) as client:
            sources = [store.iter_batches(batch_size=64, columns=columns, format="torch"),
                       client.iter_batches(batch_size=64, columns=columns, format="torch")]
            for tensors in sources:
                got = list(tensors)
                assert len(got) == len(plain)
                for a, b in zip(got, plain):
                    assert isinstance(a["obs"], torch.Tensor) and a["obs"].dtype == torch.float32
                    assert isinstance(a["terminated"], torch.Tensor) and a["terminated"].dtype == torch.bool
                    assert list(a["run_id"]) == list(b["run_id"])
                    for name in ("episode_id", "step", "obs", "reward", "terminated"):
                        np.testing.assert_array_equal(a[name].numpy(), b[name])


def test_a_replay_dataset_gives_the_replays_batches_as_tensors_drawn_from_its_updates(uri: str) -> None:
    store = trajstore.open(uri)
    with store.replay(n=2, gamma=0.9, priorities=None, seed=4) as replay, \
            store.replay(n=2, gamma=0.9, priorities=None, seed=4) as twin:
        data = ttorch.ReplayDataset(replay, 32, batches=5)
        got = list(torch.utils.data.DataLoader(data, batch_size=None))
        assert len(got) == 5
        for batch in got:
            want = twin.sample(32)
            assert list(batch) == list(want)
            for name, value in want.items():
                assert isinstance(batch[name], torch.Tensor) and batch[name].dtype == torch.from_numpy(value).dtype
                np.testing.assert_array_equal(batch[name].numpy(), value, err_msg=name)
        # an update given as tensors between batches: the next batch is drawn by it (one item holds all the mass)
        favourite = int(got[-1]["index"][0])
        replay.update(torch.arange(len(replay)), torch.zeros(len(replay)))
        replay.update(torch.tensor([favourite]), torch.tensor([1e9]))
        batch = next(iter(ttorch.ReplayDataset(replay, 64)))
        assert (batch["index"] == favourite).float().mean() > 0.99


def test_a_replay_dataset_refuses_workers_and_what_is_no_replay(uri: str) -> None:
    with trajstore.open(uri).replay(priorities=None) as replay:
        data = ttorch.ReplayDataset(replay, 8)
        with pytest.raises(InputError, match="num_workers: a ReplayDataset draws in the learner.s process"):
            next(iter(torch.utils.data.DataLoader(data, batch_size=None, num_workers=1)))
    with pytest.raises(InputError, match="^replay: expected a replay"):
        ttorch.ReplayDataset(trajstore.open(uri), 8)
    with pytest.raises(InputError, match="^batch_size"):
        ttorch.ReplayDataset(replay, 0)
