"""Fixtures of the storage tests."""

from __future__ import annotations

import shutil
from typing import Any, Iterator

import pytest


@pytest.fixture(scope="session")
def spark() -> Iterator[Any]:
    """A local Spark (one core, no UI), started once per test process for the tests that read a store with it."""
    pytest.importorskip("pyspark", reason="the [spark] extra is not installed")
    if shutil.which("java") is None:
        pytest.skip("no Java runtime (make test installs Debian's default-jre-headless)")
    from pyspark.sql import SparkSession

    session = (SparkSession.builder.master("local[1]").appName("trajstore-tests")
               .config("spark.ui.enabled", "false").config("spark.sql.session.timeZone", "UTC")
               .config("spark.sql.sources.partitionColumnTypeInference.enabled", "false").getOrCreate())
    session.sparkContext.setLogLevel("ERROR")
    yield session
    session.stop()
