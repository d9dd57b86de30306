"""The tiers of the suite stay honest: every tier marker is declared (and markers are strict), ``make check``
leaves out exactly the tiers, ``make test`` runs everything, a test that starts what its marker says without the
marker fails naming it (tests/tiers.py), and a test that commits to a store a shared fixture holds fails naming the
fixture (tests/shared_fixtures.py)."""

from __future__ import annotations

import re
import sys
import tomllib
from pathlib import Path

import pytest

from tests.tiers import NEEDS, SLOW_SECONDS, TIERS, needs_of, recorded, tiered

pytest_plugins = ["pytester"]

ROOT = Path(__file__).resolve().parents[1]


def recipe(target: str) -> str:
    """The commands of one Makefile target."""
    text = (ROOT / "Makefile").read_text()
    found = re.search(rf"^{target}:[^\n]*\n((?:\t[^\n]*\n)+)", text, re.M)
    assert found, f"the Makefile has no `{target}` target"
    return found.group(1)


def test_every_tier_is_a_declared_marker_and_markers_are_strict() -> None:
    options = tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["pytest"]["ini_options"]
    declared = {line.split(":")[0] for line in options["markers"]}
    assert set(TIERS) <= declared, set(TIERS) - declared
    assert "--strict-markers" in options["addopts"].split()


def test_make_check_leaves_out_every_tier_and_make_test_runs_everything() -> None:
    check = recipe("check")
    variables = dict(re.findall(r"^(\w+) :?= ([^\n]*)$", (ROOT / "Makefile").read_text(), re.M))
    expression = re.search(r'-m "([^"]+)"', check)
    assert expression, check
    text = re.sub(r"\$\((\w+)\)", lambda m: variables[m.group(1)], expression.group(1))
    assert re.fullmatch(r"not \(([\w ]+)\)", text), text
    assert set(re.findall(r"\w+", text)) - {"not", "or"} == set(TIERS), text
    runs = re.findall(r"-m pytest\b([^\n]*)", recipe("test"))
    assert runs and not any(re.search(r"\s-[mk]\b|--deselect|--ignore", args) for args in runs), runs


@pytest.mark.parametrize(("command", "needs"), [
    (["/venv/bin/weed", "server", "-dir=/tmp/d", "-s3"], {"s3"}),
    (["unshare", "-rm", "sh", "-c", "mount …", "/tmp/d", "/venv/bin/weed", "server", "-s3"], {"s3"}),
    ([sys.executable, "-m", "trajstore.cli", "serve", "--store", "s"], {"server"}),
    (["bash", "-e", "-c", "trajstore serve --store s &\ncurl …"], {"server"}),
    (["make", "-C", "/repo", "demo", "STORE=/tmp/s"], {"server"}),
    (["/venv/lib/python3.11/site-packages/playwright/driver/node", "cli.js", "run-driver"], {"browser"}),
    (["/usr/bin/chromium", "--headless", "--screenshot=/tmp/s.png", "http://127.0.0.1:1/"], {"browser"}),
    (["/venv/lib/python3.11/site-packages/pyspark/bin/spark-submit", "pyspark-shell"], {"spark"}),
    (["/repo/.venv-lerobot/bin/python", "tests/export/lerobot_check.py", "cases.json"], {"lerobot"}),
    (["/venv/lib/python3.11/site-packages/ray/core/src/ray/gcs/gcs_server", "--port=0"], {"ray"}),
    ([sys.executable, "-m", "trajstore.cli", "rollout", "--env", "CartPole-v1"], set()),
    ([sys.executable, "-m", "trajstore.cli", "stats", "--store", "/data/served"], set()),
])
def test_what_a_process_needs_is_read_from_its_command(command: list[str], needs: set[str]) -> None:
    assert needs_of(command) == needs
    assert needs <= set(NEEDS)


SERVES = '''
import threading
import pytest
import uvicorn

async def app(scope, receive, send):
    pass

def serve_once():
    """A real uvicorn server on a free port of 127.0.0.1, started and stopped."""
    server = uvicorn.Server(uvicorn.Config(app, host="127.0.0.1", port=0, lifespan="off", log_level="error"))
    thread = threading.Thread(target=server.run)
    thread.start()
    while not server.started and thread.is_alive():
        pass
    server.should_exit = True
    thread.join()

@pytest.fixture(scope="module")
def served():
    serve_once()

def test_serves_unmarked():
    serve_once()

@pytest.mark.server
def test_serves_marked():
    serve_once()

@pytest.mark.server
def test_a_fixture_serves_marked(served):
    pass

def test_a_fixture_serves_unmarked(served):
    pass

def test_serves_nothing():
    pass
'''

