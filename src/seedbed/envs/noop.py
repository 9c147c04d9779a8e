"""``seedbed/Noop-v0``: an environment that costs almost nothing to step.

Benchmarks and tests train on it to measure what seedbed itself costs per step (transport,
inference, unrolls), with no simulator in the way. It is registered with Gymnasium too, so
``gym.make`` knows it. Actors step their E copies in one numpy call (``NoopVectorEnv``): E single
envs in a SyncVectorEnv would cost a Python step each, most of what the benchmark measures.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, VectorEnv
from gymnasium.vector.utils import batch_space

from seedbed.envs.base import EnvFamily

NOOP_ENV_ID = "seedbed/Noop-v0"


class NoopEnv(gym.Env):
    """Observations of four zeros, two actions, reward 1 per step, episodes of 100 steps."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (4,), np.float32)
    action_space = gym.spaces.Discrete(2)
    episode_length = 100

    def __init__(self, render_mode: str | None = None) -> None:
        self.render_mode = render_mode
        self._obs = np.zeros(4, np.float32)
        self._t = 0

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._t += 1
        return self._obs, 1.0, self._t >= self.episode_length, False, {}


class NoopVectorEnv(VectorEnv):
    """``num_envs`` NoopEnvs stepped together, resetting on the step an episode ends (as every
    actor's vector env does), each step one numpy call for all of them."""

    metadata = {"autoreset_mode": AutoresetMode.SAME_STEP}

    def __init__(self, num_envs: int) -> None:
        self.num_envs = num_envs
        self.single_observation_space = NoopEnv.observation_space
        self.single_action_space = NoopEnv.action_space
        self.observation_space = batch_space(self.single_observation_space, num_envs)
        self.action_space = batch_space(self.single_action_space, num_envs)
        # Returned at every step, as the single envs return theirs: callers copy what they keep.
        self._obs = np.zeros(self.observation_space.shape, self.observation_space.dtype)
        self._reward = np.ones(num_envs, np.float32)
        self._truncated = np.zeros(num_envs, np.bool_)
        self._t = np.zeros(num_envs, np.int64)

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t[:] = 0
        return self._obs, {}

    def step(self, actions: Any) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, dict]:
        self._t += 1
        terminated = self._t >= NoopEnv.episode_length
        self._t[terminated] = 0  # the next episode starts with this step's observation
        return self._obs, self._reward, terminated, self._truncated, {}


class NoopFamily(EnvFamily):
    """The one id ``seedbed/Noop-v0``; the presets of classic control apply to it."""

    name = "noop"

    def owns(self, env_id: str) -> bool:
        return env_id == NOOP_ENV_ID

    def preset(self, env_id: str) -> str:
        return "classic"  # no presets of its own

    def check(self, env_id: str) -> None:
        pass  # owns() accepts only the one id

    def make(self, env_id: str, settings: Any, render_mode: str | None = None) -> gym.Env:
        return gym.make(NOOP_ENV_ID, render_mode=render_mode)

    def make_vector(self, env_id: str, num_envs: int, seed: int, settings: Any) -> NoopVectorEnv:
        return NoopVectorEnv(num_envs)


if NOOP_ENV_ID not in gym.registry:
    gym.register(NOOP_ENV_ID, entry_point=NoopEnv)

FAMILY = NoopFamily()
