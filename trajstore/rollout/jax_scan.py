"""The jitted half of a JAX rollout: a ``lax.scan`` over ``vmap``-ed environments returning time-major batches.

One call of the scan steps ``num_envs`` environments ``rollout_length`` times and returns a
time-major ``(T, B, …)`` batch. Environments autoreset inside the scan (or, for evaluation, stay frozen
once their episode ended), and ``next_obs`` of an episode's last step is the true final observation
(the reset observation only becomes the next step's ``obs``).

``policy(params, obs, key)`` sees the whole vector env: ``(B, …)`` observations in, ``(B, …)``
actions out, or ``(actions, extras)`` where ``extras`` maps column names (``log_prob``,
``value``, …) to ``(B, …)`` arrays stored next to the step. A per-env policy lifts with
``jax.vmap(policy, in_axes=(None, 0, 0))`` and ``jax.random.split(key, B)``.
"""

from __future__ import annotations

import functools
from dataclasses import dataclass
from typing import Any, Callable, Mapping, NamedTuple, Sequence

import numpy as np

from trajstore.errors import InputError
from trajstore.extras import needed
from trajstore.integrations.info import check_info_keys
from trajstore.rollout import envs
from trajstore.rollout.sampling import check_positive

with needed("jax", "a JAX rollout"):
    import jax
    import jax.numpy as jnp
    from gymnasium import spaces

__all__ = ["Carry", "Policy", "RolloutScan", "make_scan", "random_policy", "resolve_env", "split_policy_output"]

Policy = Callable[[Any, Any, jax.Array], Any]
"""``policy(params, obs, key) -> actions`` or ``-> (actions, extras)``, over the whole vector env."""


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


def resolve_env(env: Any) -> Any:
    """A JAX env object, from itself or from a built-in name (``"cartpole"``, ``"Pendulum-v1"``…)."""
    if isinstance(env, str):
        return envs.make(env)
    if not all(hasattr(env, a) for a in ("reset", "step", "observation_space", "action_space")):
        raise InputError("env must be a JAX env with reset(key), step(state, action, key), observation_space and "
                         f"action_space (see trajstore.rollout.envs), or a built-in name; got {type(env).__name__}")
    return env


def make_scan(env: Any, policy: Policy | None, *, num_envs: int, rollout_length: int, autoreset: bool = True,
              time_limit: int | None = None, reset_budget: int | None = None,
              info_keys: Sequence[str] = ()) -> RolloutScan:
    """The jitted rollout for ``env``/``policy`` (cached, so repeated rollouts do not compile again).

    With ``autoreset``, an env whose episode ended is reset in the same step. Only up to
    ``reset_budget`` envs (default ``B // 8``) are reset in a step unless more ended, in which case
    all are: every env still gets its own fresh reset key, at a fraction of the cost. Without
    ``autoreset``, an env stays frozen after its episode ends and its steps are marked invalid;
    ``time_limit`` then truncates episodes at that many steps. ``info_keys`` are keys of the env's step ``info``
    returned with the batch (as extras: step columns), one value per env.
    """
    check_positive("num_envs", num_envs)
    check_positive("rollout_length", rollout_length)
    budget = max(1, num_envs // 8) if reset_budget is None else check_positive("reset_budget", reset_budget)
    keys = check_info_keys(info_keys)
    try:
        return _make_scan(env, policy, num_envs, rollout_length, autoreset, time_limit, min(budget, num_envs), keys)
    except TypeError as exc:  # an unhashable env or policy: build without the cache
        if "unhashable" not in str(exc):
            raise
        return _make_scan.__wrapped__(env, policy, num_envs, rollout_length, autoreset, time_limit,
                                      min(budget, num_envs), keys)


@functools.lru_cache(maxsize=32)
def _make_scan(env: Any, policy: Policy | None, B: int, T: int, autoreset: bool, time_limit: int | None,
               budget: int, info_keys: tuple[str, ...] = ()) -> RolloutScan:
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
        state, next_obs, reward, terminated, truncated, info = stepped
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
        extras = {**extras, **_info_values(info, info_keys, B, extras)}
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


def _info_values(info: Any, keys: tuple[str, ...], B: int, extras: Mapping[str, Any]) -> dict[str, jax.Array]:
    """The ``keys`` of the env's step ``info`` (one value per env each)."""
    out = {}
    for key in keys:
        if not isinstance(info, Mapping) or key not in info:
            have = sorted(info) if isinstance(info, Mapping) else type(info).__name__
            raise InputError(f"info_keys: the env's step info has no {key!r} (it has {have})")
        if key in extras:
            raise InputError(f"info_keys: {key!r} is also an extra of the policy's output; give one another name")
        value = jnp.asarray(info[key])
        if value.ndim < 1 or value.shape[0] != B:
            raise InputError(f"info_keys: {key!r} must have one value per env (B={B}), got shape {value.shape}")
        out[key] = value
    return out


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
        low, high = np.asarray(space.low), np.asarray(space.high)  # type: ignore[assignment]  # an int above
        return lambda params, obs, key: jax.random.uniform(key, (batch_size(obs), *space.shape), space.dtype,
                                                           low, high)
    raise InputError(f"no default random policy for the action space {space}; pass policy=")


def _uniform_ints(key: jax.Array, shape: tuple[int, ...], n: int) -> jax.Array:
    """Integers uniform in ``[0, n)``; for a power of two, masked random bytes (a quarter of ``randint``'s bits)."""
    if n & (n - 1) == 0 and n <= 2**16:
        dtype = jnp.uint8 if n <= 2**8 else jnp.uint16
        return (jax.random.bits(key, shape, dtype) & (n - 1)).astype(jnp.int32)
    return jax.random.randint(key, shape, 0, n)
