"""What an actor says of the episodes that end: ``done``, and ``truncated`` only for a cut."""

from __future__ import annotations

import contextlib
import threading

import gymnasium as gym
import numpy as np
from gymnasium.vector import AutoresetMode, SyncVectorEnv

from seedbed.actor import act
from seedbed.transport.inprocess import InProcessServer


class _FallsAtStep(gym.Env):
    """Ends itself (``terminated``) at step ``falls_at``: one step before, at, or after its
    time limit, as a Walker2d that falls may."""

    observation_space = gym.spaces.Box(-1.0, 1.0, (1,), np.float32)
    action_space = gym.spaces.Discrete(2)

    def __init__(self, falls_at: int) -> None:
        self.falls_at, self.t = falls_at, 0

    def reset(self, *, seed=None, options=None):
        super().reset(seed=seed)
        self.t = 0
        return np.zeros(1, np.float32), {}

    def step(self, action):
        self.t += 1
        return np.zeros(1, np.float32), 1.0, self.t == self.falls_at, False, {}


def test_an_episode_that_ends_itself_at_its_time_limit_is_not_a_cut():
    """Gymnasium's TimeLimit reports ``truncated`` at the limit even where the task ended
    there: such an end is the task's, and a learner that bootstraps time limits must not
    bootstrap it. An env that falls at step 2, 3 or 4 of a 3-step limit: ends at 2 and 3 are
    not cuts, the limit's end at 3 for the third is."""
    limit = 3
    envs = SyncVectorEnv(
        [
            lambda f=falls_at: gym.wrappers.TimeLimit(_FallsAtStep(f), limit)
            for falls_at in (2, 3, 4)
        ],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )
    server = InProcessServer(1, 3)
    client = server.connect(0).open()

    def actor() -> None:
        with contextlib.suppress(ConnectionError):  # the server closed: the test is over
            act(client, envs, seed=0)

    thread = threading.Thread(target=actor, daemon=True)
    thread.start()
    seen = []
    try:
        while len(seen) < 4:
            request = server.recv(3, 0.01)
            if request is None:
                continue
            seen.append((np.array(request.done), np.array(request.truncated)))
            server.send(request, np.zeros(3, np.int64))
    finally:
        server.close()
        thread.join(timeout=10)
        envs.close()
    # Steps 0 (every env starts), 1, 2 (env 0 fell), 3 (env 1 fell at the limit, env 2 cut).
    assert [d.tolist() for d, _ in seen] == [
        [True, True, True],
        [False, False, False],
        [True, False, False],
        [False, True, True],
    ]
    assert [t.tolist() for _, t in seen][2:] == [[False, False, False], [False, False, True]]
