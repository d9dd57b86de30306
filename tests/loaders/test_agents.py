"""Store.sequences / Store.transitions with ``agent_id=``: windows and n-step transitions inside each agent's own
trajectory, equal to plain loops over that agent's rows as ``store.sql`` reads them, on real PettingZoo envs:
mpe2's simple_spread (3 alike agents at every env step), tictactoe (turn-based: an agent's rows skip the other's
env steps) and simple_tag (adversaries observe 16 floats, the agent 14: not one batch)."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path
from typing import Any, Callable

import numpy as np
import pytest

import trajstore
from trajstore.errors import InputError

pytest.importorskip("pettingzoo")
pytest.importorskip("mpe2")

from mpe2 import simple_spread_v3, simple_tag_v3
from pettingzoo.classic import tictactoe_v3

from trajstore.integrations.pettingzoo import RecordAECToStore
from trajstore.rollout import parallel_rollout

Trajectory = dict[str, Any]  # column -> values of one agent's rows of one episode, in step order


@pytest.fixture(scope="module")
def spread(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    """simple_spread: 3 complete episodes of 12 env steps and one stopped after 5, beside a CartPole run."""
    store = trajstore.open(tmp_path_factory.mktemp("spread") / "store", create=True)
    parallel_rollout(store, lambda: simple_spread_v3.parallel_env(max_cycles=12), run_id="spread", episodes=3,
                     steps=3 * (3 * 12) + 3 * 5, seed=4, progress=False)
    trajstore.rollout.gym_rollout(store, "CartPole-v1", run_id="solo", num_envs=2, episodes=2, progress=False)
    return store


@pytest.fixture(scope="module")
def games(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    """tictactoe, 6 games of random legal moves: each player's rows are every other env step."""
    store = trajstore.open(tmp_path_factory.mktemp("ttt") / "store", create=True)
    rng = np.random.default_rng(0)
    env = RecordAECToStore(tictactoe_v3.env(), store, run_id="ttt")
    for game in range(6):
        env.reset(seed=game)
        for _ in env.agent_iter():
            obs, _, terminated, truncated, _ = env.last()
            env.step(None if terminated or truncated else int(rng.choice(np.flatnonzero(obs["action_mask"]))))
    env.close()
    return store


def trajectories(store: trajstore.Store, agents: list[str], columns: list[str]) -> dict[tuple[int, str], Trajectory]:
    """Each (episode, agent)'s rows of ``agents`` in step order, read by plain SQL: the reference."""
    names = ", ".join(f"'{a}'" for a in agents)
    rows = store.sql(f"SELECT episode_id, agent_id, step, {', '.join(columns)} FROM steps "
                     f"WHERE agent_id IN ({names}) ORDER BY episode_id, agent_id, step").to_pylist()
    out: dict[tuple[int, str], dict[str, list[Any]]] = defaultdict(lambda: defaultdict(list))
    for r in rows:
        mine = out[(r.pop("episode_id"), r.pop("agent_id"))]
        for k, v in r.items():
            mine[k].append(v)
    return {key: {k: _array(v) for k, v in cols.items()} for key, cols in out.items()}


def _array(values: list[Any]) -> Any:
    if isinstance(values[0], dict):  # a Dict observation: its leaves
        return {k: _array([v[k] for v in values]) for k in values[0]}
    return np.asarray(values)


def _leaf(values: Any, i: Any) -> Any:
    return {k: _leaf(v, i) for k, v in values.items()} if isinstance(values, dict) else values[i]


def reference_windows(trajs: dict[tuple[int, str], Trajectory], columns: list[str], length: int, stride: int,
                      pad: bool) -> dict[tuple[int, str, int], dict[str, Any]]:
    """Every window of every trajectory, by a plain loop over its rows: keyed (episode_id, agent_id, start)."""
    out = {}
    for (eid, agent), cols in trajs.items():
        n = len(cols["step"])
        start = 0
        while start < n and (pad or start + length <= n):
            take = [min(start + i, n - 1) for i in range(length)]
            mask = np.array([start + i < n for i in range(length)])
            w: dict[str, Any] = {"mask": mask}
            for c in columns:
                w[c] = _zeroed(_leaf(cols[c], take), mask)
            out[(eid, agent, start)] = w
            start += stride
    return out


def _zeroed(values: Any, mask: np.ndarray) -> Any:
    if isinstance(values, dict):
        return {k: _zeroed(v, mask) for k, v in values.items()}
    values = np.array(values)
    values[~mask] = 0
    return values


def reference_transitions(trajs: dict[tuple[int, str], Trajectory], n: int,
                          gamma: float) -> dict[tuple[int, str, int], dict[str, Any]]:
    """Every n-step transition of every trajectory by a plain loop: keyed (episode_id, agent_id, t)."""
    out = {}
    for (eid, agent), cols in trajs.items():
        length = len(cols["step"])
        for t in range(length):
            m = min(n, length - t)
            terminated = bool(np.any(cols["terminated"][t:t + m]))
            out[(eid, agent, t)] = {
                "action": cols["action"][t],
                "reward": sum(gamma ** k * float(cols["reward"][t + k]) for k in range(m)),
                "next_obs": _leaf(cols["next_obs"], t + m - 1), "terminated": terminated,
                "discount": 0.0 if terminated else gamma ** m}
    return out


