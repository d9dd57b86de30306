"""Multi-agent episodes recorded from the real PettingZoo envs equal a log kept beside them, agent by agent and step
by step: mpe2's simple_spread (3 alike agents) and simple_tag (observations of 16 and 14 floats), PettingZoo's
knights_archers_zombies (agents removed when killed) and tictactoe (turn-based, Dict observation with an action
mask, the reward arriving at the game's end)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pyarrow as pa
import pytest

import trajstore
from trajstore.errors import InputError

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")

from mpe2 import simple_spread_v3, simple_tag_v3
from pettingzoo.classic import tictactoe_v3

from trajstore.integrations.pettingzoo import RecordAECToStore, RecordParallelToStore
from trajstore.rollout import parallel_rollout
from trajstore.store import plumbing

Row = tuple[int, Any, Any, float, Any, bool, bool]  # step, obs, action, reward, next_obs, terminated, truncated


def parallel_log(env: Any, store: trajstore.Store, *, run_id: str, episodes: int, seed: int,
                 stop_after: int | None = None) -> list[dict[str, list[Row]]]:
    """Step ``env`` wrapped in the recorder with random actions; the log is what the raw env returned, per
    episode and agent."""
    rng = np.random.default_rng(seed)
    log: list[dict[str, list[Row]]] = []
    with RecordParallelToStore(env, store, run_id=run_id) as rec:
        for e in range(episodes):
            obs, _ = rec.reset(seed=seed + e)
            rows: dict[str, list[Row]] = defaultdict(list)
            log.append(rows)
            t = 0
            while env.agents:
                if stop_after is not None and e == episodes - 1 and t == stop_after:
                    break
                actions = {a: int(rng.integers(env.action_space(a).n)) for a in env.agents}
                nxt, rew, term, trunc, _ = rec.step(actions)
                for a, act in actions.items():
                    rows[a].append((t, obs[a], act, float(rew[a]), nxt[a], bool(term[a]), bool(trunc[a])))
                obs = nxt
                t += 1
    return log


def stored(store: trajstore.Store, run_id: str) -> dict[int, dict[str, list[dict[str, Any]]]]:
    """The stored rows of a run by episode (in the order they were written) and agent, in step order."""
    table = store.sql(f"SELECT episode_id, agent_id, step, obs, action, reward, next_obs, terminated, truncated, "
                      f"env_steps FROM steps WHERE run_id = '{run_id}' ORDER BY env_steps, agent_id").to_pylist()
    out: dict[int, dict[str, list[dict[str, Any]]]] = {}
    for r in table:
        out.setdefault(r["episode_id"], defaultdict(list))[r["agent_id"]].append(r)
    return out


def assert_same(log: list[dict[str, list[Row]]], found: dict[int, dict[str, list[dict[str, Any]]]]) -> None:
    assert len(found) == len(log)
    for rows, (eid, agents) in zip(log, found.items()):
        assert sorted(agents) == sorted(rows), eid
        for a, mine in rows.items():
            got = agents[a]
            assert [g["step"] for g in got] == [m[0] for m in mine], a
            for g, (t, o, act, r, n, te, tr) in zip(got, mine):
                np.testing.assert_array_equal(np.asarray(g["obs"], dtype=o.dtype).reshape(o.shape), o)
                np.testing.assert_array_equal(np.asarray(g["next_obs"], dtype=n.dtype).reshape(n.shape), n)
                assert (g["action"], g["terminated"], g["truncated"]) == (act, te, tr), (a, t)
                assert g["reward"] == pytest.approx(r, rel=1e-6, abs=1e-6), (a, t)


def test_simple_spread_is_stored_agent_by_agent(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "s", create=True)
    env = simple_spread_v3.parallel_env(max_cycles=30)
    log = parallel_log(env, store, run_id="spread", episodes=3, seed=1)
    assert_same(log, stored(store, "spread"))
    eps = store.sql("SELECT episode_length, episode_return, n_agents, complete, truncated, terminated "
                    "FROM episodes ORDER BY env_steps").to_pylist()
    assert [e["episode_length"] for e in eps] == [30, 30, 30]
    assert [e["n_agents"] for e in eps] == [3, 3, 3]
    assert all(e["complete"] and e["truncated"] and not e["terminated"] for e in eps)
    for e, rows in zip(eps, log):
        assert e["episode_return"] == pytest.approx(sum(r[3] for a in rows.values() for r in a), rel=1e-5)


def test_agents_of_other_spaces_share_episodes(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "s", create=True)
    env = simple_tag_v3.parallel_env(max_cycles=20)
    log = parallel_log(env, store, run_id="tag", episodes=2, seed=3)
    assert_same(log, stored(store, "tag"))
    sizes = store.sql("SELECT agent_id, len(obs) AS n FROM steps GROUP BY ALL ORDER BY agent_id").to_pylist()
    assert {r["agent_id"]: r["n"] for r in sizes} == {"adversary_0": 16, "adversary_1": 16, "adversary_2": 16,
                                                       "agent_0": 14}
    by_group = store.stats(by="agent_group").to_pylist()
    assert [(r["agent_group"], r["n_traj"]) for r in by_group] == [("adversary", 6), ("agent", 2)]
    expected = [sum(r[3] for r in rows["agent_0"]) for rows in log]
    agent = store.stats(by="agent_id", where="true").to_pylist()[-1]
    assert agent["agent_id"] == "agent_0"
    assert agent["return_mean"] == pytest.approx(np.mean(expected), rel=1e-5)
    assert agent["len_mean"] == 20


def test_agents_that_die_leave_their_episode(tmp_path: Path) -> None:
    pytest.importorskip("pygame")
    from pettingzoo.butterfly import knights_archers_zombies_v11

    store = trajstore.open(tmp_path / "s", create=True)
    env = knights_archers_zombies_v11.parallel_env(max_cycles=300, spawn_delay=5, max_zombies=20)
    log = parallel_log(env, store, run_id="kaz", episodes=2, seed=0)
    lengths = {a: len(r) for rows in log for a, r in rows.items()}
    assert min(lengths.values()) < max(lengths.values())  # someone died before the end
    assert_same(log, stored(store, "kaz"))
    agents = store.sql("SELECT agent_id, agent_length, complete, terminated FROM agent_episodes "
                       "ORDER BY env_steps, agent_id").to_pylist()
    assert all(a["complete"] for a in agents)
    died = [a for a in agents if a["terminated"]]
    assert died and all(a["agent_length"] < 300 for a in died)
    eps = store.sql("SELECT episode_length, n_agents, complete FROM episodes ORDER BY env_steps").to_pylist()
    assert [e["episode_length"] for e in eps] == [max(len(r) for r in rows.values()) for rows in log]
    assert all(e["complete"] and e["n_agents"] == 4 for e in eps)


def test_the_writer_counts_an_episode_complete_when_every_agent_ended(tmp_path: Path) -> None:
    """knights_archers_zombies, stopped as soon as one agent is killed while others play on: those episodes are
    unfinished in the ``episodes`` view, and the writer's count agrees with it."""
    pytest.importorskip("pygame")
    from pettingzoo.butterfly import knights_archers_zombies_v11

    store = trajstore.open(tmp_path / "s", create=True)
    env = knights_archers_zombies_v11.parallel_env(max_cycles=300, spawn_delay=5, max_zombies=20)
    rng = np.random.default_rng(0)
    stopped = 0
    with RecordParallelToStore(env, store, run_id="kaz") as rec:
        for e in range(3):
            rec.reset(seed=e)
            while env.agents:
                _, _, term, trunc, _ = rec.step({a: int(rng.integers(env.action_space(a).n)) for a in env.agents})
                if env.agents and any(term[a] or trunc[a] for a in term):
                    stopped += 1
                    break
        rec.reset(seed=9)  # closes the last episode, as a user starting the next one does
        counted = rec.writer.episodes_completed
    complete = store.sql("SELECT count(*) FILTER (WHERE complete) AS done, count(*) AS n FROM episodes").to_pylist()
    assert stopped >= 1 and complete[0]["n"] == 3
    assert counted == complete[0]["done"] == 3 - stopped


