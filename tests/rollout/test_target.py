"""What every rollout records and checks of its run, backend by backend: ``mode`` and ``seed`` the same way in every
row (the seed as given, env_index telling the envs apart), and a run the store already holds refused unless
``append=True`` (then added to); a writer itself never refuses."""

from __future__ import annotations

from typing import Any, Callable

import pytest

import trajstore
from tests.helpers import make_batch
from trajstore.rollout import gym_evaluate, gym_rollout, jax_evaluate, jax_rollout, parallel_rollout


def _spread() -> Any:
    spread = pytest.importorskip("mpe2.simple_spread_v3", reason="the [pettingzoo] extra (mpe2) is not installed")
    return lambda: spread.parallel_env(max_cycles=5)


BACKENDS: dict[str, tuple[str, Callable[..., Any]]] = {
    "gym_rollout": ("train", lambda store, **kw: gym_rollout(store, "CartPole-v1", num_envs=2, episodes=3, **kw)),
    "gym_evaluate": ("eval", lambda store, **kw: gym_evaluate(store, "CartPole-v1", num_envs=2, episodes=3, **kw)),
    "jax_rollout": ("train", lambda store, **kw: jax_rollout(store, "cartpole", num_envs=4, rollout_length=16,
                                                             episodes=3, **kw)),
    "jax_evaluate": ("eval", lambda store, **kw: jax_evaluate(store, "cartpole", num_envs=2, rollout_length=64,
                                                              episodes=3, **kw)),
    "parallel_rollout": ("train", lambda store, **kw: parallel_rollout(store, _spread(), episodes=2, **kw)),
}


def lineage(store: trajstore.Store) -> list[dict[str, Any]]:
    return store.sql("SELECT DISTINCT mode, seed FROM episodes ORDER BY ALL").to_pylist()


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_mode_and_seed_in_every_row_and_a_held_run_refused_unless_appended(store: trajstore.Store,
                                                                           backend: str) -> None:
    mode, roll = BACKENDS[backend]
    first = roll(store, run_id="r", seed=7, progress=False)
    assert store.sql("SELECT count(*) AS n FROM steps WHERE mode IS NULL OR seed IS NULL")["n"][0].as_py() == 0
    assert lineage(store) == [{"mode": mode, "seed": 7}]
    if backend.startswith("gym"):  # env i of a vector env starts from seed + i: env_index tells them apart
        assert store.sql("SELECT list(DISTINCT env_index ORDER BY env_index) AS e FROM steps")["e"][0].as_py() == \
            [0, 1]
    version, steps = store.version, first.steps

    with pytest.raises(trajstore.InputError, match=r"^run_id: run 'r' already holds steps in .*; add to it with "
                                                   r"append=True, or store these episodes under a new run id$"):
        roll(store, run_id="r", seed=8, progress=False)
    assert store.version == version  # nothing written

    second = roll(store, run_id="r", seed=8, progress=False, append=True)
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == steps + second.steps
    assert lineage(store) == [{"mode": mode, "seed": 7}, {"mode": mode, "seed": 8}]
    ids = store.episodes(run_id="r")["episode_id"].to_pylist()
    assert len(ids) == len(set(ids))
    if mode == "eval":  # exactly N more
        assert store.stats(run_id="r")["n_traj"][0].as_py() == 6


def test_training_and_evaluation_stay_apart_even_when_appending(store: trajstore.Store) -> None:
    gym_rollout(store, "CartPole-v1", run_id="train", num_envs=2, steps=20, progress=False)
    gym_evaluate(store, "CartPole-v1", run_id="eval", num_envs=2, episodes=2, progress=False)
    with pytest.raises(trajstore.InputError, match="run 'train' already holds training"):
        jax_evaluate(store, "cartpole", run_id="train", episodes=2, num_envs=2, append=True, progress=False)
    with pytest.raises(trajstore.InputError, match="run 'eval' already holds evaluation"):
        gym_rollout(store, "CartPole-v1", run_id="eval", steps=20, append=True, progress=False)


def test_a_writer_never_refuses_a_run(store: trajstore.Store) -> None:
    """Many writers (a rollout's workers, recorders) share one run by design: only rollouts check."""
    import numpy as np

    rng = np.random.default_rng(0)
    for _ in range(2):
        with store.writer(run_id="shared", env_id="Toy-v0") as w:
            w.add_batch(make_batch(rng, 10, 2))
    assert store.sql("SELECT count(*) AS n FROM steps")["n"][0].as_py() == 40


@pytest.mark.parametrize("backend", list(BACKENDS))
def test_a_run_id_no_writer_takes_is_refused_before_rolling_out(store: trajstore.Store, backend: str) -> None:
    """The one run-id check of every write path (issue 47: ingest refused ``" "`` and ``"a\\nb"``, other paths
    did not), made by every rollout before it steps an env."""
    _, roll = BACKENDS[backend]
    for run_id, problem in ((" ", "whitespace at either end"), ("a\nb", r"it holds '\\n'"), ("a/b", "it holds '/'")):
        with pytest.raises(trajstore.InputError, match=f"^run_id must be a non-empty string .*: {problem}"):
            roll(store, run_id=run_id, seed=1, progress=False)
    assert store.maintain.files() == []
