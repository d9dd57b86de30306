"""The lifecycle commands: delete (prints, refuses off a terminal without --yes), history, vacuum, --version."""

from __future__ import annotations

import io
from pathlib import Path

import numpy as np
import pytest

import trajstore
from tests.helpers import make_batch
from trajstore import cli
from trajstore.store import plumbing


def fill(path: Path) -> trajstore.Store:
    store = trajstore.open(path, create=True)
    rng = np.random.default_rng(0)
    for run in ("a", "b"):
        with store.writer(run_id=run, env_id="E") as w:
            w.add_batch(make_batch(rng, 10, 2, p_terminated=0.5))
    return store


def test_delete_history_vacuum_and_version(tmp_path: Path, capsys: pytest.CaptureFixture[str],
                                           monkeypatch: pytest.MonkeyPatch) -> None:
    store = fill(tmp_path / "s")
    s = str(store.root)
    monkeypatch.setattr("sys.stdin", io.StringIO(""))  # not a terminal
    assert cli.main(["delete", "--store", s, "--run", "a"]) == 2
    out, err = capsys.readouterr()
    assert "would delete" in out and "not on a terminal and no --yes given; nothing was deleted" in err
    assert plumbing(store).run_ids() == ["a", "b"]
    assert cli.main(["delete", "--store", s, "--run", "nope", "--yes"]) == 2
    assert f"--run: no run 'nope' in {store.uri}; its runs: a, b" in capsys.readouterr().err
    assert cli.main(["delete", "--store", s, "--run", "a", "--yes"]) == 0
    out = capsys.readouterr().out  # said once, as done: no "would delete" first
    assert out.startswith("deleted ") and out.count("\n") == 1 and plumbing(store).run_ids() == ["b"]
    assert cli.main(["history", "--store", s, "--format", "csv"]) == 0
    lines = capsys.readouterr().out.strip().splitlines()
    assert len(lines) == 1 + store.version + 1 and "delete" in lines[-1]
    assert cli.main(["sql", "--store", s, "--version", "3", "--format", "csv",
                     "SELECT DISTINCT run_id FROM steps ORDER BY run_id"]) == 0
    assert capsys.readouterr().out.split() == ["run_id", "a", "b"]
    assert cli.main(["stats", "--store", s, "--version", "3", "--run", "a", "--format", "csv"]) == 0
    capsys.readouterr()
    assert cli.main(["vacuum", "--store", s, "--older-than", "7d", "--dry-run"]) == 0
    assert capsys.readouterr().out.startswith("would delete 0 file(s), 0 bytes, not needed by any version of the "
                                              "last 7d")
    assert cli.main(["vacuum", "--store", s, "--older-than", "0s", "--dry-run"]) == 0
    assert "would delete 1 file(s)" in capsys.readouterr().out
    assert cli.main(["vacuum", "--store", s, "--older-than", "0s"]) == 0
    assert "deleted 1 file(s)" in capsys.readouterr().out


def test_delete_takes_a_condition_over_episodes_or_over_steps(tmp_path: Path,
                                                              capsys: pytest.CaptureFixture[str]) -> None:
    """``--where`` is a condition over the episodes view, as for every other command; ``--steps-where`` over steps."""
    store = fill(tmp_path / "s")
    s = str(store.root)
    longest = store.episodes(order_by="-episode_length", limit=1).to_pylist()[0]
    condition = f"episode_length = {longest['episode_length']} AND run_id = '{longest['run_id']}'"
    chosen = store.episodes(where=condition)["episode_id"].to_pylist()
    assert cli.main(["delete", "--store", s, "--where", condition, "--yes"]) == 0
    assert f"deleted {len(chosen)} episode(s)" in capsys.readouterr().out
    assert not set(chosen) & set(store.episodes()["episode_id"].to_pylist())
    assert cli.main(["delete", "--store", s, "--steps-where", "run_id = 'b' AND step >= 0", "--yes"]) == 0
    assert "deleted" in capsys.readouterr().out and plumbing(store).run_ids() == ["a"]
