"""Make environments from an id, stepped in batches, and describe them with an EnvSpec.

Actors step E environments together through a Gymnasium vector env whose autoreset happens on
the same step: when an episode ends, ``step`` returns the next episode's first observation with
the ended episode's last reward and done flag, which is exactly what the learner's unrolls need.
"""

from __future__ import annotations

import dataclasses
import difflib
from typing import Any

import gymnasium as gym
import numpy as np
from gymnasium.envs.classic_control.cartpole import CartPoleVectorEnv
from gymnasium.vector import AutoresetMode

from seedbed import atari, dmc, dmlab, football
from seedbed.atari import AtariSettings
from seedbed.errors import ConfigError

NOOP_ENV_ID = "seedbed/Noop-v0"


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What the rest of the system needs to know about an environment.

    Actions travel through one code path whatever their kind: each env's action is an array of
    ``action_shape`` in ``action_dtype``. Discrete actions are int64 scalars (shape ``()``) below
    ``num_actions``; continuous ones are float32 arrays within ``action_low`` and
    ``action_high`` (flattened in C order), and ``num_actions`` is 0.
    """

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: str  # numpy dtype name; observations travel in this dtype
    num_actions: int  # size of the discrete action set; 0 for continuous actions
    frame_skip: int = 1  # emulator frames per agent step: reports count frames, not steps
    protocol: str | None = None  # how the environment is set up, for the run's summary
    action_shape: tuple[int, ...] = ()  # one env's action: () for a discrete action
    action_dtype: str = "int64"  # numpy dtype name: int64 (discrete) or float32 (continuous)
    action_low: tuple[float, ...] = ()  # continuous actions' bounds, flattened; () if discrete
    action_high: tuple[float, ...] = ()

    @property
    def obs_numpy_dtype(self) -> np.dtype:
        return np.dtype(self.obs_dtype)

    @property
    def continuous(self) -> bool:
        """Whether actions are real-valued arrays (a Box) rather than one of ``num_actions``."""
        return np.dtype(self.action_dtype).kind == "f"

    @property
    def action_kind(self) -> str:
        """'continuous' or 'discrete', for messages."""
        return "continuous" if self.continuous else "discrete"


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
    if env_id in gym.registry:
        return
    close = difflib.get_close_matches(env_id, list(gym.registry), n=3, cutoff=0.5)
    hint = f"; did you mean {', '.join(close)}?" if close else "; see gymnasium.registry for ids"
    raise ConfigError(f"unknown environment '{env_id}'{hint}")


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
    return gym.make(env_id, render_mode=render_mode)


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
