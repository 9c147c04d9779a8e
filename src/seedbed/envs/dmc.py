"""DeepMind Control Suite tasks (``dmc:DOMAIN-TASK``) as Gymnasium environments.

``dmc:cartpole-swingup``, ``dmc:walker-walk``… name any task of ``dm_control.suite`` (the
``dmc`` extra: dm_control with a MuJoCo 3 release). Each is wrapped as a plain Gymnasium env:

- observations: the task's observation dict flattened into one float32 vector, its entries in the
  order the task's observation spec lists them (fixed per task), each raveled;
- actions: a float32 Box with the task's bounds (the suite's are [-1, 1]);
- rewards: floats in [0, 1] per step, as the suite defines them;
- episodes: the suite ends them after a fixed time (1,000 steps for most tasks). That is a time
  limit, so it comes back as ``truncated``; ``terminated`` only where a task ends an episode
  itself (discount 0).

dm_control is imported on first use, so other envs never pay for it.
"""

from __future__ import annotations

import difflib
import functools
import logging
import warnings
from typing import Any

import gymnasium as gym
import numpy as np

from seedbed.envs.base import EnvFamily
from seedbed.errors import ConfigError

PREFIX = "dmc:"


class _QuietModelWarnings(logging.Filter):
    """Drops MuJoCo's notes that a suite model uses a deprecated compiler attribute (cheetah's
    ``settotalmass``): they come from dm_control's own files, once per env, and no user can act
    on them."""

    def filter(self, record: logging.LogRecord) -> bool:
        return "is deprecated and will be removed" not in record.getMessage()


@functools.cache
def _suite() -> Any:
    # dm_control logs through absl, which at INFO narrates its OpenGL and MuJoCo setup.
    absl_log = logging.getLogger("absl")
    absl_log.setLevel(max(absl_log.level, logging.WARNING))
    absl_log.addFilter(_QuietModelWarnings())
    try:
        with warnings.catch_warnings():
            # dm_control probes OpenGL backends on import and GLFW warns where there is no
            # display; nothing renders during training, and videos fall back to EGL/OSMesa.
            warnings.simplefilter("ignore")
            from dm_control import suite
    except ImportError:
        raise ConfigError("dmc: environments need dm_control: pip install 'seedbed[dmc]'") from None
    return suite


@functools.cache
def tasks() -> tuple[str, ...]:
    """Every suite task as ``domain-task``, e.g. ``cartpole-swingup``."""
    return tuple(f"{domain}-{task}" for domain, task in _suite().ALL_TASKS)


def task_name(env_id: str) -> tuple[str, str]:
    """The (domain, task) of a ``dmc:DOMAIN-TASK`` id, or a one-line error with close matches."""
    asked = env_id[len(PREFIX) :]
    known = tasks()
    if asked in known:
        domain, task = asked.split("-", 1)
        return domain, task
    close = difflib.get_close_matches(asked, known, n=3, cutoff=0.6)
    hint = (
        f"; did you mean {', '.join(PREFIX + c for c in close)}?"
        if close
        else "; ids are dmc:DOMAIN-TASK as in dm_control.suite, e.g. dmc:cartpole-swingup"
    )
    raise ConfigError(f"unknown DM Control task '{asked}'{hint}")


class DMCEnv(gym.Env):
    """One dm_control suite task behind the Gymnasium API (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"]}

    def __init__(
        self, domain: str, task: str, render_mode: str | None = None, size: int = 240
    ) -> None:
        self._env = _suite().load(domain, task)
        self.render_mode = render_mode
        self._size = size
        obs_spec = self._env.observation_spec()
        self._keys = tuple(obs_spec)  # the task's own order, fixed, so vectors line up
        width = sum(int(np.prod(obs_spec[k].shape)) for k in self._keys)
        self.observation_space = gym.spaces.Box(-np.inf, np.inf, (width,), np.float32)
        spec = self._env.action_spec()
        self.action_space = gym.spaces.Box(
            spec.minimum.astype(np.float32), spec.maximum.astype(np.float32), spec.shape, np.float32
        )
        # Seconds per step, for videos at real speed.
        self.metadata = {**self.metadata, "render_fps": round(1.0 / self._env.control_timestep())}

    def _flatten(self, observation: dict[str, Any]) -> np.ndarray:
        parts = [np.asarray(observation[k], np.float32).ravel() for k in self._keys]
        return np.concatenate(parts)

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            # The task draws its initial states from this generator: reseeding it in place
            # makes the episode reproducible without reloading the model.
            self._env.task.random.seed(seed)
        return self._flatten(self._env.reset().observation), {}

    def step(self, action: np.ndarray) -> tuple[np.ndarray, float, bool, bool, dict]:
        step = self._env.step(np.asarray(action, np.float64))
        reward = float(step.reward or 0.0)
        terminated = step.last() and step.discount == 0.0
        truncated = step.last() and not terminated
        return self._flatten(step.observation), reward, terminated, truncated, {}

    def render(self) -> np.ndarray:
        """An RGB frame from the task's first camera (needs an OpenGL backend; on a headless
        machine set ``MUJOCO_GL=egl`` or ``osmesa``)."""
        return self._env.physics.render(self._size, self._size, camera_id=0)

    def close(self) -> None:
        self._env.close()


def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:
    """The task of a ``dmc:DOMAIN-TASK`` id as a Gymnasium env."""
    return DMCEnv(*task_name(env_id), render_mode=render_mode)


class DMCFamily(EnvFamily):
    """``dmc:DOMAIN-TASK`` ids; the suite fixes each task, so the family has no settings."""

    name = "dmc"
    prefix = PREFIX

    def check(self, env_id: str) -> None:
        task_name(env_id)

    def make(self, env_id: str, settings: Any, render_mode: str | None = None) -> gym.Env:
        return make_env(env_id, render_mode)


FAMILY = DMCFamily()
