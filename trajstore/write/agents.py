"""Writing multi-agent episodes: one row per agent per env step at which it acted, the agents of an episode
sharing its ``episode_id``.

An :class:`AgentWriter` takes the rows of one environment as they happen (:meth:`AgentWriter.add`: the env step
and, per agent that acted, its observation, action, reward, next observation and flags) and hands them, up to
16,384 rows or about 16 MB of their values at a time, to one :class:`~trajstore.write.writer.Writer` per kind of
agent (agents whose spaces are alike share one; ``simple_tag``'s adversaries and its agent do not), whose lanes are
its agents. The
writer fills ``agent_id`` and takes each row's ``episode_id``, ``step`` (the env step) and ``env_steps`` from here.
An agent's ``next_obs`` is stored whole: its next row is not the episode's next row (see the ``agent_id`` column of
``schemas/step.v1.json``).

>>> import numpy as np, trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> with AgentWriter(store, run_id="duo", env_id="Pair-v0", agents=["a_0", "a_1"]) as w:
...     for t in range(3):
...         done = t == 2
...         w.add(t, {a: (np.zeros(2, np.float32), 0, 1.0, np.zeros(2, np.float32), done, False)
...                   for a in ("a_0", "a_1")})
...     w.end_episode()
>>> store.sql("SELECT episode_length, episode_return, n_agents FROM episodes").to_pylist()
[{'episode_length': 3, 'episode_return': 6.0, 'n_agents': 2}]
"""

from __future__ import annotations

import math
from typing import Any, Mapping, Sequence

import numpy as np

from trajstore import schema as sch
from trajstore.errors import InputError
from trajstore.write.episode_ids import EpisodeIds
from trajstore.write.writer import Writer

FIELDS = ("obs", "action", "reward", "next_obs", "terminated", "truncated")
ROWS_PER_CALL = 16384  # at most this many buffered rows of one kind of agent handed to its writer in one call,
BYTES_PER_CALL = 16 * 1024 * 1024  # and at most about this many bytes of their values (wide observations)


class _Kind:
    """The agents of one kind (alike spaces): their writer and their rows since its last call, lane by lane, a list
    per field (a row is appended where its batch takes it: no tuple per row, no pass over the rows per field)."""

    def __init__(self, writer: Writer, agents: list[str], env_index: int) -> None:
        self.writer, self.agents, self.env_index = writer, agents, env_index
        self.lane = {a: i for i, a in enumerate(agents)}
        self.limit = 0  # rows per hand-over, from the first row's size (0: no row seen yet)
        self._clear()

    def _clear(self) -> None:
        # per lane: one list per field of FIELDS, then the rows' episode ids, env steps and cumulative env steps
        self.lanes: list[tuple[list[Any], ...]] = [tuple([] for _ in range(len(FIELDS) + 3)) for _ in self.agents]
        self.count = 0

    def add(self, agent: str, row: Sequence[Any], episode: int, step: int, env_steps: int) -> None:
        obs, action, reward, next_obs, terminated, truncated = row
        o, a, r, n, te, tr, e, s, c = self.lanes[self.lane[agent]]
        o.append(obs)
        a.append(action)
        r.append(reward)
        n.append(next_obs)
        te.append(terminated)
        tr.append(truncated)
        e.append(episode)
        s.append(step)
        c.append(env_steps)
        self.count += 1

    def send(self) -> None:
        """The buffered rows as one ``(T, B)`` batch: lane b's rows at t = 0, 1, … (in their order), the rest not
        valid (filled with the first row's values)."""
        if not self.count:
            return
        counts = [len(lane[0]) for lane in self.lanes]
        T = max(counts)
        valid = np.arange(T)[:, None] < np.asarray(counts)[None, :]
        batch = {name: _column([lane[i] for lane in self.lanes], T, name) for i, name in enumerate(FIELDS)}
        batch["valid"] = valid
        if all(type(r) in _PLAIN for lane in self.lanes for r in lane[2]):
            batch["reward"] = _plain_rewards(batch["reward"])
        batch["terminated"] = batch["terminated"].astype(bool) & valid
        batch["truncated"] = batch["truncated"].astype(bool) & valid
        keys = {name: _column([lane[len(FIELDS) + i] for lane in self.lanes], T, name)
                for i, name in enumerate(("episode_id", "step", "env_steps"))}
        keys["env_index"] = np.full((T, len(self.agents)), self.env_index, np.int64)
        self.writer._add(batch, keys)
        self._clear()


_PLAIN = (bool, int, float)


