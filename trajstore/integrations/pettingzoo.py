"""Recording multi-agent envs where users step them: PettingZoo wrappers that store every agent's steps.

:class:`RecordParallelToStore` wraps a ``ParallelEnv``: each ``step(actions)`` stores one row per agent that
acted (its observation, action, reward, next observation, terminated, truncated), all at that env step.
:class:`RecordAECToStore` wraps an ``AECEnv`` (turn-based games): an agent's row for the turn it took holds the
reward it accumulated until its next turn (or the end) and its observation at that turn, as ``last()`` reports
them then; a row is stored once its agent's next ``last()`` is known. Both store agents of other spaces side by
side (:mod:`~trajstore.write.agents`), flush on ``close()``, and leave an episode the user stops mid-way
unfinished.

>>> import tempfile, trajstore
>>> from pettingzoo.classic import tictactoe_v3
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> env = RecordAECToStore(tictactoe_v3.env(), store, run_id="selfplay")
>>> env.reset(seed=0)
>>> for agent in env.agent_iter():
...     obs, reward, terminated, truncated, info = env.last()
...     mask = obs["action_mask"]
...     env.step(None if terminated or truncated else int(mask.argmax()))
>>> env.close()
>>> store.sql("SELECT agent_id, agent_return FROM agent_episodes ORDER BY agent_id").to_pylist()
[{'agent_id': 'player_1', 'agent_return': 1.0}, {'agent_id': 'player_2', 'agent_return': -1.0}]
"""

from __future__ import annotations

from typing import Any, Mapping

from trajstore.write.agents import AgentWriter


def env_name(env: Any) -> str:
    """An env's name for ``env_id``: its metadata's ``name`` (``simple_spread_v3``), else its class name."""
    base = getattr(env, "unwrapped", env)
    name = (getattr(base, "metadata", None) or {}).get("name")
    return str(name) if name else type(base).__name__


def agent_writer(env: Any, store: Any, *, run_id: str, env_id: str | None, **options: Any) -> AgentWriter:
    """An :class:`AgentWriter` for a PettingZoo env: its possible agents, each with its spaces."""
    agents = list(env.possible_agents)
    return AgentWriter(store, run_id=run_id, env_id=env_id or env_name(env), agents=agents,
                       observation_spaces={a: env.observation_space(a) for a in agents},
                       action_spaces={a: env.action_space(a) for a in agents}, **options)


class _Recorder:
    """What both recorders share: the env they wrap (its attributes are theirs), the writer, flush and close."""

    env: Any
    writer: AgentWriter

    def flush(self) -> None:
        self.writer.flush()

    def close(self) -> None:
        try:
            self.writer.close()
        finally:
            self.env.close()

    def __getattr__(self, name: str) -> Any:
        return getattr(self.env, name)

    def __enter__(self) -> Any:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


class RecordParallelToStore(_Recorder):
    """A PettingZoo ``ParallelEnv`` that stores the steps it takes in ``store`` under ``run_id``. Every attribute
    not defined here is the env's. ``env_id`` defaults to the env's name; other keywords go to the writer
    (``config``, ``tags``, ``seed``, ``mode``, …)."""

    def __init__(self, env: Any, store: Any, *, run_id: str, env_id: str | None = None, **options: Any) -> None:
        self.env = env
        self.writer = agent_writer(env, store, run_id=run_id, env_id=env_id, **options)
        self._obs: dict[str, Any] = {}
        self._step = 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> tuple[dict, dict]:
        self.writer.end_episode()
        obs, infos = self.env.reset(seed=seed, options=options)
        self._obs, self._step = dict(obs), 0
        return obs, infos

    def step(self, actions: Mapping[str, Any]) -> tuple[dict, dict, dict, dict, dict]:
        obs, rewards, terminations, truncations, infos = self.env.step(actions)
        rows = {a: (self._obs[a], action, rewards[a], obs[a], bool(terminations[a]), bool(truncations[a]))
                for a, action in actions.items() if a in self._obs and a in obs}
        self.writer.add(self._step, rows)
        self._step += 1
        self._obs = {a: o for a, o in obs.items() if not (terminations.get(a) or truncations.get(a))}
        if not self.env.agents:
            self.writer.end_episode()
        return obs, rewards, terminations, truncations, infos


class RecordAECToStore(_Recorder):
    """A PettingZoo ``AECEnv`` (turn-based) that stores the turns taken in ``store`` under ``run_id``: an
    agent's row is its turn's observation and action, with the reward, observation and flags its next ``last()``
    reports. Every attribute not defined here is the env's (``agent_iter``, ``last``, ``agent_selection``, …)."""

    def __init__(self, env: Any, store: Any, *, run_id: str, env_id: str | None = None, **options: Any) -> None:
        self.env = env
        self.writer = agent_writer(env, store, run_id=run_id, env_id=env_id, **options)
        self._turn: dict[str, tuple[int, Any, Any]] = {}  # agent -> (step, obs, action) of its turn in waiting
        self._step = 0

    def reset(self, seed: int | None = None, options: dict[str, Any] | None = None) -> None:
        self.writer.end_episode()
        self._turn, self._step = {}, 0
        self.env.reset(seed=seed, options=options)

    def agent_iter(self, max_iter: int = 2**63) -> Any:
        return self.env.agent_iter(max_iter)

    def step(self, action: Any) -> None:
        agent = self.env.agent_selection
        obs, reward, terminated, truncated, _ = self.env.last()
        waiting = self._turn.pop(agent, None)
        if waiting is not None:
            step, before, taken = waiting
            self.writer.add(step, {agent: (before, taken, reward, obs, bool(terminated), bool(truncated))})
        if not (terminated or truncated):
            self._turn[agent] = (self._step, obs, action)
            self._step += 1
        self.env.step(action)
        if not self.env.agents:
            self._finish()

    def _finish(self) -> None:
        """The episode ended: each turn still waiting gets what ``last()`` says of its agent now."""
        for agent, (step, before, taken) in self._turn.items():
            obs = self.env.observe(agent)
            base = self.env.unwrapped
            self.writer.add(step, {agent: (before, taken, base._cumulative_rewards.get(agent, 0.0), obs,
                                           bool(base.terminations.get(agent, False)),
                                           bool(base.truncations.get(agent, False)))})
        self._turn = {}
        self.writer.end_episode()
