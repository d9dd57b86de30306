"""The names of trajstore 0.1 that moved or were renamed (issue 48) keep working for one release: each says so with a
DeprecationWarning naming its new place, and gives what the new one gives. The Store's members that moved went to
``store.maintain`` (the table's maintenance), ``trajstore.store.plumbing(store)`` (what serving a store takes) or
``store.curves(by=…)``; a ``where`` that was a condition over steps (delete, add_column) keeps that meaning under the
old name, and is ``steps_where`` under the new one."""

from __future__ import annotations

import contextlib
import re
from pathlib import Path
from typing import Any, Callable, Iterator

import numpy as np
import pyarrow as pa
import pyarrow.compute as pc
import pytest

import trajstore
from tests.api.helpers import Live, serve, settings_for
from tests.helpers import make_batch
from trajstore.api.app import create_app
from trajstore.store import plumbing


def write(store: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    for run, algo in (("a", "ppo"), ("b", "dqn"), ("c", "ppo"), ("d", "dqn")):
        with store.writer(run_id=run, env_id="E", config={"algo": algo}) as w:
            w.add_batch(make_batch(rng, 30, 2, p_terminated=0.2))


@pytest.fixture
def filled(tmp_path: Path) -> trajstore.Store:
    store = trajstore.open(tmp_path / "store", create=True)
    write(store)
    return store


def warns(old: str, new: str) -> Any:
    """The warning of the old name ``old``, naming ``new``."""
    return pytest.warns(DeprecationWarning, match=rf"^{re.escape(old)} is deprecated.*: use {re.escape(new)}")


def same(a: Any, b: Any) -> None:
    if isinstance(a, pa.Table):
        assert a.equals(b)
    elif isinstance(a, list) and a and hasattr(a[0], "path"):
        assert [f.path for f in a] == [f.path for f in b]
    else:
        assert a == b


# name -> (the call on the old name, the same call on its new place)
MOVED: dict[str, tuple[str, Callable[[Any], Any]]] = {
    "files": ("store.maintain.files", lambda f: f()),
    "stored_columns": ("store.maintain.stored_columns", lambda f: f()),
    "decoding_sql": ("store.maintain.decoding_sql", lambda f: f()),
    "run_ids": ("trajstore.store.plumbing(store).run_ids", lambda f: f()),
    "run_infos": ("trajstore.store.plumbing(store).run_infos", lambda f: f()),
    "log_lag": ("trajstore.store.plumbing(store).log_lag", lambda f: f()),
    "image_leaves": ("trajstore.store.plumbing(store).image_leaves", lambda f: f()),
    "latest_stats": ("trajstore.store.plumbing(store).latest_stats", lambda f: f(5)),
    "histogram": ("trajstore.store.plumbing(store).histogram", lambda f: f(bins=4)),
    "binned_curves": ("trajstore.store.plumbing(store).binned_curves", lambda f: f(bins=4)),
    "episode_page": ("trajstore.store.plumbing(store).episode_page", lambda f: f(limit=3)[1]),
    "steps_page": ("trajstore.store.plumbing(store).steps_page", lambda f: f(["reward"], limit=4)),
    "scan_plan": ("trajstore.store.plumbing(store).scan_plan", lambda f: [p.path for p in f(["reward"]).files]),
    "commit_rows": ("trajstore.store.plumbing(store).commit_rows", lambda f: f(1, ["reward"]).rows),
    "sandboxed_sql": ("trajstore.store.plumbing(store).sandboxed_sql", lambda f: f("SELECT count(*) AS n "
                                                                                 "FROM steps").table),
}


@pytest.mark.parametrize("name", MOVED)
def test_a_store_member_that_moved_warns_and_answers_as_its_new_place(filled: trajstore.Store, name: str) -> None:
    new, call = MOVED[name]
    place = filled.maintain if new.startswith("store.maintain") else plumbing(filled)
    with warns(f"Store.{name}", new):
        got = call(getattr(filled, name))
    same(got, call(getattr(place, name)))


def test_the_old_delete_keeps_its_condition_over_steps(filled: trajstore.Store) -> None:
    """``Store.delete(where=)`` was a condition over steps (``step`` is not a column of episodes)."""
    before = filled.episodes()
    with warns("Store.delete", "store.maintain.delete (where a condition over steps is steps_where="):
        report = filled.delete(where="run_id = 'b' AND step >= 0")
    assert report.episodes == before.filter(pc.equal(before["run_id"], "b")).num_rows > 0
    assert plumbing(filled).run_ids() == ["a", "c", "d"]
    with warns("Store.vacuum", "store.maintain.vacuum"):
        assert filled.vacuum(older_than=0, dry_run=True).dry_run


def test_the_old_add_column_keeps_its_condition_over_steps(filled: trajstore.Store) -> None:
    with warns("Store.add_column", "store.maintain.add_column"):
        report = filled.add_column("first_reward", "reward", where="step = 0")
    firsts = filled.sql("SELECT count(*) AS n FROM steps WHERE step = 0")["n"][0].as_py()
    assert report.rows == firsts == filled.sql("SELECT count(first_reward) AS n FROM steps")["n"][0].as_py()


def test_group_curves_is_curves_by(filled: trajstore.Store) -> None:
    with warns("Store.group_curves", "store.curves(by=…)"):
        old = filled.group_curves("config.algo", bins=3, reps=50)
    assert old.equals(filled.curves(by="config.algo", bins=3, reps=50)) and old.num_rows > 0


def test_the_compaction_policy_says_so_in_its_name() -> None:
    from trajstore.operations import upkeep

    with pytest.warns(DeprecationWarning, match="Policy is deprecated: use CompactionPolicy"):
        old = upkeep.Policy
    assert old is upkeep.CompactionPolicy


def test_the_batch_formats_are_one_literal() -> None:
    from trajstore.loaders import loader
    from trajstore.query.batches import BatchFormat

    with pytest.warns(DeprecationWarning, match="LoaderFormat is deprecated: use trajstore.query.batches.BatchFormat"):
        old = loader.LoaderFormat
    assert old is BatchFormat


@contextlib.contextmanager
def served(store: trajstore.Store) -> Iterator[Live]:
    with contextlib.contextmanager(serve)(create_app(settings_for(store.root))) as live:
        yield live


@pytest.mark.server
def test_the_client_s_old_names(filled: trajstore.Store) -> None:
    with served(filled) as live, trajstore.Client(live.url) as client:
        with warns("Client.iter_sequences", "client.sequences"):
            old = list(client.iter_sequences(4, columns=["reward"], run_id="a"))
        new = list(client.sequences(4, columns=["reward"], run_id="a"))
        assert len(old) == len(new) > 0 and all(np.array_equal(x["reward"], y["reward"]) for x, y in zip(old, new))
        with warns("Client.group_curves", "client.curves(by=…)"):
            curves = client.group_curves("config.algo", bins=3, reps=50)
        assert curves.equals(filled.curves(by="config.algo", bins=3, reps=50))
        with pytest.warns(DeprecationWarning, match=r"Client.sql\(as_=...\) is deprecated.*\.to_pylist\(\)"):
            rows = client.sql("SELECT count(*) AS n FROM steps", as_="dicts")
        assert rows == client.sql("SELECT count(*) AS n FROM steps").to_pylist()


def test_members_that_never_were_are_still_attribute_errors(filled: trajstore.Store) -> None:
    with pytest.raises(AttributeError, match="'Store' object has no attribute 'engine'"):
        filled.engine  # noqa: B018 - the store's parts are private