def _column(lanes: list[list[Any]], T: int, name: str) -> Any:
    """Each lane's values (arrays, numbers or dicts of them) as one ``(T, B, …)`` array per leaf, lane b's at
    ``[:len(lanes[b]), b]`` and its first value in the cells after them (not valid)."""
    sample = next(v[0] for v in lanes if v)
    if isinstance(sample, Mapping):
        return {k: _column([[_key(v, k, name) for v in lane] for lane in lanes], T, f"{name}.{k}") for k in sample}
    try:
        # np.array builds a lane's (n, …) array from its n values in one pass (np.stack looks at each value a few
        # times in Python); values of different shapes are a ValueError either way
        arrays = [(b, np.array(v)) for b, v in enumerate(lanes) if v]
        if any(a.ndim != arrays[0][1].ndim for _, a in arrays):
            raise ValueError(f"shapes {sorted({a.shape[1:] for _, a in arrays})}")
        if len({a.shape[1:] for _, a in arrays}) > 1:
            raise ValueError(f"shapes {sorted({a.shape[1:] for _, a in arrays})}")
    except ValueError as exc:
        raise InputError(f"{name}: the agents of one kind give values of different shapes ({exc}); give each "
                         "kind its spaces (observation_spaces=, action_spaces=)") from None
    first = arrays[0][1]
    out = np.empty((T, len(lanes), *first.shape[1:]), np.result_type(*(a for _, a in arrays)))
    out[:] = first[0]
    for b, values in arrays:
        out[:len(values), b] = values
    return out


def _plain_rewards(reward: np.ndarray) -> np.ndarray:
    """Rewards given as Python numbers (PettingZoo's), float64 once in an array, as the step schema's float32; a
    reward given with a dtype of its own keeps it (float64 is kept). One past float32's range becomes infinity, which
    the writer refuses."""
    with np.errstate(over="ignore"):
        return reward.astype(np.float32)


def _key(value: Any, key: str, name: str) -> Any:
    if not isinstance(value, Mapping) or key not in value:
        raise InputError(f"{name}: expected a dict with key {key!r} like the first row, got {type(value).__name__}")
    return value[key]


