"""Tests for trajstore.jax_envs: parity with gymnasium, jit/vmap/scan, make, adapters."""

from __future__ import annotations

from typing import Any, NamedTuple

import gymnasium as gym
import jax
import jax.numpy as jnp
import numpy as np
import pytest

from trajstore.rollout import envs as jax_envs
from trajstore.rollout.envs import (
    CartPole,
    CartPoleState,
    FunctionalAdapter,
    GymnaxAdapter,
    JaxEnv,
    Pendulum,
    PendulumState,
    TimedState,
    make,
)

KEY = jax.random.key(0)
RTOL, ATOL = 1e-5, 1e-6


def _cartpole_state(values: np.ndarray, time: int = 0) -> CartPoleState:
    """A JAX CartPole state holding the given gymnasium state."""
    return CartPoleState(*(jnp.asarray(v, jnp.float32) for v in values), jnp.int32(time))


def _pendulum_state(values: np.ndarray, time: int = 0, dtype: Any = jnp.float32) -> PendulumState:
    """A JAX Pendulum state holding the given gymnasium state."""
    return PendulumState(*(jnp.asarray(v, dtype) for v in values), jnp.int32(time))


def _assert_same_step(jax_out: tuple[Any, ...], gym_out: tuple[Any, ...], atol: float = ATOL) -> None:
    """Compare a JAX step's (obs, reward, terminated, truncated) with gymnasium's."""
    _, obs, reward, terminated, truncated, _ = jax_out
    g_obs, g_reward, g_terminated, g_truncated, _ = gym_out
    assert obs.dtype == jnp.float32 and reward.dtype == jnp.float32
    assert terminated.dtype == jnp.bool_ and truncated.dtype == jnp.bool_
    np.testing.assert_allclose(np.asarray(obs), g_obs, rtol=RTOL, atol=atol)
    np.testing.assert_allclose(float(reward), g_reward, rtol=RTOL, atol=atol)
    assert bool(terminated) == g_terminated
    assert bool(truncated) == g_truncated


# ----------------------------------------------------------------- parity with gymnasium


def test_cartpole_matches_gymnasium_until_termination() -> None:
    env, step = CartPole(), jax.jit(CartPole().step)
    genv = gym.make("CartPole-v1")
    rng = np.random.default_rng(1)
    steps = terminations = 0
    for episode in range(15):
        genv.reset(seed=episode)
        state = _cartpole_state(genv.unwrapped.state)
        for _ in range(env.max_episode_steps):
            action = int(rng.integers(2))
            gym_out = genv.step(action)
            jax_out = step(state, jnp.int32(action), KEY)
            _assert_same_step(jax_out, gym_out)
            state, steps = jax_out[0], steps + 1
            if gym_out[2] or gym_out[3]:
                terminations += gym_out[2]
                break
    assert terminations == 15 and steps > 200


def test_cartpole_matches_gymnasium_to_time_limit() -> None:
    """A balanced 500-step episode; the unstable dynamics amplify float rounding
    exponentially, so the physical state is re-synced from gymnasium before each step
    (the step counter is the JAX env's own)."""
    step = jax.jit(CartPole().step)
    genv = gym.make("CartPole-v1")
    obs, _ = genv.reset(seed=3)
    time = jnp.int32(0)
    for t in range(500):
        state = _cartpole_state(genv.unwrapped.state)._replace(time=time)
        action = int(obs[2] + 0.5 * obs[3] + 0.01 * obs[0] + 0.1 * obs[1] > 0)
        gym_out = genv.step(action)
        jax_out = step(state, action, KEY)
        _assert_same_step(jax_out, gym_out)
        obs, time = gym_out[0], jax_out[0].time
        assert not gym_out[2] and gym_out[3] == (t == 499)
    assert int(time) == 500


@pytest.mark.parametrize("x64", [False, True], ids=["float32-resynced", "float64-free-running"])
def test_pendulum_matches_gymnasium_to_time_limit(x64: bool) -> None:
    """Two full episodes with random (partly clipped) torques.  In float32 the state
    drifts from gymnasium's float64 one near the unstable upright position, so it is
    re-synced before each step; in 64-bit mode the JAX env runs on its own."""
    with jax.enable_x64(x64):
        env, step = Pendulum(), jax.jit(Pendulum().step)
        genv = gym.make("Pendulum-v1")
        rng = np.random.default_rng(2)
        for episode in range(2):
            genv.reset(seed=episode)
            state = _pendulum_state(genv.unwrapped.state, dtype=jnp.result_type(float))
            for t in range(env.max_episode_steps):
                if not x64:
                    state = _pendulum_state(genv.unwrapped.state)._replace(time=state.time)
                action = rng.uniform(-2.5, 2.5, size=(1,)).astype(np.float32)
                gym_out = genv.step(action)
                jax_out = step(state, jnp.asarray(action), KEY)
                _assert_same_step(jax_out, gym_out)
                state = jax_out[0]
                assert not gym_out[2] and gym_out[3] == (t == env.max_episode_steps - 1)


