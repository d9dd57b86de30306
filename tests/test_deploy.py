"""The deployment in docker-compose.yml: the file is valid (``docker-compose config``), and its services' own
commands, run as they are with the environment the file gives them, make the bucket, write episodes from a
worker straight into the object store and serve them (against a real SeaweedFS; no Docker engine runs here)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

import trajstore
from tests import seaweed
from tests.api.helpers import free_port

ROOT = Path(__file__).resolve().parents[1]
yaml = pytest.importorskip("yaml")


def compose() -> dict[str, Any]:
    return yaml.safe_load((ROOT / "docker-compose.yml").read_text())


def test_the_compose_file_is_valid() -> None:
    tool = shutil.which("docker-compose")
    if tool is None:
        pytest.skip("docker-compose is not installed (`make test` installs Debian's docker-compose)")
    done = subprocess.run([tool, "-f", str(ROOT / "docker-compose.yml"), "config", "-q"], capture_output=True,
                          text=True, timeout=120, cwd=ROOT)
    assert done.returncode == 0, done.stderr
    services = compose()["services"]
    assert {"objectstore", "bucket", "api", "worker"} <= set(services)
    stores = {services[s]["environment"]["TRAJSTORE_STORE"] for s in ("api", "worker")}
    assert len(stores) == 1 and next(iter(stores)).startswith("${TRAJSTORE_STORE:-s3://")


def environment(service: dict[str, Any], server: seaweed.SeaweedFS, bucket: str) -> dict[str, str]:
    """The service's environment with its defaults, pointed at ``server`` instead of the ``objectstore`` host."""
    env = {}
    for key, value in service["environment"].items():
        value = str(value)
        if value.startswith("${") and ":-" in value:
            value = value.split(":-", 1)[1].rstrip("}")
        env[key] = value.replace("http://objectstore:8333", server.endpoint)
    env["TRAJSTORE_STORE"] = env["TRAJSTORE_STORE"].replace("s3://trajstore/", f"s3://{bucket}/")
    env["TRAJSTORE_BUCKET"] = bucket
    env["AWS_ACCESS_KEY_ID"], env["AWS_SECRET_ACCESS_KEY"] = seaweed.ACCESS_KEY, seaweed.SECRET_KEY
    return env


def run(command: list[str], env: dict[str, str], **kwargs: Any) -> Any:
    if command[0] == "python":
        command = [sys.executable, *command[1:]]
    elif command[0] == "trajstore":
        command = [sys.executable, "-m", "trajstore.cli", *command[1:]]
    return subprocess.run(command, env={**os.environ, **env}, capture_output=True, text=True, timeout=600, **kwargs)


@pytest.mark.s3
@pytest.mark.server
@pytest.mark.slow
def test_the_services_commands_work_against_a_real_object_store(s3: seaweed.SeaweedFS) -> None:
    services = compose()["services"]
    bucket = f"compose-{os.getpid()}"
    made = run(services["bucket"]["command"], environment(services["bucket"], s3, bucket))
    assert made.returncode == 0, made.stderr
    worker = environment(services["worker"], s3, bucket)
    command = [c if c != "1000" else "20" for c in services["worker"]["command"]]  # fewer episodes, same flags
    wrote = run(command, worker)
    assert wrote.returncode == 0, wrote.stderr
    options = {k: v for k, v in worker.items() if k.startswith("AWS_")}
    store = trajstore.open(worker["TRAJSTORE_STORE"], storage_options=options)
    assert store.stats(run_id="compose-worker")["n_traj"][0].as_py() >= 20
    port = free_port()
    api = [c if c != "8321" else str(port) for c in services["api"]["command"]]
    api = [c if c != "0.0.0.0" else "127.0.0.1" for c in api]
    proc = subprocess.Popen([sys.executable, "-m", "trajstore.cli", *api[1:]],
                            env={**os.environ, **environment(services["api"], s3, bucket)}, stdout=subprocess.PIPE,
                            text=True)
    try:
        assert proc.stdout is not None and "serving s3://" in proc.stdout.readline()
        with trajstore.Client(f"http://127.0.0.1:{port}", retries=10, backoff=0.3) as client:
            assert client.runs()["run_id"].to_pylist() == ["compose-worker"]
    finally:
        proc.send_signal(signal.SIGINT)
        proc.wait(30)
