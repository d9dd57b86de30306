"""The JAX rollout worker: whole episodes across scans, returns equal to the JAX loop's for the same keys,
true final observations, extras and lineage, stop rules, evaluation mode and the CLI.

Every test reuses a few (env, policy, B, T) configurations, so each jitted scan compiles once per session.
"""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import Any

import jax
import jax.numpy as jnp
import numpy as np
import pyarrow.parquet as pq
import pytest
from gymnasium import spaces

import trajstore
from tests.helpers import stored_episodes
from trajstore.cli import main
from trajstore.errors import InputError
from trajstore.rollout import jax_rollout
from trajstore.rollout.envs import CartPole, FunctionalAdapter, Pendulum
from trajstore.rollout.jax_scan import make_scan, random_policy

X_LIMIT, THETA_LIMIT = 2.4, 12 * 2 * np.pi / 360
GAIN = jnp.float32(0.5)  # with this gain `balance` keeps the pole up for 150-500 steps


def balance(params: Any, obs: jax.Array, key: jax.Array) -> tuple[jax.Array, dict[str, jax.Array]]:
    """Push towards the side the pole falls to; long episodes, some terminated, some truncated at 500."""
    theta, theta_dot = obs[:, 2], obs[:, 3]
    action = (params * theta + theta_dot > 0).astype(jnp.int32)
    return action, {"log_prob": jnp.full(obs.shape[0], jnp.log(0.5), jnp.float32), "value": theta}


def steps_table(store: trajstore.Store, run_id: str) -> dict[str, np.ndarray]:
    cols = store.sql("SELECT * EXCLUDE (obs, next_obs), obs, next_obs FROM steps "
                     f"WHERE run_id = '{run_id}' ORDER BY episode_id, step").to_pydict()
    return {k: np.array(v) for k, v in cols.items()}


def jax_loop_episodes(env: Any, policy: Any, params: Any, *, B: int, T: int, seed: int, scans: int
                      ) -> tuple[dict[int, list[tuple[float, int]]], list[tuple[float, int]]]:
    """The oracle: the same jitted scan from the same key, cut into episodes by a plain loop.

    Returns the episodes per env and, in (time, env) order, as the rollout reports them.
    """
    scan = make_scan(env, policy, num_envs=B, rollout_length=T)
    carry = scan.init(jax.random.PRNGKey(seed), jnp.ones(B, bool))
    rewards, dones = [], []
    for _ in range(scans):
        carry, batch, _ = scan.run(params, carry)
        rewards.append(np.asarray(batch["reward"], np.float64))
        dones.append(np.asarray(batch["terminated"] | batch["truncated"]))
    reward, done = np.concatenate(rewards), np.concatenate(dones)
    per_env: dict[int, list[tuple[float, int]]] = {}
    in_order: list[tuple[float, int]] = []
    ret, length = np.zeros(B), np.zeros(B, int)
    for t in range(len(reward)):
        for b in range(B):
            ret[b] += reward[t, b]
            length[b] += 1
            if done[t, b]:
                per_env.setdefault(b, []).append((ret[b], int(length[b])))
                in_order.append((ret[b], int(length[b])))
                ret[b], length[b] = 0.0, 0
    return per_env, in_order