def test_spaces_match_gymnasium() -> None:
    for env, gym_id in ((CartPole(), "CartPole-v1"), (Pendulum(), "Pendulum-v1")):
        genv = gym.make(gym_id)
        assert env.observation_space == genv.observation_space
        assert env.action_space == genv.action_space
        assert env.max_episode_steps == genv.spec.max_episode_steps
        assert env.name == gym_id
        assert isinstance(env, JaxEnv)


# ----------------------------------------------------------------- reset distribution


def test_cartpole_initial_state_distribution() -> None:
    states, obs = jax.jit(jax.vmap(CartPole().reset))(jax.random.split(KEY, 2000))
    values = np.stack([states.x, states.x_dot, states.theta, states.theta_dot], axis=1)
    assert obs.dtype == jnp.float32 and obs.shape == (2000, 4)
    np.testing.assert_array_equal(np.asarray(obs), values.astype(np.float32))
    assert np.all(np.abs(values) <= 0.05)
    assert np.all(values.min(axis=0) < -0.045) and np.all(values.max(axis=0) > 0.045)
    assert np.all(np.asarray(states.time) == 0)


def test_pendulum_initial_state_distribution() -> None:
    states, obs = jax.jit(jax.vmap(Pendulum().reset))(jax.random.split(KEY, 2000))
    theta, theta_dot = np.asarray(states.theta), np.asarray(states.theta_dot)
    assert np.all(np.abs(theta) <= np.pi) and np.all(np.abs(theta_dot) <= 1.0)
    assert theta.min() < -3.0 and theta.max() > 3.0 and theta_dot.min() < -0.95 and theta_dot.max() > 0.95
    expected = np.stack([np.cos(theta), np.sin(theta), theta_dot], axis=1)
    np.testing.assert_allclose(np.asarray(obs), expected, rtol=1e-6, atol=1e-6)
    assert obs.dtype == jnp.float32 and np.all(np.asarray(states.time) == 0)


def test_reset_depends_on_key() -> None:
    (_, o1), (_, o2) = CartPole().reset(jax.random.key(1)), CartPole().reset(jax.random.key(2))
    assert not np.array_equal(np.asarray(o1), np.asarray(o2))


# ----------------------------------------------------------------- jit / vmap / scan


@pytest.mark.parametrize("env", [CartPole(), Pendulum()], ids=["cartpole", "pendulum"])
def test_jit_vmap_step(env: JaxEnv) -> None:
    n = 8
    states, obs = jax.vmap(env.reset)(jax.random.split(KEY, n))
    if isinstance(env.action_space, gym.spaces.Discrete):
        actions = jnp.arange(n, dtype=jnp.int32) % 2
    else:
        actions = jnp.linspace(-2.0, 2.0, n, dtype=jnp.float32)[:, None]
    states, obs, reward, terminated, truncated, info = jax.jit(jax.vmap(env.step))(
        states, actions, jax.random.split(KEY, n)
    )
    assert obs.shape == (n, *env.observation_space.shape) and obs.dtype == jnp.float32
    assert reward.shape == (n,) and reward.dtype == jnp.float32
    assert terminated.shape == truncated.shape == (n,) and terminated.dtype == jnp.bool_
    assert np.all(np.asarray(states.time) == 1) and info == {}


def test_scan_matches_python_loop() -> None:
    env = Pendulum(max_episode_steps=50)
    state0, _ = env.reset(KEY)
    actions = jnp.sin(jnp.arange(60, dtype=jnp.float32))[:, None] * 2.5

    def body(state: PendulumState, action: jax.Array) -> tuple[PendulumState, tuple[jax.Array, ...]]:
        state, obs, reward, terminated, truncated, _ = env.step(state, action, KEY)
        return state, (obs, reward, terminated, truncated)

    final, (obs, reward, terminated, truncated) = jax.jit(lambda s: jax.lax.scan(body, s, actions))(state0)
    state, step = state0, jax.jit(env.step)
    for t in range(60):
        state, o, r, te, tr, _ = step(state, actions[t], KEY)
        np.testing.assert_allclose(np.asarray(obs[t]), np.asarray(o), rtol=1e-5, atol=1e-6)
        np.testing.assert_allclose(float(reward[t]), float(r), rtol=1e-5, atol=1e-6)
    assert int(final.time) == 60 and not np.any(np.asarray(terminated))
    np.testing.assert_array_equal(np.asarray(truncated), np.arange(1, 61) >= 50)


