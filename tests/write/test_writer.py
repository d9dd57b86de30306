"""The writer: numpy and JAX input, add_step, extras and lineage, spaces, flush/close, bounded memory, bad input."""

from __future__ import annotations

from datetime import datetime, timezone
from typing import Any, Callable

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gymnasium import spaces

import trajstore
from tests.helpers import make_batch, slice_batch, steps_table
from trajstore.errors import InputError, SchemaMismatchError, WriterClosedError
from trajstore.store import plumbing

ALL_STEPS = "SELECT * EXCLUDE (wall_time) FROM steps ORDER BY episode_id, step"


def env_major(x: np.ndarray, keep: np.ndarray | None = None) -> np.ndarray:
    """A (T, B, …) array in the order the steps of one episode per env come back: env by env, in time."""
    out = np.swapaxes(np.asarray(x), 0, 1).reshape(-1, *np.shape(x)[2:])
    return out if keep is None else out[np.swapaxes(keep, 0, 1).reshape(-1)]


def steps_by_env(store: trajstore.Store, columns: str = "*") -> pa.Table:
    return store.sql(f"SELECT {columns} FROM steps ORDER BY env_index, episode_id, step")


# --- values land where they belong ----------------------------------------------------------------------

def test_add_batch_numpy_round_trip(store: trajstore.Store) -> None:
    batch = make_batch(np.random.default_rng(0), 6, 3, p_terminated=0, p_truncated=0)
    with store.writer(run_id="r", env_id="e") as w:
        assert w.add_batch(batch) == 18
    got = steps_by_env(store)
    np.testing.assert_array_equal(np.stack(got["obs"].to_numpy(zero_copy_only=False)), env_major(batch["obs"]))
    np.testing.assert_array_equal(np.stack(got["next_obs"].to_numpy(zero_copy_only=False)),
                                  env_major(batch["next_obs"]))
    np.testing.assert_array_equal(got["action"].to_numpy(), env_major(batch["action"]))
    np.testing.assert_array_equal(got["reward"].to_numpy(), env_major(batch["reward"]))
    assert got["env_index"].to_pylist() == [b for b in range(3) for _ in range(6)]
    assert got["step"].to_pylist() == list(range(6)) * 3
    assert got["run_id"].unique().to_pylist() == ["r"] and got["env_id"].unique().to_pylist() == ["e"]


def test_add_batch_jax_arrays(store: trajstore.Store) -> None:
    jnp = pytest.importorskip("jax.numpy")
    batch = make_batch(np.random.default_rng(1), 5, 2, p_terminated=0.3)
    jbatch = {k: jnp.asarray(v) for k, v in batch.items()}
    assert isinstance(jbatch["obs"], type(jnp.zeros(1)))
    with store.writer(run_id="r", env_id="e") as w:
        w.add_batch(jbatch)
    got = steps_by_env(store)
    assert got.num_rows == 10
    np.testing.assert_array_equal(np.stack(got["obs"].to_numpy(zero_copy_only=False)), env_major(batch["obs"]))
    np.testing.assert_array_equal(got["reward"].to_numpy(), env_major(batch["reward"]))
    assert got["terminated"].to_pylist() == env_major(batch["terminated"]).tolist()


def test_add_step_equals_add_batch(tmp_path: Any) -> None:
    batch = make_batch(np.random.default_rng(2), 12, 3, p_terminated=0.2, p_truncated=0.1)
    a = trajstore.open(tmp_path / "a", create=True)
    b = trajstore.open(tmp_path / "b", create=True)
    with a.writer(run_id="r", env_id="e") as w:
        w.add_batch(batch)
    with b.writer(run_id="r", env_id="e") as w:
        for t in range(12):
            assert w.add_step(**{k: v[t] for k, v in batch.items()}) == 3
    q = ("SELECT s.env_index, step, reward, action, s.terminated, s.truncated, episode_length FROM steps s "
         "JOIN episodes USING (episode_id) ORDER BY s.env_index, reward")
    assert a.sql(q).equals(b.sql(q))
    assert a.episodes().num_rows == b.episodes().num_rows > 3


def test_extras_and_lineage_land_in_their_columns(store: trajstore.Store) -> None:
    rng = np.random.default_rng(3)
    T, B = 4, 3
    log_prob = rng.standard_normal((T, B))
    value = rng.standard_normal((T, B)).astype(np.float32)
    hidden = rng.standard_normal((T, B, 2)).astype(np.float32)
    batch = make_batch(rng, T, B, p_terminated=0, p_truncated=0,
                       extras={"log_prob": log_prob, "value": value, "hidden": hidden})
    with store.writer(run_id="r", env_id="e", policy_version=7, seed=np.array([10, 11, 12]),
                      worker_id="w-1", mode="eval") as w:
        w.add_batch(batch)
    got = steps_by_env(store)
    assert got["policy_version"].to_pylist() == [7] * 12
    assert got["seed"].to_pylist() == [10] * 4 + [11] * 4 + [12] * 4
    assert got["worker_id"].to_pylist() == ["w-1"] * 12
    assert got["mode"].to_pylist() == ["eval"] * 12
    assert got["env_index"].to_pylist() == [0] * 4 + [1] * 4 + [2] * 4
    np.testing.assert_allclose(got["log_prob"].to_numpy(), env_major(log_prob), rtol=1e-6)
    np.testing.assert_array_equal(got["value"].to_numpy(), env_major(value))
    np.testing.assert_array_equal(np.stack(got["hidden"].to_numpy(zero_copy_only=False)), env_major(hidden))
    eps = store.episodes(order_by="env_index").to_pylist()
    assert [(e["env_index"], e["seed"], e["policy_version"], e["worker_id"]) for e in eps] == \
        [(0, 10, 7, "w-1"), (1, 11, 7, "w-1"), (2, 12, 7, "w-1")]


