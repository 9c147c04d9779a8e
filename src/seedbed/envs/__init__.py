"""Make environments from an id, stepped in batches, and describe them with an EnvSpec
(``seedbed.types``).

An id belongs to one family (``seedbed.envs.registry``): ``atari:GAME`` (and ``ALE/GAME-v5``),
``dmc:DOMAIN-TASK``, ``football:SCENARIO``, ``dmlab:LEVEL``, ``seedbed/Noop-v0``, and any other
Gymnasium id, users' ``module:EnvId`` included. Each function here finds the family and hands it
the id with the family's settings (``settings``: e.g. an ``AtariSettings``; None: its defaults).

Actors step E environments together through a Gymnasium vector env whose autoreset happens on
the same step: when an episode ends, ``step`` returns the next episode's first observation with
the ended episode's last reward and done flag, which is exactly what the learner's unrolls need.
"""

from __future__ import annotations

from typing import Any

import gymnasium as gym

from seedbed.envs.base import EnvFamily, NoSettings, spec_from_spaces
from seedbed.envs.gym import SameStepCartPole, import_env_module
from seedbed.envs.noop import NOOP_ENV_ID, NoopEnv
from seedbed.envs.registry import (
    families,
    family_for,
    make_settings,
    register,
    settings_owners,
    unregister,
)
from seedbed.types import EnvSpec

__all__ = [
    "NOOP_ENV_ID",
    "EnvFamily",
    "NoSettings",
    "NoopEnv",
    "SameStepCartPole",
    "check_env_id",
    "families",
    "family_for",
    "import_env_module",
    "make_env",
    "make_settings",
    "make_spec",
    "make_vector_env",
    "register",
    "settings_owners",
    "spec_from_spaces",
    "unregister",
]


def check_env_id(env_id: str) -> None:
    """Raise a one-line ConfigError, with close matches, when ``env_id`` is not known."""
    family_for(env_id).check(env_id)


def _settings(family: EnvFamily, settings: Any) -> Any:
    """``settings``, or the family's defaults for None; a TypeError for another family's."""
    if settings is None:
        return family.settings_class()
    if not isinstance(settings, family.settings_class):
        raise TypeError(
            f"{family.name} envs take {family.settings_class.__name__}, "
            f"not {type(settings).__name__}"
        )
    return settings


def make_env(env_id: str, settings: Any = None, render_mode: str | None = None) -> gym.Env:
    """One environment, preprocessed as training sees it, with its family's ``settings``."""
    family = family_for(env_id)
    family.check(env_id)
    return family.make(env_id, _settings(family, settings), render_mode)


def make_vector_env(env_id: str, num_envs: int, seed: int, settings: Any = None) -> Any:
    """E environments stepped together, resetting on the step an episode ends.

    The result has Gymnasium's vector API: ``reset(seed=seed)`` then ``step(actions)``.
    """
    family = family_for(env_id)
    family.check(env_id)
    return family.make_vector(env_id, num_envs, seed, _settings(family, settings))


def make_spec(env_id: str, settings: Any = None) -> EnvSpec:
    """Describe ``env_id`` by making one instance and reading its spaces."""
    family = family_for(env_id)
    settings = _settings(family, settings)
    env = make_env(env_id, settings)
    try:
        extra = family.spec_extra(env_id, settings)
        return spec_from_spaces(env_id, env.observation_space, env.action_space, **extra)
    finally:
        env.close()
