"""The command's tables over a real store, as a user sees them in a terminal: at most as wide as the terminal
($COLUMNS, else the terminal's own width, else 100), every column asked for still there (wrapped into blocks that
repeat what names a row), episodes shown by the columns that say which one and how it went (--wide: all of them,
--columns: the ones named), numbers to 4 significant digits and times to the second."""

from __future__ import annotations

import fcntl
import json
import os
import pty
import re
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

import trajstore
from trajstore.cli import main

# run names as `make demo` gives them (named by the time)
RUNS = ("demo-gym-20261204-014800", "demo-gym-20261204-015233")
TABLES = [
    ["stats", "--by", "run_id", "--gamma", "0.99"],
    ["stats", "--by", "run_id,env_id", "--include-incomplete", "--metric", "episode_length"],
    ["episodes"],
    ["episodes", "--gamma", "0.9", "--order-by", "-started_at"],
    ["runs"],
    ["history"],
    ["compare", "--by", "run_id", "--reps", "50"],
    ["sql", "SELECT * FROM episodes LIMIT 5"],
]


@pytest.fixture(scope="module")
def store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("tables") / "store"
    for seed, run in enumerate(RUNS):
        assert main(["rollout", "--env", "CartPole-v1", "--num-envs", "4", "--episodes", "30", "--store", str(path),
                     "--run", run, "--seed", str(seed), "--no-progress"]) == 0
    return path


@pytest.fixture
def piped(monkeypatch: pytest.MonkeyPatch) -> None:
    """Standard output not a terminal and no $COLUMNS (bash does not export it): tables are 100 wide."""
    monkeypatch.delenv("COLUMNS", raising=False)


def table_of(capsys: pytest.CaptureFixture[str], store: Path, argv: list[str]) -> list[str]:
    assert main([*argv, "--store", str(store)]) == 0
    return capsys.readouterr().out.splitlines()


def headers(lines: list[str]) -> list[list[str]]:
    """The header of each block of a table (the line above each rule)."""
    return [re.split(r"\s{2,}", lines[i - 1].strip()) for i, line in enumerate(lines)
            if i and line and set(line) <= {"-", " "}]


@pytest.mark.usefixtures("piped")
@pytest.mark.parametrize("argv", TABLES, ids=lambda a: " ".join(a[:2]))
def test_every_table_fits_100_columns_and_keeps_its_columns(store: Path, capsys: pytest.CaptureFixture[str],
                                                            argv: list[str]) -> None:
    lines = table_of(capsys, store, argv)
    assert max(map(len, lines)) <= 100, "\n".join(lines)
    assert main([*argv, "--store", str(store), "--format", "json"]) == 0
    columns = list(json.loads(capsys.readouterr().out.splitlines()[0]))
    shown = [c for block in headers(lines) for c in block]
    if argv[0] != "episodes":  # every column the query returns is in some block
        if argv[0] == "compare":  # a comparison's value and interval, one column for people
            columns = [c for c in columns if c not in ("value", "ci_low", "ci_high")] + ["value [CI]"]
        assert set(shown) == set(columns)


@pytest.mark.usefixtures("piped")
def test_a_wrapped_stats_table_repeats_its_groups_and_shows_every_statistic(store: Path,
                                                                            capsys: pytest.CaptureFixture[str]) -> None:
    lines = table_of(capsys, store, ["stats", "--by", "run_id", "--gamma", "0.99"])
    blocks = headers(lines)
    assert len(blocks) > 1 and all(block[0] == "run_id" for block in blocks)
    want = trajstore.open(store).stats(by="run_id", gamma=0.99).to_pylist()
    rows = [line.split() for line in lines if line.startswith("demo-gym-")]
    assert len(rows) == len(blocks) * len(RUNS)
    by_run = {}
    for row in rows:
        by_run.setdefault(row[0], []).extend(row[1:])
    for expected in want:
        cells = dict(zip([c for block in blocks for c in block[1:]], by_run[expected["run_id"]]))
        assert int(cells["n_traj"]) == expected["n_traj"]
        for name in ("return_mean", "len_std", "discounted_return_max"):
            assert float(cells[name]) == pytest.approx(expected[name], rel=5e-4)  # 4 significant digits
            assert len(cells[name].replace("-", "").replace(".", "")) <= 5