def test_an_episode_stopped_midway_is_unfinished(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "s", create=True)
    env = simple_spread_v3.parallel_env(max_cycles=30)
    log = parallel_log(env, store, run_id="cut", episodes=2, seed=5, stop_after=7)
    assert_same(log, stored(store, "cut"))
    eps = store.sql("SELECT episode_length, complete FROM episodes ORDER BY env_steps").to_pylist()
    assert eps == [{"episode_length": 30, "complete": True}, {"episode_length": 7, "complete": False}]
    assert store.stats().column("n_traj").to_pylist() == [1]


def test_tictactoe_turns_hold_the_reward_until_the_next_turn(tmp_path: Path) -> None:
    """Independent of the recorder's use of ``last()``: the log adds up ``env.rewards`` after every step for the
    turn each agent has in waiting."""
    store = trajstore.open(tmp_path / "s", create=True)
    rng = np.random.default_rng(0)
    env = RecordAECToStore(tictactoe_v3.env(), store, run_id="ttt")
    games: list[dict[str, list[dict[str, Any]]]] = []
    for game in range(6):
        env.reset(seed=game)
        rows: dict[str, list[dict[str, Any]]] = defaultdict(list)
        waiting: dict[str, dict[str, Any]] = {}
        turn = 0
        for agent in env.agent_iter():
            obs, _, terminated, truncated, _ = env.last()
            if agent in waiting:
                row = waiting.pop(agent)
                row.update(next_obs=obs, terminated=terminated, truncated=truncated)
                rows[agent].append(row)
            if terminated or truncated:
                env.step(None)
                continue
            action = int(rng.choice(np.flatnonzero(obs["action_mask"])))
            waiting[agent] = {"step": turn, "obs": obs, "action": action, "reward": 0.0}
            turn += 1
            env.step(action)
            for a, r in env.rewards.items():
                if a in waiting:
                    waiting[a]["reward"] += r
        assert not waiting
        games.append(rows)
    env.close()
    found = stored(store, "ttt")
    assert len(found) == 6
    for rows, agents in zip(games, found.values()):
        for a, mine in rows.items():
            got = agents[a]
            assert [g["step"] for g in got] == [m["step"] for m in mine]
            for g, m in zip(got, mine):
                for key in ("observation", "action_mask"):
                    np.testing.assert_array_equal(np.asarray(g["obs"][key]).reshape(m["obs"][key].shape),
                                                  m["obs"][key])
                    np.testing.assert_array_equal(np.asarray(g["next_obs"][key]).reshape(m["next_obs"][key].shape),
                                                  m["next_obs"][key])
                assert (g["action"], g["reward"], g["terminated"]) == (m["action"], m["reward"], m["terminated"])
    returns = store.sql("SELECT agent_id, sum(agent_return) AS r, count(*) AS n FROM agent_episodes "
                        "GROUP BY ALL ORDER BY agent_id").to_pylist()
    expected = {a: sum(r["reward"] for g in games for r in g[a]) for a in ("player_1", "player_2")}
    assert {r["agent_id"]: r["r"] for r in returns} == expected
    eps = store.sql("SELECT episode_length, n_agents, complete, terminated FROM episodes").to_pylist()
    assert all(e["complete"] and e["terminated"] and e["n_agents"] == 2 for e in eps)
    assert sorted(e["episode_length"] for e in eps) == sorted(max(r["step"] for a in g.values() for r in a) + 1
                                                              for g in games)


