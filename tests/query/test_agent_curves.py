"""Learning curves per agent (``binned_curves(by="agent_id" | "agent_group")``) and each agent's return-to-go, over
a real mpe2 simple_spread run (``local_ratio=0.5``: each agent's reward partly its own) and a real simple_tag run
(two groups: adversaries and the agent), against plain loops over the ``agent_episodes`` and ``steps`` rows."""

from __future__ import annotations

from typing import Any

import numpy as np
import pytest

import trajstore
from tests.query.test_curves import reference_x
from tests.query.test_returns import reference_return_to_go
from trajstore.errors import InputError

pytest.importorskip("mpe2")

from mpe2 import simple_spread_v3, simple_tag_v3

from trajstore.rollout import gym_rollout, parallel_rollout
from trajstore.store import plumbing


@pytest.fixture(scope="module")
def agents(tmp_path_factory: pytest.TempPathFactory) -> trajstore.Store:
    store = trajstore.open(tmp_path_factory.mktemp("agent-curves") / "store", create=True)
    parallel_rollout(store, lambda: simple_spread_v3.parallel_env(max_cycles=20, local_ratio=0.5), run_id="spread",
                     episodes=24, seed=0, progress=False)
    parallel_rollout(store, lambda: simple_tag_v3.parallel_env(max_cycles=15), run_id="tag", episodes=12, seed=1,
                     progress=False)
    gym_rollout(store, "CartPole-v1", run_id="solo", num_envs=2, episodes=10, seed=0, progress=False)
    return store


def reference_agent_bins(store: trajstore.Store, by: str, x: str, y: str, bins: int) -> list[dict[str, Any]]:
    """Per (run, env, agent) and non-empty bin: numpy's edges over the agents' points (each at its episode's x),
    numpy's mean and 'linear' percentiles of each agent's own return or length."""
    curve = store.curves().to_pydict()
    at = {(r, e, i): k for k, (r, e, i) in enumerate(zip(curve["run_id"], curve["env_id"], curve["episode_id"]))}
    xs_of = reference_x(curve, x)
    group = (lambda a: a.rsplit("_", 1)[0]) if by == "agent_group" else (lambda a: a)
    rows = [r for r in store.sql("SELECT * FROM agent_episodes").to_pylist()
            if (r["run_id"], r["env_id"], r["episode_id"]) in at]
    xs = np.array([xs_of[at[(r["run_id"], r["env_id"], r["episode_id"])]] for r in rows])
    ys = np.array([r["agent_return" if y == "episode_return" else "agent_length"] for r in rows], float)
    keys = [(r["run_id"], r["env_id"], group(r["agent_id"])) for r in rows]
    edges = np.histogram_bin_edges(xs, bins)
    index = np.minimum(np.searchsorted(edges, xs, side="right") - 1, bins - 1)
    out = []
    for key in sorted(set(keys)):
        for b in range(bins):
            v = ys[[k == key and i == b for k, i in zip(keys, index)]]
            if len(v):
                p10, p50, p90 = np.percentile(v, [10, 50, 90], method="linear")
                out.append({"run_id": key[0], "env_id": key[1], by: key[2], "bin": b, "lo": edges[b],
                            "hi": edges[b + 1], "count": len(v), "mean": v.mean(), "p10": p10, "p50": p50, "p90": p90})
    return out


@pytest.mark.parametrize(("by", "x", "y", "bins"), [
    ("agent_id", "env_steps", "episode_return", 10), ("agent_group", "episode_index", "episode_return", 4),
    ("agent_id", "wall_time", "episode_length", 3)])
def test_binned_curves_per_agent_match_numpy(agents: trajstore.Store, by: str, x: str, y: str, bins: int) -> None:
    got = plumbing(agents).binned_curves(by=by, x=x, y=y, bins=bins).to_pylist()
    want = reference_agent_bins(agents, by, x, y, bins)
    assert [{k: r[k] for k in ("run_id", "env_id", by, "bin", "count")} for r in got] == \
        [{k: r[k] for k in ("run_id", "env_id", by, "bin", "count")} for r in want]
    for g, w in zip(got, want):
        assert [g[k] for k in ("lo", "hi", "mean", "p10", "p50", "p90")] == \
            pytest.approx([w[k] for k in ("lo", "hi", "mean", "p10", "p50", "p90")], rel=1e-9, abs=1e-9)
    assert {r["run_id"] for r in got} == {"spread", "tag"}  # the single-agent run has no agent series


def test_groups_pool_their_agents(agents: trajstore.Store) -> None:
    groups = plumbing(agents).binned_curves(by="agent_group", bins=1, run_id="tag").to_pylist()
    assert [r["agent_group"] for r in groups] == ["adversary", "agent"]
    per_agent = agents.sql("SELECT agent_id, count(*) AS n FROM agent_episodes WHERE run_id = 'tag' AND complete "
                           "GROUP BY ALL").to_pylist()
    assert groups[0]["count"] == sum(r["n"] for r in per_agent if r["agent_id"].startswith("adversary"))


def test_curves_per_agent_refuse_what_they_do_not_bin(agents: trajstore.Store) -> None:
    with pytest.raises(InputError, match="by: curves per agent bin each agent's own return or length"):
        plumbing(agents).binned_curves(by="agent_id", gamma=0.9)
    with pytest.raises(InputError, match="by: curves per agent"):
        plumbing(agents).binned_curves(by="agent_id", metric="episode_length")
    with pytest.raises(InputError, match="by: per-agent rows are by one of agent_id, agent_group, got 'run_id'"):
        plumbing(agents).binned_curves(by="run_id")


def test_a_store_without_agents_has_no_agent_curves(store: trajstore.Store) -> None:
    gym_rollout(store, "CartPole-v1", run_id="solo", num_envs=2, episodes=4, seed=0, progress=False)
    empty = plumbing(store).binned_curves(by="agent_id")
    assert empty.num_rows == 0 and empty.column_names[:3] == ["run_id", "env_id", "agent_id"]


@pytest.mark.parametrize("gamma", [0.0, 0.9, 1.0])
def test_each_agents_return_to_go_is_over_its_own_rewards(agents: trajstore.Store, gamma: float) -> None:
    got = agents.returns(gamma=gamma, per="step").to_pylist()
    steps = agents.sql("SELECT episode_id, agent_id, step, reward FROM steps ORDER BY episode_id, agent_id, "
                       "step").to_pylist()
    want: dict[tuple[int, Any, int], float] = {}
    trajectories: dict[tuple[int, Any], list[dict[str, Any]]] = {}
    for row in steps:
        trajectories.setdefault((row["episode_id"], row["agent_id"]), []).append(row)
    for (episode, agent), rows in trajectories.items():
        rtg = reference_return_to_go(np.array([r["reward"] for r in rows], np.float32), gamma)
        want.update({(episode, agent, r["step"]): g for r, g in zip(rows, rtg)})
    assert len(got) == len(want)
    assert [(r["episode_id"], r["step"]) for r in got] == sorted((r["episode_id"], r["step"]) for r in got)
    for r in got:
        assert r["return_to_go"] == pytest.approx(want[(r["episode_id"], r["agent_id"], r["step"])], rel=1e-9)
    solo = [r for r in got if r["run_id"] == "solo"]
    assert solo and all(r["agent_id"] is None for r in solo)  # single-agent rows: as before, agent_id null
