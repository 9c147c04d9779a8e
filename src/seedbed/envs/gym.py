"""Plain Gymnasium ids (``CartPole-v1``, ``HalfCheetah-v5``) and users' own ``module:EnvId``.

The family of every id no other family owns, so the registry asks it last. A user's env is named
``module:EnvId``, Gymnasium's convention: importing ``module`` registers ``EnvId``, and every
process that makes the env (learner, local, remote and Ray actors) imports it again through
``check``. CartPole steps all E envs in one numpy call (``SameStepCartPole``).
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode

from seedbed.envs.base import EnvFamily
from seedbed.errors import ConfigError

# Gymnasium's MuJoCo tasks (their ids are NAME-vN): continuous control, with defaults of its own.
MUJOCO_TASKS = (
    "Ant",
    "HalfCheetah",
    "Hopper",
    "Humanoid",
    "HumanoidStandup",
    "InvertedDoublePendulum",
    "InvertedPendulum",
    "Pusher",
    "Reacher",
    "Swimmer",
    "Walker2d",
)
_NUMPY_CARTPOLES = {"CartPole-v0", "CartPole-v1"}


class SameStepCartPole(CartPoleVectorEnv):
    """Gymnasium's CartPole stepping all E envs in one numpy call, resetting on the step an
    episode ends (Gymnasium's own resets one step later, with a step that ignores the action).

    E single CartPoles in a SyncVectorEnv cost ~10 us each per step in Python; this costs about
    as much for all E, so actors spend their time on the policy and the transport instead.
    """

    metadata = {**CartPoleVectorEnv.metadata, "autoreset_mode": AutoresetMode.SAME_STEP}

    def step(self, action: np.ndarray) -> tuple:
        obs, reward, terminated, truncated, info = super().step(np.asarray(action))
        ended = self.prev_done  # episodes that ended on this step: start the next ones now
        if ended.any():
            self.state[:, ended] = self.np_random.uniform(self.low, self.high, (4, ended.sum()))
            self.steps[ended] = 0
            ended[:] = False  # nothing left for the parent's next step to reset
            obs = self.state.T.astype(np.float32)
        return obs, reward, terminated, truncated, info


def import_env_module(module: str, env_id: str) -> None:
    """Import the module of a ``module:EnvId`` id, which registers the user's env with Gymnasium
    (Gymnasium's own convention; every process that makes the env imports it again)."""
    try:
        importlib.import_module(module)
    except ImportError as error:
        raise ConfigError(
            f"cannot import '{module}' for --env {env_id} ({error}); put the module on "
            "PYTHONPATH or install its package, where the learner and every actor run"
        ) from None


class GymFamily(EnvFamily):
    """Any id in Gymnasium's registry, after importing the module a ``module:`` part names."""

    name = "gym"
    presets = {
        # PPO reached CartPole's 475 sooner from the command's start than V-trace did
        # (docs/benchmarks.md), and it also acts in continuous spaces (Pendulum).
        "classic": {"agent": "ppo"},
        # Continuous control: returns have no common target.
        "mujoco": {"agent": "ppo", "target_return": None, "total_frames": 1_000_000},
    }

    def owns(self, env_id: str) -> bool:
        return True  # the registry asks this family only when no other owns the id

    def preset(self, env_id: str) -> str:
        return "mujoco" if env_id.rsplit("-v", 1)[0] in MUJOCO_TASKS else "classic"

    def run_defaults(self, env_id: str) -> dict[str, Any]:
        return self.presets[self.preset(env_id)]

    def check(self, env_id: str) -> None:
        module, _, name = env_id.rpartition(":")
        if module:
            import_env_module(module, env_id)
        if name in gym.registry:
            return
        close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.5)
        hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.registry"
        where = f" (module '{module}' registered no such id)" if module else ""
        raise ConfigError(f"unknown environment '{env_id}'{where}{hint}")

    def make(self, env_id: str, settings: Any, render_mode: str | None = None) -> gym.Env:
        # Only when asked: many users' envs take no render_mode argument at all.
        try:
            return gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))
        except TypeError as error:
            if render_mode is None or "render_mode" not in str(error):
                raise
            raise ConfigError(
                f"{env_id} takes no render_mode argument, so it cannot be recorded; evaluate "
                "it without --video, or give its constructor render_mode"
            ) from None

    def make_vector(self, env_id: str, num_envs: int, seed: int, settings: Any) -> Any:
        if env_id in _NUMPY_CARTPOLES:
            return SameStepCartPole(num_envs, gym.spec(env_id).max_episode_steps)
        return super().make_vector(env_id, num_envs, seed, settings)


FAMILY = GymFamily()