def test_cartpole_scan_terminates() -> None:
    env = CartPole()

    def body(state: CartPoleState, _: None) -> tuple[CartPoleState, tuple[jax.Array, jax.Array]]:
        state, _obs, reward, terminated, _tr, _info = env.step(state, jnp.int32(1), KEY)
        return state, (reward, terminated)

    state0, _ = env.reset(KEY)
    _, (reward, terminated) = jax.jit(lambda s: jax.lax.scan(body, s, None, length=100))(state0)
    assert np.all(np.asarray(reward) == 1.0)
    first = int(np.argmax(np.asarray(terminated)))
    assert np.asarray(terminated)[first] and 0 < first < 100 and not np.any(np.asarray(terminated)[:first])


def test_state_uses_float64_in_x64_mode_but_obs_stay_float32() -> None:
    with jax.enable_x64(True):
        state, obs = CartPole().reset(KEY)
        state, obs, reward, *_ = CartPole().step(state, 0, KEY)
        assert state.x.dtype == jnp.float64 and obs.dtype == jnp.float32 and reward.dtype == jnp.float32


# ----------------------------------------------------------------- make


@pytest.mark.parametrize(
    ("name", "cls"),
    [("cartpole", CartPole), ("CartPole-v1", CartPole), ("CARTPOLE", CartPole),
     ("pendulum", Pendulum), ("Pendulum-v1", Pendulum), ("pendulum-V1", Pendulum)],
)
def test_make_by_name(name: str, cls: type) -> None:
    assert isinstance(make(name), cls)


def test_make_forwards_kwargs() -> None:
    assert make("cartpole", max_episode_steps=10).max_episode_steps == 10


def test_make_unknown_name() -> None:
    with pytest.raises(ValueError, match="unknown JAX environment 'MountainCar-v0'") as info:
        make("MountainCar-v0")
    for known in ("cartpole", "CartPole-v1", "pendulum", "Pendulum-v1"):
        assert known in str(info.value)


# ----------------------------------------------------------------- gymnax adapter


class _FakeDiscrete:
    def __init__(self, num_categories: int) -> None:
        self.n = num_categories


class _FakeBox:
    def __init__(self, low: float, high: float, shape: tuple[int, ...], dtype: Any) -> None:
        self.low, self.high, self.shape, self.dtype = low, high, shape, dtype


class _WalkState(NamedTuple):
    pos: jax.Array
    time: jax.Array


class _WalkParams(NamedTuple):
    goal: int = 3
    max_steps_in_episode: int = 5


class _FakeGymnaxWalk:
    """gymnax-shaped env: move right by the action; done at the goal or the time limit."""

    name = "FakeWalk"

    @property
    def default_params(self) -> _WalkParams:
        return _WalkParams()

    def observation_space(self, params: _WalkParams) -> _FakeBox:
        return _FakeBox(0.0, 10.0, (1,), jnp.float32)

    def action_space(self, params: _WalkParams) -> _FakeDiscrete:
        return _FakeDiscrete(2)

    def reset_env(self, key: jax.Array, params: _WalkParams) -> tuple[jax.Array, _WalkState]:
        state = _WalkState(jnp.int32(0), jnp.int32(0))
        return self._obs(state), state

    def step_env(self, key: jax.Array, state: _WalkState, action: jax.Array, params: _WalkParams) -> tuple[Any, ...]:
        state = _WalkState(state.pos + action, state.time + 1)
        done = (state.pos >= params.goal) | (state.time >= params.max_steps_in_episode)
        return self._obs(state), state, 1.0, done, {"discount": 1.0 - done}

    def reset(self, key: jax.Array, params: _WalkParams | None = None) -> tuple[jax.Array, _WalkState]:
        return self.reset_env(key, params or self.default_params)

    def step(self, key: jax.Array, state: _WalkState, action: jax.Array,
             params: _WalkParams | None = None) -> tuple[Any, ...]:
        """Autoresetting step, as gymnax does: the adapter must not use it."""
        params = params or self.default_params
        obs, new, reward, done, info = self.step_env(key, state, action, params)
        reset_obs, reset_state = self.reset_env(key, params)
        new = jax.tree_util.tree_map(lambda r, s: jnp.where(done, r, s), reset_state, new)
        return jnp.where(done, reset_obs, obs), new, reward, done, info

    @staticmethod
    def _obs(state: _WalkState) -> jax.Array:
        return jnp.asarray(state.pos, jnp.float32)[None]


