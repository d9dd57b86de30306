"""The writer's arrays in Arrow's memory pool (trajstore.write.memory): the same values numpy gives, in the pool
when they are large."""

from __future__ import annotations

import numpy as np
import pyarrow as pa
import pytest

from trajstore.write import memory


@pytest.mark.parametrize("shape, dtype", [((50,), "int64"), ((50, 4), "float32"), ((50, 2, 3), "uint8"),
                                          ((50,), "bool"), ((50,), "object"), ((0, 4), "float64")])
def test_take_gives_what_numpy_take_gives(shape: tuple[int, ...], dtype: str) -> None:
    rng = np.random.default_rng(0)
    values = rng.integers(0, 100, shape).astype(dtype)
    for indices in (rng.integers(0, max(shape[0], 1), 80) if shape[0] else np.zeros(0, np.int64),
                    np.zeros(0, np.int64), np.arange(shape[0])[::-1]):
        got = memory.take(values, indices)
        want = np.take(values, indices, axis=0)
        assert got.dtype == want.dtype and got.shape == want.shape
        np.testing.assert_array_equal(got, want)


def test_large_arrays_are_writable_and_in_arrows_pool_small_ones_numpys() -> None:
    before = pa.total_allocated_bytes()
    out = memory.empty((memory.POOLED_FROM // 16, 4), np.float32)
    assert pa.total_allocated_bytes() - before >= out.nbytes
    out[:] = 1.5
    assert out.flags.writeable and out.flags.c_contiguous
    assert pa.array(out.reshape(-1)).to_numpy().sum() == 1.5 * out.size
    before = pa.total_allocated_bytes()
    small = memory.empty((128, 4), np.float32)  # a RemoteWriter's flush of 128 steps: no call into Arrow
    assert pa.total_allocated_bytes() == before and small.flags.writeable and small.shape == (128, 4)
    taken = memory.take(np.arange(10), np.array([9, 0, 3]))
    taken[0] = -1
    assert taken.tolist() == [-1, 0, 3]