def test_parallel_rollout_counts_episodes_and_records_seed(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "s", create=True)
    seen: list[str] = []

    def policy(agent: str, obs: Any) -> int:
        seen.append(agent)
        return 0

    result = parallel_rollout(store, lambda: simple_spread_v3.parallel_env(max_cycles=10), run_id="r",
                              policy=policy, episodes=3, seed=7, progress=False, mode="eval")
    assert result.episodes == 3 and result.episode_lengths == [10, 10, 10]
    assert set(seen) == {"agent_0", "agent_1", "agent_2"}
    eps = store.sql("SELECT env_id, seed, mode, n_agents FROM episodes").to_pylist()
    assert len(eps) == 3 and all(e == {"env_id": "simple_spread_v3", "seed": 7, "mode": "eval", "n_agents": 3}
                                 for e in eps)
    assert store.sql("SELECT DISTINCT action FROM steps").column(0).to_pylist() == [0]


def test_single_agent_rows_are_unchanged_beside_agents(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "s", create=True)
    trajstore.rollout.gym_rollout(store, "CartPole-v1", run_id="solo", num_envs=2, episodes=4, progress=False)
    before = store.sql("SELECT * FROM episodes ORDER BY episode_id").drop_columns(["n_agents"])
    parallel_rollout(store, simple_spread_v3.parallel_env, run_id="team", episodes=1, seed=0,
                     progress=False)
    after = store.sql("SELECT * FROM episodes WHERE run_id = 'solo' ORDER BY episode_id")
    assert after.drop_columns(["n_agents"]).equals(before)
    assert set(after.column("n_agents").to_pylist()) == {1}
    assert store.sql("SELECT count(*) FROM steps WHERE run_id = 'solo' AND agent_id IS NOT NULL")[0][0].as_py() == 0


