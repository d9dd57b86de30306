"""A computation's budget (trajstore/query/budget.py): a comparison gives the same answer whatever its memory
bound and wherever it runs (here, or in a worker process as the service runs it), a piece past the bound is refused
before it is allocated, and the time limit stops a bootstrap between blocks and a DuckDB query from a timer."""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pytest

import trajstore
from trajstore.errors import QueryMemoryError, QueryTimeoutError
from trajstore.query import budget
from trajstore.query.budget import Budget, bounded

MiB = 1 << 20


@pytest.fixture(scope="module")
def study(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    """Two algorithms x 6 seeds on two tasks, 4 one-step episodes each run."""
    store = trajstore.open(tmp_path_factory.mktemp("budget") / "store", create=True)
    rng = np.random.default_rng(3)
    for algo, shift in (("a", 0.0), ("b", 0.5)):
        for seed in range(6):
            for task in ("T1", "T2"):
                with store.writer(run_id=f"{algo}{seed}", env_id=task, config={"algo": algo}) as w:
                    w.add_batch({"obs": np.zeros((1, 4, 2), np.float32), "action": np.zeros((1, 4), np.int64),
                                 "reward": (rng.normal(size=(1, 4)) + shift).astype(np.float32),
                                 "next_obs": np.zeros((1, 4, 2), np.float32), "terminated": np.ones((1, 4), bool),
                                 "truncated": np.zeros((1, 4), bool)})
    return store


def test_a_comparison_is_the_same_under_any_memory_bound_and_in_a_worker(study: trajstore.Store) -> None:
    want = study.compare("config.algo", last=4, reps=1000, seed=7)
    profile = study.performance_profile("config.algo", thresholds=[-1, 0, 0.5, 1], last=4, reps=600, seed=2)
    improvement = study.probability_of_improvement("b", "a", by="config.algo", last=4, reps=700, seed=1)
    curves = study.curves(by="config.algo", bins=3, reps=300, seed=5)
    with bounded(Budget(memory_bytes=1 * MiB)):  # many blocks of 256 replications, one at a time
        assert study.compare("config.algo", last=4, reps=1000, seed=7).equals(want)
    with bounded(Budget(timeout_s=60, memory_bytes=64 * MiB, worker_bytes=512 * MiB)):  # as the service runs them
        assert study.compare("config.algo", last=4, reps=1000, seed=7).equals(want)
        assert study.performance_profile("config.algo", thresholds=[-1, 0, 0.5, 1], last=4, reps=600,
                                         seed=2).equals(profile)
        assert study.probability_of_improvement("b", "a", by="config.algo", last=4, reps=700, seed=1) == improvement
        assert study.curves(by="config.algo", bins=3, reps=300, seed=5).equals(curves)


def test_errors_found_in_a_worker_are_the_callers_own(study: trajstore.Store) -> None:
    with bounded(Budget(timeout_s=60, worker_bytes=512 * MiB)):
        with pytest.raises(trajstore.errors.InputError, match="x: no group 'c' of config.algo"):
            study.probability_of_improvement("c", "a", by="config.algo", last=4)


def test_a_block_past_the_memory_bound_is_refused_naming_the_setting(study: trajstore.Store) -> None:
    for where in (None, 512 * MiB):
        with bounded(Budget(memory_bytes=100_000, worker_bytes=where, what="/compare/profile")):
            with pytest.raises(QueryMemoryError, match=r"^/compare/profile: needs about .* over the limit of 97.66 "
                                                       r"KiB \(compute_memory_bytes\); .*fewer thresholds"):
                study.performance_profile("config.algo", thresholds=np.linspace(0, 1, 1000), last=4)


def test_the_time_limit_stops_a_bootstrap_between_blocks(study: trajstore.Store) -> None:
    for where in (None, 512 * MiB):
        started = time.monotonic()
        with bounded(Budget(timeout_s=0.5, worker_bytes=where, what="/compare")):
            with pytest.raises(QueryTimeoutError, match=r"^/compare: stopped at the time limit of 0.5 s "
                                                        r"\(compute_timeout_s\)"):
                study.performance_profile("config.algo", thresholds=np.linspace(-3, 3, 1000), last=4,
                                          reps=1_000_000)
        assert time.monotonic() - started < 30  # stopped, not run to its end (minutes)


def test_the_time_limit_interrupts_a_query_of_the_process_database(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "s", create=True)
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch({"obs": np.zeros((2, 1, 1), np.float32), "action": np.zeros((2, 1), np.int64),
                     "reward": np.ones((2, 1), np.float32), "next_obs": np.zeros((2, 1, 1), np.float32),
                     "terminated": np.array([[False], [True]]), "truncated": np.zeros((2, 1), bool)})
    with store.snapshot() as snap, bounded(Budget(timeout_s=0.3, what="/stats", settings=("request_timeout_s", ""))):
        with pytest.raises(QueryTimeoutError, match=r"^/stats: stopped at the time limit of 0.3 s "
                                                    r"\(request_timeout_s\)"):
            snap.arrow("SELECT count(*) FROM range(10000000000) a, range(10) b WHERE a.range % 7 = b.range")


def test_pieces_fit_the_bound_and_check_the_time() -> None:
    limits = Budget(memory_bytes=1000, timeout_s=60)
    assert list(limits.pieces(10, 300, hint="h")) == [(0, 3), (3, 6), (6, 9), (9, 10)]
    assert list(Budget().pieces(5, 300, hint="h")) == [(0, 5)]
    with pytest.raises(QueryMemoryError, match="needs about 1.465 KiB at once, over the limit of 1000 bytes"):
        list(limits.pieces(10, 1500, hint="h"))
    assert budget.current() is budget.UNBOUNDED and not budget.current().passed()
