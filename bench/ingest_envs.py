"""Atari-sized observations for ``bench/ingest.py``, as a user's ``module:EnvId`` env.

The learner of that benchmark only reads an env's spec (its observation and action spaces): the
simulated actors send pre-built steps and step no env. These ids give it Atari's sizes without
an emulator, and count frames as agent steps (no frame skip):

- ``ingest_envs:ingest/Stacked84-v0``: uint8 ``[4, 84, 84]``, the 4 stacked frames seedbed's
  Atari family sends (``--frame-stack 4``, the default);
- ``ingest_envs:ingest/Newest84-v0``: uint8 ``[1, 84, 84]``, what ``--frame-stack 1`` sends.

Both have Pong's 6 actions. This module must be importable where the learner runs
(``bench/`` on ``PYTHONPATH``), as any ``module:EnvId`` module must.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym
import numpy as np

STACKED_ID = "ingest/Stacked84-v0"
NEWEST_ID = "ingest/Newest84-v0"


class FramesEnv(gym.Env):
    """Black uint8 frames ``[frames, 84, 84]``, 6 actions, episodes of 100 steps."""

    action_space = gym.spaces.Discrete(6)
    episode_length = 100

    def __init__(self, frames: int = 4, render_mode: str | None = None) -> None:
        self.observation_space = gym.spaces.Box(0, 255, (frames, 84, 84), np.uint8)
        self.render_mode = render_mode
        self._obs = np.zeros(self.observation_space.shape, np.uint8)
        self._t = 0

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        self._t = 0
        return self._obs, {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        self._t += 1
        return self._obs, 0.0, self._t >= self.episode_length, False, {}


for _id, _frames in ((STACKED_ID, 4), (NEWEST_ID, 1)):
    if _id not in gym.registry:
        gym.register(_id, entry_point=FramesEnv, kwargs={"frames": _frames})