def test_wrong_rows_are_refused_by_name(tmp_path: Path) -> None:
    from trajstore.write.agents import AgentWriter

    store = trajstore.open(tmp_path / "s", create=True)
    with pytest.raises(InputError, match="agents"):
        AgentWriter(store, run_id="x", env_id="e", agents=["a", "a"])
    with AgentWriter(store, run_id="x", env_id="e", agents=["a", "b"]) as w:
        row = (np.zeros(2, np.float32), 0, 1.0, np.zeros(2, np.float32), True, False)
        with pytest.raises(InputError, match="agent_id: 'c'"):
            w.add(0, {"c": row})
        with pytest.raises(InputError, match=r"reward: must be finite, got nan for agent 'b' at step 0"):
            w.add(0, {"b": (row[0], 0, float("nan"), row[3], False, False)})
        w.add(0, {"a": row})
        with pytest.raises(InputError, match="already ended"):
            w.add(1, {"a": row})
    with pytest.raises(InputError, match="AgentWriter"):
        store.writer(run_id="x", env_id="e", agents=["a"]).add_batch({})


@pytest.fixture(scope="module")
def tag_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """simple_tag (adversaries of 16 floats, an agent of 14) beside a CartPole run."""
    path = tmp_path_factory.mktemp("agents") / "store"
    store = trajstore.open(path, create=True)
    parallel_rollout(store, simple_tag_v3.parallel_env, run_id="tag", episodes=3, seed=2, progress=False)
    trajstore.rollout.gym_rollout(store, "CartPole-v1", run_id="solo", num_envs=2, episodes=3, progress=False)
    return path