def test_policy_version_per_step_as_an_extra(store: trajstore.Store) -> None:
    batch = make_batch(np.random.default_rng(4), 3, 2, p_terminated=0, p_truncated=0,
                       extras={"policy_version": np.array([[1, 1], [2, 2], [3, 3]])})
    with store.writer(run_id="r", env_id="e") as w:
        w.add_batch(batch)
    assert steps_by_env(store, "policy_version")["policy_version"].to_pylist() == [1, 2, 3, 1, 2, 3]
    assert store.episodes()["policy_version"].to_pylist() == [1, 1]  # the episode's first step


def test_dict_observation_space_is_a_struct_column(store: trajstore.Store) -> None:
    space = spaces.Dict({"pos": spaces.Box(-1, 1, (2,), np.float32), "grid": spaces.Box(0, 9, (2, 3), np.int64),
                         "mode": spaces.Discrete(3)})
    rng = np.random.default_rng(5)
    T, B = 3, 2
    obs = {"pos": rng.uniform(-1, 1, (T, B, 2)).astype(np.float32), "grid": rng.integers(0, 9, (T, B, 2, 3)),
           "mode": rng.integers(0, 3, (T, B))}
    batch = make_batch(rng, T, B, p_terminated=0, p_truncated=0)
    batch["obs"] = batch["next_obs"] = obs
    with store.writer(run_id="r", env_id="e", observation_space=space, action_space=spaces.Discrete(4)) as w:
        w.add_batch(batch)
    schema = store.schema()  # what readers get (next_obs is stored only where it is not the next obs)
    # gymnasium's Dict orders its keys by name
    assert schema.field("obs").type == pa.struct([("grid", pa.list_(pa.list_(pa.int64(), 3), 2)),
                                                  ("mode", pa.int64()), ("pos", pa.list_(pa.float32(), 2))])
    assert schema.field("next_obs").type == schema.field("obs").type
    got = store.sql("SELECT obs.pos AS pos, obs.grid AS grid, obs.mode AS mode FROM steps "
                    "ORDER BY env_index, step")
    np.testing.assert_array_equal(np.stack(got["pos"].to_numpy(zero_copy_only=False)), env_major(obs["pos"]))
    grid = np.array(got["grid"].to_pylist())
    np.testing.assert_array_equal(grid, env_major(obs["grid"]))
    np.testing.assert_array_equal(got["mode"].to_numpy(), env_major(obs["mode"]))


@pytest.mark.parametrize(("space", "action", "expected"), [
    (spaces.Discrete(5), lambda rng, T, B: rng.integers(0, 5, (T, B)), pa.int64()),
    (spaces.Box(-2, 2, (3,), np.float64), lambda rng, T, B: rng.uniform(-2, 2, (T, B, 3)),
     pa.list_(pa.float64(), 3)),
    (spaces.MultiDiscrete([3, 4]), lambda rng, T, B: rng.integers(0, 3, (T, B, 2)), pa.list_(pa.int64(), 2)),
])
def test_action_spaces(store: trajstore.Store, space: Any, action: Callable[..., np.ndarray],
                       expected: pa.DataType) -> None:
    rng = np.random.default_rng(6)
    batch = make_batch(rng, 4, 2, obs_dim=4)
    batch["action"] = action(rng, 4, 2)
    obs_space = spaces.Box(-np.inf, np.inf, (4,), np.float32)
    with store.writer(run_id="r", env_id="e", observation_space=obs_space, action_space=space) as w:
        w.add_batch(batch)
    schema = pq.read_schema(store.maintain.files()[0].path)
    assert schema.field("action").type == expected
    assert schema.field("obs").type == pa.list_(pa.float32(), 4)
    got = np.array(steps_by_env(store, "action")["action"].to_pylist())
    np.testing.assert_allclose(got, env_major(batch["action"]), rtol=1e-6)


def test_declared_space_refuses_other_shapes(store: trajstore.Store) -> None:
    batch = make_batch(np.random.default_rng(7), 2, 2, obs_dim=3)
    with store.writer(run_id="r", env_id="e", observation_space=spaces.Box(0, 1, (4,), np.float32)) as w:
        with pytest.raises(SchemaMismatchError, match=r"obs: expected shape \(4,\) float32 per step"):
            w.add_batch(batch)
    assert store.maintain.files() == []


# --- where and when: env_steps and wall_time ---------------------------------------------------------------