SHARES = '''
import numpy as np
import pytest
import trajstore

def batch():
    ones = np.ones((3, 1), np.float32)
    return {"obs": ones[..., None], "action": np.zeros((3, 1), np.int64), "reward": ones,
            "next_obs": ones[..., None], "terminated": np.array([[False], [False], [True]]),
            "truncated": np.zeros((3, 1), bool)}

@pytest.fixture(scope="module")
def shared(tmp_path_factory):
    store = trajstore.open(tmp_path_factory.mktemp("shared") / "store", create=True)
    with store.writer(run_id="a", env_id="Toy-v0") as w:
        w.add_batch(batch())
    return store

def test_reads(shared):
    assert shared.episodes().num_rows == 1

def test_adds_a_run(shared):
    with shared.writer(run_id="b", env_id="Toy-v0") as w:
        w.add_batch(batch())

def test_writes_its_own(tmp_path):
    store = trajstore.open(tmp_path / "own", create=True)
    with store.writer(run_id="b", env_id="Toy-v0") as w:
        w.add_batch(batch())
'''


def run_plugin(pytester: pytest.Pytester, plugin: str, tests: str, *args: str) -> pytest.RunResult:
    """``tests`` run by a pytest of their own (a subprocess) with ``plugin`` loaded and this checkout first on the
    path; no other plugin (the installed ones, loaded by default, took ~1.6 s of CPU to import and play no part)."""
    pytester.makeconftest(f"pytest_plugins = [{plugin!r}]")
    pytester.makepyfile(test_case=tests)
    pytester.makeini("[pytest]\nmarkers =\n    server: serves\n    slow: slow\n")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(ROOT))
        patch.setenv("PYTEST_DISABLE_PLUGIN_AUTOLOAD", "1")
        return pytester.runpytest_subprocess("-p", "no:cacheprovider", "-rA", *args)


def test_a_test_that_serves_without_its_marker_fails_naming_it(pytester: pytest.Pytester) -> None:
    result = run_plugin(pytester, "tests.tiers", SERVES)
    result.assert_outcomes(passed=3, failed=2)
    failed = {line.split("::")[1].split()[0] for line in result.outlines if line.startswith("FAILED")}
    assert failed == {"test_serves_unmarked", "test_a_fixture_serves_unmarked"}
    said = [line for line in result.outlines  # the failures' own text, not the summary (cut to the terminal's width)
            if "not marked @pytest.mark.server (server: it serves the API on a port" in line
            and not line.startswith("FAILED")]
    assert len(said) == 2


def test_a_test_that_commits_to_a_shared_store_fails_naming_the_fixture(pytester: pytest.Pytester) -> None:
    result = run_plugin(pytester, "tests.shared_fixtures", SHARES)
    result.assert_outcomes(passed=2, failed=1)
    assert [line.split("::")[1].split()[0] for line in result.outlines if line.startswith("FAILED")] == \
        ["test_adds_a_run"]
    assert "the test committed to a store shared with other tests: shared (module)" in result.stdout.str()


TIMED = '''
import time

def test_waits():
    time.sleep(0.2)

def test_instant():
    pass
'''


def test_a_run_records_each_test_s_seconds_and_leaves_out_the_instant_ones(pytester: pytest.Pytester) -> None:
    result = run_plugin(pytester, "tests.tiers", TIMED, "--record-timings", "timings.json")
    result.assert_outcomes(passed=2)
    seconds = recorded(pytester.path / "timings.json")
    assert list(seconds) == ["test_case.py::test_waits"]
    assert 0.2 <= seconds["test_case.py::test_waits"] < 60


def test_a_test_measured_slow_is_marked_slow_and_the_longest_file_goes_first(pytester: pytest.Pytester) -> None:
    pytester.makepyfile(test_a="def test_quick(): pass\ndef test_long(): pass\n",
                        test_b="def test_one(): pass\n", test_c="def test_new(): pass\n")
    items, _ = pytester.inline_genitems()
    tiered(items, {"test_a.py::test_long": SLOW_SECONDS + 0.1, "test_a.py::test_quick": 0.2,
                   "test_b.py::test_one": 3 * SLOW_SECONDS})
    assert [item.nodeid for item in items] == ["test_b.py::test_one", "test_a.py::test_quick",
                                               "test_a.py::test_long", "test_c.py::test_new"]
    assert {item.name for item in items if item.get_closest_marker("slow")} == {"test_long", "test_one"}


def test_the_recorded_timings_name_tests_with_their_seconds() -> None:
    """``make timings`` wrote tests/timings.json: ids of this suite's files, plausible seconds, some of them slow."""
    seconds = recorded()
    assert seconds, "tests/timings.json is missing: run `make timings`"
    assert all((ROOT / nodeid.split("::")[0]).is_file() for nodeid in seconds), \
        [nodeid for nodeid in seconds if not (ROOT / nodeid.split("::")[0]).is_file()][:5]
    assert all(0 < s < 3600 for s in seconds.values())
    assert any(s > SLOW_SECONDS for s in seconds.values())
