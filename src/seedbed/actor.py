"""An actor process: step E environments together and ask the learner for their actions.

In central mode the actor holds no model and knows nothing of the agent: it only turns actions
into observations. It imports neither torch nor the learner, so it starts in a fraction of a second.
"""

from __future__ import annotations

import logging
import signal
from typing import Any

import numpy as np

from seedbed.atari import AtariSettings
from seedbed.envs import make_vector_env

log = logging.getLogger(__name__)


def run_actor(
    endpoint: Any, env_id: str, num_envs: int, settings: AtariSettings | None, seed: int
) -> None:
    """Act until the learner goes away. ``endpoint.open()`` gives the transport client."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the learner decides when actors stop
    client = endpoint.open()
    envs = make_vector_env(env_id, num_envs, seed, settings)
    try:
        obs, _ = envs.reset(seed=seed)
        reward = np.zeros(num_envs, np.float32)
        done = np.ones(num_envs, np.bool_)  # every env starts an episode
        truncated = np.zeros(num_envs, np.bool_)
        while True:
            action = client.call(obs, reward, done, truncated)
            obs, reward, terminated, truncated, _ = envs.step(action)
            done = terminated | truncated
    except ConnectionError:
        log.debug("actor %s: learner gone, stopping", getattr(endpoint, "actor", "?"))
    finally:
        client.close()
        envs.close()
