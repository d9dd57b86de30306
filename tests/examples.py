"""Running the examples of a Markdown page (README.md, the guides under docs/) exactly as printed.

A page's fenced blocks run in order, in one folder: ``python`` blocks through Python's own REPL machinery
(:class:`Repl`, a :class:`code.InteractiveConsole` fed one line at a time, as a paste into ``python`` is), ``sh``
blocks in bash (``-e``, the installed ``trajstore`` command on the PATH), ``sql`` blocks through the session's
``store.sql``. A shell block's background processes (a server started with ``&``) are stopped by :meth:`Page.close`.
Every page's examples serve on trajstore's default port and SeaweedFS's, so :func:`examples_lock` lets one page run
at a time on this machine (across pytest workers and other test sessions).
"""

from __future__ import annotations

import code
import contextlib
import fcntl
import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import trajstore

ROOT = Path(__file__).resolve().parents[1]
FENCE = re.compile(r"^```(\w+)([^\n]*)\n(.*?)^```", re.S | re.M)
LOCK = Path(tempfile.gettempdir()) / "trajstore-doc-examples.lock"


@dataclass(frozen=True)
class Block:
    """One fenced block of a page: its language, what follows the language on the fence line, its code, and the
    line of the page it starts on."""

    lang: str
    info: str
    code: str
    line: int


def blocks(page: Path) -> list[Block]:
    """Every fenced block of ``page``, in order."""
    text = page.read_text()
    return [Block(m.group(1), m.group(2).strip(), m.group(3), text.count("\n", 0, m.start()) + 2)
            for m in FENCE.finditer(text)]


class Repl(code.InteractiveConsole):
    """Python's interactive console fed line by line, as a block pasted into ``python`` is; an error raises.

    What the REPL refuses fails here too: a statement right after an indented block without the blank line that
    ends it, a blank line inside a function body. Expression results are not printed (the REPL would print them).
    """

    def __init__(self, namespace: dict[str, Any]) -> None:
        super().__init__(namespace, filename="<stdin>")

    def runcode(self, compiled: Any) -> None:
        saved, sys.displayhook = sys.displayhook, lambda value: None
        try:
            exec(compiled, self.locals)
        finally:
            sys.displayhook = saved

    def showsyntaxerror(self, filename: str | None = None, **kwargs: Any) -> None:
        raise sys.exc_info()[1]  # type: ignore[misc]

    def paste(self, text: str) -> None:
        """Push every line of ``text``, then the blank line a user types to end a last indented block."""
        self.resetbuffer()
        for line in text.splitlines():
            self.push(line)
        if self.buffer:
            self.push("")


@dataclass
class Page:
    """The examples of one page, run in ``folder``: one Python namespace for the page unless ``fresh`` (then each
    Python block gets its own, so it must say everything it needs itself)."""

    path: Path
    folder: Path
    fresh: bool = False
    namespace: dict[str, Any] = field(default_factory=lambda: {"__name__": "__main__"})
    started: list[subprocess.Popen[str]] = field(default_factory=list)

    def run(self, block: Block) -> None:
        where = f"{self.path.name}, line {block.line}"
        if block.lang == "python":
            namespace = {"__name__": "__main__"} if self.fresh else self.namespace
            try:
                Repl(namespace).paste(block.code)
            except BaseException as exc:
                raise AssertionError(f"{where}: the Python block failed in the REPL: {exc!r}\n{block.code}") from exc
            if not self.fresh:
                self.namespace = namespace
        elif block.lang == "sh":
            self.sh(block.code, where)
        elif block.lang == "sql":  # over the page's `store`, or ./trajdata on a page of self-contained blocks
            store = self.namespace.get("store") or trajstore.open(self.folder / "trajdata")
            store.sql(block.code)

    def sh(self, script: str, where: str) -> None:
        env = {**os.environ, "PATH": f"{Path(sys.executable).parent}{os.pathsep}{os.environ['PATH']}"}
        log = self.folder / f"sh-{len(self.started)}.log"
        with log.open("w") as out:  # a file, not a pipe: a server started with & keeps its output open
            proc = subprocess.Popen(["bash", "-e", "-c", script], cwd=self.folder, env=env, text=True,
                                    start_new_session=True, stdout=out, stderr=subprocess.STDOUT)
            self.started.append(proc)
            proc.wait(timeout=900)
        assert proc.returncode == 0, \
            f"{where}: the shell block failed ({proc.returncode}):\n{script}\n--- output:\n{log.read_text()[-4000:]}"

    def close(self) -> None:
        ray = sys.modules.get("ray")
        if ray is not None and ray.is_initialized():  # a page that starts a local Ray
            ray.shutdown()
        for proc in self.started:
            stop_group(proc.pid)


def stop_group(pgid: int) -> None:
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
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


@contextlib.contextmanager
def examples_lock() -> Iterator[None]:
    """One page's examples at a time on this machine: they serve on fixed ports (8321, SeaweedFS's 8333)."""
    with LOCK.open("a") as handle:
        fcntl.flock(handle, fcntl.LOCK_EX)
        try:
            yield
        finally:
            fcntl.flock(handle, fcntl.LOCK_UN)


def run_page(path: Path, folder: Path, *, fresh: bool = False, skip: set[str] = frozenset()) -> int:
    """Run every block of ``path`` in ``folder`` (the working directory meanwhile), but those whose fence info is in
    ``skip``; returns how many ran."""
    page, ran = Page(path, folder, fresh=fresh), 0
    cwd = Path.cwd()
    os.chdir(folder)
    try:
        for block in blocks(path):
            if block.info in skip:
                continue
            page.run(block)
            ran += 1
    finally:
        os.chdir(cwd)
        page.close()
    return ran
