"""Every example in README.md runs exactly as printed, in the order printed, in a fresh folder.

Each Python block is pasted into a fresh Python REPL of its own (:class:`tests.examples.Repl`), so it must say
everything it needs itself; the blocks share the folder, so a store one block writes is the store the next one reads.
Shell blocks run in bash (``-e``, with the installed ``trajstore`` command on the PATH) in the same folder; a server a
shell block starts in the background is stopped at the end. The set-up block (``sh setup``) is run too: ``make demo``
against a store in the folder, until its dashboard answers; ``make test`` is the command that runs this very test, so
it is the one line not run here.
"""

from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.api.helpers import free_port
from tests.examples import ROOT, Repl, blocks, examples_lock, run_page

README = ROOT / "README.md"


def test_every_block_is_python_sh_or_sql() -> None:
    kinds = {b.lang for b in blocks(README)}
    assert kinds <= {"python", "sh", "sql"}, kinds
    assert [b.info for b in blocks(README) if b.lang == "sh" and b.info] == ["setup"]


def test_the_readme_is_short() -> None:
    assert len(README.read_text().splitlines()) <= 250


@pytest.mark.server
@pytest.mark.slow
def test_the_examples_run_as_printed(tmp_path: Path) -> None:
    with examples_lock():
        with socket.socket() as probe:  # the README serves on trajstore's default port
            if probe.connect_ex(("127.0.0.1", 8321)) == 0:
                pytest.fail("port 8321 is taken (a server left running?): the README's examples serve there")
        ran = run_page(README, tmp_path, fresh=True, skip={"setup"})
    assert ran >= 6


@pytest.mark.parametrize("pasted", [
    "for i in range(2):\n    x = i\nprint(x)\n",            # a statement right after an indented block
    "def f():\n    a = 1\n\n    return a\n",                  # a blank line inside a function body
])
def test_the_repl_refuses_what_a_pasted_block_cannot_hold(pasted: str) -> None:
    """What Python's REPL refuses in a paste, the README's runner refuses too (while exec would run it)."""
    exec(compile(pasted, "<block>", "exec"), {})
    with pytest.raises(SyntaxError):
        Repl({}).paste(pasted)


def test_the_repl_runs_what_a_pasted_block_can_hold() -> None:
    namespace: dict[str, object] = {}
    Repl(namespace).paste("total = 0\nfor i in range(3):\n    total += i\n\nprint(total)\nif total:\n    done = True\n")
    assert namespace["total"] == 3 and namespace["done"] is True


@pytest.mark.server
@pytest.mark.slow
def test_make_demo_serves_its_dashboard(tmp_path: Path) -> None:
    setup = next(b.code for b in blocks(README) if b.info == "setup")
    assert re.search(r"^make demo\b", setup, re.M) and re.search(r"^make test\b", setup, re.M)
    port = free_port()
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["make", "-C", str(ROOT), "demo", f"STORE={tmp_path / 'demo-store'}", f"PORT={port}",
                                 f"VENV={Path(sys.executable).parents[1]}", "DEMO_INSTALL="],  # this one has it all
                                text=True, start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 600
        while time.monotonic() < deadline and proc.poll() is None:
            try:
                if httpx.get(f"http://127.0.0.1:{port}/dashboard", timeout=2).status_code == 200:
                    break
            except httpx.TransportError:
                time.sleep(0.5)
        else:
            pytest.fail(f"make demo did not serve its dashboard (exit {proc.poll()}):\n{log.read_text()[-4000:]}")
        runs = httpx.get(f"http://127.0.0.1:{port}/runs").json()
        assert len(runs) == 2 and all(r["complete_episodes"] > 0 for r in runs)
        os.killpg(proc.pid, signal.SIGINT)  # Ctrl-C, as a terminal sends it: to make and the server alike
        proc.wait(60)
        said = log.read_text()
        assert "trajstore: stopped serving (Ctrl-C)" in said and "make: ***" not in said, said[-2000:]
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGTERM)
            proc.wait(30)
