"""What the read engine keeps: a memo is computed once for concurrent requests, an error is not kept."""

from __future__ import annotations

import threading
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import numpy as np
import pytest

import trajstore
from tests.helpers import engine_of, make_batch
from trajstore.query.engine import Engine


@pytest.fixture
def store(tmp_path: Path) -> trajstore.Store:
    store = trajstore.open(tmp_path / "store", create=True)
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(0), 20, 2))
    return store


@pytest.fixture
def engine(store: trajstore.Store) -> Engine:
    """A read engine over the store's table, as a Store builds one (the layer under test)."""
    return engine_of(store)


def test_a_memo_asked_for_while_it_is_computed_is_computed_once(engine: Engine) -> None:
    calls, lock = [], threading.Lock()

    def compute() -> int:
        with lock:
            calls.append(1)
        time.sleep(0.2)
        return 42

    with ThreadPoolExecutor(6) as pool:
        values = list(pool.map(lambda _: engine.memo("slow", compute), range(6)))
    assert values == [42] * 6 and len(calls) == 1
    assert engine.memo("slow", compute) == 42 and len(calls) == 1


def test_an_error_reaches_every_waiter_and_is_not_kept(engine: Engine) -> None:
    def fail() -> int:
        time.sleep(0.1)
        raise ValueError("no")

    with ThreadPoolExecutor(3) as pool:
        futures = [pool.submit(engine.memo, "failing", fail) for _ in range(3)]
        for future in futures:
            with pytest.raises(ValueError, match="no"):
                future.result()
    assert engine.memo("failing", lambda: 7) == 7


def test_a_commit_starts_the_memo_again(store: trajstore.Store, engine: Engine) -> None:
    assert engine.memo("k", lambda: 1) == 1
    with store.writer(run_id="r", env_id="E") as w:
        w.add_batch(make_batch(np.random.default_rng(1), 5, 2))
    assert engine.memo("k", lambda: 2) == 2
