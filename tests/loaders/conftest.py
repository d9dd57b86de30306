"""Where loaders gather from: the data files' array copies (made by the first loader) or layouts built from Parquet."""

from __future__ import annotations

import logging
from typing import Callable

import pytest

from tests.helpers import layouts_built


@pytest.fixture(params=["copies", "built"])
def both_layouts(request: pytest.FixtureRequest, monkeypatch: pytest.MonkeyPatch) -> str:
    """The test twice: stores with array copies (made by the first loader, then stitched), and stores without (loaders
    build their layouts from Parquet). Use before the store fixture (``pytest.mark.usefixtures``)."""
    monkeypatch.setenv("TRAJSTORE_LOADER_ARRAYS", "1" if request.param == "copies" else "0")
    return str(request.param)


@pytest.fixture
def built_layouts(monkeypatch: pytest.MonkeyPatch) -> None:
    """Stores without array copies: every loader builds its layout from Parquet (what these tests are about)."""
    monkeypatch.setenv("TRAJSTORE_LOADER_ARRAYS", "0")


@pytest.fixture
def built(caplog: pytest.LogCaptureFixture) -> Callable[[], int]:
    """How many loader layouts this test has built so far, in this process: each build says so in the log (INFO,
    ``trajstore.loaders.layout_store``), a layout found kept in the store or in memory says nothing."""
    caplog.set_level(logging.INFO, logger="trajstore.loaders.layout_store")
    return lambda: layouts_built(caplog.records)
