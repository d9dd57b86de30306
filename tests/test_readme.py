"""Every example in README.md runs exactly as printed, in the order printed, in a fresh folder.

Python blocks run one after the other in one namespace (like a session); shell blocks run in bash (``-e``, with
the installed ``trajstore`` command on the PATH) in the same folder, so a store one block creates is the store
the next one reads. A server a shell block starts in the background is stopped at the end. The set-up block
(``sh setup``) is run too: ``make demo`` against a store in the folder, until its dashboard answers;
``make test`` is the command that runs this very test, so it is the one line not run here.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path
from typing import Iterator

import httpx
import pytest

from tests.api.helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)


def blocks() -> list[tuple[str, str, str]]:
    """``(language, info, code)`` of every fenced block of README.md, in order."""
    return [(m.group(1), m.group(2).strip(), m.group(3)) for m in FENCE.finditer((ROOT / "README.md").read_text())]


def test_every_block_is_python_sh_or_sql() -> None:
    kinds = {lang for lang, _, _ in blocks()}
    assert kinds <= {"python", "sh", "sql"}, kinds
    assert [info for lang, info, _ in blocks() if lang == "sh" and info] == ["setup"]


@pytest.fixture
def session(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Iterator[list[subprocess.Popen[str]]]:
    """A fresh folder as the working directory (and for Minari's datasets); every shell process group is
    killed afterwards."""
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari-datasets"))
    started: list[subprocess.Popen[str]] = []
    yield started
    import sys as _sys

    if "ray" in _sys.modules and _sys.modules["ray"].is_initialized():  # the README starts a local Ray
        _sys.modules["ray"].shutdown()
    for proc in started:
        _stop_group(proc.pid)


def _stop_group(pgid: int) -> None:
    """SIGTERM a shell block's process group (a server it started with &), SIGKILL what is left after 5 s."""
    try:
        os.killpg(pgid, signal.SIGTERM)
    except ProcessLookupError:
        return
    deadline = time.monotonic() + 5
    while time.monotonic() < deadline:
        try:
            os.killpg(pgid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    try:
        os.killpg(pgid, signal.SIGKILL)
    except ProcessLookupError:
        pass


def run_sh(code: str, started: list[subprocess.Popen[str]]) -> None:
    env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
    log = Path(f"sh-{len(started)}.log")
    with log.open("w") as out:  # a file, not a pipe: a server started with & keeps its output open
        proc = subprocess.Popen(["bash", "-e", "-c", code], env=env, text=True, start_new_session=True,
                                stdout=out, stderr=subprocess.STDOUT)
        started.append(proc)
        proc.wait(timeout=900)
    assert proc.returncode == 0, \
        f"README shell block failed ({proc.returncode}):\n{code}\n--- output:\n{log.read_text()[-4000:]}"


@pytest.mark.ray
@pytest.mark.server
@pytest.mark.slow
def test_the_examples_run_as_printed(session: list[subprocess.Popen[str]]) -> None:
    import socket

    with socket.socket() as probe:  # the README serves on trajstore's default port
        if probe.connect_ex(("127.0.0.1", 8321)) == 0:
            pytest.fail("port 8321 is taken (a server left running?): the README's examples serve there")
    namespace: dict[str, object] = {"__name__": "__readme__"}
    ran = 0
    for lang, info, code in blocks():
        if lang == "python":
            try:
                exec(compile(code, "README.md", "exec"), namespace)
            except Exception as exc:
                raise AssertionError(f"README python block failed: {exc!r}\n{code}") from exc
        elif lang == "sh" and not info:
            run_sh(code, session)
        elif lang == "sql":
            namespace["store"].sql(code)  # type: ignore[attr-defined]
        ran += lang != "sh" or not info
    assert ran >= 6


@pytest.mark.server
@pytest.mark.slow
def test_make_demo_serves_its_dashboard(tmp_path: Path) -> None:
    setup = next(code for lang, info, code in blocks() if info == "setup")
    assert re.search(r"^make demo\b", setup, re.M) and re.search(r"^make test\b", setup, re.M)
    port = free_port()
    log = tmp_path / "demo.log"
    with log.open("w") as out:
        proc = subprocess.Popen(["make", "-C", str(ROOT), "demo", f"STORE={tmp_path / 'demo-store'}", f"PORT={port}",
                                 f"VENV={Path(sys.executable).parents[1]}"],
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
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def test_the_minari_example_runs_twice(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Run again, the Minari recording example keeps the dataset it made instead of failing on its id."""
    pytest.importorskip("minari")
    monkeypatch.setenv("MINARI_DATASETS_PATH", str(tmp_path / "minari-datasets"))
    code = next(code for lang, _, code in blocks() if lang == "python" and "minari.DataCollector" in code)
    for _ in range(2):
        exec(compile(code, "README.md", "exec"), {"__name__": "__readme__"})
    assert [p.name for p in (tmp_path / "minari-datasets" / "cartpole").iterdir() if p.is_dir()] == ["random-v0"]
