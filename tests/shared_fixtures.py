"""A pytest plugin (loaded by ``tests/conftest.py``) that keeps shared fixtures read-only: a store that a module,
package or session fixture holds is shared by every test that asks for it, in whatever order they run (and on
whichever xdist worker), so a test that commits to it makes the others' results depend on the order. Each test's
call is checked: the commits in the log of every such store (``steps`` and ``runs``) are the same after it as
before, else the test fails naming the fixture. A test that writes asks for a store of its own (``store``,
``tmp_path``) or a copy.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Iterator

import pytest

import trajstore


def store_roots(value: Any, depth: int = 0) -> Iterator[Path]:
    """The local store folders a fixture's value holds: a ``Store``, a store's path, an app or server over one
    (``.app.state.store``, a served store's ``.store``), or a tuple, list or dict of those."""
    if depth > 2:
        return
    if isinstance(value, trajstore.Store):
        if isinstance(value.root, Path):
            yield value.root
    elif isinstance(value, Path):
        if (value / "steps" / "_delta_log").is_dir():
            yield value
    elif isinstance(value, (tuple, list)):
        for item in value:
            yield from store_roots(item, depth + 1)
    elif isinstance(value, dict):
        for item in value.values():
            yield from store_roots(item, depth + 1)
    else:
        app = getattr(value, "app", None)
        held = getattr(getattr(app, "state", None), "store", None) or getattr(value, "store", None)
        if held is not None:
            yield from store_roots(held, depth + 1)


def commits(root: Path) -> frozenset[str]:
    """The commits in the store's logs (``steps/_delta_log``, ``runs/_delta_log``), by file name."""
    return frozenset(f"{log.parent.name}/{entry.name}" for log in root.glob("*/_delta_log")
                     for entry in log.glob("*.json"))


def shared_stores(item: pytest.Item) -> dict[str, Path]:
    """The stores of the module-, package- and session-scoped fixtures ``item`` uses, by fixture name."""
    found: dict[str, Path] = {}
    infos = getattr(item, "_fixtureinfo", None)
    for name, defs in (infos.name2fixturedefs.items() if infos else ()):
        if defs and defs[-1].scope != "function" and name in getattr(item, "funcargs", {}):
            for root in store_roots(item.funcargs[name]):
                found[f"{name} ({defs[-1].scope}): {root}"] = root
    return found


@pytest.hookimpl(wrapper=True)
def pytest_runtest_call(item: pytest.Item) -> Iterator[None]:
    stores = shared_stores(item)
    before = {name: commits(root) for name, root in stores.items()}
    result = yield
    changed = [name for name, root in stores.items() if commits(root) != before[name]]
    if changed:
        pytest.fail(f"the test committed to a store shared with other tests: {'; '.join(changed)}. A test that "
                    "writes needs a store of its own (the `store` fixture, tmp_path, or a copy)", pytrace=False)
    return result