def test_every_row_records_its_position_and_time(store: trajstore.Store) -> None:
    """env_steps is (t + 1)·B for the writer's global time index t (every index counts: masked steps, gymnasium's
    reset steps, add_step calls); wall_time never decreases along t, within a call or across calls."""
    rng = np.random.default_rng(20)
    B, sizes = 3, [5, 1, 7, 1, 4]
    T = sum(sizes)
    valid = rng.random((T, B)) < 0.8
    batch = make_batch(rng, T, B, p_terminated=0.2, p_truncated=0.05, valid=valid,
                       extras={"t": np.repeat(np.arange(T)[:, None], B, axis=1)})
    opened = datetime.now(timezone.utc)
    with store.writer(run_id="r", env_id="e", autoreset="next-step") as w:
        for a, b in zip(np.cumsum([0, *sizes[:-1]]), np.cumsum(sizes)):
            part = slice_batch(batch, a, b)
            if b - a == 1:
                w.add_step(**{k: v[0] for k, v in part.items() if k not in ("extras", "valid")},
                           valid=part["valid"][0], extras={"t": part["extras"]["t"][0]})
            else:
                w.add_batch(part)
    closed = datetime.now(timezone.utc)
    got = store.sql("SELECT t, env_steps, wall_time FROM steps ORDER BY t, env_index").to_pylist()
    assert 0 < len(got) < T * B  # some steps masked, some dropped as reset steps
    assert [r["env_steps"] for r in got] == [(r["t"] + 1) * B for r in got]
    times = [r["wall_time"] for r in got]
    assert times == sorted(times) and opened <= times[0] and times[-1] <= closed
    assert all(x["wall_time"] == y["wall_time"] for x, y in zip(got, got[1:]) if x["t"] == y["t"])
    last = store.sql("SELECT episode_id, max(t) AS t FROM steps GROUP BY episode_id").to_pylist()
    env_steps = {e["episode_id"]: e["env_steps"] for e in store.episodes().to_pylist()}
    assert env_steps == {e["episode_id"]: (e["t"] + 1) * B for e in last}


def test_wall_time_is_spread_evenly_over_the_time_indices_of_a_call(store: trajstore.Store) -> None:
    rng = np.random.default_rng(21)
    with store.writer(run_id="r", env_id="e") as w:
        w._last_us -= 1_000_000  # as if opened a second earlier: the call's 50 indices share that second
        w.add_batch(make_batch(rng, 50, 2))
    per_t = store.sql("SELECT env_steps, min(wall_time) AS lo, max(wall_time) AS hi FROM steps "
                      "GROUP BY env_steps ORDER BY env_steps").to_pylist()
    assert len(per_t) == 50 and all(r["lo"] == r["hi"] for r in per_t)  # one time per index
    gaps = [(b["lo"] - a["lo"]).total_seconds() * 1e6 for a, b in zip(per_t, per_t[1:])]
    assert min(gaps) >= 1_000_000 / 50 - 1 and max(gaps) - min(gaps) <= 1  # evenly, over at least the second


def test_a_new_writer_counts_from_zero(store: trajstore.Store) -> None:
    rng = np.random.default_rng(22)
    for _ in range(2):
        with store.writer(run_id="r", env_id="e") as w:
            w.add_batch(make_batch(rng, 4, 2))
    counts = store.sql("SELECT env_steps, count(*) AS n FROM steps GROUP BY ALL ORDER BY ALL").to_pylist()
    assert counts == [{"env_steps": 2 * (t + 1), "n": 4} for t in range(4)]


# --- flush, close, bounded memory ------------------------------------------------------------------------

def test_flush_commits_running_episodes_and_the_next_batch_continues(store: trajstore.Store) -> None:
    rng = np.random.default_rng(8)
    with store.writer(run_id="r", env_id="e") as w:
        w.add_batch(make_batch(rng, 5, 2, p_terminated=0, p_truncated=0))
        w.flush()
        assert len(store.maintain.files()) == 1
        running = store.episodes(complete=False)
        assert running.num_rows == 2 and running["episode_length"].to_pylist() == [5, 5]
        assert store.stats()["n_traj"].to_pylist() == [0]
        last = make_batch(rng, 3, 2, p_terminated=0, p_truncated=0)
        last["terminated"][2] = True
        w.add_batch(last)
    assert len(store.maintain.files()) == 2
    eps = store.episodes().to_pylist()
    assert {e["episode_id"] for e in eps} == set(running["episode_id"].to_pylist())
    assert all(e["episode_length"] == 8 and e["complete"] and e["first_step"] == 0 and e["last_step"] == 7
               for e in eps)


def test_close_is_idempotent_and_writing_after_close_is_refused(store: trajstore.Store) -> None:
    batch = make_batch(np.random.default_rng(9), 2, 2)
    w = store.writer(run_id="r", env_id="e")
    w.add_batch(batch)
    w.close()
    w.close()
    assert len(store.maintain.files()) == 1
    with pytest.raises(WriterClosedError, match="closed"):
        w.add_batch(batch)
    with pytest.raises(WriterClosedError, match="closed"):
        w.add_step(**{k: v[0] for k, v in batch.items()})
    assert len(store.maintain.files()) == 1


