"""The docs site: every guide's examples run exactly as printed (each page in a fresh folder, its blocks pasted into
Python's REPL in order), the site builds with warnings as errors and without the network, and the examples of the
API reference's docstrings run."""

from __future__ import annotations

import doctest
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.examples import ROOT, Repl, blocks, examples_lock, run_page, stop_group

GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
PAGES = [ROOT / "docs" / "index.md", *GUIDES]  # the site's pages with examples (the reference's are docstrings)
NAV_GUIDES = ["recording", "querying", "training", "service", "many-actors", "multi-agent", "experiments",
              "lifecycle", "open-table", "replay"]


def test_a_guide_per_task() -> None:
    assert [p.stem for p in GUIDES] == sorted(NAV_GUIDES)
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(f"guides/{name}.md" in nav for name in NAV_GUIDES)


def needs(page: Path) -> list[pytest.MarkDecorator]:
    """The tiers a page's examples need (tests/tiers.py): what its blocks start, and ``slow`` for every page."""
    text = page.read_text()
    marks = [pytest.mark.slow]
    marks += [pytest.mark.server] if "trajstore serve" in text else []
    marks += [pytest.mark.s3] if "s3://" in text or "weed " in text else []
    marks += [pytest.mark.ray] if "trajstore.ray" in text or "import ray" in text else []
    return marks


