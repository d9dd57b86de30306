"""Pure-JAX environments with a small functional interface.

Every environment here is a stateless object with two pure functions::

    state, obs = env.reset(key)
    state, obs, reward, terminated, truncated, info = env.step(state, action, key)

All returned values are JAX arrays or pytrees of them, so both functions can be
wrapped in ``jax.jit``, mapped with ``jax.vmap`` and looped with ``jax.lax.scan``.
``step`` never resets by itself: the rollout loop decides what to do after an
episode ends.  ``truncated`` becomes true when the step counter carried in the
state reaches ``max_episode_steps`` (the same rule as gymnasium's ``TimeLimit``).

Observations and rewards are float32, ``terminated``/``truncated`` are bool
scalars per environment.  Internal physical state uses JAX's default float type
(float32 unless 64-bit mode is enabled), so the dynamics can be checked against
gymnasium's float64 implementation in 64-bit mode.

``observation_space`` and ``action_space`` are gymnasium spaces so the rest of
the package can derive its storage schema from them.

Own environments plug in through :class:`GymnaxAdapter` (gymnax-style envs) or
:class:`FunctionalAdapter` (Brax-style or hand-written reset/step functions).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any, NamedTuple, Protocol, runtime_checkable

import numpy as np

from trajstore.errors import InputError
from trajstore.extras import needed

with needed("jax", "a JAX rollout"):
    import jax
    import jax.numpy as jnp
    from gymnasium import spaces

__all__ = [
    "CartPole",
    "CartPoleState",
    "FunctionalAdapter",
    "GymnaxAdapter",
    "JaxEnv",
    "Pendulum",
    "PendulumState",
    "TimedState",
    "make",
]

PyTree = Any
StepResult = tuple[PyTree, PyTree, jax.Array, jax.Array, jax.Array, dict[str, Any]]


@runtime_checkable
class JaxEnv(Protocol):
    """The functional environment interface used by the JAX rollout workers.

    Attributes:
        name: Human-readable environment id, e.g. ``"CartPole-v1"``.
        max_episode_steps: Time limit after which ``step`` reports ``truncated``;
            ``None`` means no time limit.
        observation_space: A gymnasium space describing one observation.
        action_space: A gymnasium space describing one action.
    """

    @property
    def name(self) -> str: ...

    @property
    def max_episode_steps(self) -> int | None: ...

    @property
    def observation_space(self) -> spaces.Space[Any]: ...

    @property
    def action_space(self) -> spaces.Space[Any]: ...

    def reset(self, key: jax.Array) -> tuple[PyTree, PyTree]:
        """Sample an initial state; return ``(state, obs)``."""
        ...

    def step(self, state: PyTree, action: PyTree, key: jax.Array) -> StepResult:
        """Advance one step without autoreset.

        Returns ``(state, obs, reward, terminated, truncated, info)``.
        """
        ...


def _float() -> np.dtype[Any]:
    """JAX's default float dtype: float32, or float64 when 64-bit mode is on."""
    return np.dtype(jax.dtypes.canonicalize_dtype(jnp.float64))


def _time_limit_reached(time: jax.Array, max_episode_steps: int | None) -> jax.Array:
    """``time >= max_episode_steps`` as a bool scalar (always false without a limit)."""
    if max_episode_steps is None:
        return jnp.zeros((), dtype=jnp.bool_)
    return jnp.asarray(time >= max_episode_steps, dtype=jnp.bool_)


def _as_float32(tree: PyTree) -> PyTree:
    """Cast every floating-point leaf of ``tree`` to float32, leaving others untouched."""

    def cast(leaf: Any) -> Any:
        leaf = jnp.asarray(leaf)
        return leaf.astype(jnp.float32) if jnp.issubdtype(leaf.dtype, jnp.floating) else leaf

    return jax.tree_util.tree_map(cast, tree)


# --------------------------------------------------------------------------- CartPole


class CartPoleState(NamedTuple):
    """CartPole state: cart position/velocity, pole angle/angular velocity, step count."""

    x: jax.Array
    x_dot: jax.Array
    theta: jax.Array
    theta_dot: jax.Array
    time: jax.Array


