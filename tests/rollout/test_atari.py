"""Real Atari frame stacks (ale-py's Breakout through AtariPreprocessing and FrameStackObservation) through
gym_rollout and VectorRecordToStore, in both autoreset modes, with episodes ending by termination (a life lost)
and by truncation (a time limit): every stored obs and next_obs, read back by scan, SQL and sequences, is exactly
what each env returned (logged right around it), and each frame is stored once."""

from __future__ import annotations

import gymnasium as gym
import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from gymnasium.vector import AutoresetMode, SyncVectorEnv

import trajstore
from tests.integrations.steplog import Episode, StepLog, assert_same
from trajstore.integrations import VectorRecordToStore
from trajstore.rollout import gym_rollout
from trajstore.storage.encoding import FileEncoding

ale_py = pytest.importorskip("ale_py", reason="the [atari] extra (ale-py) is not installed")
pytest.importorskip("cv2", reason="the [atari] extra (opencv-python-headless) is not installed")
gym.register_envs(ale_py)

K, SIDE, LIMIT, NUM_ENVS, STEPS = 4, 84, 30, 4, 400
FRAME = SIDE * SIDE  # bytes of one 84x84 gray frame
MODES = {"next-step": AutoresetMode.NEXT_STEP, "same-step": AutoresetMode.SAME_STEP}


def breakout() -> StepLog:
    """Breakout as DQN sees it, 4 frames stacked; a lost life terminates, 30 steps truncate; logged around."""
    env = gym.make("ALE/Breakout-v5", frameskip=1)  # AtariPreprocessing skips the frames
    env = gym.wrappers.AtariPreprocessing(env, frame_skip=4, screen_size=SIDE, grayscale_obs=True,
                                          terminal_on_life_loss=True)
    env = gym.wrappers.FrameStackObservation(env, K)
    return StepLog(gym.wrappers.TimeLimit(env, LIMIT))


def vector_env(mode: str) -> SyncVectorEnv:
    return SyncVectorEnv([breakout] * NUM_ENVS, autoreset_mode=MODES[mode])


def logged(venv: SyncVectorEnv) -> dict[int, list[Episode]]:
    return {i: env.episodes() for i, env in enumerate(venv.envs)}


