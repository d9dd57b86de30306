"""The extras (trajstore/extras.py): ``import trajstore`` imports none of their packages, a feature whose package is
missing says which extra installs it, and progress bars draw without tqdm (trajstore/progress_bar.py). What a core
installation does with each missing extra, for real, is tests/test_core_install.py."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import tomllib
from pathlib import Path

import pytest

from trajstore.errors import InputError, MissingExtraError
from trajstore.extras import EXTRAS, needed
from trajstore.progress_bar import PlainBar

ROOT = Path(__file__).resolve().parents[1]

# the packages of every extra, by the name they are imported under
OPTIONAL = ["fastapi", "uvicorn", "starlette", "pydantic", "httpx", "gymnasium", "PIL", "yaml", "tqdm", "polars",
            "jax", "torch", "ray", "minari", "stable_baselines3", "pettingzoo", "ale_py", "cv2", "pyspark", "h5py"]
CORE = ["numpy", "pyarrow", "pyarrow.dataset", "pyarrow.parquet", "duckdb", "deltalake", "numba"]


def imported_after(*statements: str) -> list[set[str]]:
    """The packages of :data:`OPTIONAL` one fresh interpreter holds after running each of ``statements`` in turn
    (what each adds to the ones before: one interpreter's imports instead of one per statement)."""
    code = "import json, sys\n" + "".join(
        f"{statement}\nprint(json.dumps([m for m in {OPTIONAL!r} if m in sys.modules]))\n" for statement in statements)
    done = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(ROOT)})
    assert done.returncode == 0, done.stderr[-2000:]
    return [set(json.loads(line)) for line in done.stdout.splitlines()[-len(statements):]]


def test_import_trajstore_imports_no_extra() -> None:
    """Here every extra is installed: what ``import trajstore`` brings beyond what its core dependencies import by
    themselves (numba reads its config with PyYAML where PyYAML is there) is none of them."""
    by_the_core, with_trajstore, with_the_cli = imported_after(
        "\n".join(f"import {m}" for m in CORE), "import trajstore",
        "import trajstore.cli.main, trajstore.rollout, trajstore.integrations.info")
    assert with_trajstore - by_the_core == set()
    assert with_the_cli - by_the_core == set()


def test_every_extra_named_in_the_code_is_one_pyproject_declares() -> None:
    declared = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["optional-dependencies"]
    assert set(EXTRAS) <= set(declared)
    every = declared["all"][0]
    assert set(EXTRAS) == set(every[every.index("[") + 1:every.index("]")].split(","))


def test_a_missing_package_is_one_error_naming_the_extra() -> None:
    with pytest.raises(MissingExtraError, match=r"^trajstore serve needs FastAPI and uvicorn: "
                                                r"pip install 'trajstore\[serve\]'$") as caught:
        with needed("serve", "trajstore serve"):
            import trajstore_no_such_package  # noqa: F401 - a package that is not installed
    assert isinstance(caught.value, ImportError) and isinstance(caught.value, InputError)
    assert caught.value.extra == "serve" and caught.value.name == "trajstore_no_such_package"


def test_a_missing_extra_inside_is_said_again_for_what_the_caller_asked() -> None:
    with pytest.raises(MissingExtraError, match=r"^trajstore rollout --backend jax needs JAX: "
                                                r"pip install 'trajstore\[jax\]'$"):
        with needed("gym", "trajstore rollout --backend jax"):
            with needed("jax", "JAX rollouts"):
                import trajstore_no_such_package  # noqa: F401


def test_a_missing_module_of_trajstore_itself_stays_a_bug() -> None:
    with pytest.raises(ModuleNotFoundError) as caught:
        with needed("gym", "x"):
            import trajstore.no_such_module  # noqa: F401
    assert not isinstance(caught.value, MissingExtraError)


def test_the_plain_bar_counts_on_one_line_and_ends_it() -> None:
    out = io.StringIO()
    with PlainBar(total=3, desc="compact", unit="partition", min_interval=0, stream=out) as bar:
        for _ in range(3):
            bar.update(1)
        bar.set_postfix({"files": 12})
    assert out.getvalue().endswith("\rcompact: 3/3 partition, files=12\n")
    assert "\n" not in out.getvalue()[:-1]
    quiet = io.StringIO()
    with PlainBar(total=3, desc="compact", unit="partition", enabled=False, stream=quiet) as bar:
        bar.update(3)
    assert quiet.getvalue() == ""
