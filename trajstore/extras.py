"""The optional parts of trajstore, each an extra of the package (``pip install 'trajstore[serve]'``), and the one
error a feature raises when its extra is not installed.

``pip install trajstore`` stores and queries (Python, SQL, the CLI) with numpy, pyarrow, DuckDB, deltalake and
numba alone; everything else is an extra: the service (``serve``), the client (``client``), rollouts and recorders
over gymnasium (``gym``) or JAX (``jax``), YAML config files (``yaml``), the LeRobot export's pictures
(``lerobot``), and the integrations (``torch``, ``sb3``, ``atari``, ``minari``, ``ray``, ``pettingzoo``,
``spark``); ``all`` holds them all. A module that needs one imports it inside :func:`needed`:

>>> with needed("gym", "recording a gymnasium env"):
...     import gymnasium  # doctest: +SKIP

so a missing package is a :class:`~trajstore.errors.MissingExtraError` naming what to install, never a bare
``ModuleNotFoundError``.
"""

from __future__ import annotations

import contextlib
from typing import Iterator

from trajstore.errors import MissingExtraError

# each extra of pyproject.toml: what it brings, as a message names it
EXTRAS = {
    "serve": "FastAPI and uvicorn",
    "client": "httpx",
    "gym": "gymnasium",
    "jax": "JAX",
    "yaml": "PyYAML",
    "lerobot": "Pillow",
    "torch": "PyTorch",
    "sb3": "Stable-Baselines3",
    "atari": "ale-py and OpenCV",
    "minari": "minari",
    "ray": "Ray",
    "pettingzoo": "PettingZoo",
    "spark": "PySpark",
}


def install(extra: str) -> str:
    """The command that installs ``extra``."""
    return f"pip install 'trajstore[{extra}]'"


@contextlib.contextmanager
def needed(extra: str, feature: str) -> Iterator[None]:
    """Imports of ``extra``'s packages for ``feature`` (what the caller asked for, as the message names it): a
    package that is not installed is a :class:`MissingExtraError` saying ``<feature> needs <what the extra
    brings>: pip install 'trajstore[<extra>]'``; one that a module imported inside raised is said again for
    ``feature`` (naming its own extra). A missing module of trajstore itself stays what it is (a bug)."""
    if extra not in EXTRAS:
        raise ValueError(f"extra: not one of {sorted(EXTRAS)}: {extra!r}")  # a slip in trajstore, not the caller's
    try:
        yield
    except MissingExtraError as exc:
        raise missing(exc.extra, feature, exc.name) from None
    except ModuleNotFoundError as exc:
        if (exc.name or "").partition(".")[0] == "trajstore":
            raise
        raise missing(extra, feature, exc.name) from None


def missing(extra: str, feature: str, name: str | None = None) -> MissingExtraError:
    """The error of ``feature``, which needs ``extra`` (``name``: the module that could not be imported)."""
    return MissingExtraError(f"{feature} needs {EXTRAS[extra]}: {install(extra)}", extra=extra, name=name)
