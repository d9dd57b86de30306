"""Rolling out a multi-agent PettingZoo ``ParallelEnv`` into a store.

:func:`parallel_rollout` steps one env (or one made by a zero-argument factory) with a policy per agent, or
random actions, and records it through :class:`~trajstore.integrations.pettingzoo.RecordParallelToStore`: one
row per agent per env step, the agents of an episode sharing its id.

>>> import tempfile, trajstore
>>> from mpe2 import simple_spread_v3
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> result = parallel_rollout(store, simple_spread_v3.parallel_env, run_id="spread", episodes=2, seed=0,
...                           progress=False)
>>> store.sql("SELECT n_agents, episode_length FROM episodes").to_pylist()
[{'n_agents': 3, 'episode_length': 25}, {'n_agents': 3, 'episode_length': 25}]
"""

from __future__ import annotations

import time
from typing import Any, Callable

from trajstore.errors import InputError
from trajstore.integrations.pettingzoo import RecordParallelToStore
from trajstore.rollout.progress import Progress, RolloutProgress
from trajstore.rollout.sampling import RolloutResult, sample_until
from trajstore.rollout.target import Mode, check_mode, check_run

AgentPolicy = Callable[[str, Any], Any]
"""``policy(agent_id, obs) -> action`` for one agent."""


def parallel_rollout(store: Any, env: Any, *, run_id: str, env_id: str | None = None,
                     policy: AgentPolicy | None = None, episodes: int | None = None, steps: int | None = None,
                     seed: int | None = 0, mode: Mode = "train", append: bool = False, progress: Progress = True,
                     **options: Any) -> RolloutResult:
    """Roll out a PettingZoo ``ParallelEnv`` (or a zero-argument factory of one) into ``store`` until
    ``episodes`` complete episodes and ``steps`` stored agent rows are reached (both, when both are given).

    ``policy(agent_id, obs) -> action`` acts for each agent; without one, actions are sampled from each agent's
    action space (seeded with ``seed``, which also seeds the first reset; ``None`` seeds nothing). An episode
    running at the stop is stored too, unfinished. Every row stores ``mode`` and ``seed`` (as given), as every
    rollout does; one env plays, so ``mode="eval"`` with ``episodes=N`` stores exactly its first N episodes. A
    ``run_id`` the store already holds is refused unless ``append=True``. Other keywords go to the writer
    (``config``, ``tags``, lineage values). The result counts agent rows as ``steps``; its returns are the
    episodes' (summed over agents) and lengths their env steps."""
    if check_mode(mode) == "eval" and (episodes is None or steps is not None):
        raise InputError("mode='eval' runs exactly `episodes` complete episodes: give episodes=N and no steps=")
    until = sample_until(min_timesteps=steps, min_episodes=episodes)
    made = env() if callable(env) and not hasattr(env, "possible_agents") else env
    if not hasattr(made, "possible_agents") or not hasattr(made, "step"):
        raise InputError(f"env: expected a PettingZoo ParallelEnv or a factory of one, got {type(made).__name__}")
    check_run(store, run_id, mode=mode, append=append)
    options["mode"] = mode
    if seed is not None:
        options["seed"] = seed  # recorded with every row, as gym_rollout and jax_rollout do
    recorder = RecordParallelToStore(made, store, run_id=run_id, env_id=env_id, **options)
    result = RolloutResult(run_id=run_id, env_id=recorder.writer.env_id)
    start = time.perf_counter()
    with recorder, RolloutProgress(episodes=episodes, steps=steps, enabled=progress, desc="parallel rollout") as bar:
        for a in made.possible_agents:
            made.action_space(a).seed(None if seed is None else seed + made.possible_agents.index(a))
        obs, _ = recorder.reset(seed=seed)
        ret, length = 0.0, 0
        while not until(episodes=result.episodes, timesteps=result.steps):
            actions = {a: made.action_space(a).sample() if policy is None else policy(a, obs[a]) for a in made.agents}
            obs, rewards, _, _, _ = recorder.step(actions)
            result.steps += len(actions)
            ret += float(sum(rewards[a] for a in actions))
            length += 1
            if not made.agents:
                result.episodes += 1
                result.episode_returns.append(ret)
                result.episode_lengths.append(length)
                bar.update(steps=result.steps, episodes=result.episodes, returns=[ret])
                ret, length = 0.0, 0
                obs, _ = recorder.reset()
            else:
                bar.update(steps=result.steps, episodes=result.episodes)
        bar.finish(steps=result.steps, episodes=result.episodes)
    result.seconds = time.perf_counter() - start
    return result
