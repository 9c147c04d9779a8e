"""An environment of your own: walk a corridor to its far end (importing registers Corridor-v0).

seedbed names it ``corridor:Corridor-v0``, Gymnasium's ``module:EnvId`` convention: the learner
and every actor import ``corridor`` before making the env, so the module must be importable
where they run (the script's folder, PYTHONPATH or an installed package). It is the example of
docs/guides/own-env.md; it takes no ``render_mode``, as many users' envs do not.
"""

import gymnasium as gym
import numpy as np


class Corridor(gym.Env):
    """Start in cell 0 of 8; step left (0) or right (1); 1.0 at cell 7, -0.01 for other steps."""

    observation_space = gym.spaces.Box(0.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)  # left, right

    def reset(self, *, seed=None, options=None):
        self.cell = 0
        return np.array([0.0], np.float32), {}

    def step(self, action):
        self.cell = max(0, self.cell + (1 if action == 1 else -1))
        end = self.cell == 7
        return np.array([self.cell / 7], np.float32), 1.0 if end else -0.01, end, False, {}


gym.register("Corridor-v0", entry_point=Corridor, max_episode_steps=100)