@pytest.mark.usefixtures("piped")
def test_episodes_show_which_and_how_it_went_and_say_how_to_see_more(store: Path,
                                                                     capsys: pytest.CaptureFixture[str]) -> None:
    lines = table_of(capsys, store, ["episodes", "--run", RUNS[1], "--limit", "5"])
    assert lines[0] == f"every row: run_id {RUNS[1]}, env_id CartPole-v1"  # said once, not on every line
    assert lines[1].split() == ["episode_id", "episode_length", "episode_return", "terminated", "truncated"]
    assert lines[-1] == "(5 rows; 12 more columns: --wide, or --columns NAME,...)"
    mixed = table_of(capsys, store, ["episodes", "--order-by", "-episode_return", "--limit", "8", "--gamma", "0.9"])
    assert mixed[0] == "every row: env_id CartPole-v1" and max(map(len, mixed)) <= 100
    blocks = headers(mixed)
    assert all(block[:1] == ["episode_id"] or block[:2] == ["run_id", "episode_id"] for block in blocks)
    assert {c for block in blocks for c in block} == {"run_id", "episode_id", "episode_length", "episode_return",
                                                      "terminated", "truncated", "discounted_return"}
    wide = table_of(capsys, store, ["episodes", "--limit", "3", "--wide"])
    assert len(wide) == 6 and wide[0].split() == trajstore.open(store).episodes(limit=1).column_names
    assert len(wide[2]) > 200  # --wide: every column on one line, as long as it needs
    picked = table_of(capsys, store, ["episodes", "--limit", "2", "--columns", "started_at,episode_id"])
    assert picked[0].split() == ["started_at", "episode_id"] and picked[-1] == "(2 rows)"
    assert picked[2].endswith("Z") is False and picked[2][19] == "Z"  # a time to the second, in UTC


def test_columns_apply_to_every_format_and_name_what_is_missing(store: Path,
                                                                capsys: pytest.CaptureFixture[str]) -> None:
    assert main(["episodes", "--store", str(store), "--limit", "2", "--format", "csv", "--columns",
                 "episode_id", "--columns", "mode"]) == 0
    assert capsys.readouterr().out.splitlines()[0] == "episode_id,mode"
    assert main(["stats", "--store", str(store), "--columns", "n_traj,colour"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("trajstore: error: --columns: no column 'colour' in the result; its columns: n_traj, ")


def test_columns_from_the_environment_set_the_width(store: Path, capsys: pytest.CaptureFixture[str],
                                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("COLUMNS", "60")
    lines = table_of(capsys, store, ["stats", "--by", "run_id"])
    assert max(map(len, lines)) <= 60 and len(headers(lines)) > 1


def test_a_terminal_s_own_width_is_used(store: Path) -> None:
    """In a real (pseudo-)terminal 72 columns wide, without $COLUMNS: the table fits 72."""
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 72, 0, 0))
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    try:
        subprocess.run([sys.executable, "-m", "trajstore.cli", "stats", "--by", "run_id", "--gamma", "0.99",
                        "--store", str(store)], stdout=follower, stderr=subprocess.DEVNULL, env=env, timeout=300,
                       check=True)
        os.close(follower)
        out = b""
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: all read
                break
            if not chunk:
                break
            out += chunk
    finally:
        os.close(leader)
    lines = out.decode().replace("\r\n", "\n").splitlines()
    assert lines and lines[-1] == "(2 rows)" and max(map(len, lines)) <= 72
    assert len(headers(lines)) >= 3