class AgentWriter:
    """Appends the multi-agent episodes of one ``(run_id, env_id)`` to a store; use as a context manager.

    ``agents``: every agent that may act (PettingZoo's ``possible_agents``). ``observation_spaces`` and
    ``action_spaces`` (agent -> gymnasium space) put agents of other spaces in writers of their own; without them,
    all agents share one writer and must give alike values. Other keywords are writer options or lineage
    (``config``, ``tags``, ``notes``, ``seed``, ``mode``, …), as for :meth:`trajstore.Store.writer`.
    """

    def __init__(self, store: Any, *, run_id: str, env_id: str, agents: Sequence[str],
                 observation_spaces: Mapping[str, Any] | None = None, action_spaces: Mapping[str, Any] | None = None,
                 env_index: int = 0, **options: Any) -> None:
        names = list(agents)
        if not names or len(set(names)) != len(names) or not all(isinstance(a, str) and a for a in names):
            raise InputError(f"agents: expected distinct non-empty agent names, got {names!r}")
        self.agents, self.env_index, self.run_id, self.env_id = names, int(env_index), run_id, env_id
        self._kinds: list[_Kind] = []
        self._kind_of: dict[str, _Kind] = {}
        try:
            for members, obs_space, act_space in _kinds(names, observation_spaces, action_spaces):
                writer = store.writer(run_id=run_id, env_id=env_id, agents=members, observation_space=obs_space,
                                      action_space=act_space, **options)
                kind = _Kind(writer, members, self.env_index)
                self._kinds.append(kind)
                self._kind_of.update(dict.fromkeys(members, kind))
        except BaseException:
            for kind in self._kinds:
                kind.writer.close()
            raise
        self._ids = EpisodeIds()
        self._episode: int | None = None
        self._length = 0  # env steps of the open episode seen so far
        self._base = 0  # env steps of the episodes before it
        self._acted: set[str] = set()  # agents that acted in the open episode
        self._last: dict[str, int] = {}  # each of them: the env step it last acted at (kept across flushes)
        self._ended: set[str] = set()  # those of them whose row ended it
        self.steps_written = 0
        self.episodes_completed = 0  # closed episodes every agent that acted in ended (the episodes view's rule)

    @property
    def episode_id(self) -> int | None:
        """The open episode's id (None between episodes)."""
        return self._episode

    def add(self, step: int, rows: Mapping[str, Sequence[Any]]) -> None:
        """The rows of the agents that acted at env ``step`` of the open episode (one is opened if none is):
        agent -> ``(obs, action, reward, next_obs, terminated, truncated)``. An agent's env steps in one episode
        strictly increase (it may skip some), also across flushes; an agent whose row ended it acts no more in this
        episode. Nothing of the call is kept if one of its rows is refused."""
        step = int(step)
        if step < 0:
            raise InputError(f"step: expected the env step (>= 0), got {step}")
        kind_of, ended, last, width = self._kind_of, self._ended, self._last, len(FIELDS)
        for agent, row in rows.items():
            if agent not in kind_of:
                raise InputError(f"agent_id: {agent!r} is not one of this writer's agents {self.agents}")
            if agent in ended:
                raise InputError(f"agent_id: {agent!r} already ended episode {self._episode}; it cannot act at "
                                 f"step {step}")
            before = last.get(agent)
            if before is not None and step <= before:
                self._refuse_step(agent, step, before)
            if len(row) != width:
                raise InputError(f"{agent}: expected a row {FIELDS}, got {len(row)} values")
            if not _finite(row[2]):  # said now, naming the agent and step, not when the rows are handed over
                raise InputError(f"reward: must be finite, got {row[2]!r} for agent {agent!r} at step {step}")
        if self._episode is None:
            self._episode = int(self._ids(1)[0])
        episode, env_steps, acted = self._episode, self._base + step + 1, self._acted
        for agent, row in rows.items():
            kind = kind_of[agent]
            acted.add(agent)
            last[agent] = step
            if row[4] or row[5]:
                ended.add(agent)
            if not kind.limit:
                kind.limit = max(1, min(ROWS_PER_CALL, BYTES_PER_CALL // _row_bytes(row)))
            kind.add(agent, row, episode, step, env_steps)
            if kind.count >= kind.limit:
                kind.send()
        if step >= self._length:
            self._length = step + 1
        self.steps_written += len(rows)

    def _refuse_step(self, agent: str, step: int, last: int) -> None:
        """Refuse an env ``step`` at which ``agent`` cannot act: its env steps in one episode strictly increase
        (it may skip some: turns, agents that do not act or leave); it last acted at ``last``."""
        what = "the same step again" if step == last else "a step back"
        raise InputError(f"step: agent {agent!r} of episode {self._episode} acted at env step {last}; got step "
                         f"{step}, {what}: expected strictly increasing env steps for one agent in one episode "
                         f"(a step after {last}; it may skip steps)")

    def end_episode(self) -> None:
        """Close the open episode (its agents that did not end stay unfinished, and so does the episode: it counts
        in :attr:`episodes_completed` only when every agent that acted in it ended); the next :meth:`add` opens
        another."""
        if self._episode is None:
            return
        if self._acted and self._ended == self._acted:
            self.episodes_completed += 1
        self._base += self._length
        self._episode, self._length, self._acted, self._ended, self._last = None, 0, set(), set(), {}

    def flush(self) -> None:
        """Commit every row given so far."""
        for kind in self._kinds:
            kind.send()
            kind.writer.flush()

    def close(self) -> None:
        """Flush and close the writers (idempotent)."""
        try:
            for kind in self._kinds:
                kind.send()
        finally:
            for kind in self._kinds:
                kind.writer.close()

    def __enter__(self) -> AgentWriter:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _row_bytes(row: Sequence[Any]) -> int:
    """About the bytes a row's values hold (its arrays' and a number's 8, and a row's bookkeeping): how many rows
    of its kind wait for one hand-over."""
    return 64 + sum(_nbytes(v) for v in row)


def _nbytes(value: Any) -> int:
    if isinstance(value, Mapping):
        return sum(_nbytes(v) for v in value.values())
    return int(getattr(value, "nbytes", 8))


def _finite(reward: Any) -> bool:
    try:
        return math.isfinite(float(reward))
    except (TypeError, ValueError):
        return False


def _kinds(agents: list[str], observation_spaces: Mapping[str, Any] | None,
           action_spaces: Mapping[str, Any] | None) -> list[tuple[list[str], Any, Any]]:
    """The agents grouped by their spaces' stored types (one group without spaces), in ``agents`` order."""
    if observation_spaces is None and action_spaces is None:
        return [(agents, None, None)]
    groups: dict[tuple[str, str], tuple[list[str], Any, Any]] = {}
    for a in agents:
        obs = (observation_spaces or {}).get(a)
        act = (action_spaces or {}).get(a)
        key = (_described(obs, "observation", a), _described(act, "action", a))
        groups.setdefault(key, ([], obs, act))[0].append(a)
    return list(groups.values())


def _described(space: Any, role: str, agent: str) -> str:
    if space is None:
        return ""
    try:
        return sch.describe(sch.type_of_space(space, role=role))
    except InputError as exc:
        raise InputError(f"{agent}: {exc}") from None