def test_context_manager_commits_on_exit(store: trajstore.Store) -> None:
    with store.writer(run_id="r", env_id="e") as w:
        w.add_batch(make_batch(np.random.default_rng(10), 3, 2))
        assert store.maintain.files() == []  # nothing visible before a commit
    assert store.sql("SELECT count(*) AS n FROM steps")["n"].to_pylist() == [6]


def test_memory_is_bounded_while_an_episode_runs(store: trajstore.Store) -> None:
    rng = np.random.default_rng(11)
    counts = []
    with store.writer(run_id="r", env_id="e", flush_bytes=1024, upkeep=None) as w:  # one file per flush
        for _ in range(12):
            w.add_batch(make_batch(rng, 16, 2, p_terminated=0, p_truncated=0))
            counts.append(len(store.maintain.files()))
        assert w.open_episodes == 2
        assert counts[-1] >= 8  # every batch passed flush_bytes and was committed while the episodes ran
        assert counts == sorted(counts)
    assert len(store.maintain.files()) == 12
    eps = store.episodes(complete=False)
    assert eps["episode_length"].to_pylist() == [192, 192]
    assert eps["last_step"].to_pylist() == [191, 191]


def test_two_writers_never_share_episode_ids(store: trajstore.Store) -> None:
    rng = np.random.default_rng(12)
    for _ in range(3):
        with store.writer(run_id="r", env_id="e") as w:
            w.add_batch(make_batch(rng, 20, 4, p_terminated=0.3))
    ids = store.sql("SELECT episode_id, count(DISTINCT env_index) AS n_env, count(*) AS n, max(step) AS last "
                    "FROM steps GROUP BY episode_id")
    assert ids["n_env"].to_pylist() == [1] * ids.num_rows
    assert [n - 1 for n in ids["n"].to_pylist()] == ids["last"].to_pylist()


# --- bad input: refused before anything of the call is written -------------------------------------------

def _nan_reward(b: dict[str, Any]) -> None:
    b["reward"][2, 1] = np.nan


def _inf_reward(b: dict[str, Any]) -> None:
    b["reward"][1, 0] = -np.inf


def _float32_overflow(b: dict[str, Any]) -> None:
    b["reward"] = b["reward"].astype(np.float64)
    b["reward"][3, 1] = 1e300  # finite as float64, inf in the table's float32 column


def _obs_dim(b: dict[str, Any]) -> None:
    b["obs"] = np.zeros((4, 2, 5), np.float32)


def _obs_dtype(b: dict[str, Any]) -> None:
    b["obs"] = np.zeros((4, 2, 3), np.complex64)


def _action_dtype(b: dict[str, Any]) -> None:
    b["action"] = np.zeros((4, 2), np.float32)


def _obs_lead(b: dict[str, Any]) -> None:
    b["next_obs"] = np.zeros((4, 3, 3), np.float32)


def _b_mismatch(b: dict[str, Any]) -> None:
    for k in list(b):
        b[k] = np.concatenate([b[k], b[k][:, :1]], axis=1)


def _missing(b: dict[str, Any]) -> None:
    del b["next_obs"]


def _unknown(b: dict[str, Any]) -> None:
    b["log_prob"] = np.zeros((4, 2))


def _terminated_float(b: dict[str, Any]) -> None:
    b["terminated"] = b["terminated"].astype(np.float32)


def _terminated_int(b: dict[str, Any]) -> None:
    b["terminated"] = b["terminated"].astype(np.int64)


def _terminated_shape(b: dict[str, Any]) -> None:
    b["terminated"] = b["terminated"][:, :, None]


def _extras_shape(b: dict[str, Any]) -> None:
    b["extras"] = {"log_prob": np.zeros((3, 2))}


def _extras_reserved(b: dict[str, Any]) -> None:
    b["extras"] = {"episode_id": np.zeros((4, 2), np.int64)}


def _extras_env_steps(b: dict[str, Any]) -> None:
    b["extras"] = {"env_steps": np.zeros((4, 2), np.int64)}


def _extras_retyped(b: dict[str, Any]) -> None:
    b["extras"] = {"value": np.zeros((4, 2, 2), np.float32)}  # value is float32 per step in the schema


BAD_INPUTS = [
    (_nan_reward, InputError, r"reward must be finite.*nan at env 1, t=2"),
    (_inf_reward, InputError, r"reward must be finite.*-inf at env 0, t=1"),
    (_float32_overflow, InputError,
     r"reward must be finite \(as float, the table's reward type\): got 1e\+300 at env 1, t=3"),
    (_obs_dim, SchemaMismatchError, r"obs: expected shape \(3,\) float32 per step .*got shape \(5,\)"),
    (_obs_dtype, SchemaMismatchError, r"obs: expected shape \(3,\) float32 .*complex64"),
    (_action_dtype, SchemaMismatchError, r"action: expected shape \(\) int64 .*float32"),
    (_obs_lead, InputError, r"next_obs: expected leading dims \(T, B\) = \(4, 2\)"),
    (_b_mismatch, InputError, r"batch has B=3 envs but this writer was started with B=2"),
    (_missing, InputError, r"batch is missing \['next_obs'\]"),
    (_unknown, InputError, r"unknown keys \['log_prob'\]; put per-step extras under batch\['extras'\]"),
    (_terminated_float, InputError, r"terminated: expected a bool array, got dtype float32"),
    (_terminated_int, InputError, r"terminated: expected a bool array, got dtype int64"),
    (_terminated_shape, InputError, r"terminated: expected shape \(4, 2\)"),
    (_extras_shape, InputError, r"extras\.log_prob: expected leading dims \(T, B\) = \(4, 2\)"),
    (_extras_reserved, InputError, r"extras: 'episode_id' is a reserved column name"),
    (_extras_env_steps, InputError, r"extras: 'env_steps' is a reserved column name"),
    (_extras_retyped, SchemaMismatchError, r"value: expected shape \(\) float32 per step"),
]