@dataclasses.dataclass(frozen=True)
class CartPole:
    """Gymnasium's ``CartPole-v1`` in pure JAX (Euler integration, reward 1 per step).

    The episode terminates when ``|x| > 2.4`` or ``|theta| > 12 degrees`` and is
    truncated after ``max_episode_steps`` steps.  Actions are ``0`` (push left)
    and ``1`` (push right).
    """

    max_episode_steps: int | None = 500
    name: str = "CartPole-v1"

    gravity = 9.8
    masscart = 1.0
    masspole = 0.1
    total_mass = masspole + masscart
    length = 0.5  # half the pole's length
    polemass_length = masspole * length
    force_mag = 10.0
    tau = 0.02
    theta_threshold_radians = 12 * 2 * math.pi / 360
    x_threshold = 2.4

    @property
    def observation_space(self) -> spaces.Box:
        """Box of shape (4,), float32, with gymnasium's bounds."""
        high = np.array(
            [self.x_threshold * 2, np.inf, self.theta_threshold_radians * 2, np.inf],
            dtype=np.float32,
        )
        return spaces.Box(-high, high, dtype=np.float32)

    @property
    def action_space(self) -> spaces.Discrete:
        """Discrete(2): 0 pushes left, 1 pushes right."""
        return spaces.Discrete(2)

    def reset(self, key: jax.Array) -> tuple[CartPoleState, jax.Array]:
        """Draw every state variable uniformly from ``[-0.05, 0.05]``."""
        x, x_dot, theta, theta_dot = jax.random.uniform(
            key, (4,), dtype=_float(), minval=-0.05, maxval=0.05
        )
        state = CartPoleState(x, x_dot, theta, theta_dot, jnp.zeros((), jnp.int32))
        return state, self.observe(state)

    def observe(self, state: CartPoleState) -> jax.Array:
        """The float32 observation ``[x, x_dot, theta, theta_dot]`` of ``state``."""
        obs = jnp.stack([state.x, state.x_dot, state.theta, state.theta_dot])
        return obs.astype(jnp.float32)

    def step(self, state: CartPoleState, action: jax.Array, key: jax.Array) -> StepResult:
        """Apply one Euler step of the cart-pole dynamics (``key`` is unused)."""
        del key
        new = self._integrate(state, jnp.asarray(action).reshape(()))
        terminated = (
            (new.x < -self.x_threshold)
            | (new.x > self.x_threshold)
            | (new.theta < -self.theta_threshold_radians)
            | (new.theta > self.theta_threshold_radians)
        )
        truncated = _time_limit_reached(new.time, self.max_episode_steps)
        reward = jnp.ones((), dtype=jnp.float32)
        return new, self.observe(new), reward, terminated, truncated, {}

    def _integrate(self, state: CartPoleState, action: jax.Array) -> CartPoleState:
        """Explicit Euler update, identical to gymnasium's ``kinematics_integrator='euler'``."""
        x, x_dot, theta, theta_dot, time = state
        force = jnp.where(action == 1, self.force_mag, -self.force_mag).astype(x.dtype)
        costheta, sintheta = jnp.cos(theta), jnp.sin(theta)
        temp = (force + self.polemass_length * theta_dot**2 * sintheta) / self.total_mass
        thetaacc = (self.gravity * sintheta - costheta * temp) / (
            self.length * (4.0 / 3.0 - self.masspole * costheta**2 / self.total_mass)
        )
        xacc = temp - self.polemass_length * thetaacc * costheta / self.total_mass
        return CartPoleState(
            x=x + self.tau * x_dot,
            x_dot=x_dot + self.tau * xacc,
            theta=theta + self.tau * theta_dot,
            theta_dot=theta_dot + self.tau * thetaacc,
            time=time + 1,
        )


# --------------------------------------------------------------------------- Pendulum


class PendulumState(NamedTuple):
    """Pendulum state: angle (0 is upright), angular velocity, step count."""

    theta: jax.Array
    theta_dot: jax.Array
    time: jax.Array


def angle_normalize(x: jax.Array) -> jax.Array:
    """Wrap an angle into ``[-pi, pi)`` exactly like gymnasium's pendulum."""
    return ((x + jnp.pi) % (2 * jnp.pi)) - jnp.pi