@pytest.mark.parametrize("page", [pytest.param(p, marks=needs(p)) for p in PAGES], ids=lambda p: p.stem)
def test_the_pages_examples_run_as_printed(page: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert {b.lang for b in blocks(page)} <= {"python", "sh", "sql"}
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari-datasets"))
    with examples_lock():
        ran = run_page(page, tmp_path)
    assert ran >= (1 if page.stem == "index" else 2), f"{page.name} has {ran} examples"


def test_only_the_pages_run_here_have_examples() -> None:
    """A page of the site with a Python, shell or SQL block is one the test above runs."""
    with_examples = {p for p in (ROOT / "docs").rglob("*.md") if any(b.lang in ("python", "sh", "sql")
                                                                      for b in blocks(p))}
    assert with_examples <= set(PAGES), sorted(map(str, with_examples - set(PAGES)))


def test_the_minari_example_runs_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run again, the recording guide's Minari example keeps the dataset it made instead of failing on its id."""
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari-datasets"))
    recording = ROOT / "docs" / "guides" / "recording.md"
    code = next(b.code for b in blocks(recording) if b.lang == "python" and "minari.DataCollector" in b.code)
    namespace: dict[str, Any] = {}
    Repl(namespace).paste("import gymnasium as gym")
    for _ in range(2):
        Repl(namespace).paste(code)
    assert [p.name for p in (tmp_path / "minari-datasets" / "cartpole").iterdir() if p.is_dir()] == ["random-v0"]


# --- the API reference's examples ----------------------------------------------------------------------------------

def documented() -> list[Any]:
    """The objects whose docstrings carry examples that run on their own (each in an empty folder)."""
    import trajstore.errors
    from trajstore.rollout.gym_loop import gym_rollout

    store = [getattr(trajstore.Store, name) for name in ("writer", "sql", "episodes", "stats", "scan", "iter_batches",
                                                        "returns", "sequences", "transitions")]
    errors = [getattr(trajstore.errors, name) for name in trajstore.errors.__all__]
    return [trajstore.open, *store, trajstore.Writer.add_batch, trajstore.Writer.add_step, gym_rollout, *errors]


def run_examples(obj: Any, folder: Path, monkeypatch: pytest.MonkeyPatch) -> int:
    """Run the doctest examples of ``obj``'s own docstring in ``folder``; returns how many ran."""
    import trajstore

    monkeypatch.chdir(folder)
    finder = doctest.DocTestFinder(recurse=False)
    runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
    tests = [t for t in finder.find(obj, getattr(obj, "__qualname__", str(obj)), globs={"trajstore": trajstore})
             if t.examples]
    for test in tests:
        runner.run(test)
    result = runner.summarize(verbose=False)
    assert result.failed == 0, f"{obj.__qualname__}: {result.failed} of {result.attempted} examples failed"
    return result.attempted


@pytest.mark.parametrize("obj", documented(), ids=lambda o: o.__qualname__)
def test_the_api_reference_examples_run(obj: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    if obj.__name__ in ("ConflictError", "VersionNotFoundError", "ResultTooLargeError", "QueryTimeoutError",
                        "QueryMemoryError", "QueryWorkerDiedError", "QueryBusyError", "CommitError",
                        "CommitUnknownError", "StoreDamagedError", "UnsupportedTableError", "StoreAccessError",
                        "AuthenticationError", "BodyTooLargeError", "ReplayNotFoundError", "IngestBusyError"):
        pytest.skip("no example: raised by a store or a service in trouble, which a docstring cannot make")
    if obj.__name__ == "MissingExtraError":
        pytest.skip("no example: the docs are built with every extra installed (tests/test_core_install.py raises it)")
    assert run_examples(obj, tmp_path, monkeypatch) >= 1


@pytest.fixture
def served_demo(tmp_path_factory: pytest.TempPathFactory) -> Any:
    """``trajstore serve`` on the default port over a store with the run ``demo`` (10 CartPole episodes), as the
    Client's examples expect."""
    import trajstore
    from trajstore.rollout.gym_loop import gym_rollout

    folder = tmp_path_factory.mktemp("served-demo")
    store = trajstore.open(folder / "trajdata", create=True)
    gym_rollout(store, "CartPole-v1", run_id="demo", num_envs=2, episodes=10, seed=0, progress=False)
    with examples_lock():
        proc = subprocess.Popen([sys.executable, "-m", "trajstore.cli", "serve", "--store", str(folder / "trajdata")],
                                start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        try:
            client = trajstore.Client("http://127.0.0.1:8321", retries=30, backoff=0.5)
            client.health()
            yield client
        finally:
            stop_group(proc.pid)


@pytest.mark.server
def test_the_client_examples_run(served_demo: Any, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    import trajstore

    methods = [trajstore.Client, trajstore.Client.stats, trajstore.Client.episodes, trajstore.Client.sql,
               trajstore.Client.iter_batches]
    assert sum(run_examples(m, tmp_path, monkeypatch) for m in methods) >= len(methods)


# --- the site --------------------------------------------------------------------------------------------------------

@pytest.fixture(scope="module")
def site(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """The site as ``make docs`` builds it (``mkdocs build --strict``: a warning fails it), with every proxy pointed
    at a closed port, so that anything fetched from the network fails the build."""
    out = tmp_path_factory.mktemp("site")
    dead = "http://127.0.0.1:9"
    env = {**os.environ, "HTTP_PROXY": dead, "HTTPS_PROXY": dead, "http_proxy": dead, "https_proxy": dead,
           "NO_PROXY": "", "no_proxy": "", "NO_MKDOCS_2_WARNING": "1"}
    done = subprocess.run([sys.executable, "-m", "mkdocs", "build", "--strict", "--site-dir", str(out)], cwd=ROOT,
                          env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-4000:]
    return out


@pytest.mark.slow
def test_the_site_builds_strict_and_offline(site: Path) -> None:
    pages = {p.relative_to(site).as_posix() for p in site.rglob("index.html")}
    assert {"index.html", "guides/recording/index.html", "reference/store/index.html", "changelog/index.html",
            "architecture/index.html"} <= pages
    text = "\n".join(p.read_text() for p in site.rglob("*.html"))
    assert "fonts.googleapis.com" not in text and "fonts.gstatic.com" not in text  # no web fonts asked for
    assert "Unreleased" in (site / "changelog" / "index.html").read_text()


def test_the_api_reference_names_every_public_function(site: Path) -> None:
    """Every name of ``trajstore.__all__`` and every public method of Store, Client and Writer has its entry."""
    import trajstore

    reference = "\n".join(p.read_text() for p in (site / "reference").rglob("index.html"))
    missing = [f"trajstore.{name}" for name in trajstore.__all__ if name != "__version__"
               and f'id="trajstore.{name}"' not in reference and f'id="trajstore.errors.{name}"' not in reference]
    errors = [f"trajstore.errors.{name}" for name in trajstore.errors.__all__
              if f'id="trajstore.errors.{name}"' not in reference]
    for cls in (trajstore.Store, trajstore.Client, trajstore.Writer):
        missing += [f"{cls.__name__}.{name}" for name in vars(cls) if not name.startswith("_")
                    and f'id="trajstore.{cls.__name__}.{name}"' not in reference]
    assert not missing and not errors, (missing, errors)
