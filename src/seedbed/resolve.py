"""Resolve a run's settings: the layers a user gave, over the defaults of the env's family and of
the agent, into one validated ``RunConfig``.

It sits above the three kinds of settings it merges: the run's (``seedbed.config``), the env
family's (``seedbed.envs``, e.g. ``atari: {sticky_actions: 0.0}``) and the agent's (its
``config.py``). Each layer may hold the family's and the agent's settings flat, as flags give
them (``sticky_actions``, ``lr``), or nested under the family's or agent's name, as the saved
``config.yaml`` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

from seedbed.agents import AGENTS, config_class, family_defaults, run_defaults  # no torch
from seedbed.config import RunConfig, TrainConfig, build, coerce, unknown_message
from seedbed.envs import EnvFamily, families, family_for, settings_owners
from seedbed.errors import ConfigError
from seedbed.loggers import check_loggers
from seedbed.plugins import import_plugins

_TRAIN_NAMES = frozenset(f.name for f in dataclasses.fields(TrainConfig))


def env_family(env_id: str) -> str:
    """The row of the defaults tables that applies to ``env_id``: its family's name (``atari``,
    ``dmc``, ``football``, ``dmlab``, or a user's family's), ``mujoco`` for Gymnasium's MuJoCo
    ids (``HalfCheetah-v5``...), else ``classic``."""
    return family_for(env_id).preset(env_id)


def resolve(layers: list[dict[str, Any]]) -> RunConfig:
    """Merge setting layers (earlier ones lose) into a validated RunConfig.

    The modules the ``plugins`` setting names are imported first, so what they register is
    known. The defaults of the environment's family come first (``EnvFamily.run_defaults`` for the
    run, the agent's ``FAMILY_DEFAULTS`` row for the agent), then the agent's own run defaults
    for that family, then the layers.
    """
    train_values: dict[str, Any] = {}
    for layer in layers:
        train_values.update({k: v for k, v in layer.items() if k in _TRAIN_NAMES})
    if "plugins" in train_values:  # first: they may register the env's family, the agent...
        import_plugins(coerce("plugins", train_values["plugins"], tuple[str, ...]))
    family = family_for(str(train_values.get("env", TrainConfig.env)))
    if "env" in train_values:  # ALE/Pong-v5 is recorded as atari:Pong
        train_values["env"] = family.canonical_id(str(train_values["env"]))
    env_id = str(train_values.get("env", TrainConfig.env))
    preset = family.preset(env_id)
    family_run = family.run_defaults(env_id)
    agent_name = train_values.get("agent", family_run.get("agent", TrainConfig.agent))
    train_values = {**family_run, **run_defaults(agent_name, preset), **train_values}
    agent_cls = config_class(agent_name)
    agent_values, env_values = _sections(layers, agent_name, agent_cls, family)
    agent_values = {**family_defaults(agent_name, preset), **agent_values}
    config = RunConfig(
        build(TrainConfig, train_values),
        build(agent_cls, agent_values),
        build(family.settings_class, env_values),
        family.name,
    )
    config.validate()
    check_loggers(config.train.loggers)
    return config


def _sections(
    layers: Iterable[dict[str, Any]], agent_name: str, agent_cls: type, family: EnvFamily
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The agent's and the env family's values in ``layers``, flat or in their sections.

    Another agent's or family's section, and another family's flat settings (``--frame-skip``
    with a Gymnasium id), are kept in the file and unused, so one config file can serve several
    envs and agents.
    """
    agent_names = {f.name for f in dataclasses.fields(agent_cls)}
    env_names = {f.name for f in dataclasses.fields(family.settings_class)}
    owners = settings_owners()
    sections = {f.name for f in families()}
    clash = sections & set(AGENTS)
    if clash:
        raise ConfigError(f"env family {', '.join(sorted(clash))} has an agent's name")
    agent_values: dict[str, Any] = {}
    env_values: dict[str, Any] = {}
    for layer in layers:
        for key, value in layer.items():
            if key in _TRAIN_NAMES:
                continue
            if (key in AGENTS or key in sections) and isinstance(value, dict):
                if key in (agent_name, family.name):
                    target = agent_values if key == agent_name else env_values
                    target.update({k.replace("-", "_"): v for k, v in value.items()})
                continue  # another agent's or family's section
            if key in owners and key not in agent_names:
                if key in env_names:
                    env_values[key] = value
                continue  # another family's setting
            if key not in agent_names:
                known = _TRAIN_NAMES | agent_names | env_names
                raise ConfigError(unknown_message(key, known))
            agent_values[key] = value
    for key in agent_values:
        if key not in agent_names:
            raise ConfigError(f"{unknown_message(key, agent_names)} (agent {agent_name})")
    for key in env_values:
        if key not in env_names:
            raise ConfigError(f"{unknown_message(key, env_names)} ({family.name} settings)")
    return agent_values, env_values
