"""The tiers of the test suite, and a pytest plugin (loaded by ``tests/conftest.py``) that keeps every test marked
with what it needs.

``make check`` runs the tests marked with none of ``TIERS`` (the fast tier, for the edit-test loop); ``make test``
runs every test. A test is marked with what it starts (``NEEDS``), seen as it runs: a process or a server thread it
or one of its fixtures starts is matched against ``STARTS``, and a test that started one without the marker fails,
saying which marker to add. ``security`` (the hostile probe) is marked by hand; ``slow`` by hand (a long run) or by
measure: a test that took more than ``SLOW_SECONDS`` in the last ``make timings`` (``tests/timings.json``, each test's
set-up, call and tear-down as ``make test`` runs them). The same timings hand the test files to the
workers the longest first, so that no long file is left for the end. Every worker computes on one thread
(``ONE_THREAD``).
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import threading
from collections import Counter
from pathlib import Path
from typing import Any, Iterator

import pytest

NEEDS = {
    "server": "serves the API on a port: uvicorn in a thread, `trajstore serve` or `make demo` in a process",
    "browser": "drives headless Chromium through Playwright",
    "s3": "talks to a real S3-compatible server (SeaweedFS: the `s3` fixture or one of its own)",
    "spark": "runs a local Spark (pyspark and a Java runtime)",
    "lerobot": "opens exports with the real LeRobot in .venv-lerobot",
    "ray": "starts a local Ray",
}
TIERS = {**NEEDS,
         "slow": "a long run (a wait for a timeout, many processes), or over SLOW_SECONDS in tests/timings.json",
         "security": "the hostile probe replayed against a real `trajstore serve` (tests/security/)"}

TIMINGS = Path(__file__).with_name("timings.json")  # test id -> seconds, written by `make timings`
# Every worker, and every process a test starts, computes on one thread: three workers share two cores, and the
# libraries that start a thread per core (OpenBLAS under numpy, XLA, polars, deltalake's runtime) would otherwise
# fight over them (over the heaviest files: 11% less CPU and wall time). A variable already set is kept.
ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "POLARS_MAX_THREADS": "1",
              "RAYON_NUM_THREADS": "1", "TOKIO_WORKER_THREADS": "1",
              "XLA_FLAGS": "--xla_cpu_multi_thread_eigen=false intra_op_parallelism_threads=1"}
SLOW_SECONDS = 0.5  # above this a test leaves the fast tier
KEPT_SECONDS = 0.05  # shorter times are not written: they neither make a test slow nor weigh on a file's order

# What each kind of process started looks like on its command line (the arguments joined by spaces).
STARTS = {
    "s3": re.compile(r"(^|/)weed server\b"),
    "server": re.compile(r"\btrajstore(\.cli)? serve\b|\bmake\b.* demo\b"),
    "browser": re.compile(r"/playwright/driver/|(^|/)chromium(-browser)? "),
    "spark": re.compile(r"/pyspark/|\bspark-submit\b"),
    "lerobot": re.compile(r"\.venv-lerobot/|lerobot_check\.py"),
    "ray": re.compile(r"/site-packages/ray/|\bray start\b"),
}


def needs_of(command: Any) -> set[str]:
    """What a process started with ``command`` (a list of arguments or a shell string) needs."""
    line = command if isinstance(command, (str, bytes)) else " ".join(str(a) for a in command)
    line = line.decode(errors="replace") if isinstance(line, bytes) else line
    return {need for need, pattern in STARTS.items() if pattern.search(line)}


class Started:
    """What was started since the session began, in order (processes and server threads alike)."""

    def __init__(self) -> None:
        self.needs: list[set[str]] = []
        self._lock = threading.Lock()

    def add(self, needs: set[str]) -> None:
        if needs:
            with self._lock:
                self.needs.append(needs)

    def since(self, mark: int) -> set[str]:
        with self._lock:
            return set().union(*self.needs[mark:])


STARTED = Started()
_FIXTURES: dict[int, set[str]] = {}  # what each fixture's set-up started, by id of its FixtureDef
_ITEMS: dict[str, set[str]] = {}  # what each test's set-up and call started, by node id


def _watch_processes() -> None:
    """Note every process started through ``subprocess.Popen`` (asyncio's and Ray's included)."""
    original = subprocess.Popen.__init__

    def init(self: subprocess.Popen[Any], args: Any, *rest: Any, **kwargs: Any) -> None:
        STARTED.add(needs_of(args))
        original(self, args, *rest, **kwargs)

    subprocess.Popen.__init__ = init  # type: ignore[method-assign]


def _watch_uvicorn() -> None:
    """Note every uvicorn server run in this process (a test's live server in a thread)."""
    try:
        import uvicorn
    except ImportError:
        return
    original = uvicorn.Server.run

    def run(self: Any, *args: Any, **kwargs: Any) -> None:
        STARTED.add({"server"})
        original(self, *args, **kwargs)

    uvicorn.Server.run = run  # type: ignore[method-assign]


def pytest_addoption(parser: pytest.Parser) -> None:
    parser.addoption("--record-timings", metavar="PATH", default=None,
                     help="write each test's seconds (set-up, call and tear-down) to PATH as JSON (`make timings`)")


def pytest_configure(config: pytest.Config) -> None:
    for name, value in ONE_THREAD.items():  # before xdist starts its workers, which inherit them
        os.environ.setdefault(name, value)
    _watch_processes()
    _watch_uvicorn()
    path = config.getoption("--record-timings")
    if path and not hasattr(config, "workerinput"):  # the xdist controller (or a run without workers) writes it
        config.pluginmanager.register(Timings(Path(path)), "trajstore-timings")


def recorded(path: Path = TIMINGS) -> dict[str, float]:
    """Each test's seconds as the last ``make timings`` measured them (none when there is no file)."""
    try:
        return {str(k): float(v) for k, v in json.loads(path.read_text()).items()}
    except FileNotFoundError:
        return {}


def file_of(nodeid: str) -> str:
    return nodeid.split("::", 1)[0]


def tiered(items: list[pytest.Item], seconds: dict[str, float]) -> None:
    """Mark each test slower than ``SLOW_SECONDS`` as ``slow`` and order the files the longest first (each file's
    tests kept together, in their order), unknown tests and files counted as instant."""
    for item in items:
        if seconds.get(item.nodeid, 0.0) > SLOW_SECONDS and item.get_closest_marker("slow") is None:
            item.add_marker(pytest.mark.slow)
    per_file: Counter[str] = Counter()
    for item in items:
        per_file[file_of(item.nodeid)] += seconds.get(item.nodeid, 0.0)
    items.sort(key=lambda item: -per_file[file_of(item.nodeid)])


@pytest.hookimpl(tryfirst=True)  # before `-m` deselects by marker
def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    tiered(items, recorded())


class Timings:
    """Each test's seconds of a run, written as JSON when the run ends (longer ones than ``KEPT_SECONDS``)."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.seconds: Counter[str] = Counter()

    def pytest_runtest_logreport(self, report: pytest.TestReport) -> None:
        self.seconds[report.nodeid] += report.duration

    def pytest_sessionfinish(self) -> None:
        kept = {nodeid: round(s, 2) for nodeid, s in sorted(self.seconds.items()) if s >= KEPT_SECONDS}
        self.path.write_text(json.dumps(kept, indent=0) + "\n")


@pytest.hookimpl(wrapper=True)
def pytest_fixture_setup(fixturedef: pytest.FixtureDef[Any], request: pytest.FixtureRequest) -> Iterator[Any]:
    mark = len(STARTED.needs)
    try:
        return (yield)
    finally:
        _FIXTURES.setdefault(id(fixturedef), set()).update(STARTED.since(mark))


@pytest.hookimpl(wrapper=True)
def pytest_runtest_setup(item: pytest.Item) -> Iterator[None]:
    mark = len(STARTED.needs)
    try:
        return (yield)
    finally:
        _ITEMS[item.nodeid] = STARTED.since(mark)


def missing(item: pytest.Item, started: set[str]) -> set[str]:
    """The markers ``item`` lacks for what it started (``started``) and what its fixtures started when set up."""
    infos = getattr(item, "_fixtureinfo", None)
    for defs in (infos.name2fixturedefs.values() if infos else ()):
        for fixturedef in defs:
            started |= _FIXTURES.get(id(fixturedef), set())
    return started - {mark.name for mark in item.iter_markers()}


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    mark = len(STARTED.needs)
    result = yield
    lacking = missing(item, _ITEMS.pop(item.nodeid, set()) | STARTED.since(mark))
    if lacking:
        marks = ", ".join(f"@pytest.mark.{need}" for need in sorted(lacking))
        said = "; ".join(f"{need}: it {NEEDS[need]}" for need in sorted(lacking))
        pytest.fail(f"not marked {marks} ({said}): mark it (or its module, with pytestmark) so that `make check` "
                    "leaves it out (tests/tiers.py)", pytrace=False)
    return result
