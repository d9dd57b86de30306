"""The declared minimum versions work: in the virtualenv `make min-venv` builds (every core dependency and the gym
extra's at the minimum pyproject.toml declares: gymnasium 1.0.0, numpy 2.0, pyarrow 26, …), a gym_rollout, both
recording wrappers and a few reads give what gymnasium reports (tests/integrations/min_versions_check.py). Skipped,
naming the target, where that virtualenv has not been built."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]
MIN_VENV = ROOT / ".cache" / "min-venv"


def declared_minimums() -> dict[str, str]:
    """Each core dependency's declared minimum, and the gym extra's (what the check runs)."""
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    deps = project["dependencies"] + project["optional-dependencies"]["gym"]
    return dict(re.fullmatch(r"([\w-]+)>=([\d.]+)", d).groups() for d in deps)  # type: ignore[union-attr]


def padded(version: str) -> tuple[int, ...]:
    parts = tuple(int(p) for p in version.split("."))
    return parts + (0,) * (3 - len(parts))


def test_rollout_recording_and_reads_at_the_declared_minimum_versions(tmp_path: Path) -> None:
    python = MIN_VENV / "bin" / "python"
    if not (MIN_VENV / ".installed").exists() or sys.platform == "win32":
        pytest.skip("no virtualenv of the declared minimum versions: build it with `make min-venv`")
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    done = subprocess.run([str(python), "-m", "tests.integrations.min_versions_check", str(tmp_path / "store")],
                          cwd=ROOT, env=env, capture_output=True, text=True, timeout=600)
    assert done.returncode == 0, done.stderr[-3000:]
    installed = json.loads(done.stdout.strip().splitlines()[-1])
    stale = {name: (v, installed[name]) for name, v in declared_minimums().items()
             if padded(installed[name]) != padded(v)}
    assert not stale, f"{MIN_VENV} is not at the declared minimums {stale}: rebuild it with `make min-venv`"
    assert installed["gymnasium"] == "1.0.0"