def items(batches: Any, key: str) -> dict[tuple[int, str, int], dict[str, Any]]:
    """Every item of every batch, keyed (episode_id, agent_id, start or step); each key once."""
    out: dict[tuple[int, str, int], dict[str, Any]] = {}
    for b in batches:
        assert b["agent_id"].dtype.kind == "U"
        for i in range(len(b["episode_id"])):
            k = (int(b["episode_id"][i]), str(b["agent_id"][i]), int(b[key][i]))
            assert k not in out
            out[k] = {name: _leaf(v, i) for name, v in b.items()}
    return out


def assert_close(got: Any, want: Any, what: Any) -> None:
    if isinstance(want, dict):
        assert set(got) == set(want), what
        for k in want:
            assert_close(got[k], want[k], (what, k))
        return
    np.testing.assert_allclose(np.asarray(got, np.float64), np.asarray(want, np.float64), rtol=1e-6, atol=1e-6,
                               err_msg=str(what))


@pytest.mark.parametrize(("length", "stride", "pad"), [(4, None, False), (5, 2, True), (1, None, False),
                                                       (20, None, True)])
def test_windows_of_each_agent_equal_a_loop_over_its_rows(spread: trajstore.Store, length: int, stride: int | None,
                                                          pad: bool) -> None:
    agents = ["agent_0", "agent_2"]
    columns = ["obs", "action", "reward", "terminated", "truncated"]
    want = reference_windows(trajectories(spread, agents, columns), columns, length, stride or length, pad)
    got = items(spread.sequences(length, stride=stride, pad=pad, agent_id=agents, columns=columns, batch_size=7,
                                 shuffle=True, seed=1), "start")
    assert sorted(got) == sorted(want) and want
    for k, w in want.items():
        for name in ("mask", *columns):
            assert_close(got[k][name], w[name], (k, name))


def test_transitions_of_each_agent_equal_a_loop_over_its_rows(spread: trajstore.Store) -> None:
    trajs = trajectories(spread, ["agent_1"], ["obs", "action", "reward", "terminated", "next_obs"])
    assert sorted(len(t["step"]) for t in trajs.values()) == [5, 12, 12, 12]  # the stopped episode too
    for n in (1, 3, 20):
        want = reference_transitions(trajs, n, 0.9)
        got = items(spread.transitions(n, gamma=0.9, agent_id="agent_1", batch_size=10), "step")
        assert sorted(got) == sorted(want)
        for k, w in want.items():
            for name, value in w.items():
                assert_close(got[k][name], value, (n, k, name))


def test_turn_based_agents_step_through_their_own_turns(games: trajstore.Store) -> None:
    """A player acts at every other env step: its trajectory is its own rows, windows and n-step returns never
    count the other player's turns, and ``start``/``step`` count the player's rows."""
    agents = ["player_1", "player_2"]
    trajs = trajectories(games, agents, ["obs", "action", "reward", "terminated", "truncated", "next_obs"])
    steps = {agent: [t["step"] for (_, a), t in trajs.items() if a == agent] for agent in agents}
    assert all((np.diff(s) == 2).all() for s in steps["player_1"] + steps["player_2"])  # gaps of the other's turn
    assert {int(s[0]) for s in steps["player_2"]} == {1}
    columns = ["obs", "action", "reward", "terminated"]
    want = reference_windows(trajs, columns, 2, 1, True)
    got = items(games.sequences(2, stride=1, pad=True, columns=columns, agent_id=agents, batch_size=8), "start")
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        for name in ("mask", *columns):
            assert_close(got[k][name], w[name], (k, name))
    want = reference_transitions(trajs, 2, 0.5)
    got = items(games.transitions(2, gamma=0.5, columns=["action"], agent_id=agents, batch_size=5), "step")
    assert sorted(got) == sorted(want)
    for k, w in want.items():
        for name, value in w.items():
            assert_close(got[k][name], value, (k, name))
    ends = [w["reward"] for k, w in got.items() if w["terminated"]]
    assert ends and {round(float(r)) for r in ends} <= {-1, 0, 1}  # each player's own result at its last turn


