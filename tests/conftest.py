"""Fixtures shared by every test: a fresh store per test (helpers are in ``tests/helpers.py``)."""

from __future__ import annotations

from typing import Any

import pytest

import trajstore


@pytest.fixture
def store(tmp_path: Any) -> trajstore.Store:
    return trajstore.open(tmp_path / "store", create=True)