NARROWER = [  # fields given 7 lanes beside the others' 8: the error names them, the majority's (T, B) is the batch's
    (("reward",), r"^reward: expected leading dims \(T, B\) = \(64, 8\) like obs, action, next_obs, terminated and "
                  r"truncated, got shape \(64, 7\)$"),
    (("obs",), r"^obs: expected leading dims \(T, B\) = \(64, 8\) like reward, action, next_obs, terminated and "
               r"truncated, got shape \(64, 7, 3\)$"),
    (("reward", "terminated"), r"^reward and terminated: expected leading dims \(T, B\) = \(64, 8\) like obs, action, "
                               r"next_obs and truncated, got shapes \(64, 7\), \(64, 7\)$"),
    (("obs", "action", "reward"), r"^reward, obs and action have leading dims \(64, 7\); next_obs, terminated and "
                                  r"truncated have leading dims \(64, 8\): the fields disagree on the batch's "
                                  r"leading dims \(T, B\)"),  # a tie: both groups named
]


@pytest.mark.parametrize(("narrow", "match"), NARROWER, ids=["+".join(n) for n, _ in NARROWER])
def test_a_shape_error_names_the_fields_that_differ_from_the_others(store: trajstore.Store, narrow: tuple[str, ...],
                                                                    match: str) -> None:
    batch = make_batch(np.random.default_rng(3), 64, 8)
    for name in narrow:
        batch[name] = batch[name][:, :7]
    with store.writer(run_id="r", env_id="e") as w:
        with pytest.raises(InputError, match=match):
            w.add_batch(batch)
        assert w.steps_written == 0
    assert store.sql("SELECT count(*) AS n FROM steps")["n"].to_pylist() == [0]


@pytest.mark.parametrize(("spoil", "error", "match"), BAD_INPUTS, ids=[f.__name__[1:] for f, _, _ in BAD_INPUTS])
def test_bad_input_is_refused_and_nothing_is_written(store: trajstore.Store, spoil: Callable[..., None],
                                                     error: type[Exception], match: str) -> None:
    rng = np.random.default_rng(13)
    with store.writer(run_id="r", env_id="e") as w:
        w.add_batch(make_batch(rng, 4, 2, p_terminated=0, p_truncated=0))
        w.flush()
        before = store.sql(ALL_STEPS)
        bad = make_batch(rng, 4, 2, p_terminated=0, p_truncated=0)
        spoil(bad)
        with pytest.raises(error, match=match):
            w.add_batch(bad)
        w.flush()
        assert store.sql(ALL_STEPS).equals(before)
        w.add_batch(make_batch(rng, 4, 2, p_terminated=0, p_truncated=0))  # the writer goes on as before
    after = store.sql(ALL_STEPS)
    assert after.num_rows == 16
    assert after.filter(pa.compute.less(after["step"], 4)).equals(before)
    assert sorted(set(after["env_steps"].to_pylist())) == [2 * (t + 1) for t in range(8)]  # the refused call's T
    assert sorted(store.episodes()["episode_length"].to_pylist()) == [8, 8]


def test_bad_step_is_refused_by_add_step(store: trajstore.Store) -> None:
    batch = make_batch(np.random.default_rng(14), 2, 3)
    with store.writer(run_id="r", env_id="e") as w:
        w.add_step(**{k: v[0] for k, v in batch.items()})
        step = {k: v[1].copy() for k, v in batch.items()}
        step["reward"][2] = np.nan
        with pytest.raises(InputError, match=r"reward must be finite.*at env 2, t=0"):
            w.add_step(**step)
    assert store.sql("SELECT count(*) AS n FROM steps")["n"].to_pylist() == [3]


def test_schema_of_the_store_is_enforced_across_writers(store: trajstore.Store) -> None:
    rng = np.random.default_rng(15)
    with store.writer(run_id="r", env_id="e") as w:
        w.add_batch(make_batch(rng, 4, 2, obs_dim=3))
    before = store.sql(ALL_STEPS)
    with store.writer(run_id="other", env_id="e") as w:
        with pytest.raises(SchemaMismatchError, match=r"obs: expected shape \(3,\) float32 per step \(the table's "
                                                      r"schema\), got shape \(4,\)"):
            w.add_batch(make_batch(rng, 4, 2, obs_dim=4))
    with pytest.raises(SchemaMismatchError, match=r"obs: the stored steps of env_id 'e' hold float32\[3\], but "
                                                  r"the given space needs float32\[4\]"):
        store.writer(run_id="other", env_id="e", observation_space=spaces.Box(0, 1, (4,), np.float32))
    assert store.sql(ALL_STEPS).equals(before)
    with store.writer(run_id="other", env_id="e") as w:  # the right shape is still accepted
        w.add_batch(make_batch(rng, 4, 2, obs_dim=3))
    assert store.sql("SELECT count(*) AS n FROM steps")["n"].to_pylist() == [16]


