"""The JAX rollout worker: a jitted ``lax.scan`` over ``vmap``-ed environments, every transition into a store.

One call of the scan steps ``num_envs`` environments ``rollout_length`` times and returns a
time-major ``(T, B, …)`` batch. Environments autoreset inside the scan, and ``next_obs`` of an
episode's last step is the true final observation (the reset observation only becomes the next
step's ``obs``), so the writer runs in same-step mode and carries each env's open episode from
batch to batch: episodes crossing many scans come out whole.

Storing overlaps the rollout: the next scan is dispatched (JAX runs it asynchronously) before the
previous batch is copied to the host once with ``jax.device_get`` and handed to a background
thread that feeds the :class:`~trajstore.writer.Writer`; a bounded queue keeps memory flat.

``policy(params, obs, key)`` sees the whole vector env: ``(B, …)`` observations in, ``(B, …)``
actions out, or ``(actions, extras)`` where ``extras`` maps column names (``log_prob``,
``value``, …) to ``(B, …)`` arrays stored next to the step. A per-env policy lifts with
``jax.vmap(policy, in_axes=(None, 0, 0))`` and ``jax.random.split(key, B)``.

>>> import trajstore, tempfile
>>> store = trajstore.open(tempfile.mkdtemp(), create=True)
>>> result = jax_rollout(store, "cartpole", run_id="doc", num_envs=8, rollout_length=16, episodes=5,
...                      progress=False)
>>> result.episodes >= 5
True
"""

from __future__ import annotations

import functools
import logging
import queue
import threading
import time
from dataclasses import dataclass, field
from typing import Any, Callable, Literal, Mapping, NamedTuple

import jax
import jax.numpy as jnp
import numpy as np
from gymnasium import spaces

from trajstore import jax_envs
from trajstore.errors import InputError
from trajstore.rollout.progress import RolloutProgress
from trajstore.rollout.sampling import RolloutResult, SampleUntil, sample_until
from trajstore.query import quote_literal
from trajstore.remote import RemoteStore
from trajstore.store import Store
from trajstore.writer import Writer

log = logging.getLogger(__name__)

__all__ = ["Carry", "Policy", "RolloutScan", "jax_rollout", "make_scan", "random_policy"]

Policy = Callable[[Any, Any, jax.Array], Any]
"""``policy(params, obs, key) -> actions`` or ``-> (actions, extras)``, over the whole vector env."""

Mode = Literal["train", "eval"]


class Carry(NamedTuple):
    """What one scan hands to the next: env states, current observations, the key and open-episode sums."""

    env_state: Any
    obs: Any
    key: jax.Array
    ep_return: jax.Array  # (B,) float32, return of the open episode so far
    ep_length: jax.Array  # (B,) int32
    alive: jax.Array      # (B,) bool; without autoreset, False once the env's episode has ended


@dataclass(frozen=True)
class RolloutScan:
    """The jitted pieces of a rollout: ``init(key, alive) -> Carry`` and ``run(params, carry)``.

    ``run`` returns ``(carry, batch, ends)``: ``batch`` is the time-major dict the writer takes
    (with ``valid`` when there is no autoreset) and ``ends`` holds ``return`` and ``length`` of each
    episode at its last step (zero elsewhere), summed inside JAX.
    """

    num_envs: int
    rollout_length: int
    init: Callable[[jax.Array, jax.Array], Carry]
    run: Any  # jitted (params, carry) -> (carry, batch, ends)

    def compile(self, params: Any, carry: Carry) -> None:
        """Trace and compile ``run`` for these ``params`` now (cached), so timings and progress leave it out."""
        self.run.lower(params, carry).compile()


