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

from tests.examples import ROOT, Repl, blocks, examples_lock, run_page

GUIDES = sorted((ROOT / "docs" / "guides").glob("*.md"))
NAV_GUIDES = ["recording", "querying", "training", "service", "many-actors", "multi-agent", "experiments",
              "lifecycle", "open-table"]


def test_a_guide_per_task() -> None:
    assert [p.stem for p in GUIDES] == sorted(NAV_GUIDES)
    nav = (ROOT / "mkdocs.yml").read_text()
    assert all(f"guides/{name}.md" in nav for name in NAV_GUIDES)


@pytest.mark.parametrize("guide", GUIDES, ids=lambda p: p.stem)
def test_the_guides_examples_run_as_printed(guide: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    assert {b.lang for b in blocks(guide)} <= {"python", "sh", "sql"}
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari-datasets"))
    with examples_lock():
        ran = run_page(guide, tmp_path)
    assert ran >= 2, f"{guide.name} has {ran} examples"


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