def test_agents_of_other_spaces_are_refused_naming_them(tmp_path: Path) -> None:
    store = trajstore.open(tmp_path / "s", create=True)
    parallel_rollout(store, lambda: simple_tag_v3.parallel_env(max_cycles=8), run_id="tag", episodes=2, seed=2,
                     progress=False)
    differ = r"obs \(float32\[16\]: adversary_0; float32\[14\]: agent_0\)"
    refused = r"^agent_id: the agents 'adversary_0', 'agent_0' differ in "
    for read, message in ((lambda **kw: store.sequences(2, **kw), refused + differ + "; a batch stacks"),
                          (lambda **kw: store.transitions(1, gamma=0.9, **kw),
                           refused + differ + ", next_" + differ + "; a batch stacks")):
        with pytest.raises(InputError, match=message) as caught:
            read(agent_id=["adversary_0", "agent_0"], columns=["obs", "action"])
        assert "\n" not in str(caught.value)
    with pytest.raises(InputError, match=r"^agent_id: no rows of 'agent_9' in the selection \(run_id='tag'\); its "
                                         r"agents are 'adversary_0', 'adversary_1', 'adversary_2', 'agent_0'"):
        store.sequences(2, run_id="tag", agent_id="agent_9")
    # alike agents go together: every trajectory of the three adversaries is an item, shuffled among the others
    batches = list(store.sequences(4, agent_id=["adversary_0", "adversary_1", "adversary_2"], shuffle=True,
                                   batch_size=6))
    assert sum(len(b["agent_id"]) for b in batches) == 3 * 2 * 2
    assert len(set(batches[0]["agent_id"].tolist())) > 1 and batches[0]["obs"].shape == (6, 4, 16)
    agent = next(iter(store.sequences(8, agent_id="agent_0")))
    assert agent["obs"].shape == (2, 8, 14) and set(agent["agent_id"].tolist()) == {"agent_0"}


def test_multi_agent_runs_need_agent_id(spread: trajstore.Store) -> None:
    for read in (lambda **kw: spread.sequences(4, **kw), lambda **kw: spread.transitions(1, gamma=0.9, **kw)):
        with pytest.raises(InputError, match=r"^run_id: 'spread' holds multi-agent episodes .*pass agent_id=") as e:
            read()
        assert "\n" not in str(e.value)
        solo = next(iter(read(run_id="solo")))
        assert "agent_id" not in solo
    # agent_id keeps agents' rows alone: the CartPole run's rows are nobody's
    got = items(spread.sequences(1, agent_id="agent_0"), "start")
    assert len(got) == 3 * 12 + 5


def test_resume_continues_the_agents_order_and_layouts_are_kept(spread: trajstore.Store,
                                                                built: Callable[[], int]) -> None:
    args = dict(agent_id=["agent_0", "agent_1"], shuffle=True, seed=5, epoch=1, batch_size=4, pad=True)
    full = list(spread.sequences(3, **args))
    it = spread.sequences(3, **args)
    first = [next(it) for _ in range(3)]
    state = it.state_dict()
    it.close()
    rest = list(spread.sequences(3, resume=state, **args))
    keys = [(e, a, s) for b in first + rest for e, a, s in zip(b["episode_id"], b["agent_id"], b["start"])]
    assert keys == [(e, a, s) for b in full for e, a, s in zip(b["episode_id"], b["agent_id"], b["start"])]
    np.testing.assert_array_equal(np.concatenate([b["obs"] for b in rest]),
                                  np.concatenate([b["obs"] for b in full[3:]]))
    with pytest.raises(InputError, match="resume: the state was made with other arguments"):
        spread.sequences(3, resume=state, **{**args, "agent_id": ["agent_0", "agent_2"]})
    before = built()
    again = trajstore.open(spread.uri)  # nothing kept in its memory
    list(again.sequences(3, **args))  # found in the store, not built again
    assert built() == before
    list(again.sequences(3, **{**args, "agent_id": "agent_2"}))  # another agent: another layout
    assert built() == before + 1


@pytest.mark.server
def test_rest_and_the_client_give_the_agents_batches(spread: trajstore.Store) -> None:
    from tests.api.helpers import API_KEY, serve, settings_for
    from trajstore.api.app import create_app

    local = list(spread.sequences(4, agent_id=["agent_0", "agent_1"], batch_size=5, shuffle=True))
    steps = list(spread.transitions(2, gamma=0.8, agent_id="agent_2", batch_size=16))
    for live in serve(create_app(settings_for(Path(spread.uri)))):
        with trajstore.Client(live.url, api_key=API_KEY) as client:
            remote = list(client.sequences(4, agent_id=["agent_0", "agent_1"], batch_size=5, shuffle=True))
            far = list(client.transitions(2, gamma=0.8, agent_id="agent_2", batch_size=16))
    for mine, theirs in ((local, remote), (steps, far)):
        assert len(mine) == len(theirs)
        for a, b in zip(mine, theirs):
            assert set(a) == set(b)
            for name in a:
                np.testing.assert_array_equal(a[name], b[name])
            assert b["agent_id"].dtype.kind == "U"


@pytest.mark.parametrize("format", ["torch", "jax", "arrow"])
def test_every_format_names_the_agent(spread: trajstore.Store, format: str) -> None:  # noqa: A002
    """Tensors of torch and JAX hold no text: ``agent_id`` stays a numpy array of str beside them."""
    pytest.importorskip({"torch": "torch", "jax": "jax", "arrow": "pyarrow"}[format])
    batch = next(iter(spread.sequences(4, agent_id="agent_1", format=format, batch_size=3)))
    if format == "arrow":
        assert batch.column("agent_id").to_pylist() == ["agent_1"] * 3
        return
    assert batch["agent_id"].tolist() == ["agent_1"] * 3
    assert tuple(batch["obs"].shape) == (3, 4, 18) and not isinstance(batch["obs"], np.ndarray)  # a tensor