def test_a_refused_first_batch_does_not_fix_column_types(store: trajstore.Store) -> None:
    rng = np.random.default_rng(16)
    with store.writer(run_id="r", env_id="e") as w:
        bad = make_batch(rng, 3, 2, obs_dim=2)
        bad["reward"][0, 0] = np.nan
        with pytest.raises(InputError, match="reward"):
            w.add_batch(bad)
        spoiled = make_batch(rng, 3, 2, obs_dim=2, extras={"episode_id": np.zeros((3, 2))})
        with pytest.raises(InputError, match="reserved"):
            w.add_batch(spoiled)  # obs (2,) was seen here, but the call was refused
        w.add_batch(make_batch(rng, 3, 2, obs_dim=5))
    assert pq.read_schema(store.maintain.files()[0].path).field("obs").type == pa.list_(pa.float32(), 5)


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"run_id": "", "env_id": "e"}, r"run_id must be a non-empty string"),
    ({"run_id": "r", "env_id": " e"}, r"env_id must be a non-empty string without surrounding spaces"),
    ({"run_id": "r", "env_id": "e", "observation_space": spaces.Text(5)}, r"observation_space: unsupported"),
    ({"run_id": "r", "env_id": "e", "env_steps": 10}, r"env_steps: a column the writer fills itself"),
    ({"run_id": "r", "env_id": "e", "wall_time": 0}, r"wall_time: a column the writer fills itself"),
])
def test_bad_writer_options(store: trajstore.Store, kwargs: dict[str, Any], match: str) -> None:
    with pytest.raises(InputError, match=match):
        store.writer(**kwargs)


def test_lineage_of_wrong_shape_is_refused(store: trajstore.Store) -> None:
    with store.writer(run_id="r", env_id="e", seed=np.array([1, 2, 3])) as w:
        with pytest.raises(InputError, match=r"seed: a writer lineage value must be a scalar or one value per env "
                                             r"\(shape \(2,\)\), got shape \(3,\)"):
            w.add_batch(make_batch(np.random.default_rng(17), 2, 2))
    assert store.maintain.files() == []


def test_nan_reward_at_a_skipped_step_is_accepted(store: trajstore.Store) -> None:
    batch = make_batch(np.random.default_rng(18), 3, 2, p_terminated=0, p_truncated=0)
    batch["reward"][1, 0] = np.nan
    batch["valid"] = np.ones((3, 2), bool)
    batch["valid"][1, 0] = False  # e.g. a padded step of a finished env in a JAX scan
    with store.writer(run_id="r", env_id="e") as w:
        assert w.add_batch(batch) == 5
    got = store.sql("SELECT env_index, step, reward FROM steps ORDER BY env_index, step").to_pylist()
    assert [(r["env_index"], r["step"]) for r in got] == [(0, 0), (0, 1), (1, 0), (1, 1), (1, 2)]
    assert all(np.isfinite(r["reward"]) for r in got)


def test_environments_with_other_observation_shapes_share_a_store(store: trajstore.Store) -> None:
    rng = np.random.default_rng(0)
    for env_id, dim in (("Four-v0", 4), ("Six-v0", 6)):
        with store.writer(run_id="r", env_id=env_id) as w:
            w.add_batch(make_batch(rng, 20, 2, obs_dim=dim))
    dims = store.sql("SELECT env_id, min(len(obs)) lo, max(len(obs)) hi FROM steps GROUP BY env_id ORDER BY env_id")
    assert dims.to_pylist() == [{"env_id": "Four-v0", "lo": 4, "hi": 4}, {"env_id": "Six-v0", "lo": 6, "hi": 6}]
    with pytest.raises(trajstore.SchemaMismatchError, match=r"obs: expected shape \(4,\)"):
        with store.writer(run_id="r2", env_id="Four-v0") as w:
            w.add_batch(make_batch(rng, 5, 2, obs_dim=6))


def test_an_action_of_another_kind_is_stored_under_a_typed_column(store: trajstore.Store) -> None:
    """CartPole-like int64 actions and Pendulum-like float32[1] actions in one store: the second one goes to a
    typed column of the log, every reader shows it as ``action`` of its own type."""
    rng = np.random.default_rng(1)
    with store.writer(run_id="r", env_id="Discrete-v0") as w:
        w.add_batch(make_batch(rng, 10, 2))
    batch = make_batch(rng, 10, 2)
    batch["action"] = rng.normal(size=(10, 2, 1)).astype(np.float32)
    with store.writer(run_id="r", env_id="Box-v0") as w:
        w.add_batch(batch)
    log = {f.name: f.type for f in steps_table(store).log.read().schema}
    assert log["action"] == pa.int64() and log["action__float32_1d"] == pa.list_(pa.float32())
    assert store.schema("Box-v0").field("action").type == pa.list_(pa.float32(), 1)
    assert store.schema("Discrete-v0").field("action").type == pa.int64()
    got = store.scan(["action"], env_id="Box-v0").read_all()["action"]
    np.testing.assert_array_equal(np.stack(got.to_numpy(zero_copy_only=False)), env_major(batch["action"]))
    assert store.stats(by="env_id", include_incomplete=True)["env_id"].to_pylist() == ["Box-v0", "Discrete-v0"]
    assert store.sql("SELECT DISTINCT typeof(action) AS t FROM steps")["t"].to_pylist() == ["VARIANT"]
    assert store.sql("SELECT DISTINCT typeof(action) AS t FROM steps", env_id="Box-v0")["t"].to_pylist() == \
        ["FLOAT[]"]