@pytest.mark.server
def test_rest_and_client_give_agent_rows_and_stats(tag_store: Path) -> None:
    from tests.api.helpers import API_KEY, serve, settings_for
    from trajstore.api.app import create_app

    store = trajstore.open(tag_store)
    eid = store.sql("SELECT episode_id FROM episodes WHERE run_id = 'tag' LIMIT 1")[0][0].as_py()
    for live in serve(create_app(settings_for(tag_store))):
        with trajstore.Client(live.url, api_key=API_KEY) as client:
            rows = client.episode_steps(eid, ["reward"])
            assert rows.column_names == ["step", "agent_id", "reward"]
            assert rows.num_rows == 4 * 25
            assert rows.column("agent_id").to_pylist()[:4] == ["adversary_0", "adversary_1", "adversary_2", "agent_0"]
            mine = client.episode_steps(eid, ["reward"], agent_id="agent_0")
            assert mine.column("step").to_pylist() == list(range(25))
            expected = store.episode_steps(eid, ["reward"], agent_id="agent_0")
            assert mine.column("reward").equals(expected.column("reward"))
            stats = client.stats(by="agent_id", run_id="tag")
            assert stats.column("agent_id").to_pylist() == ["adversary_0", "adversary_1", "adversary_2", "agent_0"]
            assert stats.column("n_traj").to_pylist() == [3, 3, 3, 3]
            body = httpx.get(f"{live.url}/stats", params={"by": "agent_group", "run_id": "tag"},
                             headers={"Authorization": f"Bearer {API_KEY}"}).json()
            assert [(r["agent_group"], r["n_traj"]) for r in body] == [("adversary", 9), ("agent", 3)]


def test_stats_per_agent_read_agent_episodes_alone_as_joined(tag_store: Path) -> None:
    """Grouped and filtered by agent_episodes' own columns, statistics per agent read that view alone (one
    aggregation over the steps); the same numbers as joined with the episodes (a where= or a lineage column needs
    that) and as numpy over each agent's rows."""
    store = trajstore.open(tag_store)
    rows = store.sql("SELECT episode_id, agent_id, reward FROM steps WHERE agent_id IS NOT NULL").to_pylist()
    returns: dict[str, dict[int, float]] = defaultdict(lambda: defaultdict(float))
    lengths: dict[str, dict[int, int]] = defaultdict(lambda: defaultdict(int))
    for r in rows:
        returns[r["agent_id"]][r["episode_id"]] += r["reward"]
        lengths[r["agent_id"]][r["episode_id"]] += 1
    for by, kw in (("agent_id", {}), (["run_id", "agent_group"], {"include_incomplete": True}),
                   ("agent_id", {"min_return": -5.0, "run_id": "tag"})):
        alone = store.stats(by=by, **kw)
        joined = store.stats(by=by, where="true", **kw)
        assert alone.column_names == joined.column_names and alone.num_rows == joined.num_rows > 0
        for name in alone.column_names:
            if pa.types.is_floating(alone.schema.field(name).type):
                np.testing.assert_allclose(alone[name].to_numpy(), joined[name].to_numpy(), rtol=1e-9)
            else:
                assert alone[name].to_pylist() == joined[name].to_pylist(), (by, name)
    mine = store.stats(by="agent_id").to_pylist()
    assert [r["agent_id"] for r in mine] == sorted(returns)
    for r in mine:
        ret, n = np.array(list(returns[r["agent_id"]].values())), np.array(list(lengths[r["agent_id"]].values()))
        assert (r["n_traj"], r["len_mean"]) == (len(ret), n.mean())
        assert r["return_mean"] == pytest.approx(ret.mean(), rel=1e-5)
        assert r["return_std"] == pytest.approx(ret.std(), rel=1e-4)


def test_exports_refuse_multi_agent_runs_in_one_line(tag_store: Path, tmp_path: Path) -> None:
    from trajstore.export.lerobot import export_lerobot

    store = trajstore.open(tag_store)
    with pytest.raises(InputError, match=r"^run_id: 'tag' holds multi-agent episodes .* export one agent "
                                         r"\(agent=…\), one of adversary_0, adversary_1, adversary_2, agent_0;") \
            as caught:
        export_lerobot(store, tmp_path / "out")
    assert "\n" not in str(caught.value)
    assert not (tmp_path / "out").exists()
    export_lerobot(store, tmp_path / "solo", run_id="solo")  # the single-agent run of the same store still goes


