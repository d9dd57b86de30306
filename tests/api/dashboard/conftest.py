"""Fixtures for the dashboard: a store with learning runs, the app behind uvicorn, and headless Chromium.

The browser tests drive Debian's ``chromium`` (``apt-get install -y chromium``; ``make test`` does it) through
Playwright; they are skipped, with the reason, when either is missing. Screenshots go to ``test-artifacts/``.
"""

from __future__ import annotations

from typing import Any, Iterator

import pytest

import trajstore
from tests.api.dashboard.helpers import CHROMIUM, CHROMIUM_ARGS, Dashboard, write_demo_store
from tests.api.helpers import Live, serve
from trajstore.api.app import create_app
from trajstore.api.settings import ServiceSettings


@pytest.fixture(scope="package")
def demo_store(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    return write_demo_store(tmp_path_factory.mktemp("dashboard") / "store")


@pytest.fixture(scope="package")
def demo_live(demo_store: trajstore.Store) -> Iterator[Live]:
    yield from serve(create_app(ServiceSettings(store=str(demo_store.root))))


@pytest.fixture(scope="session")
def browser() -> Iterator[Any]:
    """Headless Chromium, or a skip saying what is missing."""
    try:
        from playwright.sync_api import sync_playwright
    except ImportError:
        pytest.skip("playwright is not installed: `pip install -e '.[dev]'` installs it")
    if not CHROMIUM.is_file():
        pytest.skip(f"no Chromium at {CHROMIUM}: `apt-get install -y chromium` (or `make system-tools`) installs it")
    with sync_playwright() as p:
        browser = p.chromium.launch(executable_path=str(CHROMIUM), args=CHROMIUM_ARGS)
        try:
            yield browser
        finally:
            browser.close()


@pytest.fixture(scope="session")
def context(browser: Any) -> Iterator[Any]:
    """One browser context for the session, so Plotly.js is compiled once and then comes from the cache."""
    ctx = browser.new_context(viewport={"width": 1400, "height": 1000}, locale="en-GB", timezone_id="UTC")
    ctx.set_default_timeout(60_000)
    yield ctx
    ctx.close()


@pytest.fixture
def dashboard(context: Any, demo_live: Live) -> Iterator[Dashboard]:
    page = context.new_page()
    yield Dashboard(page, demo_live.url)
    page.close()