@pytest.mark.parametrize("space_dtype, given, bad, message", [
    (np.float16, np.float64, 1e5, r"obs: values 100000.0\.\.100000.0 do not fit the stored float16 \(they would be "
                                  r"stored as infinity\); expected finite values in -65504\.\.65504"),
    (np.float32, np.float64, -1e300, r"obs: values -1e\+300\.\.-1e\+300 do not fit the stored float32"),
    (np.int8, np.int64, 300, r"obs: values .*300 do not fit the stored int8; expected values in -128\.\.127"),
])
def test_a_value_that_does_not_fit_the_stored_type_is_refused_naming_the_field(
        store: trajstore.Store, space_dtype: Any, given: Any, bad: float, message: str) -> None:
    """Floats narrowed to infinity are refused like integers out of range; nothing of the batch is stored, and the
    writer goes on with the next good batch. Precision lost in the last bits is no refusal."""
    import gymnasium as gym

    space = gym.spaces.Box(-np.inf, np.inf, (3,), space_dtype) if np.dtype(space_dtype).kind == "f" else \
        gym.spaces.Box(-128, 127, (3,), space_dtype)
    rng = np.random.default_rng(0)
    with store.writer(run_id="narrow", env_id="E", observation_space=space) as w:
        batch = make_batch(rng, 4, 2)
        for key in ("obs", "next_obs"):
            batch[key] = np.round(batch[key]).astype(given) if np.dtype(space_dtype).kind == "i" else \
                batch[key].astype(given)
        batch["obs"][2, 1, 0] = bad
        with pytest.raises(SchemaMismatchError, match=message):
            w.add_batch(batch)
        good = make_batch(rng, 4, 2)
        good["obs"] = good["obs"] * 1.0000001  # narrowed with its last bits rounded: stored
        for key in ("obs", "next_obs"):
            good[key] = np.round(good[key]).astype(given) if np.dtype(space_dtype).kind == "i" else \
                good[key].astype(given)
        w.add_batch(good)
    stored = store.scan(["obs"], run_id="narrow").read_all()
    assert stored.num_rows == 8 and stored.schema.field("obs").type.value_type == pa.from_numpy_dtype(space_dtype)


# --- names (issue 47): every name users give checked where it enters, nothing of a refused call stored -----------

BAD_NAMES = [
    ("", r"extras: '' cannot be a column name: it is empty"),
    ("Reward", r"extras: 'Reward' cannot be a column name: it differs only in case from 'reward'"),
    ("Run_Id", r"extras: 'Run_Id' cannot be a column name: it differs only in case from 'run_id'"),
    ("next_obs_sparse", r"extras: 'next_obs_sparse' cannot be a column name: 'next_obs_sparse' is a column trajstore"),
    ("a\nb", r"extras: 'a\\nb' cannot be a column name: it holds '\\n'"),
    ("a b", r"extras: 'a b' cannot be a column name: it holds ' '"),
    ("Seed", r"extras: 'Seed' cannot be a column name: it differs only in case from the step column 'seed'"),
]


@pytest.mark.parametrize(("name", "match"), BAD_NAMES, ids=[repr(n) for n, _ in BAD_NAMES])
def test_an_extra_no_engine_can_hold_is_refused_by_name(store: trajstore.Store, name: str, match: str) -> None:
    """The probe's extras (an empty name bricked every later read; Reward gave deltalake's "Duplicate field name"):
    refused at add_batch and add_step, nothing stored, the writer goes on; every read works afterwards."""
    rng = np.random.default_rng(40)
    with store.writer(run_id="r", env_id="e") as w:
        w.add_batch(make_batch(rng, 4, 2))
        w.flush()
        before, logged = store.sql(ALL_STEPS), steps_table(store).log.read().schema.names
        with pytest.raises(InputError, match=match):
            w.add_batch(make_batch(rng, 4, 2, extras={"ok": np.ones((4, 2)), name: np.ones((4, 2))}))
        step = {k: v[0] for k, v in make_batch(rng, 1, 2).items()}
        with pytest.raises(InputError, match=match):
            w.add_step(**step, extras={name: np.ones(2)})
        w.add_batch(make_batch(rng, 4, 2))
    assert store.sql(ALL_STEPS).num_rows == before.num_rows + 8
    assert steps_table(store).log.read().schema.names == logged and "ok" not in store.sql(ALL_STEPS).column_names
    assert store.stats()["n_traj"][0].as_py() >= 0 and trajstore.check(store).ok


