"""Users' envs that go wrong, for the tests of what the learner refuses (importing registers
them): ``tests.runtime.nan_envs:NanCartPole-v0`` is CartPole whose observation is NaN once every
``EVERY`` steps; ``tests.runtime.nan_envs:AlwaysNan-v0`` gives NaN observations only."""

from __future__ import annotations

import gymnasium as gym
import numpy as np

EVERY = 300  # steps between NaN observations, per env


class NanNowAndThen(gym.Wrapper):
    """An env whose observation is NaN every ``every`` steps (1: always)."""

    def __init__(self, env: gym.Env, every: int = EVERY) -> None:
        super().__init__(env)
        self.every, self.steps = every, 0

    def step(self, action):
        obs, reward, terminated, truncated, info = self.env.step(action)
        self.steps += 1
        if self.steps % self.every == 0:
            obs = np.full_like(obs, np.nan)
        return obs, reward, terminated, truncated, info


def _cartpole(every: int = EVERY) -> gym.Env:
    return NanNowAndThen(gym.make("CartPole-v1").unwrapped, every)


gym.register("NanCartPole-v0", entry_point=_cartpole, max_episode_steps=500)
gym.register("AlwaysNan-v0", entry_point=_cartpole, kwargs={"every": 1}, max_episode_steps=500)
