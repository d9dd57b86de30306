"""The batch kernels against plain numpy: windows (padded or not, any stride, crossing fragments, at episode ends)
and n-step transitions (terminated and truncated ends, every gamma, n past the longest episode, float32 and float64
rewards, the same float64 sums as numpy's) copied out of spans whose fragments lie in any order, with gaps between
them, exactly as the rows they stand for."""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import pytest

from trajstore.loaders import assemble

PATHS = ["compiled", "plain"]  # each kernel's two ways: numba's, and plain numpy (a process's first batch)

SHAPES = {"x": ((3,), np.float32), "flag": ((), np.bool_), "pic": ((2, 5, 5), np.uint8), "none": ((0,), np.float32),
          "big": ((), np.int64)}


def episode_major(rng: np.random.Generator, lengths: list[int], reward: type = np.float32) -> dict[str, np.ndarray]:
    """Random values of every leaf for the steps of episodes of ``lengths``, in position order."""
    steps = sum(lengths)
    out = {k: (rng.random((steps, *shape)) * 200).astype(dtype) for k, (shape, dtype) in SHAPES.items()}
    out["flag"] = rng.random(steps) < 0.5
    out["reward"] = rng.standard_normal(steps).astype(reward)
    out["next_obs"] = rng.standard_normal((steps, 3)).astype(np.float32)
    return out


def scattered(rng: np.random.Generator, lengths: list[int], values: dict[str, np.ndarray],
              cut: int) -> assemble.Spans:
    """The steps ``values`` (position order) held as stitched copies hold them: cut into fragments of at most
    ``cut`` steps (none across an episode's start), laid out in a shuffled order with gaps, each leaf's span with
    its own gaps."""
    offset = np.concatenate([[0], np.cumsum(lengths)[:-1]]).astype(np.int64)
    starts = sorted({int(p) for o, n in zip(offset, lengths) for p in range(o, o + n, cut)} | set(offset.tolist()))
    start = np.array([*starts, sum(lengths)], np.int64)
    sizes = np.diff(start)
    arrays, rows = {}, {}
    for leaf, v in values.items():
        places = rng.permutation(len(sizes))
        gaps = rng.integers(0, 4, len(sizes))
        at = np.zeros(len(sizes), np.int64)
        row = 0
        for f in places:  # fragments in a shuffled order, a few rows of junk between them
            row += int(gaps[f])
            at[f] = row
            row += int(sizes[f])
        span = np.full((row + 3, *v.shape[1:]), 7, v.dtype)
        for f in range(len(sizes)):
            span[at[f]:at[f] + sizes[f]] = v[start[f]:start[f + 1]]
        arrays[leaf], rows[leaf] = span, at
    return assemble.Spans(offset, np.array(lengths, np.int64), start, arrays, rows)


def reference_windows(values: dict[str, np.ndarray], lengths: list[int], names: list[str], items: np.ndarray,
                      length: int, stride: int, pad: bool) -> dict[str, Any]:
    """Windows numbered episode by episode, starts ascending, cut with plain slices and padded with zeros."""
    table = []
    offset = 0
    for e, n in enumerate(lengths):
        s = 0
        while s < n and (pad or s + length <= n):
            table.append((e, s, offset))
            s += stride
        offset += n
    out: dict[str, Any] = {k: [] for k in [*names, "mask", "episode", "start"]}
    for item in items:
        e, s, o = table[item]
        keep = min(lengths[e] - s, length)
        for k in names:
            w = np.zeros((length, *values[k].shape[1:]), values[k].dtype)
            w[:keep] = values[k][o + s:o + s + keep]
            out[k].append(w)
        out["mask"].append(np.arange(length) < keep)
        out["episode"].append(e)
        out["start"].append(s)
    return {k: np.array(v) for k, v in out.items()}