@dataclasses.dataclass(frozen=True)
class Pendulum:
    """Gymnasium's ``Pendulum-v1`` in pure JAX.

    The action is a torque in ``Box(-2, 2, (1,))`` (clipped), the observation is
    ``[cos theta, sin theta, theta_dot]`` and the reward is
    ``-(angle_normalize(theta)**2 + 0.1 * theta_dot**2 + 0.001 * u**2)``.
    Episodes never terminate; they are truncated after ``max_episode_steps``.
    """

    max_episode_steps: int | None = 200
    g: float = 10.0
    name: str = "Pendulum-v1"

    max_speed = 8.0
    max_torque = 2.0
    dt = 0.05
    m = 1.0
    l = 1.0  # noqa: E741 - gymnasium's name for the pole length

    @property
    def observation_space(self) -> spaces.Box:
        """Box of shape (3,), float32: ``[cos, sin, theta_dot]``."""
        high = np.array([1.0, 1.0, self.max_speed], dtype=np.float32)
        return spaces.Box(-high, high, dtype=np.float32)

    @property
    def action_space(self) -> spaces.Box:
        """Box(-2, 2, (1,), float32): the applied torque."""
        return spaces.Box(-self.max_torque, self.max_torque, shape=(1,), dtype=np.float32)

    def reset(self, key: jax.Array) -> tuple[PendulumState, jax.Array]:
        """Draw ``theta`` from ``[-pi, pi]`` and ``theta_dot`` from ``[-1, 1]``."""
        high = jnp.array([jnp.pi, 1.0], dtype=_float())
        theta, theta_dot = jax.random.uniform(key, (2,), dtype=_float(), minval=-high, maxval=high)
        state = PendulumState(theta, theta_dot, jnp.zeros((), jnp.int32))
        return state, self.observe(state)

    def observe(self, state: PendulumState) -> jax.Array:
        """The float32 observation ``[cos theta, sin theta, theta_dot]`` of ``state``."""
        obs = jnp.stack([jnp.cos(state.theta), jnp.sin(state.theta), state.theta_dot])
        return obs.astype(jnp.float32)

    def step(self, state: PendulumState, action: jax.Array, key: jax.Array) -> StepResult:
        """Apply the clipped torque for one time step (``key`` is unused)."""
        del key
        th, thdot, time = state
        # The torque stays float32 (the action space's dtype), as in gymnasium.
        u = jnp.clip(jnp.asarray(action, jnp.float32).reshape(-1)[0], -self.max_torque, self.max_torque)
        costs = angle_normalize(th) ** 2 + 0.1 * thdot**2 + 0.001 * u**2
        accel = 3 * self.g / (2 * self.l) * jnp.sin(th) + 3.0 / (self.m * self.l**2) * u
        newthdot = jnp.clip(thdot + accel * self.dt, -self.max_speed, self.max_speed)
        new = PendulumState(th + newthdot * self.dt, newthdot, time + 1)
        terminated = jnp.zeros((), dtype=jnp.bool_)
        truncated = _time_limit_reached(new.time, self.max_episode_steps)
        reward = (-costs).astype(jnp.float32)
        return new, self.observe(new), reward, terminated, truncated, {}


# --------------------------------------------------------------------------- registry

_REGISTRY: dict[str, Callable[..., JaxEnv]] = {
    "cartpole": CartPole,
    "cartpole-v1": CartPole,
    "pendulum": Pendulum,
    "pendulum-v1": Pendulum,
}


def make(name: str, **kwargs: Any) -> JaxEnv:
    """Build a built-in JAX environment by (case-insensitive) name.

    Known names: ``"cartpole"``/``"CartPole-v1"`` and ``"pendulum"``/``"Pendulum-v1"``.
    Keyword arguments go to the environment's constructor (e.g. ``max_episode_steps``).

    Raises:
        InputError: (a ``ValueError``) if ``name`` is not a known environment.
    """
    factory = _REGISTRY.get(str(name).strip().lower())
    if factory is None:
        known = ", ".join(repr(n) for n in ("cartpole", "CartPole-v1", "pendulum", "Pendulum-v1"))
        raise InputError(f"env: unknown JAX environment {name!r}; known environments: {known}")
    return factory(**kwargs)


# --------------------------------------------------------------------------- adapters


def _to_gymnasium_space(space: Any) -> spaces.Space[Any]:
    """Convert a gymnax-style space (``Discrete(num_categories)`` or ``Box``) to gymnasium."""
    if isinstance(space, spaces.Space):
        return space
    n = getattr(space, "n", getattr(space, "num_categories", None))
    if n is not None:
        return spaces.Discrete(int(n))
    if hasattr(space, "low") and hasattr(space, "high"):
        shape = tuple(getattr(space, "shape", np.shape(space.low)))
        dtype = np.dtype(getattr(space, "dtype", np.float32))
        low = np.broadcast_to(np.asarray(space.low, dtype=dtype), shape)
        high = np.broadcast_to(np.asarray(space.high, dtype=dtype), shape)
        return spaces.Box(low, high, shape=shape, dtype=dtype)
    raise InputError(f"space: cannot convert {space!r} to a gymnasium space; expected a Discrete-like space "
                     "(n or num_categories) or a Box-like one (low, high)")


