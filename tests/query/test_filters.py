"""Typed episode filters: every combination selects exactly the episodes a plain Python filter over the whole
``episodes`` view keeps, whether it reaches SQL through ``episodes``, ``stats``, ``scan`` or ``returns``."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import trajstore
from tests.helpers import make_batch
from trajstore.errors import InputError
from trajstore.query.filters import EpisodeFilter


@pytest.fixture(scope="module")
def filled(tmp_path_factory: pytest.TempPathFactory) -> tuple[trajstore.Store, list[dict[str, Any]]]:
    store = trajstore.open(tmp_path_factory.mktemp("filters") / "store", create=True)
    rng = np.random.default_rng(3)
    for run, mode, version in (("a", "train", 1), ("b", "eval", 2), ("c", "train", 3)):
        for env in ("E1", "E2"):
            with store.writer(run_id=run, env_id=env, mode=mode, policy_version=version, seed=7) as w:
                w.add_batch(make_batch(rng, 30, 3, p_terminated=0.15, p_truncated=0.05))
    return store, store.episodes().to_pylist()


def reference(rows: list[dict[str, Any]], f: EpisodeFilter) -> set[int]:
    def keep(r: dict[str, Any]) -> bool:
        for name in ("run_id", "env_id", "episode_id"):
            values = getattr(f, name)
            if values and r[name] not in values:
                return False
        for name in ("complete", "terminated", "truncated"):
            if getattr(f, name) is not None and r[name] != getattr(f, name):
                return False
        checks = ((f.min_return, lambda v: r["episode_return"] >= v),
                  (f.max_return, lambda v: r["episode_return"] <= v),
                  (f.min_length, lambda v: r["episode_length"] >= v),
                  (f.max_length, lambda v: r["episode_length"] <= v))
        if any(v is not None and not ok(v) for v, ok in checks):
            return False
        return all(not values or r[k] in values for k, values in f.lineage.items())
    return {r["episode_id"] for r in rows if keep(r)}


def filters(ids: list[int]) -> st.SearchStrategy[EpisodeFilter]:
    maybe_bool = st.none() | st.booleans()
    return st.builds(
        EpisodeFilter,
        run_id=st.none() | st.lists(st.sampled_from(["a", "b", "c"]), max_size=2),
        env_id=st.none() | st.lists(st.sampled_from(["E1", "E2"]), max_size=1),
        episode_id=st.none() | st.lists(st.sampled_from(ids), max_size=4),
        complete=maybe_bool, terminated=maybe_bool, truncated=maybe_bool,
        min_return=st.none() | st.floats(-5, 5), max_return=st.none() | st.floats(-5, 5),
        min_length=st.none() | st.integers(0, 15), max_length=st.none() | st.integers(0, 15),
        lineage=st.fixed_dictionaries({}, optional={
            "mode": st.lists(st.sampled_from(["train", "eval"]), max_size=2),
            "policy_version": st.lists(st.sampled_from([1, 2, 3]), max_size=2),
            "seed": st.lists(st.sampled_from([7, 8]), max_size=2)}),
    )


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(data=st.data())
def test_every_filter_selects_what_a_plain_filter_keeps(filled: tuple[trajstore.Store, list[dict[str, Any]]],
                                                        data: st.DataObject) -> None:
    store, rows = filled
    f = data.draw(filters([r["episode_id"] for r in rows]))
    want = reference(rows, f)
    assert set(store.episodes(filter=f)["episode_id"].to_pylist()) == want
    assert store.stats(filter=f, include_incomplete=True)["n_traj"][0].as_py() == len(want)
    assert set(store.scan(["episode_id"], filter=f).read_all()["episode_id"].to_pylist()) == want
    assert set(store.returns(gamma=0.9, per="step", filter=f)["episode_id"].to_pylist()) == want


def test_lineage_values_of_the_wrong_type_are_refused() -> None:
    with pytest.raises(InputError, match=r"lineage\['policy_version'\]: expected int values, got \['train'\]"):
        EpisodeFilter(lineage={"policy_version": ["train"]})
    with pytest.raises(InputError, match=r"lineage\['mode'\]: expected str values, got \[1\]"):
        EpisodeFilter(lineage={"mode": [1]})


def test_an_empty_filter_is_no_condition(filled: tuple[trajstore.Store, list[dict[str, Any]]]) -> None:
    store, rows = filled
    assert EpisodeFilter().is_empty() and not EpisodeFilter(complete=False).is_empty()
    assert store.episodes(filter=EpisodeFilter()).num_rows == len(rows)


def test_per_episode_drops_the_conditions_that_select_steps_directly() -> None:
    f = EpisodeFilter(run_id=["a"], env_id=["E"], episode_id=[1], complete=True, lineage={"mode": ["eval"]})
    assert f.per_episode() == EpisodeFilter(complete=True, lineage={"mode": ["eval"]})
