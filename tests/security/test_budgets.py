"""Every request bounded (issue 47, item 2): the comparisons, profiles and learning curves across seeds that the
probe ran unbounded — 6 GB for one ``/compare/improvement?reps=100000`` on 80 runs, 3.8 GB for 400 thresholds, 60
curves at once holding every thread while ``/stats`` waited a minute — each take a place (429 with Retry-After
beyond ``compute_max_concurrent``), a time limit (408) and a memory bound (413), and a cheap request is answered
while they run. Against a real ``trajstore serve`` over a store of 80 runs (40 per algorithm) on two tasks."""

from __future__ import annotations

import threading
from pathlib import Path
from typing import Iterator

import httpx
import numpy as np
import pytest

import trajstore
from tests.security.conftest import BUDGETS
from tests.served import MiB, Server

pytestmark = [pytest.mark.server, pytest.mark.security]

RUNS = 40  # per algorithm, as the probe's 80
COMPUTE = {"compute_max_concurrent": 2, "compute_timeout_s": 3, "compute_memory_bytes": 64 * MiB}


@pytest.fixture(scope="module")
def wide(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """80 runs (ppo and dqn, 40 seeds each) of 12 five-step episodes on two tasks, each run described by its
    config."""
    path = tmp_path_factory.mktemp("wide") / "store"
    store = trajstore.open(path, create=True)
    rng = np.random.default_rng(0)
    T, B = 5, 12
    for algo in ("ppo", "dqn"):
        for seed in range(RUNS):
            for task in ("Easy-v0", "Hard-v0"):
                with store.writer(run_id=f"{algo}-{seed}", env_id=task, config={"algo": algo, "seed": seed}) as w:
                    w.add_batch({"obs": rng.normal(size=(T, B, 2)).astype(np.float32),
                                 "action": rng.integers(0, 2, (T, B)),
                                 "reward": rng.normal(size=(T, B)).astype(np.float32),
                                 "next_obs": rng.normal(size=(T, B, 2)).astype(np.float32),
                                 "terminated": np.arange(T)[:, None].repeat(B, 1) == T - 1,
                                 "truncated": np.zeros((T, B), bool)})
    return path


@pytest.fixture(scope="module")
def bounded(wide: Path) -> Iterator[Server]:
    with Server(wide, **BUDGETS, **COMPUTE) as live:
        yield live


def get(server: Server, path: str, **params: object) -> httpx.Response:
    return httpx.get(server.url + path, params=params, timeout=120)


def test_a_comparison_past_its_time_limit_is_408_naming_the_setting(bounded: Server) -> None:
    # 1,000 thresholds x 80 runs x 2 tasks x 100,000 replications: minutes of work unbounded
    answer = get(bounded, "/compare/profile", by="config.algo", threshold=list(np.linspace(-3, 3, 1000)),
                 reps=100_000, last=12)
    assert answer.status_code == 408, answer.text[:300]
    assert "time limit of 3 s (compute_timeout_s)" in answer.json()["detail"]
    assert get(bounded, "/stats").status_code == 200


def test_more_thresholds_than_allowed_are_refused(bounded: Server) -> None:
    answer = get(bounded, "/compare/profile", by="config.algo", threshold=[0.5] * 1001)
    assert answer.status_code == 422 and "threshold" in answer.text


def test_the_probes_improvement_stays_within_its_memory(bounded: Server) -> None:
    """``reps=100000`` on 80 runs held 6.06 GB, and two at once OOM-killed the server: now each holds one block of
    replications at a time (the memory bound) and stops at the time limit, two at once."""
    budget = bounded.idle() + 2 * COMPUTE["compute_memory_bytes"] + 256 * MiB
    bounded.watch(budget)
    answers = []

    def ask() -> None:
        answers.append(get(bounded, "/compare/improvement", by="config.algo", x="ppo", y="dqn", reps=100_000,
                           last=12))

    threads = [threading.Thread(target=ask) for _ in range(2)]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join()
    finally:
        bounded.unwatch()  # the next tests' work is not held to this one's budget
    assert bounded.proc.poll() is None, f"killed at {bounded.peak / MiB:.0f} MiB, over {budget / MiB:.0f} MiB"
    assert sorted(a.status_code for a in answers) in ([200, 200], [200, 408], [408, 408]), \
        [a.text[:200] for a in answers]
    assert bounded.peak <= budget


def test_a_block_past_the_memory_bound_is_413_before_it_is_drawn(wide: Path) -> None:
    with Server(wide, **BUDGETS, **{**COMPUTE, "compute_memory_bytes": 64 * 1024}) as small:
        answer = get(small, "/compare/profile", by="config.algo", threshold=list(np.linspace(-3, 3, 1000)),
                     reps=1000, last=12)
        assert answer.status_code == 413, answer.text[:300]
        assert "over the limit of 64 KiB (compute_memory_bytes)" in answer.json()["detail"]
        assert get(small, "/compare", by="config.algo", reps=10, last=12).status_code == 200


def test_a_burst_takes_two_places_and_stats_is_answered_while_they_run(bounded: Server) -> None:
    """The probe's 60 concurrent ``/curves/groups?bins=10000&reps=40000`` (here half of them profiles that run to
    their time limit): two run at a time, the others are 429 at once with Retry-After, and ``/stats`` answers while
    the two still run."""
    heavy = [("/compare/profile", {"by": "config.algo", "threshold": list(np.linspace(-3, 3, 1000)),
                                   "reps": 100_000, "last": 12}),
             ("/curves/groups", {"by": "config.algo", "bins": 10_000, "reps": 40_000})] * 30
    answers: dict[int, httpx.Response] = {}
    refused = threading.Event()
    urls = [str(httpx.URL(bounded.url + path, params=params)) for path, params in heavy]  # built before the burst
    limits = httpx.Limits(max_connections=len(heavy) + 1, max_keepalive_connections=len(heavy) + 1)
    with httpx.Client(timeout=120, limits=limits) as http:

        def ask(i: int) -> None:
            answers[i] = http.get(urls[i])
            if answers[i].status_code == 429:
                refused.set()

        threads = [threading.Thread(target=ask, args=(i,)) for i in range(len(heavy))]
        for t in threads:
            t.start()
        assert refused.wait(60)
        stats = http.get(bounded.url + "/stats")
        ran_when_stats_answered = sum(a.status_code != 429 for a in list(answers.values()))
        for t in threads:
            t.join()
    assert stats.status_code == 200
    ran = sum(a.status_code != 429 for a in answers.values())
    assert ran_when_stats_answered < ran, "/stats waited until every request that had a place was answered"
    busy = [a for i, a in answers.items() if a.status_code == 429]
    assert len(busy) >= 50 and {heavy[i][0] for i, a in answers.items() if a.status_code == 429} == \
        {"/compare/profile", "/curves/groups"}
    assert all(a.headers["retry-after"] == "1" for a in busy)
    assert "2 comparisons or learning curves across seeds are running" in busy[0].json()["detail"]
    assert "(compute_max_concurrent)" in busy[0].json()["detail"]
    assert {a.status_code for a in answers.values() if a.status_code != 429} <= {200, 408}