def test_names_that_differ_only_in_case_are_refused(store: trajstore.Store) -> None:
    """Within one call, beside an earlier call's or a lineage value, and beside a column another writer stored
    (in another environment: the table has one schema)."""
    rng = np.random.default_rng(41)
    with store.writer(run_id="a", env_id="other") as w:
        w.add_batch(make_batch(rng, 3, 2, extras={"score": np.ones((3, 2), np.float32)}))
    with store.writer(run_id="b", env_id="e", algo="ppo") as w:
        with pytest.raises(InputError, match=r"extras: 'Gain' and 'gain' \(given beside it\) differ only in case"):
            w.add_batch(make_batch(rng, 3, 2, extras={"gain": np.ones((3, 2)), "Gain": np.ones((3, 2))}))
        with pytest.raises(InputError, match=r"extras: 'Score' and 'score' \(a column already there\) differ only"):
            w.add_batch(make_batch(rng, 3, 2, extras={"Score": np.ones((3, 2))}))
        with pytest.raises(InputError, match=r"extras: 'ALGO' and 'algo' \(a column already there\)"):
            w.add_batch(make_batch(rng, 3, 2, extras={"ALGO": np.ones((3, 2))}))
        w.add_batch(make_batch(rng, 3, 2, extras={"gain": np.ones((3, 2)), "score": np.ones((3, 2), np.float32)}))
        with pytest.raises(InputError, match=r"extras: 'GAIN' and 'gain' \(a column already there\)"):
            w.add_batch(make_batch(rng, 3, 2, extras={"GAIN": np.ones((3, 2))}))  # this writer's own, buffered
    assert store.sql("SELECT count(*) AS n FROM steps WHERE run_id = 'b'")["n"].to_pylist() == [6]
    assert {"gain", "score", "algo"} <= set(store.sql(ALL_STEPS).column_names)
    store.maintain.delete(run_id="b")
    store.maintain.delete(run_id="a")  # no file holds score any more; the table's schema does (Delta keeps its columns)
    with store.writer(run_id="c", env_id="e") as w:
        with pytest.raises(InputError, match=r"extras: 'SCORE' and 'score' \(a column already there\)"):
            w.add_batch(make_batch(rng, 3, 2, extras={"SCORE": np.ones((3, 2))}))


@pytest.mark.parametrize(("kwargs", "match"), [
    ({"run_id": " ", "env_id": "e"}, r"run_id must be a non-empty string .*got ' ': whitespace at either end"),
    ({"run_id": "a\nb", "env_id": "e"}, r"run_id must be a non-empty string .*got 'a\\nb': it holds '\\n'"),
    ({"run_id": "a/b", "env_id": "e"}, r"run_id must .*: it holds '/'; a run id is a segment of the REST API"),
    ({"run_id": "r", "env_id": "__HIVE_DEFAULT_PARTITION__"}, r"env_id must .*Hive partitioning reads back as null"),
    ({"run_id": "r", "env_id": "e", "Seed": 1}, r"lineage: 'Seed' cannot be a column name: it differs only in case"),
    ({"run_id": "r", "env_id": "e", "a=b": 1}, r"lineage: 'a=b' cannot be a column name: it holds '='"),
    ({"run_id": "r", "env_id": "e", "algo": 1, "Algo": 2}, r"lineage: 'Algo' and 'algo' \(given beside it\)"),
    ({"run_id": "r", "env_id": "e", "agents": ["a", "b\tc"]}, r"agent_id must .*got 'b\\tc': it holds '\\t'"),
])
def test_ids_and_lineage_names_are_checked_when_the_writer_opens(store: trajstore.Store, kwargs: dict[str, Any],
                                                                  match: str) -> None:
    with pytest.raises(InputError, match=match):
        store.writer(**kwargs)
    assert store.maintain.files() == [] and plumbing(store).run_ids() == []


def test_dict_keys_are_fields_every_engine_holds(store: trajstore.Store) -> None:
    """A dict extra's or a Dict observation's keys are struct fields: an empty one (DuckDB read it as
    ``element1``) and two differing only in case (deltalake's "Duplicate field name") are refused."""
    rng = np.random.default_rng(42)
    with store.writer(run_id="r", env_id="e") as w:
        with pytest.raises(InputError, match=r"info\.: '' cannot be a field name: it is empty"):
            w.add_batch(make_batch(rng, 3, 2, extras={"info": {"": np.ones((3, 2)), "a": np.ones((3, 2))}}))
        with pytest.raises(InputError, match=r"info: 'A' and 'a' \(given beside it\) differ only in case"):
            w.add_batch(make_batch(rng, 3, 2, extras={"info": {"a": np.ones((3, 2)), "A": np.ones((3, 2))}}))
        w.add_batch(make_batch(rng, 3, 2, extras={"info": {"a": np.ones((3, 2)), "b": np.ones((3, 2))}}))
    space = spaces.Dict({"pos x": spaces.Box(0, 1, (2,), np.float32)})
    with pytest.raises(InputError, match=r"obs\.pos x: 'pos x' cannot be a field name: it holds ' '"):
        store.writer(run_id="r", env_id="d", observation_space=space)
    assert store.sql("SELECT info.a AS a FROM steps")["a"].to_pylist() == [1.0] * 6