def numbering(lengths: list[int], length: int, stride: int, pad: bool) -> tuple[np.ndarray, np.ndarray]:
    n = np.array(lengths)
    count = np.where(n > 0, (n - 1) // stride + 1, 0) if pad else \
        np.where(n >= length, (n - length) // stride + 1, 0)
    return np.cumsum(count), count


LENGTHS = [1, 5, 12, 40, 3, 64, 17, 9, 33]


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("length,stride,pad,cut", [(4, 4, False, 7), (4, 1, True, 7), (12, 3, True, 5),
                                                   (5, 5, True, 1), (16, 2, False, 100), (40, 40, True, 3)])
def test_windows_are_the_slices_they_stand_for(length: int, stride: int, pad: bool, cut: int, path: str) -> None:
    rng = np.random.default_rng(length * 100 + cut)
    values = episode_major(rng, LENGTHS)
    spans = scattered(rng, LENGTHS, values, cut)
    end, count = numbering(LENGTHS, length, stride, pad)
    names = list(SHAPES)
    items = rng.permutation(int(end[-1]))
    kernel = assemble.WindowKernel(spans, names, end, count, stride, length)
    got = getattr(kernel, path)(items)
    want = reference_windows(values, LENGTHS, names, items, length, stride, pad)
    for k in names:
        assert got.arrays[k].dtype == values[k].dtype and got.arrays[k].shape == want[k].shape
        np.testing.assert_array_equal(got.arrays[k], want[k], err_msg=k)
    for k in ("mask", "episode", "start"):
        assert getattr(got, k).dtype == want[k].dtype, k
        np.testing.assert_array_equal(getattr(got, k), want[k], err_msg=k)
    empty = getattr(kernel, path)(items[:0])
    assert empty.arrays["pic"].shape == (0, length, 2, 5, 5) and empty.mask.shape == (0, length)


@pytest.mark.parametrize("path", PATHS)
def test_windows_from_a_column_file_are_the_slices_they_stand_for(tmp_path: Any, path: str) -> None:
    rng = np.random.default_rng(3)
    values = rng.random((500, 4)).astype(np.float32)
    values.tofile(tmp_path / "c.bin")
    mapped = np.memmap(tmp_path / "c.bin", dtype=np.float32, mode="r", shape=(500, 4))
    spans = assemble.Spans(np.array([0]), np.array([500]), np.array([0, 500]), {"c": mapped}, {"c": np.zeros(1)})
    end, count = numbering([500], 7, 1, True)
    items = np.array([0, 493, 499, 3, 3, 250])
    got = getattr(assemble.WindowKernel(spans, ["c"], end, count, 1, 7), path)(items)
    want = np.stack([np.concatenate([values[i:i + 7], np.zeros((max(i + 7 - 500, 0), 4), np.float32)]) for i in items])
    np.testing.assert_array_equal(got.arrays["c"], want)


def reference_transitions(values: dict[str, np.ndarray], lengths: list[int], terminal: np.ndarray, names: list[str],
                          positions: np.ndarray, n: int, gamma: float) -> dict[str, np.ndarray]:
    """The n-step rule over the steps in position order, as numpy computes it per batch."""
    offset = np.concatenate([[0], np.cumsum(lengths)[:-1]])
    episode = np.searchsorted(offset, positions, side="right") - 1
    t = positions - offset[episode]
    left = np.array(lengths)[episode] - t
    m = np.minimum(n, left)
    k = np.arange(n, dtype=np.int64)
    within = k[None, :] < m[:, None]
    rewards = values["reward"][positions[:, None] + np.minimum(k[None, :], m[:, None] - 1)]
    reward = (rewards.astype(np.float64) * np.where(within, gamma ** k[None, :], 0.0)).sum(axis=1)
    terminated = terminal[episode] & (m == left)
    out = {name: values[name][positions] for name in names}
    out["next_obs"] = values["next_obs"][positions + m - 1]
    out["reward"] = reward.astype(values["reward"].dtype)
    out["terminated"] = terminated
    out["discount"] = np.where(terminated, 0.0, np.power(gamma, m, dtype=np.float64)).astype(values["reward"].dtype)
    out["episode"], out["step"] = episode, t
    return out


@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("n,gamma,cut,reward", [(1, 0.99, 7, np.float32), (3, 0.99, 7, np.float32),
                                                (3, 0.0, 2, np.float64), (5, 1.0, 1, np.float32),
                                                (9, 0.9, 4, np.float64), (64, 0.97, 10, np.float32),
                                                (130, 0.999, 30, np.float64)])
def test_transitions_follow_the_n_step_rule_exactly(n: int, gamma: float, cut: int, reward: type, path: str) -> None:
    rng = np.random.default_rng(n + cut)
    lengths = [*LENGTHS, 200]
    values = episode_major(rng, lengths, reward)
    spans = scattered(rng, lengths, values, cut)
    terminal = np.arange(len(lengths)) % 3 != 1  # terminated episodes, and truncated (or unfinished) ones
    names = ["x", "flag", "pic", "none", "big"]
    n = min(n, max(lengths))
    positions = rng.permutation(sum(lengths))
    got = getattr(assemble.TransitionKernel(spans, names, ["next_obs"], n, gamma, terminal), path)(positions)
    want = reference_transitions(values, lengths, terminal, names, positions, n, gamma)
    for k in [*names, "next_obs"]:
        np.testing.assert_array_equal(got.arrays[k], want[k], err_msg=k)
    for k in ("reward", "terminated", "discount", "episode", "step"):
        assert getattr(got, k).dtype == want[k].dtype, k
        np.testing.assert_array_equal(getattr(got, k), want[k], err_msg=k)
    ends = positions[got.step == np.array(lengths)[got.episode] - 1]
    assert got.terminated[np.isin(positions, ends)].any() and not got.terminated[np.isin(positions, ends)].all()


def test_rewards_are_summed_as_numpy_sums_a_row() -> None:
    rng = np.random.default_rng(0)
    for n in [*range(1, 40), 127, 128, 129, 136, 257, 300, 1000, 1031]:
        rows = rng.standard_normal((20, n)) * rng.choice([1.0, 1e-8, 1e8], (20, n))
        want = rows.sum(axis=1)
        got = np.array([assemble._pairwise(r, np.empty(8)) for r in rows])
        np.testing.assert_array_equal(got, want, err_msg=str(n))


def test_a_process_s_first_batch_is_plain_while_the_kernels_load(monkeypatch: pytest.MonkeyPatch) -> None:
    loaded = threading.Event()
    monkeypatch.setattr(assemble, "_call_kernels", loaded.wait)
    loading = assemble._Loading()
    assert not loading.compiled(0)  # the schema's empty batch: plain, the kernels start loading
    assert not loading.compiled(256)  # the first batch: plain while they load
    loaded.set()
    assert loading.compiled(256) and loading.compiled(0) is False and loading.compiled(3)


def test_without_kernels_every_batch_is_plain(monkeypatch: pytest.MonkeyPatch) -> None:
    def broken() -> None:
        raise RuntimeError("no compiler here")

    monkeypatch.setattr(assemble, "_call_kernels", broken)
    loading = assemble._Loading()
    loading.compiled(0)
    loading.wait()
    assert not loading.compiled(256) and not loading.compiled(256)
    assert isinstance(loading.failed, RuntimeError)


@pytest.mark.parametrize("seed", range(20))
def test_the_bucket_index_finds_what_a_binary_search_finds(seed: int) -> None:
    rng = np.random.default_rng(seed)
    top = int(rng.integers(1, 5000))
    keys = np.sort(rng.integers(0, top, int(rng.integers(0, 300))))  # repeated keys: episodes of no windows
    if seed % 3 == 0 and len(keys):
        keys[0] = 0  # a key at the first value, as every episode offset table starts
    first, shift = assemble.bucketed(keys, top)
    assert len(first) <= 2 * max(len(keys), 1)  # about one bucket per key
    values = np.arange(top, dtype=np.int64)
    want = np.searchsorted(keys, values, side="right") - 1
    got = [assemble._last_at_or_below(keys, first, shift, int(v)) for v in values]
    np.testing.assert_array_equal(got, want)