@pytest.fixture(scope="module")
def balanced(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    """8 envs x 16 steps per scan, 80 scans: episodes of 150-500 steps cross 10-32 scans."""
    store = trajstore.open(tmp_path_factory.mktemp("balanced") / "store", create=True)
    jax_rollout(store, CartPole(), run_id="bal", policy=balance, params=GAIN, num_envs=8, rollout_length=16,
                steps=8 * 16 * 80, seed=5, policy_version=3, worker_id="w-1", progress=False)
    return store


@pytest.fixture(scope="module")
def random_run(tmp_path_factory: pytest.TempPathFactory) -> tuple[trajstore.Store, Any]:
    """The default uniform policy, 64 envs x 16 steps, 30 scans: ~1,300 short episodes."""
    store = trajstore.open(tmp_path_factory.mktemp("random") / "store", create=True)
    result = jax_rollout(store, "cartpole", run_id="rnd", num_envs=64, rollout_length=16, steps=64 * 16 * 30,
                         seed=11, progress=False)
    return store, result


@pytest.fixture
def random_copy(random_run: tuple[trajstore.Store, Any], tmp_path: Path) -> trajstore.Store:
    """A copy of ``random_run``'s store, for a test that adds runs to it (the module's store stays as made)."""
    shutil.copytree(random_run[0].root, tmp_path / "store")
    return trajstore.open(tmp_path / "store")


def test_episodes_spanning_many_scans_come_out_whole(balanced: trajstore.Store) -> None:
    s = steps_table(balanced, "bal")
    eps = balanced.episodes(run_id="bal").to_pylist()
    assert max(e["episode_length"] for e in eps if e["complete"]) > 10 * 16  # many scans per episode
    assert {e["episode_length"] for e in eps if e["truncated"]} == {500}
    assert any(e["terminated"] for e in eps)
    for e in eps:
        rows = s["episode_id"] == e["episode_id"]
        np.testing.assert_array_equal(s["step"][rows], np.arange(rows.sum()))  # contiguous from 0
        assert len(set(s["env_index"][rows])) == 1
        ends = s["terminated"][rows] | s["truncated"][rows]
        assert not ends[:-1].any() and ends[-1] == e["complete"]
        np.testing.assert_array_equal(s["next_obs"][rows][:-1], s["obs"][rows][1:])  # one trajectory
    assert len(s["step"]) == 8 * 16 * 80


@pytest.mark.parametrize("env, policy, params, B", [(CartPole(), None, None, 64), (CartPole(), balance, GAIN, 8),
                                                    (Pendulum(), None, None, 8)],
                         ids=["cartpole", "balance", "pendulum"])
def test_stored_returns_and_lengths_equal_the_jax_loop(store: trajstore.Store, env: Any, policy: Any,
                                                       params: Any, B: int) -> None:
    T, scans, seed = 16, 40, 2
    result = jax_rollout(store, env, run_id="r", policy=policy, params=params, num_envs=B, rollout_length=T,
                         steps=B * T * scans, seed=seed, progress=False)
    per_env, in_order = jax_loop_episodes(env, policy, params, B=B, T=T, seed=seed, scans=scans)
    stored = stored_episodes(store, "r")
    assert stored.keys() == per_env.keys() and result.episodes == len(in_order) > 0
    for b in per_env:
        np.testing.assert_allclose([r for r, _ in stored[b]], [r for r, _ in per_env[b]], rtol=1e-9)
        assert [n for _, n in stored[b]] == [n for _, n in per_env[b]]
    # the sums the rollout computed inside its scan (float32), in the order the episodes ended
    np.testing.assert_allclose(result.episode_returns, [r for r, _ in in_order], rtol=1e-5)
    np.testing.assert_array_equal(result.episode_lengths, [n for _, n in in_order])


def test_next_obs_at_terminal_steps_is_the_true_final_state(random_run: tuple[trajstore.Store, Any]) -> None:
    store, _ = random_run
    s = steps_table(store, "rnd")
    final = s["next_obs"][s["terminated"]]
    assert len(final) > 1000
    assert np.all((np.abs(final[:, 0]) > X_LIMIT) | (np.abs(final[:, 2]) > THETA_LIMIT))
    assert np.all(np.abs(s["obs"][s["step"] == 0]) <= 0.05)  # the reset observation starts the next episode
    same = s["episode_id"][1:] == s["episode_id"][:-1]
    np.testing.assert_array_equal(s["next_obs"][:-1][same], s["obs"][1:][same])


def test_extras_and_lineage_land_in_their_columns(balanced: trajstore.Store) -> None:
    s = steps_table(balanced, "bal")
    np.testing.assert_allclose(s["log_prob"], np.log(0.5), rtol=1e-6)
    np.testing.assert_array_equal(s["value"], s["obs"][:, 2])  # the policy's value extra: theta of obs
    types = balanced.sql("SELECT log_prob, value, policy_version, seed FROM steps LIMIT 0").schema
    assert [str(t) for t in types.types] == ["float", "float", "int64", "int64"]
    assert set(s["policy_version"]) == {3} and set(s["seed"]) == {5}
    assert set(s["worker_id"]) == {"w-1"} and set(s["mode"]) == {"train"}
    assert sorted(set(s["env_index"])) == list(range(8))
    eps = balanced.sql("SELECT DISTINCT policy_version, seed, worker_id, mode FROM episodes").to_pylist()
    assert eps == [{"policy_version": 3, "seed": 5, "worker_id": "w-1", "mode": "train"}]


@pytest.mark.parametrize("limits", [{"steps": 1000}, {"episodes": 50}, {"steps": 3000, "episodes": 150}])
def test_sample_until_stops_at_the_first_vector_step_meeting_the_rule(store: trajstore.Store,
                                                                      limits: dict[str, int]) -> None:
    B = 64
    result = jax_rollout(store, "cartpole", run_id="u", num_envs=B, rollout_length=16, seed=1, progress=False,
                         **limits)

    def rule(episodes: int, steps: int) -> bool:
        return episodes >= limits.get("episodes", 0) and steps >= limits.get("steps", 0)

    n = store.sql("SELECT count(*) AS n FROM steps").column("n")[0].as_py()
    assert n == result.steps and n % B == 0  # whole vector steps, every one stored
    assert store.stats(run_id="u").column("n_traj")[0].as_py() == result.episodes
    # the vector step (time index within each env) at which each complete episode ended
    ends = store.sql("SELECT t, count(*) AS n FROM (SELECT terminated OR truncated AS done, row_number() OVER "
                     "(PARTITION BY env_index ORDER BY episode_id, step) - 1 AS t FROM steps) WHERE done "
                     "GROUP BY t").to_pydict()
    last = n // B - 1
    ended_last = dict(zip(ends["t"], ends["n"])).get(last, 0)
    assert rule(result.episodes, result.steps)
    assert not rule(result.episodes - ended_last, result.steps - B)  # one vector step earlier it did not hold


@pytest.mark.slow
def test_evaluation_runs_exactly_n_complete_deterministic_episodes(random_copy: trajstore.Store) -> None:
    store = random_copy
    train_before = store.stats(run_id="rnd").to_pylist()
    kwargs = dict(policy=balance, params=GAIN, episodes=37, num_envs=16, rollout_length=16, seed=4,
                  max_episode_steps=120, progress=False)
    first = jax_rollout(store, "cartpole", run_id="eval-a", mode="eval", **kwargs)
    second = jax_rollout(store, "cartpole", run_id="eval-b", mode="eval", **kwargs)
    assert first.episodes == second.episodes == 37
    a, b = steps_table(store, "eval-a"), steps_table(store, "eval-b")
    for name in ("obs", "action", "reward", "terminated", "truncated", "step", "env_index"):
        np.testing.assert_array_equal(a[name], b[name])  # same seed and params, same episodes
    eps = store.episodes(run_id="eval-a").to_pylist()
    assert len(eps) == 37 and all(e["complete"] for e in eps)
    assert all(e["episode_length"] <= 120 for e in eps) and any(e["episode_length"] == 120 for e in eps)
    assert {e["mode"] for e in eps} == {"eval"}
    for e in eps:
        rows = a["episode_id"] == e["episode_id"]
        np.testing.assert_array_equal(a["step"][rows], np.arange(rows.sum()))
    np.testing.assert_allclose(sorted(first.episode_returns), sorted(e["episode_return"] for e in eps))
    # stored apart: training statistics unchanged, and grouping by mode separates the two
    assert store.stats(run_id="rnd").to_pylist()[0] == pytest.approx(train_before[0], rel=1e-12)
    modes = {r["mode"]: r["n_traj"] for r in store.stats(by="mode").to_pylist()}
    assert modes["eval"] == 74 and modes["train"] == train_before[0]["n_traj"]
    with pytest.raises(InputError, match="own run_id"):
        jax_rollout(store, "cartpole", run_id="rnd", mode="eval", **kwargs)
    with pytest.raises(InputError, match="own run_id"):
        jax_rollout(store, "cartpole", run_id="eval-a", steps=100, num_envs=64, rollout_length=16, progress=False)


def test_evaluation_needs_a_time_limit_and_episodes(store: trajstore.Store) -> None:
    with pytest.raises(InputError, match="max_episode_steps"):
        jax_rollout(store, Pendulum(max_episode_steps=None), run_id="e", mode="eval", episodes=3, progress=False)
    with pytest.raises(InputError, match="give episodes=N"):
        jax_rollout(store, "cartpole", run_id="e", mode="eval", progress=False)
    with pytest.raises(InputError, match="steps= does not apply"):
        jax_rollout(store, "cartpole", run_id="e", mode="eval", episodes=3, steps=10, progress=False)


def test_autoreset_gives_every_ended_env_a_fresh_reset() -> None:
    """With a reset budget of 1, steps where several envs end take the all-envs branch; both must reset."""
    B = 16
    scan = make_scan(CartPole(), None, num_envs=B, rollout_length=32, reset_budget=1)
    carry = scan.init(jax.random.PRNGKey(3), jnp.ones(B, bool))
    multi_end_steps = 0
    for _ in range(4):
        carry, batch, _ = scan.run(None, carry)
        batch = jax.device_get(batch)
        done = batch["terminated"] | batch["truncated"]
        multi_end_steps += int((done.sum(axis=1) > 1).sum())
        t, b = np.nonzero(done[:-1])
        first = batch["obs"][t + 1, b]
        assert np.all(np.abs(first) <= 0.05)  # the next step starts from a reset state
        assert len(np.unique(first, axis=0)) == len(first)  # each with its own key
        assert not np.any(np.all(batch["next_obs"][t, b] == first, axis=1))
    assert multi_end_steps > 0


@pytest.mark.parametrize("space, values", [(spaces.Discrete(2), [0, 1]), (spaces.Discrete(4, start=1), [1, 2, 3, 4]),
                                           (spaces.Discrete(3), [0, 1, 2])])
def test_random_policy_is_uniform_over_a_discrete_space(space: spaces.Discrete, values: list[int]) -> None:
    actions = np.asarray(random_policy(space)(None, jnp.zeros((30_000, 1)), jax.random.PRNGKey(0)))
    counts = np.array([(actions == v).sum() for v in values])
    assert counts.sum() == len(actions)  # nothing outside the space
    expected = len(actions) / len(values)
    assert np.all(np.abs(counts - expected) < 5 * np.sqrt(expected))


def test_random_policy_for_boxes_and_binary_spaces() -> None:
    key, obs = jax.random.PRNGKey(1), jnp.zeros((5_000, 3))
    box = np.asarray(random_policy(spaces.Box(-2, np.array([1, 3], np.float32)))(None, obs, key))
    assert box.shape == (5_000, 2) and box.dtype == np.float32
    assert np.all((box >= -2) & (box <= [1, 3])) and np.all(box.min(0) < -1.9) and np.all(box.max(0) > [0.9, 2.9])
    bits = np.asarray(random_policy(spaces.MultiBinary(3))(None, obs, key))
    assert bits.shape == (5_000, 3) and set(np.unique(bits)) == {0, 1} and abs(bits.mean() - 0.5) < 0.03
    with pytest.raises(InputError, match="bounded action space"):
        random_policy(spaces.Box(-np.inf, np.inf, (2,)))


def test_policy_errors_and_writer_errors_reach_the_caller(store: trajstore.Store) -> None:
    def wrong_shape(params: Any, obs: jax.Array, key: jax.Array) -> jax.Array:
        return jnp.zeros(3, jnp.int32)

    with pytest.raises(InputError, match="leading axis of B=8"):
        jax_rollout(store, "cartpole", run_id="x", policy=wrong_shape, num_envs=8, steps=10, progress=False)
    with pytest.raises(InputError, match="unknown JAX environment"):
        jax_rollout(store, "no-such-env", run_id="x", steps=10, progress=False)

    def nan_at_step_20(state: jax.Array, action: jax.Array, key: jax.Array) -> tuple[Any, ...]:
        reward = jnp.where(state == 20, jnp.nan, 1.0)
        return state + 1, jnp.stack([state + 1.0]), reward, state >= 30, {}

    counter = FunctionalAdapter(lambda key: (jnp.int32(0), jnp.zeros(1)), nan_at_step_20,
                                spaces.Box(-np.inf, np.inf, (1,), np.float32), spaces.Discrete(2), None, "Counter")
    with pytest.raises(InputError, match="reward must be finite"):
        jax_rollout(store, counter, run_id="nan", num_envs=4, rollout_length=8, steps=4 * 8 * 10, progress=False)


def test_cli_rollout_with_the_jax_backend(tmp_path: Path, capsys: pytest.CaptureFixture[str]) -> None:
    path = tmp_path / "cli-store"
    code = main(["rollout", "--backend", "jax", "--env", "cartpole", "--num-envs", "64", "--steps", "20000",
                 "--rollout-length", "16", "--store", str(path), "--run", "jax-cli", "--seed", "7",
                 "--policy-version", "2", "--no-progress"])
    out = capsys.readouterr().out
    assert code == 0 and "complete episodes of CartPole-v1 as run 'jax-cli'" in out
    store = trajstore.open(path)
    row = store.sql("SELECT count(*) n, min(seed) s, min(policy_version) v, min(mode) m FROM steps").to_pylist()[0]
    assert 20000 <= row["n"] < 20000 + 64 and row["s"] == 7 and row["v"] == 2 and row["m"] == "train"
    assert main(["rollout", "--backend", "jax", "--env", "nope", "--steps", "10", "--store", str(path),
                 "--run", "x"]) == 2
    assert "unknown JAX environment 'nope'" in capsys.readouterr().err


def stacking_env(k: int = 4) -> FunctionalAdapter:
    """A JAX env whose observation is the stack of its last ``k`` frames (newest last; at a reset, the first
    frame k times, as FrameStackObservation pads): frames of 3 floats wander until one leaves [-1, 1]."""

    def reset_fn(key: jax.Array) -> tuple[jax.Array, jax.Array]:
        stack = jnp.broadcast_to(jax.random.uniform(key, (3,), minval=-0.5, maxval=0.5), (k, 3))
        return stack, stack

    def step_fn(stack: jax.Array, action: jax.Array, key: jax.Array) -> tuple[Any, ...]:
        frame = stack[-1] + 0.1 * jax.random.normal(key, (3,)) + 0.05 * (action - 0.5)
        stack = jnp.concatenate([stack[1:], frame[None]])
        return stack, stack, -jnp.abs(frame).sum(), jnp.abs(frame).max() > 1.0, {}

    return FunctionalAdapter(reset_fn, step_fn, spaces.Box(-np.inf, np.inf, (k, 3), np.float32), spaces.Discrete(2),
                             max_episode_steps=30, name="stacked")


def test_frame_stack_stores_each_frame_once_and_reads_back_the_same(store: trajstore.Store) -> None:
    env = stacking_env()
    for run, frame_stack in (("whole", None), ("stacked", {"obs": 4})):
        jax_rollout(store, env, run_id=run, num_envs=8, rollout_length=16, steps=8 * 16 * 6, seed=2,
                    frame_stack=frame_stack, progress=False)
    read = {run: store.scan(["episode_id", "step", "obs", "next_obs", "terminated", "truncated"],
                            run_id=run).read_all().sort_by([("episode_id", "ascending"), ("step", "ascending")])
            for run in ("whole", "stacked")}
    assert read["stacked"].drop_columns("episode_id").equals(read["whole"].drop_columns("episode_id"))
    ends = read["whole"]
    assert pa_any(ends["terminated"]) and pa_any(ends["truncated"])
    sizes = {}
    for f in store.maintain.files():
        meta = pq.ParquetFile(f.path, filesystem=f.fs).metadata
        sizes[f.run_id] = sizes.get(f.run_id, 0) + sum(
            meta.row_group(g).column(c).total_uncompressed_size for g in range(meta.num_row_groups)
            for c in range(meta.num_columns) if meta.row_group(g).column(c).path_in_schema.startswith("obs"))
    assert sizes["stacked"] < 0.5 * sizes["whole"]


def pa_any(column: Any) -> bool:
    return bool(np.asarray(column.to_numpy()).any())