class GymnaxAdapter:
    """Expose a gymnax-style environment through the :class:`JaxEnv` interface.

    gymnax envs have ``reset(key, params) -> (obs, state)`` and
    ``step(key, state, action, params) -> (obs, state, reward, done, info)``, where
    ``step`` autoresets and ``done`` merges termination and the time limit.  The
    adapter calls ``reset_env``/``step_env`` (no autoreset) when the env has them,
    and splits ``done`` using ``params.max_steps_in_episode`` and ``state.time``:
    ``truncated = state.time >= max_steps_in_episode`` and
    ``terminated = done & ~truncated``.  A termination that coincides with the time
    limit is therefore reported as a truncation (gymnax keeps no way to tell them
    apart).  Without ``state.time`` or a time limit, ``done`` is ``terminated``.
    """

    def __init__(self, env: Any, params: Any = None, *, name: str | None = None) -> None:
        """Wrap ``env``; ``params`` defaults to ``env.default_params``."""
        self.env = env
        self.params = env.default_params if params is None else params
        self.name = name or str(getattr(env, "name", type(env).__name__))
        limit = getattr(self.params, "max_steps_in_episode", None)
        self.max_episode_steps: int | None = None if limit is None else int(limit)
        self.observation_space = _to_gymnasium_space(env.observation_space(self.params))
        self.action_space = _to_gymnasium_space(env.action_space(self.params))

    def reset(self, key: jax.Array) -> tuple[PyTree, PyTree]:
        """Reset the wrapped env; return ``(state, obs)``."""
        reset = getattr(self.env, "reset_env", self.env.reset)
        obs, state = reset(key, self.params)
        return state, _as_float32(obs)

    def step(self, state: PyTree, action: PyTree, key: jax.Array) -> StepResult:
        """Step the wrapped env without autoreset and split ``done``."""
        step = getattr(self.env, "step_env", self.env.step)
        obs, state, reward, done, info = step(key, state, action, self.params)
        done = jnp.asarray(done, dtype=jnp.bool_)
        time = getattr(state, "time", None)
        if time is None:
            truncated = jnp.zeros((), dtype=jnp.bool_)
        else:
            truncated = _time_limit_reached(time, self.max_episode_steps)
        reward = jnp.asarray(reward, dtype=jnp.float32)
        return state, _as_float32(obs), reward, done & ~truncated, truncated, dict(info)


class TimedState(NamedTuple):
    """A user environment's state paired with the step counter added by :class:`FunctionalAdapter`."""

    env_state: PyTree
    time: jax.Array


class FunctionalAdapter:
    """Build a :class:`JaxEnv` from plain reset/step functions (Brax-style or hand-written).

    ``reset_fn(key) -> (state, obs)`` and
    ``step_fn(state, action, key) -> (state, obs, reward, terminated, info)``, both pure
    and without autoreset.  The adapter keeps the step counter in a :class:`TimedState`
    and reports ``truncated`` once it reaches ``max_episode_steps``.  For a Brax env::

        FunctionalAdapter(
            lambda key: (s := brax_env.reset(key), s.obs),
            lambda s, a, key: (n := brax_env.step(s, a), n.obs, n.reward, n.done > 0, {}),
            observation_space, action_space, max_episode_steps=1000, name="ant",
        )
    """

    def __init__(
        self,
        reset_fn: Callable[[jax.Array], tuple[PyTree, PyTree]],
        step_fn: Callable[[PyTree, PyTree, jax.Array], tuple[PyTree, PyTree, Any, Any, dict[str, Any]]],
        observation_space: spaces.Space[Any],
        action_space: spaces.Space[Any],
        max_episode_steps: int | None,
        name: str,
    ) -> None:
        """Store the functions, spaces and time limit."""
        self.reset_fn = reset_fn
        self.step_fn = step_fn
        self.observation_space = observation_space
        self.action_space = action_space
        self.max_episode_steps = max_episode_steps
        self.name = name

    def reset(self, key: jax.Array) -> tuple[TimedState, PyTree]:
        """Call ``reset_fn`` and start the step counter at zero."""
        env_state, obs = self.reset_fn(key)
        return TimedState(env_state, jnp.zeros((), jnp.int32)), _as_float32(obs)

    def step(self, state: TimedState, action: PyTree, key: jax.Array) -> StepResult:
        """Call ``step_fn``, advance the step counter and compute ``truncated``."""
        env_state, obs, reward, terminated, info = self.step_fn(state.env_state, action, key)
        time = state.time + 1
        truncated = _time_limit_reached(time, self.max_episode_steps)
        reward = jnp.asarray(reward, dtype=jnp.float32)
        terminated = jnp.asarray(terminated, dtype=jnp.bool_)
        return TimedState(env_state, time), _as_float32(obs), reward, terminated, truncated, dict(info)
