"""Make environments from an id, stepped in batches, and describe them with an EnvSpec.

Actors step E environments together through a Gymnasium vector env whose autoreset happens on
the same step: when an episode ends, ``step`` returns the next episode's first observation with
the ended episode's last reward and done flag, which is exactly what the learner's unrolls need.
"""

from __future__ import annotations

import dataclasses
import difflib

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode

from seedbed.errors import ConfigError

NOOP_ENV_ID = "seedbed/Noop-v0"


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What the rest of the system needs to know about an environment."""

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: str  # numpy dtype name; observations travel in this dtype
    num_actions: int  # size of the discrete action set

    @property
    def obs_numpy_dtype(self) -> np.dtype:
        return np.dtype(self.obs_dtype)


class NoopEnv(gym.Env):
    """A trivial environment that costs almost nothing to step: measures framework overhead."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)
    episode_length = 100

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self._obs = np.zeros(4, np.float32)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None):
        super().reset(seed=seed)
        self._t = 0
        return self._obs, {}

    def step(self, action):
        self._t += 1
        return self._obs, 1.0, self._t >= self.episode_length, False, {}


if NOOP_ENV_ID not in gym.registry:
    gym.register(NOOP_ENV_ID, entry_point=NoopEnv)


def check_env_id(env_id: str) -> None:
    """Raise a one-line ConfigError, with close matches, when ``env_id`` is not registered."""
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.registry for ids"
    raise ConfigError(f"unknown environment '{env_id}'{hint}")


def make_vector_env(env_id: str, num_envs: int) -> gym.vector.VectorEnv:
    """E environments stepped together, resetting on the step an episode ends."""
    check_env_id(env_id)
    return gym.make_vec(
        env_id,
        num_envs=num_envs,
        vectorization_mode="sync",
        vector_kwargs={"autoreset_mode": AutoresetMode.SAME_STEP},
    )


def spec_from_spaces(env_id: str, obs_space: gym.Space, action_space: gym.Space) -> EnvSpec:
    """Build an EnvSpec, refusing spaces the agents cannot handle with a clear message."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(
            f"{env_id}: observation space {obs_space} is not supported; seedbed needs an array "
            "(Box) observation"
        )
    if not isinstance(action_space, gym.spaces.Discrete):
        raise ConfigError(
            f"{env_id}: action space {action_space} is not supported by this agent; it needs a "
            "discrete action space"
        )
    return EnvSpec(env_id, tuple(obs_space.shape), obs_space.dtype.name, int(action_space.n))


def make_spec(env_id: str) -> EnvSpec:
    """Describe ``env_id`` by making one instance and reading its spaces."""
    check_env_id(env_id)
    env = gym.make(env_id)
    try:
        return spec_from_spaces(env_id, env.observation_space, env.action_space)
    finally:
        env.close()
