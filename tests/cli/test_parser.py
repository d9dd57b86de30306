"""The command line's shape: every command described, every option with help, one duration format, progress bars
only on a terminal, and errors as one line naming flags (never the library's argument names, never colour codes)."""

from __future__ import annotations

import argparse
import fcntl
import os
import pty
import struct
import subprocess
import sys
import termios
from pathlib import Path

import pytest

from trajstore.cli import main
from trajstore.cli.main import _message
from trajstore.cli.parser import build_parser
from trajstore.errors import InputError, RunNotFoundError

PROGRESS_COMMANDS = {"rollout", "import", "compact", "export"}


def commands() -> dict[str, argparse.ArgumentParser]:
    sub = next(a for a in build_parser()._actions if isinstance(a, argparse._SubParsersAction))
    return dict(sub.choices)


def test_every_command_has_a_description_and_every_option_help() -> None:
    top = build_parser()
    assert top.description and all(a.help for a in top._actions)
    found = commands()
    assert set(found) == {"rollout", "import", "stats", "episodes", "sql", "serve", "compact", "check", "delete",
                          "history", "vacuum", "export", "schema", "runs", "describe", "compare", "retention"}
    for name, p in found.items():
        assert p.description and len(p.description) > 20, name
        for action in p._actions:
            if isinstance(action, argparse._HelpAction):
                continue
            assert action.help and action.help.strip(), (name, action.dest)


def test_the_store_option_says_what_a_store_may_be() -> None:
    for name, p in commands().items():
        store = next((a for a in p._actions if a.dest == "store"), None)
        if store is not None:
            assert "directory or s3://bucket/prefix" in store.help, name


def test_no_progress_wherever_a_bar_may_show() -> None:
    for name, p in commands().items():
        has = any(a.dest == "no_progress" for a in p._actions)
        assert has == (name in PROGRESS_COMMANDS), name


def test_durations_are_one_format(capsys: pytest.CaptureFixture[str]) -> None:
    parser = build_parser()
    for command in ("check", "vacuum"):
        assert parser.parse_args([command, "--older-than", "12h"]).older_than == 12 * 3600
        assert parser.parse_args([command, "--older-than", "30m"]).older_than == 1800
        assert parser.parse_args([command, "--older-than", "7d"]).older_than == 7 * 86400
        with pytest.raises(SystemExit) as done:
            parser.parse_args([command, "--older-than", "60"])  # minutes, as check took them once: refused
        assert done.value.code == 2
        assert capsys.readouterr().err == ("trajstore: error: --older-than: expected a duration such as 7d, 12h, "
                                           "30m, 90s or 500ms, got '60'\n")
    assert parser.parse_args(["check"]).older_than == 3600
    assert parser.parse_args(["vacuum"]).older_than == 7 * 86400


def test_messages_name_flags_and_are_one_line() -> None:
    flags = commands()["stats"].get_default("flags")
    assert flags["run_id"] == "--run" and flags["env_id"] == "--env" and flags["version"] == "--version"
    err = RunNotFoundError("run_id: no run 'x' in /s; its runs: a")
    assert _message(err, flags) == "--run: no run 'x' in /s; its runs: a"
    assert _message(InputError("gamma must be in [0, 1], got 2"), flags) == "--gamma must be in [0, 1], got 2"
    assert _message(InputError("give run_id= and/or where=; pad=True"), flags) == \
        "give --run and/or --where; pad=True"
    coloured = OSError("Kernel error -> \x1b[1;31mGeneric S3 error\x1b[0m:\n  \u21b3 connection refused\n")
    assert _message(coloured, flags) == "Kernel error -> Generic S3 error: connection refused"


def _stderr(argv: list[str], *, terminal: bool) -> str:
    """stderr of ``trajstore argv``, given a 100-column pseudo-terminal or a pipe as its standard error."""
    argv = [sys.executable, "-m", "trajstore.cli", *argv]
    env = {**os.environ, "TRAJSTORE_DEBUG": ""}
    if not terminal:
        return subprocess.run(argv, capture_output=True, text=True, env=env, timeout=300, check=True).stderr
    leader, follower = pty.openpty()
    fcntl.ioctl(follower, termios.TIOCSWINSZ, struct.pack("HHHH", 24, 100, 0, 0))
    try:
        subprocess.run(argv, stdout=subprocess.DEVNULL, stderr=follower, env=env, timeout=300, check=True)
        os.close(follower)
        chunks = []
        while True:
            try:
                chunk = os.read(leader, 65536)
            except OSError:  # the terminal closed: all read
                break
            if not chunk:
                break
            chunks.append(chunk)
        return b"".join(chunks).decode(errors="replace")
    finally:
        os.close(leader)


@pytest.mark.slow
def test_progress_bars_only_on_a_terminal(tmp_path: Path) -> None:
    def rollout(name: str, *extra: str) -> list[str]:
        return ["rollout", "--env", "CartPole-v1", "--episodes", "30", "--num-envs", "2", "--store",
                str(tmp_path / name), "--run", "r", *extra]

    assert _stderr(rollout("a"), terminal=False) == ""  # a log file or a pipe gets no bar redrawn into it
    shown = _stderr(rollout("b"), terminal=True)
    assert "rollout" in shown and "steps/s" in shown
    assert _stderr(rollout("c", "--no-progress"), terminal=True).strip() == ""
    export = ["export", "lerobot", "--store", str(tmp_path / "a"), "--run", "r"]
    assert _stderr([*export, str(tmp_path / "out1")], terminal=False) == ""
    assert "export" in _stderr([*export, str(tmp_path / "out2")], terminal=True)
    assert _stderr([*export, str(tmp_path / "out3"), "--no-progress"], terminal=True).strip() == ""


def test_the_help_of_each_command_prints(capsys: pytest.CaptureFixture[str]) -> None:
    for name in commands():
        with pytest.raises(SystemExit) as done:
            main([name, "--help"])
        assert done.value.code == 0
        assert capsys.readouterr().out.startswith(f"usage: trajstore {name}")


@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_root_help_prints(flag: str, capsys: pytest.CaptureFixture[str]) -> None:
    with pytest.raises(SystemExit) as done:
        main([flag])
    assert done.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("usage: trajstore [-h]")
    assert all(f"    {name} " in out for name in commands())  # every command listed with its summary
    assert "95% intervals" in " ".join(out.split())  # a literal % in a summary is text, not a format


@pytest.mark.slow
@pytest.mark.parametrize("flag", ["--help", "-h"])
def test_the_root_help_prints_from_a_shell(flag: str) -> None:
    done = subprocess.run([sys.executable, "-m", "trajstore.cli", flag], capture_output=True, text=True,
                          env={**os.environ, "TRAJSTORE_DEBUG": ""}, timeout=300)
    assert (done.returncode, done.stderr) == (0, "")
    assert done.stdout.startswith("usage: trajstore") and "Traceback" not in done.stdout


def test_every_help_text_formats() -> None:
    """argparse %-formats every help string when it prints one: each parser's whole help (its options, and the
    root's list of commands) formats, so no help text anywhere can turn ``--help`` into a traceback."""
    for name, p in {"": build_parser(), **commands()}.items():
        assert p.format_help().startswith(f"usage: trajstore {name}".rstrip()), name
        assert p.format_usage().startswith(f"usage: trajstore {name}".rstrip()), name
