"""``trajstore serve`` in a process of its own, as a user starts it: for the tests that probe the real service
(memory bounds, the security probe), with its resident memory and its SQL workers' read from /proc."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import httpx

import trajstore
from tests.api.helpers import free_port

MiB = 1 << 20


class Server:
    """``trajstore serve`` in a process of its own, and the resident memory of it and its children."""

    def __init__(self, store: Path, **settings: Any) -> None:
        self.url = f"http://127.0.0.1:{free_port()}"
        env = {**os.environ, **{f"TRAJSTORE_{k.upper()}": str(v) for k, v in settings.items()}}
        self.proc = subprocess.Popen([sys.executable, "-m", "trajstore.cli", "serve", "--store", str(store),
                                      "--port", self.url.rsplit(":", 1)[1]], env=env, stdout=subprocess.DEVNULL,
                                     start_new_session=True)
        self.steps = trajstore.open(store).sql("SELECT count(*) AS n FROM steps")["n"][0].as_py()
        self.workers = int(settings.get("sql_max_concurrent", 4))  # SQL worker processes it keeps warm
        self.peak = 0
        self._stop = threading.Event()

    def wait_ready(self, workers: int) -> None:
        """Until it answers and its ``workers`` SQL workers are up and idle (their memory settled)."""
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline:
            try:
                if httpx.get(self.url + "/health", timeout=2).status_code == 200 and \
                        len(self.children()) >= workers and self._settled():
                    return
            except httpx.TransportError:
                pass
            assert self.proc.poll() is None, "the server exited"
            time.sleep(0.2)
        raise AssertionError(f"the server did not start {workers} SQL workers within 120 s")

    def _settled(self) -> bool:
        first = self.rss()
        time.sleep(0.5)
        return abs(self.rss() - first) < 8 * MiB

    def children(self) -> list[int]:
        out = []
        for name in os.listdir("/proc"):
            if name.isdigit():
                try:
                    with open(f"/proc/{name}/stat") as f:
                        if int(f.read().rsplit(")", 1)[1].split()[1]) == self.proc.pid:
                            out.append(int(name))
                except (OSError, ValueError, IndexError):
                    pass
        return out

    def rss(self, *, workers: bool = True) -> int:
        """The resident memory of the server and (with ``workers``) its SQL worker processes, in bytes."""
        total = 0
        for pid in [self.proc.pid, *(self.children() if workers else [])]:
            try:
                with open(f"/proc/{pid}/status") as f:
                    total += next(int(line.split()[1]) * 1024 for line in f if line.startswith("VmRSS:"))
            except (OSError, StopIteration):
                pass
        return total

    def idle(self, *, workers: bool = True) -> int:
        """The memory once the server is idle with every SQL worker started (replacing retired ones takes
        seconds); of the server process alone without ``workers``."""
        self.wait_ready(self.workers)
        return self.rss(workers=workers)

    def watch(self, limit: int, *, workers: bool = True) -> None:
        """Sample the memory every 20 ms from now on; past ``limit`` kill the server (the test fails) before it
        takes the machine's memory. Each watch keeps its own peak (an earlier watch's sampler, stopped mid-sample,
        must not hand this one its reading)."""
        self._stop.set()
        self._stop = threading.Event()
        self.peak = 0
        stop = self._stop

        def sample() -> None:
            peak = 0
            while not stop.wait(0.02):
                peak = max(peak, self.rss(workers=workers))
                if stop.is_set():
                    return
                self.peak = peak
                if peak > limit:
                    os.killpg(self.proc.pid, signal.SIGKILL)
                    return

        threading.Thread(target=sample, daemon=True).start()

    def unwatch(self) -> None:
        """Stop sampling the memory (the last watch's limit no longer kills the server)."""
        self._stop.set()

    def close(self) -> None:
        self._stop.set()
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGINT)
            try:
                self.proc.wait(20)
            except subprocess.TimeoutExpired:
                os.killpg(self.proc.pid, signal.SIGKILL)
                self.proc.wait(10)

    def __enter__(self) -> Server:
        self.wait_ready(self.workers)
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
