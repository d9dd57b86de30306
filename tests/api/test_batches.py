"""Training batches (trajstore.query.batches, here beside the service it is compared with): fixed sizes in stream
order, a bounded seeded shuffle, conversion to numpy/JAX/Arrow, and ``Store.iter_batches`` giving exactly the batches
``Client.iter_batches`` gives from a served store."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pyarrow as pa
import pytest

import trajstore
from tests.api.helpers import Live
from trajstore.errors import InputError
from trajstore.query.batches import rebatch, shuffled


def _batches(sizes: list[int]) -> list[pa.RecordBatch]:
    out, start = [], 0
    for n in sizes:
        out.append(pa.record_batch([pa.array(range(start, start + n), pa.int64())], ["x"]))
        start += n
    return out


@pytest.mark.parametrize("sizes, size", [([5, 4], 4), ([1, 1, 1, 10], 3), ([7], 7), ([], 3), ([3, 0, 2], 2)])
def test_rebatch_keeps_order_and_sizes(sizes: list[int], size: int) -> None:
    out = list(rebatch(_batches(sizes), size))
    values = [v for b in out for v in b.column(0).to_pylist()]
    assert values == list(range(sum(sizes)))
    assert all(b.num_rows == size for b in out[:-1]) and (not out or 0 < out[-1].num_rows <= size)
    dropped = list(rebatch(_batches(sizes), size, drop_last=True))
    assert all(b.num_rows == size for b in dropped) and len(dropped) == sum(sizes) // size


def test_shuffle_is_a_seeded_permutation_within_a_bounded_buffer() -> None:
    def draw(seed: int) -> list[int]:
        batches = shuffled(rebatch(_batches([100] * 10), 32), 32, 64, np.random.default_rng(seed))
        return [v for b in batches for v in b.column(0).to_pylist()]

    first = draw(0)
    assert sorted(first) == list(range(1000)) and first != list(range(1000))
    assert draw(0) == first and draw(1) != first
    # a row can only come out once the stream has reached it, and not later than the buffer allows
    assert all(v <= i + 64 + 32 for i, v in enumerate(first))


@pytest.mark.server
def test_iter_batches_of_a_store_are_the_batches_of_its_service(live: Live, populated: Path) -> None:
    store = trajstore.open(populated)
    for kwargs in ({"batch_size": 1000}, {"batch_size": 777, "shuffle": True, "seed": 3, "shuffle_buffer": 2000},
                   {"batch_size": 500, "run_id": "alpha", "columns": ["obs", "reward"], "drop_last": True}):
        local = list(store.iter_batches(**kwargs))
        with trajstore.Client(live.url) as client:
            remote = list(client.iter_batches(**kwargs))
        assert len(local) == len(remote) > 1
        for a, b in zip(local, remote):
            assert a.keys() == b.keys()
            for name in a:
                assert_same(a[name], b[name])


def assert_same(a: np.ndarray, b: np.ndarray) -> None:
    assert a.dtype == b.dtype and a.shape == b.shape
    if a.dtype == object:  # one array per row
        for x, y in zip(a, b):
            np.testing.assert_array_equal(x, y)
    else:
        np.testing.assert_array_equal(a, b)


def test_rows_of_different_shapes_come_as_one_array_each(populated: Path) -> None:
    store = trajstore.open(populated)  # run alpha: CartPole (4 observations) and Acrobot (6)
    obs = np.concatenate([b["obs"] for b in store.iter_batches(batch_size=5000, columns=["obs"], run_id="alpha")])
    assert obs.dtype == object and {len(o) for o in obs} == {4, 6}


def test_numpy_batches_have_the_observation_shape(populated: Path) -> None:
    store = trajstore.open(populated)
    batch = next(store.iter_batches(batch_size=64, columns=["obs", "action"], env_id="CartPole-v1"))
    assert batch["obs"].shape == (64, 4) and batch["obs"].dtype == np.float32 and batch["action"].shape == (64,)
    arrow = next(store.iter_batches(batch_size=64, columns=["obs"], env_id="CartPole-v1", format="arrow"))
    assert arrow.schema.field("obs").type == pa.list_(pa.float32(), 4)


def test_bad_arguments_name_the_field(populated: Path) -> None:
    store = trajstore.open(populated)
    for kwargs, message in (({"batch_size": 0}, "batch_size"), ({"format": "torchy"}, "format"),
                            ({"shuffle_buffer": -1}, "shuffle_buffer"), ({"columns": ["nope"]}, "columns")):
        with pytest.raises(InputError, match=message):
            next(store.iter_batches(**kwargs))