def _run(env: JaxEnv, actions: list[int]) -> list[tuple[int, bool, bool]]:
    """(time, terminated, truncated) after each action, stepping under jit."""
    state, _ = env.reset(KEY)
    step, out = jax.jit(env.step), []
    for a in actions:
        state, obs, reward, terminated, truncated, _ = step(state, jnp.int32(a), KEY)
        assert obs.dtype == jnp.float32 and reward.dtype == jnp.float32
        out.append((int(state.time), bool(terminated), bool(truncated)))
    return out


def test_gymnax_adapter_spaces_and_reset() -> None:
    env = GymnaxAdapter(_FakeGymnaxWalk())
    assert env.name == "FakeWalk" and env.max_episode_steps == 5 and isinstance(env, JaxEnv)
    assert env.action_space == gym.spaces.Discrete(2)
    assert env.observation_space == gym.spaces.Box(0.0, 10.0, (1,), np.float32)
    state, obs = env.reset(KEY)
    assert isinstance(state, _WalkState) and obs.dtype == jnp.float32 and obs.shape == (1,)


def test_gymnax_adapter_splits_done_and_does_not_autoreset() -> None:
    env = GymnaxAdapter(_FakeGymnaxWalk())
    assert _run(env, [1, 1, 1]) == [(1, False, False), (2, False, False), (3, True, False)]
    assert _run(env, [0, 0, 0, 0, 0]) == [(t, False, t == 5) for t in range(1, 6)]
    state, _ = env.reset(KEY)
    for _ in range(3):
        state, obs, *_ = env.step(state, jnp.int32(1), KEY)
    assert int(state.pos) == 3 and float(obs[0]) == 3.0  # not reset to 0


def test_gymnax_adapter_custom_params_and_vmap() -> None:
    env = GymnaxAdapter(_FakeGymnaxWalk(), _WalkParams(goal=100, max_steps_in_episode=2))
    states, _ = jax.vmap(env.reset)(jax.random.split(KEY, 4))
    step = jax.jit(jax.vmap(env.step))
    actions = jnp.ones(4, jnp.int32)
    states, _, _, terminated, truncated, info = step(states, actions, jax.random.split(KEY, 4))
    states, _, _, terminated, truncated, info = step(states, actions, jax.random.split(KEY, 4))
    assert not np.any(np.asarray(terminated)) and np.all(np.asarray(truncated))
    assert "discount" in info and info["discount"].shape == (4,)


# ----------------------------------------------------------------- functional adapter


def _walk_adapter(max_episode_steps: int | None) -> FunctionalAdapter:
    def reset_fn(key: jax.Array) -> tuple[jax.Array, jax.Array]:
        pos = jax.random.uniform(key, (), minval=-0.1, maxval=0.1)
        return pos, pos[None]

    def step_fn(pos: jax.Array, action: jax.Array, key: jax.Array) -> tuple[Any, ...]:
        pos = pos + action.astype(jnp.float32)
        return pos, pos[None], -jnp.abs(pos), pos >= 2.5, {"pos": pos}

    return FunctionalAdapter(
        reset_fn, step_fn, gym.spaces.Box(-np.inf, np.inf, (1,), np.float32),
        gym.spaces.Discrete(2), max_episode_steps, "walk",
    )


def test_functional_adapter_time_limit_and_termination() -> None:
    env = _walk_adapter(4)
    assert env.name == "walk" and isinstance(env, JaxEnv)
    state, obs = env.reset(KEY)
    assert isinstance(state, TimedState) and int(state.time) == 0 and obs.dtype == jnp.float32
    assert _run(env, [0, 0, 0, 0]) == [(1, False, False), (2, False, False), (3, False, False), (4, False, True)]
    assert _run(env, [1, 1, 1]) == [(1, False, False), (2, False, False), (3, True, False)]


def test_functional_adapter_without_limit_under_scan() -> None:
    env = _walk_adapter(None)

    def body(state: TimedState, action: jax.Array) -> tuple[TimedState, jax.Array]:
        state, _, _, _, truncated, _ = env.step(state, action, KEY)
        return state, truncated

    state0, _ = env.reset(KEY)
    final, truncated = jax.jit(lambda s: jax.lax.scan(body, s, jnp.zeros(1000, jnp.int32)))(state0)
    assert int(final.time) == 1000 and not np.any(np.asarray(truncated))


def test_module_exports() -> None:
    for name in jax_envs.__all__:
        assert hasattr(jax_envs, name)
