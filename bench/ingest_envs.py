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

import gymnasium as gym
import numpy as np

from seedbed.envs.noop import NoopEnv

STACKED_ID = "ingest/Stacked84-v0"
NEWEST_ID = "ingest/Newest84-v0"


class FramesEnv(NoopEnv):
    """seedbed's no-op env with black uint8 frames ``[frames, 84, 84]`` and Pong's 6 actions."""

    action_space = gym.spaces.Discrete(6)

    def __init__(self, frames: int = 4, render_mode: str | None = None) -> None:
        super().__init__(render_mode)
        self.observation_space = gym.spaces.Box(0, 255, (frames, 84, 84), np.uint8)
        self._obs = np.zeros(self.observation_space.shape, np.uint8)


for _id, _frames in ((STACKED_ID, 4), (NEWEST_ID, 1)):
    if _id not in gym.registry:
        gym.register(_id, entry_point=FramesEnv, kwargs={"frames": _frames})
