"""The interface of an environment family, and the EnvSpec every family's envs are described by.

A family owns a set of env ids (``atari:`` ids, ``dmc:`` ids, plain Gymnasium ids...) and says
everything seedbed needs to know about them: its settings (a dataclass that becomes a section of
the run's config, ``atari: {sticky_actions: 0.0}``, and one flag per field), the row of presets
its ids use (``seedbed.presets``), how to check an id, and how to make one env, E envs stepped
together, and the spec. ``seedbed.envs.registry`` holds the families; ``seedbed.envs`` asks it.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import gymnasium as gym
from gymnasium.vector import AutoresetMode

from seedbed.errors import ConfigError
from seedbed.types import EnvSpec


@dataclasses.dataclass(frozen=True)
class NoSettings:
    """The settings of a family that has none: no config section, no flags."""


class EnvFamily:
    """An environment family. Subclass it, set the class attributes, override what differs.

    The call loop, for one run: ``registry.family_for(env_id)`` finds the family (the first
    whose ``owns`` says yes); ``canonical_id`` names the env as the run records it; ``preset``
    picks the row of preset files (``seedbed.presets``: ``ROW.yaml``, ``ROW/AGENT.yaml``)
    applied before the user's settings; ``settings_class`` is built from its config section
    and flags and validated. Then every process that makes envs calls ``check`` once, and
    ``make`` (one env: evaluation, video), ``make_vector`` (an actor's E envs) or
    ``spec_extra`` (what ``make_spec`` adds to the spaces of one env) with those settings.
    """

    name: str = ""  # the config section of its settings, and its row of presets
    prefix: str = ""  # ids it owns start with this ("atari:"); "" where owns() decides
    settings_class: type = NoSettings  # a dataclass of config.setting(...) fields
    # A folder of preset files of its own (ROW.yaml, ROW/AGENT.yaml), asked before seedbed's.
    presets: Path | None = None

    def owns(self, env_id: str) -> bool:
        """Whether ``env_id`` belongs to this family."""
        return bool(self.prefix) and env_id.startswith(self.prefix)

    def canonical_id(self, env_id: str) -> str:
        """The id a run records for ``env_id`` (e.g. ``ALE/Pong-v5`` is ``atari:Pong``)."""
        return env_id

    def preset(self, env_id: str) -> str:
        """The row of presets that applies to ``env_id``: the family's name, or a finer one
        where ids of one family want different defaults (classic, continuous, mujoco)."""
        return self.name

    def check(self, env_id: str) -> None:
        """Raise a one-line ConfigError, with close matches, when ``env_id`` is not known."""
        raise NotImplementedError

    def make(self, env_id: str, settings: Any, render_mode: str | None = None) -> gym.Env:
        """One environment, preprocessed as training sees it."""
        raise NotImplementedError

    def make_vector(self, env_id: str, num_envs: int, seed: int, settings: Any) -> Any:
        """E environments stepped together, resetting on the step an episode ends (the
        learner's unrolls need the ended episode's last reward beside the next one's start)."""
        return gym.vector.SyncVectorEnv(
            [lambda: self.make(env_id, settings) for _ in range(num_envs)],
            autoreset_mode=AutoresetMode.SAME_STEP,
        )

    def spec_extra(self, env_id: str, settings: Any) -> dict[str, Any]:
        """EnvSpec fields beyond the spaces (``frame_skip``, ``protocol``); checks here fail
        once, in the learner, rather than in every actor."""
        return {}


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