def test_other_engines_read_agent_rows(tag_store: Path) -> None:
    """deltalake and polars read agent_id and every agent's next_obs whole."""
    import deltalake
    import polars as pl

    mine = trajstore.open(tag_store).sql("SELECT episode_id, agent_id, step, next_obs FROM steps "
                                         "WHERE run_id = 'tag' ORDER BY ALL").to_pylist()
    table = deltalake.DeltaTable(str(tag_store / "steps"))
    # agents of other sizes (16 and 14 floats) and CartPole's 4 are under typed names, one per size: the row's
    # next observation is in one of them, whole (polars through pyarrow: its native reader refuses fixed sizes)
    wide = [f.name for f in table.schema().fields if f.name.startswith("next_obs")]
    assert len(wide) == 3
    frame = pl.scan_delta(str(tag_store / "steps"), use_pyarrow=True).filter(pl.col("run_id") == "tag").collect()
    theirs = frame.select("episode_id", "agent_id", "step", pl.coalesce(wide).alias("next_obs")) \
        .sort("episode_id", "agent_id", "step")
    assert theirs["next_obs"].null_count() == 0
    assert [[float(x) for x in r["next_obs"]] for r in theirs.iter_rows(named=True)] == \
        [[float(x) for x in r["next_obs"]] for r in mine]


def test_deltalake_optimize_keeps_agent_rows(tmp_path: Path) -> None:
    """deltalake's compaction merges the files of a partition; every agent's row reads back the same."""
    import deltalake

    store = trajstore.open(tmp_path / "s", create=True)
    for seed in range(3):
        parallel_rollout(store, simple_spread_v3.parallel_env, run_id="spread", episodes=2, seed=seed,
                         progress=False, append=True)
    trajstore.rollout.gym_rollout(store, "CartPole-v1", run_id="solo", num_envs=2, episodes=3, progress=False)
    query = "SELECT * EXCLUDE (wall_time) FROM steps ORDER BY run_id, episode_id, step, agent_id"
    before = store.sql(query)
    episodes = store.sql("SELECT * EXCLUDE (started_at, ended_at) FROM episodes ORDER BY episode_id")
    assert len(store.maintain.files()) > 2
    deltalake.DeltaTable(str(tmp_path / "s" / "steps")).optimize.compact()
    after = trajstore.open(tmp_path / "s")
    assert len(after.maintain.files()) == 2
    assert after.sql(query).equals(before)
    assert after.sql("SELECT * EXCLUDE (started_at, ended_at) FROM episodes ORDER BY episode_id").equals(episodes)
    assert after.sql("SELECT count(*) FROM episodes WHERE n_agents = 3 AND complete")[0][0].as_py() == 6


def test_training_loaders_refuse_interleaved_agents(tag_store: Path) -> None:
    """A loader follows an episode's rows; those of a multi-agent episode interleave its agents: refused without
    agent_id=, naming the run, while the single-agent run of the same store still loads (tests/loaders/test_agents.py
    loads agents)."""
    store = trajstore.open(tag_store)
    for read in (lambda **kw: store.sequences(4, **kw), lambda **kw: store.transitions(1, gamma=0.99, **kw)):
        with pytest.raises(InputError, match=r"^run_id: 'tag' holds multi-agent episodes .*pass agent_id="):
            next(iter(read()))
        batch = next(iter(read(run_id="solo")))
        assert len(batch["reward"]) > 0


