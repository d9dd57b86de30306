"""Schemathesis, with its default checks, against the live server's OpenAPI document."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import pytest

from tests.api.helpers import API_KEY, Live, serve, settings_for
from trajstore.api.app import create_app

pytestmark = [pytest.mark.server, pytest.mark.slow]  # the tiers: tests/tiers.py

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def own_live(populated: Path, tmp_path: Path) -> Iterator[Live]:
    """A copy of the populated store behind its own server: schemathesis writes and deletes runs with the key."""
    copy = tmp_path / "store"
    shutil.copytree(populated, copy)
    yield from serve(create_app(settings_for(copy)))


def test_schemathesis_finds_no_failure(own_live: Live) -> None:
    live = own_live
    cli = shutil.which("schemathesis", path=str(Path(sys.executable).parent)) or shutil.which("schemathesis")
    if cli is None:
        pytest.fail("schemathesis is not installed: `pip install -e '.[dev]'` installs it")
    env = {**os.environ, "SCHEMATHESIS_HOOKS": "tests.api.schemathesis_hooks", "PYTHONPATH": str(ROOT)}
    proc = subprocess.run([cli, "run", f"{live.url}/openapi.json", "-H", f"Authorization: Bearer {API_KEY}",
                           "--max-time", os.environ.get("TRAJSTORE_SCHEMATHESIS_SECONDS", "60"), "-w", "1",
                           "--seed", os.environ.get("TRAJSTORE_SCHEMATHESIS_SEED", "1")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert proc.returncode == 0, proc.stdout[-6000:] + proc.stderr[-2000:]
