"""trajstore's core alone (`pip install trajstore`: numpy, pyarrow, DuckDB, deltalake, numba; no extra), in the
virtualenv `make core-venv` builds in .cache/core-venv (built here when it is missing or older than pyproject.toml;
skipped, saying why, only where pip cannot build it): nothing of an extra is installed; a Writer stores and every
reader of the core reads it back (tests/core_install_check.py); the CLI's stats and sql answer what this process
reads; and each feature of a missing extra, from Python and from the CLI, is one error naming the extra to install,
with no traceback at a CLI user and no store made."""

from __future__ import annotations

import fcntl
import json
import os
import re
import subprocess
import sys
import tomllib
from pathlib import Path
from typing import Any

import pytest

import trajstore

ROOT = Path(__file__).resolve().parents[1]
CORE_VENV = ROOT / ".cache" / "core-venv"
PYPROJECT = ROOT / "pyproject.toml"


def build(venv: Path) -> str | None:
    """``venv`` with trajstore (editable) and its core dependencies alone, as `make core-venv` makes it; None when
    done, else why it could not be (one process of this machine at a time builds it)."""
    venv.parent.mkdir(parents=True, exist_ok=True)
    with open(venv.parent / "core-venv.lock", "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        marker = venv / ".installed"
        if marker.exists() and marker.stat().st_mtime >= PYPROJECT.stat().st_mtime:
            return None
        subprocess.run(["rm", "-rf", str(venv)], check=True)
        steps = [[sys.executable, "-m", "venv", str(venv)],
                 [str(venv / "bin" / "python"), "-m", "pip", "install", "-q", "-e", str(ROOT)]]
        for step in steps:
            done = subprocess.run(step, capture_output=True, text=True, timeout=900)
            if done.returncode != 0:
                return f"{' '.join(step[:4])} failed: {(done.stderr or done.stdout).strip().splitlines()[-1:]}"
        marker.touch()
    return None


pytestmark = [pytest.mark.slow, pytest.mark.server]  # builds a virtualenv; runs `trajstore serve` there


@pytest.fixture(scope="module")
def venv() -> Path:
    why = build(CORE_VENV)
    if why is not None:
        pytest.skip(f"no virtualenv of the core alone ({why}): build it with `make core-venv`")
    return CORE_VENV


def run(venv: Path, *argv: str, cwd: Path = ROOT) -> subprocess.CompletedProcess[str]:
    """``argv[0]`` of the virtualenv's bin/ (``python``, ``trajstore``) run with this checkout's trajstore."""
    env = {**os.environ, "PYTHONPATH": str(ROOT), "TRAJSTORE_DEBUG": "0"}
    return subprocess.run([str(venv / "bin" / argv[0]), *argv[1:]], cwd=cwd, env=env, capture_output=True,
                          text=True, timeout=600)


@pytest.fixture(scope="module")
def checked(venv: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    """What tests/core_install_check.py found, with the store it wrote (``root``)."""
    root = tmp_path_factory.mktemp("core") / "store"
    done = run(venv, "python", "-m", "tests.core_install_check", str(root))
    assert done.returncode == 0, done.stderr[-3000:]
    return {**json.loads(done.stdout.strip().splitlines()[-1]), "root": root}


def extras_packages() -> set[str]:
    """The distributions every extra of pyproject.toml brings (their own names, normalized), but trajstore's."""
    extras = tomllib.loads(PYPROJECT.read_text())["project"]["optional-dependencies"]
    names = {re.match(r"[A-Za-z0-9._-]+", d).group(0) for k, deps in extras.items() if k not in ("dev", "bench")  # type: ignore[union-attr]
             for d in deps}
    return {re.sub(r"[-_.]+", "-", n).lower() for n in names} - {"trajstore"}


def test_the_core_installs_no_extra(venv: Path) -> None:
    done = run(venv, "python", "-m", "pip", "list", "--format=json")
    installed = {re.sub(r"[-_.]+", "-", p["name"]).lower() for p in json.loads(done.stdout)}
    assert {"numpy", "pyarrow", "duckdb", "deltalake", "numba", "trajstore"} <= installed
    assert installed & extras_packages() == set()
    assert "polars" not in installed


def test_a_core_installation_stores_and_reads_with_every_core_reader(checked: dict[str, Any]) -> None:
    written, read = checked["written"], checked["read"]
    assert read["sql_steps"] == read["scanned"] == read["return_to_go_rows"] == written["steps"] == 768
    assert read["n_traj"] == read["episodes"] == written["complete"] > 0
    assert read["sql_reward"] == pytest.approx(written["reward"], rel=1e-9)
    assert read["window_obs"] == [16, 8, 3] and read["transition_reward"] == [16]
    assert read["compact"] == "compacted 1 partition(s): 3 files into 1" and read["check"] is True
    assert "uint8" in read["pictures"]
    assert checked["imported"] == []  # not even through a reader: no extra was imported


def test_the_cli_s_stats_and_sql_answer_what_the_store_holds(venv: Path, checked: dict[str, Any]) -> None:
    store = str(checked["root"])
    stats = run(venv, "trajstore", "stats", "--store", store, "--run", "core", "--format", "json")
    assert stats.returncode == 0, stats.stderr
    here = trajstore.open(store).stats(run_id="core").to_pylist()[0]
    shown = json.loads(stats.stdout.splitlines()[0])
    assert shown["n_traj"] == here["n_traj"] == checked["written"]["complete"]
    assert shown["return_mean"] == pytest.approx(here["return_mean"])
    sql = run(venv, "trajstore", "sql", "--store", store, "--format", "json",
              "SELECT run_id, count(*) AS n FROM steps GROUP BY run_id ORDER BY run_id")
    assert sql.returncode == 0, sql.stderr
    assert [json.loads(line) for line in sql.stdout.splitlines()] == [{"run_id": "core", "n": 768},
                                                                      {"run_id": "frames", "n": 256}]


def test_each_missing_extra_names_itself_from_python(checked: dict[str, Any]) -> None:
    def says(feature: str, package: str, extra: str) -> str:
        return f"MissingExtraError: {feature} needs {package}: pip install 'trajstore[{extra}]'"

    assert checked["missing"] == {
        "client": says("trajstore.Client (and a remote writer)", "httpx", "client"),
        "gym": says("a gymnasium rollout or recorder (gym_rollout, RecordToStore)", "gymnasium", "gym"),
        "jax": says("a JAX rollout", "JAX", "jax"),
        "serve": says("the trajstore service (trajstore.api)", "FastAPI and uvicorn", "serve"),
        "torch": says("format: 'torch'", "PyTorch", "torch"),
        "lerobot": says("export_lerobot of picture observations (PNG image features)", "Pillow", "lerobot")}


@pytest.mark.parametrize(("argv", "message"), [
    (["serve", "--store", "{store}"], "trajstore serve needs FastAPI and uvicorn: pip install 'trajstore[serve]'"),
    (["rollout", "--env", "CartPole-v1", "--steps", "8", "--run", "r", "--store", "{new}"],
     "trajstore rollout --backend gym needs gymnasium: pip install 'trajstore[gym]'"),
    (["rollout", "--backend", "jax", "--env", "cartpole", "--steps", "8", "--run", "r", "--store", "{new}"],
     "trajstore rollout --backend jax needs JAX: pip install 'trajstore[jax]'"),
    (["import", "--store", "{new}", "minari", "cartpole/expert-v0"],
     "trajstore import needs minari: pip install 'trajstore[minari]'"),
    (["describe", "--store", "{new}", "--config-file", "{yaml}", "core"],
     "--config-file: {yaml}, read as YAML (its name does not end in .json), needs PyYAML: "
     "pip install 'trajstore[yaml]'"),
])
def test_each_missing_extra_is_one_line_from_the_cli(venv: Path, checked: dict[str, Any], tmp_path: Path,
                                                     argv: list[str], message: str) -> None:
    (tmp_path / "run.yaml").write_text("algo: ppo\n")
    where = {"store": str(checked["root"]), "new": str(tmp_path / "new"), "yaml": str(tmp_path / "run.yaml")}
    done = run(venv, "trajstore", *(a.format(**where) for a in argv), cwd=tmp_path)
    assert (done.returncode, done.stdout) == (2, "")
    assert done.stderr == f"trajstore: error: {message.format(**where)}\n"  # one line, no traceback
    assert not (tmp_path / "new").exists()  # said before any store is made


def test_a_json_config_file_needs_no_extra(venv: Path, tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "store", create=True)
    with store.writer(run_id="r", env_id="E") as w:
        w.add_step(obs=[[0.0]], action=[0], reward=[1.0], next_obs=[[1.0]], terminated=[True], truncated=[False])
    (tmp_path / "run.json").write_text('{"algo": "ppo", "lr": 0.0003}')
    done = run(venv, "trajstore", "describe", "--store", str(store.root), "--config-file", str(tmp_path / "run.json"),
               "r")
    assert done.returncode == 0, done.stderr
    assert trajstore.open(store.root).run_info("r")["config"] == {"algo": "ppo", "lr": 0.0003}