def record(store: trajstore.Store, venv: SyncVectorEnv, how: str, run_id: str) -> None:
    """STEPS steps of random actions into ``store``; small writer calls and files, so that episodes and stacks
    cross both."""
    if how == "gym_rollout":
        gym_rollout(store, venv, run_id=run_id, env_id="Breakout", steps=STEPS, seed=5, chunk=16,
                    flush_bytes=1_500_000, progress=False)
        return
    venv.action_space.seed(5)
    with VectorRecordToStore(venv, store, run_id=run_id, env_id="Breakout", chunk=16,
                             flush_bytes=1_500_000) as env:
        env.reset(seed=5)
        for _ in range(STEPS // NUM_ENVS):
            env.step(env.action_space.sample())


def as_numpy(column: pa.ChunkedArray | pa.Array) -> np.ndarray:
    """A column of (nested) lists of one shape (fixed-size, or variable as SQL gives them) as ``(n, *shape)``."""
    arr = column.combine_chunks() if isinstance(column, pa.ChunkedArray) else column
    n, shape = len(arr), []
    while pa.types.is_fixed_size_list(arr.type) or pa.types.is_list(arr.type):
        sizes = np.unique(arr.value_lengths().to_numpy(zero_copy_only=False))
        assert len(sizes) <= 1, f"rows of different shapes: {sizes}"
        shape.append(int(sizes[0]) if len(sizes) else 0)
        arr = arr.flatten()
    return arr.to_numpy(zero_copy_only=False).reshape(n, *shape)


@pytest.mark.parametrize("how", ["gym_rollout", "VectorRecordToStore"])
@pytest.mark.parametrize("mode", list(MODES))
def test_frame_stacks_round_trip_exactly(store: trajstore.Store, mode: str, how: str) -> None:
    venv = vector_env(mode)
    record(store, venv, how, mode)
    expected = logged(venv)
    ends = [e for eps in expected.values() for e in eps if e.complete]
    assert any(e.terminated[-1] for e in ends) and any(e.truncated[-1] for e in ends)  # both ends occur

    sql = stored_steps(store, mode)  # SELECT … FROM steps (DuckDB decodes)
    for i in expected:
        assert_same(sql[i], expected[i])
        assert sql[i][0].obs.dtype == np.uint8 and sql[i][0].obs.shape[1:] == (K, SIDE, SIDE)

    scanned = store.scan(["env_index", "episode_id", "step", "obs", "next_obs"], run_id=mode).read_all()
    _assert_rows_match(scanned, sql)

    by_id = _episodes_by_id(store, mode, sql)
    length = 8
    windows = 0
    for batch in store.sequences(length, columns=["obs", "next_obs"], pad=True, run_id=mode, batch_size=64):
        for j, (episode, start) in enumerate(zip(batch["episode_id"], batch["start"])):
            ep = by_id[int(episode)]
            n = int(np.asarray(batch["mask"][j]).sum())
            np.testing.assert_array_equal(batch["obs"][j][:n], ep.obs[start:start + n])
            np.testing.assert_array_equal(batch["next_obs"][j][:n], ep.next_obs[start:start + n])
            windows += 1
    assert windows == sum(-(-len(e.reward) // length) for e in by_id.values())
    venv.close()


@pytest.mark.parametrize("mode", list(MODES))
def test_each_frame_is_stored_once(store: trajstore.Store, mode: str) -> None:
    venv = vector_env(mode)
    record(store, venv, "gym_rollout", mode)
    episodes = sum(len(eps) for eps in logged(venv).values())
    files = store.maintain.files()
    assert len(files) > 1  # stacks cross files, where the first row of each episode is whole
    obs_bytes = next_bytes = rows = 0
    for f in files:
        meta = pq.ParquetFile(f.path, filesystem=f.fs).metadata
        assert FileEncoding.of(meta.schema.to_arrow_schema().metadata).stacks == {"obs": K}
        rows += meta.num_rows
        for g in range(meta.num_row_groups):
            for c in range(meta.num_columns):
                column = meta.row_group(g).column(c)
                top = column.path_in_schema.split(".")[0]
                if top == "obs_new_frames":  # the names say what they hold: new frames, sparse next obs
                    obs_bytes += column.total_uncompressed_size
                elif top == "next_obs_sparse_new_frames":
                    next_bytes += column.total_uncompressed_size
    assert rows == STEPS
    anchors = episodes + NUM_ENVS * len(files)  # at most: each episode's start, each env's first row of a file
    assert rows * FRAME <= obs_bytes <= 1.05 * (rows + (K - 1) * anchors) * FRAME
    assert obs_bytes < 1.5 * rows * FRAME  # whole stacks would be 4x, as in the env
    # next_obs only where it is not the next row's obs: episode ends and each env's last row of a file
    assert next_bytes <= 1.05 * (episodes + NUM_ENVS * len(files)) * K * FRAME
    assert next_bytes < 0.5 * rows * FRAME
    venv.close()


def test_gym_rollout_finds_the_frame_stack_or_takes_it(store: trajstore.Store) -> None:
    venv = vector_env("next-step")
    gym_rollout(store, venv, run_id="found", env_id="Breakout", steps=8, progress=False)
    gym_rollout(store, venv, run_id="whole", env_id="Breakout", steps=8, frame_stack={}, progress=False)
    found, whole = ([FileEncoding.of(pq.ParquetFile(f.path, filesystem=f.fs).schema_arrow.metadata).stacks
                     for f in store.maintain.files() if f.run_id == run] for run in ("found", "whole"))
    assert found == [{"obs": K}] and whole == [{}]
    for run in ("found", "whole"):
        got = as_numpy(store.sql(f"SELECT obs FROM steps WHERE run_id = '{run}' ORDER BY env_index, step")["obs"])
        assert got.shape == (8, K, SIDE, SIDE) and got.dtype == np.uint8
    venv.close()


def _episodes_by_id(store: trajstore.Store, run_id: str, sql: dict[int, list[Episode]]) -> dict[int, Episode]:
    ids = store.sql(f"SELECT env_index, episode_id, min(step) AS s FROM steps WHERE run_id = '{run_id}' "
                    "GROUP BY ALL ORDER BY env_index, episode_id").to_pydict()
    order: dict[int, list[int]] = {}
    for env, episode in zip(ids["env_index"], ids["episode_id"]):
        order.setdefault(env, []).append(episode)
    return {episode: sql[env][n] for env, eps in order.items() for n, episode in enumerate(eps)}


def _assert_rows_match(scanned: pa.Table, sql: dict[int, list[Episode]]) -> None:
    """Rows of a scan (in any order) equal the SQL's episodes, step by step."""
    order = np.lexsort([scanned["step"].to_numpy(), scanned["episode_id"].to_numpy(),
                        scanned["env_index"].to_numpy()])
    table = scanned.take(order)
    obs, nxt = as_numpy(table["obs"]), as_numpy(table["next_obs"])
    want_obs = np.concatenate([e.obs for env in sorted(sql) for e in sql[env]])
    want_next = np.concatenate([e.next_obs for env in sorted(sql) for e in sql[env]])
    np.testing.assert_array_equal(obs, want_obs)
    np.testing.assert_array_equal(nxt, want_next)


def stored_steps(store: trajstore.Store, run_id: str) -> dict[int, list[Episode]]:
    """The stored episodes of ``run_id`` per env index, in the order they started, read by SQL (as
    tests.integrations.steplog.stored, with the frames as numpy arrays rather than Python lists)."""
    names = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
    table = store.sql(f"SELECT env_index, episode_id, {', '.join(names)} FROM steps WHERE run_id = '{run_id}' "
                      "ORDER BY env_index, episode_id, step")
    env, ids = table["env_index"].to_numpy(), table["episode_id"].to_numpy()
    starts = np.r_[0, np.flatnonzero((env[1:] != env[:-1]) | (ids[1:] != ids[:-1])) + 1, len(ids)]
    columns = {name: as_numpy(table[name]) for name in names}
    out: dict[int, list[Episode]] = {}
    for a, b in zip(starts[:-1], starts[1:]):
        out.setdefault(int(env[a]), []).append(Episode(*(columns[name][a:b] for name in names)))
    return out


def test_an_ale_id_by_name_with_dqn_preprocessing(store: trajstore.Store) -> None:
    from trajstore.rollout.atari import dqn_preprocessing

    wrappers, env_kwargs = dqn_preprocessing(frame_stack=K)
    gym_rollout(store, "ALE/Breakout-v5", run_id="dqn", num_envs=2, steps=40, wrappers=wrappers,
                env_kwargs=env_kwargs, progress=False)
    gym_rollout(store, "ale_py:ALE/Breakout-v5", run_id="prefixed", num_envs=1, steps=8, wrappers=wrappers,
                env_kwargs=env_kwargs, progress=False)
    assert {(f.run_id, f.env_id) for f in store.maintain.files()} == {("dqn", "ALE/Breakout-v5"),
                                                             ("prefixed", "ALE/Breakout-v5")}
    files = store.maintain.files()
    assert all(FileEncoding.of(pq.ParquetFile(f.path).schema_arrow.metadata).stacks == {"obs": K} for f in files)
    obs = as_numpy(store.sql("SELECT obs FROM steps WHERE run_id = 'dqn'")["obs"])
    assert obs.shape == (40, K, SIDE, SIDE) and obs.dtype == np.uint8


def test_an_ale_id_without_ale_py_names_the_extra(store: trajstore.Store, monkeypatch: pytest.MonkeyPatch) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "ale_py", None)  # as if the extra were not installed
    with pytest.raises(trajstore.InputError, match=r"^env: ALE/Breakout-v5 is an Atari game, which needs ale-py: "
                                                   r"pip install 'trajstore\[atari\]'$"):
        gym_rollout(store, "ALE/Breakout-v5", run_id="x", steps=8, progress=False)
    assert store.maintain.files() == []
