"""Make environments from an id, stepped in batches, and describe them with an EnvSpec
(``seedbed.types``).

Actors step E environments together through a Gymnasium vector env whose autoreset happens on
the same step: when an episode ends, ``step`` returns the next episode's first observation with
the ended episode's last reward and done flag, which is exactly what the learner's unrolls need.
"""

from __future__ import annotations

import difflib
import importlib
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode

from seedbed import atari, dmc, dmlab, football
from seedbed.atari import AtariSettings
from seedbed.errors import ConfigError
from seedbed.types import EnvSpec

NOOP_ENV_ID = "seedbed/Noop-v0"


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


_NUMPY_CARTPOLES = {"CartPole-v0", "CartPole-v1"}


if NOOP_ENV_ID not in gym.registry:
    gym.register(NOOP_ENV_ID, entry_point=NoopEnv)


def check_env_id(env_id: str) -> None:
    """Raise a one-line ConfigError, with close matches, when ``env_id`` is not known."""
    if atari.is_atari(env_id):
        atari.game_name(env_id)
        return
    if dmc.is_dmc(env_id):
        dmc.task_name(env_id)
        return
    if football.is_football(env_id):
        football.parse(env_id)
        return
    if dmlab.is_dmlab(env_id):
        dmlab.level_path(env_id)
        return
    module, _, name = env_id.rpartition(":")
    if module:
        import_env_module(module, env_id)
    if name in gym.registry:
        return
    close = difflib.get_close_matches(name, list(gym.registry), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.registry for ids"
    where = f" (module '{module}' registered no such id)" if module else ""
    raise ConfigError(f"unknown environment '{env_id}'{where}{hint}")


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


def make_env(
    env_id: str, settings: AtariSettings | None = None, render_mode: str | None = None
) -> gym.Env:
    """One environment, preprocessed as training sees it (``atari:`` ids use ``settings``)."""
    check_env_id(env_id)
    if atari.is_atari(env_id):
        return atari.make_env(env_id, settings or AtariSettings.defaults(), render_mode)
    if dmc.is_dmc(env_id):
        return dmc.make_env(env_id, render_mode)
    if football.is_football(env_id):
        return football.make_env(env_id, render_mode)
    if dmlab.is_dmlab(env_id):
        return dmlab.make_env(env_id, render_mode)
    # Only when asked: many users' envs take no render_mode argument at all.
    try:
        return gym.make(env_id, **({"render_mode": render_mode} if render_mode else {}))
    except TypeError as error:
        if render_mode is None or "render_mode" not in str(error):
            raise
        raise ConfigError(
            f"{env_id} takes no render_mode argument, so it cannot be recorded; evaluate it "
            "without --video, or give its constructor render_mode"
        ) from None


def make_vector_env(
    env_id: str, num_envs: int, seed: int, settings: AtariSettings | None = None
) -> Any:
    """E environments stepped together, resetting on the step an episode ends.

    The result has Gymnasium's vector API: ``reset(seed=seed)`` then ``step(actions)``.
    """
    check_env_id(env_id)
    settings = settings or AtariSettings.defaults()
    if atari.is_atari(env_id) and settings.backend == "envpool":
        return atari.EnvPoolVector(env_id, settings, num_envs, seed)
    if env_id in _NUMPY_CARTPOLES:
        return SameStepCartPole(num_envs, gym.spec(env_id).max_episode_steps)
    return gym.vector.SyncVectorEnv(
        [lambda: make_env(env_id, settings) for _ in range(num_envs)],
        autoreset_mode=AutoresetMode.SAME_STEP,
    )


def spec_from_spaces(
    env_id: str, obs_space: gym.Space, action_space: gym.Space, **extra: Any
) -> EnvSpec:
    """Build an EnvSpec, refusing spaces the agents cannot handle with a clear message."""
    if not isinstance(obs_space, gym.spaces.Box):
        raise ConfigError(
            f"{env_id}: observation space {obs_space} is not supported; seedbed needs an array "
            "(Box) observation"
        )
    obs = (env_id, tuple(obs_space.shape), obs_space.dtype.name)
    if isinstance(action_space, gym.spaces.Discrete):
        return EnvSpec(*obs, int(action_space.n), **extra)
    if isinstance(action_space, gym.spaces.Box) and action_space.dtype.kind == "f":
        # Continuous actions travel as float32 whatever the Box says: networks act in float32.
        return EnvSpec(
            *obs,
            0,
            action_shape=tuple(action_space.shape),
            action_dtype="float32",
            action_low=tuple(float(x) for x in action_space.low.ravel()),
            action_high=tuple(float(x) for x in action_space.high.ravel()),
            **extra,
        )
    raise ConfigError(
        f"{env_id}: action space {action_space} is not supported; seedbed needs Discrete or "
        "real-valued Box actions"
    )


def make_spec(env_id: str, settings: AtariSettings | None = None) -> EnvSpec:
    """Describe ``env_id`` by making one instance and reading its spaces."""
    env = make_env(env_id, settings)
    extra = {}
    if atari.is_atari(env_id):
        settings = settings or AtariSettings.defaults()
        if settings.backend == "envpool":
            atari.envpool_id(env_id)  # fail here, not in every actor
        extra = {"frame_skip": settings.frame_skip, "protocol": settings.protocol()}
    elif football.is_football(env_id):
        extra = {"protocol": football.parse(env_id).protocol()}
    elif dmlab.is_dmlab(env_id):
        extra = {"frame_skip": dmlab.ACTION_REPEATS, "protocol": dmlab.protocol()}
    try:
        return spec_from_spaces(env_id, env.observation_space, env.action_space, **extra)
    finally:
        env.close()