def jax_rollout(store: Store, env: Any, *, run_id: str, policy: Policy | None = None, params: Any = None,
                num_envs: int = 1024, rollout_length: int = 128, steps: int | None = None,
                episodes: int | None = None, seed: int = 0, mode: Mode = "train",
                policy_version: int | None = None, worker_id: str | None = None, env_id: str | None = None,
                max_episode_steps: int | None = None, queue_size: int = 2, progress: bool = True,
                **lineage: Any) -> RolloutResult:
    """Roll out the JAX env ``env`` (a :class:`~trajstore.jax_envs.JaxEnv` or a name for
    :func:`trajstore.jax_envs.make`) into ``store`` until ``episodes``/``steps`` are reached.

    ``episodes`` counts complete episodes, ``steps`` stored steps; with both, both must be reached
    (``imitation``'s ``make_sample_until``). The stop is exact to one vector step: rows of the last
    scan after the rule is met are not stored. Episodes still running are stored, as incomplete.
    With no ``policy``, actions are uniform over the action space.

    ``mode="eval"`` runs :func:`trajstore.rollout.evaluate.jax_evaluate` instead: no autoreset and
    exactly ``episodes`` complete episodes (pass the deterministic policy as ``policy``).
    ``seed``, ``mode``, ``policy_version`` (when given), ``worker_id`` and ``env_index`` are stored
    as lineage columns, as are extra keywords.
    """
    if mode == "eval":
        from trajstore.rollout.evaluate import jax_evaluate

        if steps is not None:
            raise InputError("mode='eval' runs exactly `episodes` complete episodes; steps= does not apply")
        if episodes is None:
            raise InputError("mode='eval': give episodes=N, the number of complete episodes to evaluate")
        return jax_evaluate(store, env, run_id=run_id, policy=policy, params=params, episodes=episodes,
                            num_envs=num_envs, rollout_length=rollout_length, seed=seed,
                            policy_version=policy_version, worker_id=worker_id, env_id=env_id,
                            max_episode_steps=max_episode_steps, queue_size=queue_size, progress=progress,
                            **lineage)
    if mode != "train":
        raise InputError(f"mode must be 'train' or 'eval', got {mode!r}")
    if max_episode_steps is not None:
        raise InputError("max_episode_steps applies to mode='eval'; for training, build the env with its limit "
                         "(e.g. jax_envs.make('cartpole', max_episode_steps=200))")
    until = sample_until(min_timesteps=steps, min_episodes=episodes)
    env = resolve_env(env)
    scan = make_scan(env, policy, num_envs=num_envs, rollout_length=rollout_length)
    check_run_mode(store, run_id, "train")
    max_scans = -(-steps // (num_envs * rollout_length)) if episodes is None and steps is not None else None
    lineage.update(seed=check_seed(seed), mode="train", **_optional(policy_version=policy_version))
    opts = {"worker_id": worker_id} if worker_id is not None else {}
    carry = scan.init(jax.random.PRNGKey(seed), jnp.ones(num_envs, bool))
    scan.compile(params, carry)
    tally = Tally(num_envs)
    started = time.perf_counter()
    with RolloutProgress(episodes=episodes, steps=steps, enabled=progress) as bar, \
            open_writer(store, env, run_id=run_id, env_id=env_id, **opts, **lineage) as writer:
        with BackgroundWriter(writer, queue_size) as sink:
            collect(scan, params, carry, sink=sink, until=until, tally=tally, bar=bar, max_scans=max_scans)
        bar.finish(steps=tally.steps, episodes=tally.episodes)
    return tally.result(writer, started)


# --- the scan ---------------------------------------------------------------------------------------------

def resolve_env(env: Any) -> Any:
    """A JAX env object, from itself or from a built-in name (``"cartpole"``, ``"Pendulum-v1"``…)."""
    if isinstance(env, str):
        try:
            return jax_envs.make(env)
        except ValueError as exc:
            raise InputError(f"env: {exc}") from None
    if not all(hasattr(env, a) for a in ("reset", "step", "observation_space", "action_space")):
        raise InputError("env must be a JAX env with reset(key), step(state, action, key), observation_space and "
                         f"action_space (see trajstore.jax_envs), or a built-in name; got {type(env).__name__}")
    return env


def make_scan(env: Any, policy: Policy | None, *, num_envs: int, rollout_length: int, autoreset: bool = True,
              time_limit: int | None = None, reset_budget: int | None = None) -> RolloutScan:
    """The jitted rollout for ``env``/``policy`` (cached, so repeated rollouts do not compile again).

    With ``autoreset``, an env whose episode ended is reset in the same step. Only up to
    ``reset_budget`` envs (default ``B // 8``) are reset in a step unless more ended, in which case
    all are: every env still gets its own fresh reset key, at a fraction of the cost. Without
    ``autoreset``, an env stays frozen after its episode ends and its steps are marked invalid;
    ``time_limit`` then truncates episodes at that many steps.
    """
    check_positive("num_envs", num_envs)
    check_positive("rollout_length", rollout_length)
    budget = max(1, num_envs // 8) if reset_budget is None else check_positive("reset_budget", reset_budget)
    try:
        return _make_scan(env, policy, num_envs, rollout_length, autoreset, time_limit, min(budget, num_envs))
    except TypeError as exc:  # an unhashable env or policy: build without the cache
        if "unhashable" not in str(exc):
            raise
        return _make_scan.__wrapped__(env, policy, num_envs, rollout_length, autoreset, time_limit,
                                      min(budget, num_envs))


@functools.lru_cache(maxsize=32)
def _make_scan(env: Any, policy: Policy | None, B: int, T: int, autoreset: bool, time_limit: int | None,
               budget: int) -> RolloutScan:
    act = policy if policy is not None else random_policy(env.action_space)

    def init(key: jax.Array, alive: jax.Array) -> Carry:
        key, reset_key = jax.random.split(key)
        state, obs = jax.vmap(env.reset)(jax.random.split(reset_key, B))
        state, obs = _strong((state, obs))
        zero = jnp.zeros(B, jnp.float32)
        return Carry(state, obs, key, zero, jnp.zeros(B, jnp.int32), jnp.asarray(alive, bool))

    def step(params: Any, carry: Carry, _: Any) -> tuple[Carry, tuple[dict[str, Any], dict[str, jax.Array]]]:
        key, k_act, k_env, k_reset = jax.random.split(carry.key, 4)
        action, extras = split_policy_output(act(params, carry.obs, k_act), B)
        stepped = jax.vmap(env.step)(carry.env_state, action, jax.random.split(k_env, B))
        state, next_obs, reward, terminated, truncated, _info = stepped
        state, next_obs = _like((state, next_obs), (carry.env_state, carry.obs))
        reward = jnp.asarray(reward, jnp.float32).reshape(B)
        terminated = jnp.asarray(terminated, bool).reshape(B)
        truncated = jnp.asarray(truncated, bool).reshape(B)
        valid = carry.alive
        ep_return = carry.ep_return + jnp.where(valid, reward, 0.0)
        ep_length = carry.ep_length + valid.astype(jnp.int32)
        if time_limit is not None:
            truncated = truncated | (ep_length >= time_limit)
        done = (terminated | truncated) & valid
        batch: dict[str, Any] = {"obs": carry.obs, "action": action, "reward": reward, "next_obs": next_obs,
                                 "terminated": terminated, "truncated": truncated}
        if extras:
            batch["extras"] = extras
        ends = {"return": jnp.where(done, ep_return, 0.0), "length": jnp.where(done, ep_length, 0)}
        if autoreset:
            state, obs = _autoreset(env, done, state, next_obs, k_reset, budget)
            alive = carry.alive
        else:
            batch["valid"] = valid
            state, obs = _where(valid, (state, next_obs), (carry.env_state, carry.obs))
            alive = valid & ~done
        carry = Carry(state, obs, key, jnp.where(done, 0.0, ep_return), jnp.where(done, 0, ep_length), alive)
        return carry, (batch, ends)

    @jax.jit
    def run(params: Any, carry: Carry) -> tuple[Carry, dict[str, Any], dict[str, jax.Array]]:
        carry, (batch, ends) = jax.lax.scan(functools.partial(step, params), carry, None, length=T)
        return carry, batch, ends

    return RolloutScan(B, T, jax.jit(init), run)


def _autoreset(env: Any, done: jax.Array, state: Any, obs: Any, key: jax.Array, budget: int) -> tuple[Any, Any]:
    """Replace the state and observation of the envs whose episode ended by a fresh reset."""
    B = done.shape[0]

    def all_envs(_: None) -> tuple[Any, Any]:
        fresh = jax.vmap(env.reset)(jax.random.split(key, B))
        return _where(done, fresh, (state, obs))

    def ended_envs(_: None) -> tuple[Any, Any]:
        idx = jnp.nonzero(done, size=budget, fill_value=B)[0]
        fresh = jax.vmap(env.reset)(jax.random.split(key, budget))
        return jax.tree.map(lambda cur, new: cur.at[idx].set(new.astype(cur.dtype), mode="drop"),
                            (state, obs), fresh)

    if budget >= B:
        return all_envs(None)
    return jax.lax.cond(done.sum() > budget, all_envs, ended_envs, None)


def _where(mask: jax.Array, a: Any, b: Any) -> Any:
    """Per env, ``a`` where ``mask`` else ``b`` (pytrees with a leading env axis), in ``b``'s dtypes."""
    def pick(x: jax.Array, y: jax.Array) -> jax.Array:
        return jnp.where(mask.reshape(mask.shape + (1,) * (y.ndim - 1)), x, y).astype(y.dtype)

    return jax.tree.map(pick, a, b)


def _like(tree: Any, like: Any) -> Any:
    """``tree`` cast to the dtypes of ``like``, so the scan's carry keeps one type."""
    return jax.tree.map(lambda x, y: jnp.asarray(x).astype(y.dtype), tree, like)


def _strong(tree: Any) -> Any:
    return jax.tree.map(lambda x: jnp.asarray(x).astype(jnp.asarray(x).dtype), tree)


def split_policy_output(out: Any, num_envs: int) -> tuple[Any, dict[str, Any]]:
    """``actions`` or ``(actions, extras)`` → ``(actions, extras)``, with every extra checked to be ``(B, …)``."""
    if isinstance(out, tuple) and len(out) == 2 and isinstance(out[1], Mapping):
        action, extras = out[0], dict(out[1])
    else:
        action, extras = out, {}
    for name, leaf in [("action", a) for a in jax.tree.leaves(action)] + \
            [(f"extras[{k!r}]", x) for k, v in extras.items() for x in jax.tree.leaves(v)]:
        if jnp.ndim(leaf) < 1 or jnp.shape(leaf)[0] != num_envs:
            raise InputError(f"policy: {name} must have a leading axis of B={num_envs} envs (the policy sees "
                             f"the whole vector env), got shape {jnp.shape(leaf)}")
    return action, extras


def random_policy(action_space: Any) -> Policy:
    """A policy drawing actions uniformly from ``action_space`` (Discrete, MultiDiscrete, MultiBinary, bounded Box)."""
    space = action_space

    def batch_size(obs: Any) -> int:
        return int(jnp.shape(jax.tree.leaves(obs)[0])[0])

    if isinstance(space, spaces.Discrete):
        low, n = int(space.start), int(space.n)
        return lambda params, obs, key: low + _uniform_ints(key, (batch_size(obs),), n)
    if isinstance(space, spaces.MultiBinary):
        return lambda params, obs, key: _uniform_ints(key, (batch_size(obs), *space.shape), 2)
    if isinstance(space, spaces.MultiDiscrete):
        nvec = np.asarray(space.nvec)
        return lambda params, obs, key: jax.random.randint(key, (batch_size(obs), *nvec.shape), 0, nvec)
    if isinstance(space, spaces.Box) and np.issubdtype(space.dtype, np.floating):
        if not space.is_bounded("both"):
            raise InputError(f"the default random policy needs a bounded action space, got {space}; pass policy=")
        low, high = np.asarray(space.low), np.asarray(space.high)
        return lambda params, obs, key: jax.random.uniform(key, (batch_size(obs), *space.shape), space.dtype,
                                                           low, high)
    raise InputError(f"no default random policy for the action space {space}; pass policy=")


def _uniform_ints(key: jax.Array, shape: tuple[int, ...], n: int) -> jax.Array:
    """Integers uniform in ``[0, n)``; for a power of two, masked random bytes (a quarter of ``randint``'s bits)."""
    if n & (n - 1) == 0 and n <= 2**16:
        dtype = jnp.uint8 if n <= 2**8 else jnp.uint16
        return (jax.random.bits(key, shape, dtype) & (n - 1)).astype(jnp.int32)
    return jax.random.randint(key, shape, 0, n)


# --- the host side: counting, stopping, storing ---------------------------------------------------------

@dataclass
class Tally:
    """Steps and complete episodes stored so far, with the returns and lengths summed inside JAX."""

    num_envs: int
    steps: int = 0
    episodes: int = 0
    returns: list[np.ndarray] = field(default_factory=list)
    lengths: list[np.ndarray] = field(default_factory=list)

    def take(self, batch: dict[str, Any], ends: dict[str, np.ndarray], until: SampleUntil) -> tuple[int, bool]:
        """Count a host batch; returns how many time rows to store and whether the rollout stops there."""
        valid = batch.get("valid")
        done = batch["terminated"] | batch["truncated"]
        per_t = valid.sum(axis=1) if valid is not None else np.full(len(done), self.num_envs)
        if valid is not None:
            done = done & valid
        steps_t = self.steps + np.cumsum(per_t)
        eps_t = self.episodes + np.cumsum(done.sum(axis=1))
        keep, stop = len(done), until(episodes=int(eps_t[-1]), timesteps=int(steps_t[-1]))
        if stop:  # the first vector step at which the rule holds (it only turns true once)
            keep = 1 + next(t for t in range(len(done)) if until(episodes=int(eps_t[t]), timesteps=int(steps_t[t])))
        ended = done[:keep]
        self.returns.append(ends["return"][:keep][ended].astype(np.float64))
        self.lengths.append(ends["length"][:keep][ended].astype(np.int64))
        self.steps, self.episodes = int(steps_t[keep - 1]), int(eps_t[keep - 1])
        return keep, stop

    def result(self, writer: Writer, started: float) -> RolloutResult:
        """The rollout's result, its returns and lengths as numpy arrays (16 bytes an episode, not a list's ~70)."""
        returns = np.concatenate(self.returns) if self.returns else np.zeros(0)
        lengths = np.concatenate(self.lengths) if self.lengths else np.zeros(0, np.int64)
        out = RolloutResult(run_id=writer.run_id, env_id=writer.env_id, steps=writer.steps_written,
                            episodes=self.episodes, seconds=time.perf_counter() - started,
                            episode_returns=returns, episode_lengths=lengths)  # type: ignore[arg-type]
        if out.steps != self.steps:
            log.warning("rollout %s: counted %d steps but the writer stored %d", out.run_id, self.steps, out.steps)
        log.info("rollout %s/%s: %d steps, %d episodes in %.1fs", out.run_id, out.env_id, out.steps,
                 out.episodes, out.seconds)
        return out


def collect(scan: RolloutScan, params: Any, carry: Carry, *, sink: BackgroundWriter, until: SampleUntil,
            tally: Tally, bar: RolloutProgress, max_scans: int | None = None) -> None:
    """Run scans until ``until`` holds, each next scan dispatched before the previous batch is copied out."""
    pending: Any = scan.run(params, carry)
    dispatched = 1
    while pending is not None:
        carry, batch, ends = pending
        pending = None
        if max_scans is None or dispatched < max_scans:
            pending = scan.run(params, carry)  # asynchronous: the device works on it while we store this one
            dispatched += 1
        batch, ends = jax.device_get((batch, ends))  # the one host copy
        before = tally.episodes
        keep, stop = tally.take(batch, ends, until)
        sink.put(_head(batch, keep) if keep < scan.rollout_length else batch)
        new = tally.returns[-1][-100:].tolist() if tally.episodes > before else None
        bar.update(steps=tally.steps, episodes=tally.episodes, returns=new)
        if stop:
            return


def _head(batch: Any, n: int) -> Any:
    if isinstance(batch, Mapping):
        return {k: _head(v, n) for k, v in batch.items()}
    return batch[:n]


class BackgroundWriter:
    """Feeds host batches to a writer from its own thread through a bounded queue.

    ``put`` blocks while ``depth`` batches wait, so a slow writer slows the rollout instead of
    letting memory grow. An error in the writer thread is raised by the next ``put`` or by ``close``.
    """

    def __init__(self, writer: Writer, depth: int = 2) -> None:
        if not isinstance(depth, int) or depth < 1:
            raise InputError(f"queue_size must be a positive integer, got {depth!r}")
        self.writer = writer
        self._queue: queue.Queue[Any] = queue.Queue(maxsize=depth)
        self._error: BaseException | None = None
        self._thread = threading.Thread(target=self._run, name="trajstore-jax-writer", daemon=True)
        self._thread.start()

    def _run(self) -> None:
        while True:
            batch = self._queue.get()
            if batch is None:
                return
            if self._error is None:  # after an error, keep draining so that put() never blocks for ever
                try:
                    self.writer.add_batch(batch)
                except BaseException as exc:  # noqa: BLE001 - handed to the rollout thread
                    self._error = exc

    def put(self, batch: dict[str, Any]) -> None:
        self._raise()
        self._queue.put(batch)

    def close(self, *, raise_error: bool = True) -> None:
        """Wait until every queued batch is written. Idempotent — safe to call multiple times."""
        if self._thread.is_alive():
            self._queue.put(None)
            self._thread.join()
        if raise_error:
            self._raise()

    def _raise(self) -> None:
        if self._error is not None:
            error, self._error = self._error, None
            raise error

    def __enter__(self) -> BackgroundWriter:
        return self

    def __exit__(self, exc_type: Any, *exc: object) -> None:
        self.close(raise_error=exc_type is None)


# --- store-side helpers ----------------------------------------------------------------------------------

def open_writer(store: Store, env: Any, *, run_id: str, env_id: str | None, **options: Any) -> Writer:
    """A same-step writer for ``env``'s spaces."""
    return store.writer(run_id=run_id, env_id=env_id or str(getattr(env, "name", type(env).__name__)),
                        observation_space=env.observation_space, action_space=env.action_space,
                        autoreset="same-step", **options)


def check_run_mode(store: Store | RemoteStore, run_id: str, mode: Mode) -> None:
    """Refuse to mix training and evaluation episodes in one run, so their statistics never mix."""
    cond = "mode IS DISTINCT FROM 'eval'" if mode == "eval" else "mode = 'eval'"
    q = f"SELECT count(*) AS n FROM steps WHERE {cond}"
    if isinstance(store, Store):  # only the run's files, not the whole store
        files = [f for f in store.files() if f.run_id == run_id]
        if not files:
            return
        from trajstore.query import Snapshot

        with Snapshot(files) as snap:
            n = snap.arrow(q).column("n")[0].as_py()
    else:
        n = store.sql(f"{q} AND run_id = {quote_literal(run_id)}").column("n")[0].as_py()
    if n:
        other = "training (or untagged)" if mode == "eval" else "evaluation"
        raise InputError(f"run {run_id!r} already holds {other} steps; store {mode} episodes under their own "
                         "run_id so training and evaluation statistics never mix")


def check_seed(seed: Any) -> int:
    if not isinstance(seed, (int, np.integer)) or isinstance(seed, bool):
        raise InputError(f"seed must be an integer, got {seed!r}")
    return int(seed)


def check_positive(name: str, value: Any) -> int:
    if not isinstance(value, (int, np.integer)) or isinstance(value, bool) or value < 1:
        raise InputError(f"{name} must be a positive integer, got {value!r}")
    return int(value)


def _optional(**values: Any) -> dict[str, Any]:
    return {k: v for k, v in values.items() if v is not None}