def test_the_cli_asks_per_agent_questions(tag_store: Path, capsys: pytest.CaptureFixture[str]) -> None:
    import json

    from trajstore.cli import main

    assert main(["stats", "--store", str(tag_store), "--by", "agent_group", "--run", "tag", "--format", "json"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [(r["agent_group"], r["n_traj"]) for r in rows] == [("adversary", 9), ("agent", 3)]
    assert main(["sql", "--store", str(tag_store), "--format", "json",
                 "SELECT agent_id, count(*) AS n FROM agent_episodes GROUP BY ALL ORDER BY agent_id"]) == 0
    rows = [json.loads(line) for line in capsys.readouterr().out.splitlines()]
    assert [r["agent_id"] for r in rows] == ["adversary_0", "adversary_1", "adversary_2", "agent_0"]
    assert main(["stats", "--store", str(tag_store), "--by", "agent_id", "--gamma", "0.9"]) != 0
    err = capsys.readouterr().err
    assert err.startswith("trajstore: error: --gamma: discounted returns per agent") and err.count("\n") == 1


@pytest.fixture(scope="module")
def spread_store(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """simple_spread (3 agents of 18 floats) beside a CartPole run."""
    path = tmp_path_factory.mktemp("spread") / "store"
    store = trajstore.open(path, create=True)
    parallel_rollout(store, lambda: simple_spread_v3.parallel_env(max_cycles=10), run_id="spread", episodes=3,
                     seed=4, progress=False)
    trajstore.rollout.gym_rollout(store, "CartPole-v1", run_id="solo", num_envs=2, episodes=2, progress=False)
    return path


@pytest.mark.server
@pytest.mark.parametrize("limit", [2, 4, 7])
def test_step_pages_by_cursor_walk_every_agent_row_once(spread_store: Path, limit: int) -> None:
    """A page that ends inside an env step (4 rows: a step's 3 agents and the next step's first) goes on with that
    step's other agents: every row once, in (episode, step, agent) order, over REST and as the Client reads each
    episode. Each limit is prime to a step's 3 rows, so pages end after each of a step's agents in turn."""
    from tests.api.helpers import API_KEY, serve, settings_for
    from trajstore.api.app import create_app

    store = trajstore.open(spread_store)
    full = store.sql("SELECT episode_id, step, agent_id, reward FROM steps "
                     "ORDER BY episode_id, step, agent_id NULLS FIRST").to_pylist()
    for live in serve(create_app(settings_for(spread_store))):
        headers = {"Authorization": f"Bearer {API_KEY}"}
        got: list[dict[str, Any]] = []
        cursor = None
        while True:
            params = {"format": "json", "limit": limit, "columns": "episode_id,step,reward",
                      **({"cursor": cursor} if cursor else {})}
            body = httpx.get(f"{live.url}/steps", params=params, headers=headers).json()
            got += body["items"]
            cursor = body["next_cursor"]
            if cursor is None:
                break
            assert len(got) <= len(full)
        # episode ids are decimal strings in JSON (exact beyond 2**53)
        assert [(int(r["episode_id"]), r["step"]) for r in got] == [(r["episode_id"], r["step"]) for r in full]
        assert [r["reward"] for r in got] == pytest.approx([r["reward"] for r in full])
        with trajstore.Client(live.url, api_key=API_KEY) as client:
            spread = store.sql("SELECT episode_id FROM episodes WHERE run_id = 'spread' ORDER BY 1").column(0)
            for eid in spread.to_pylist():
                mine = client.episode_steps(eid, ["reward"]).to_pylist()
                paged = [r for r in full if r["episode_id"] == eid]
                assert [(r["step"], r["agent_id"], r["reward"]) for r in mine] == \
                    [(r["step"], r["agent_id"], pytest.approx(r["reward"])) for r in paged]
    # the store's own pages: an agent's row is keyed (episode_id, step, agent_id)
    spread = trajstore.EpisodeFilter(run_id=["spread"])
    page = plumbing(store).steps_page(["episode_id", "step"], filter=spread, limit=4).to_pylist()
    assert [r["agent_id"] for r in page] == ["agent_0", "agent_1", "agent_2", "agent_0"]
    last = page[-1]
    after = plumbing(store).steps_page(["step"], filter=spread, limit=2,
                             after=(last["episode_id"], last["step"], last["agent_id"])).to_pylist()
    assert after == [{"step": 1, "agent_id": "agent_1"}, {"step": 1, "agent_id": "agent_2"}]
