"""Resolve a run's settings: the preset of the env's family and agent, then the layers a user
gave, over the built-in defaults, into one validated ``RunConfig``.

It sits above the three kinds of settings it merges: the run's (``seedbed.config``), the env
family's (``seedbed.envs``, e.g. ``atari: {sticky_actions: 0.0}``) and the agent's (its
``config.py``). One order of precedence, later layers winning: built-in defaults, the preset
(``seedbed.presets``: ``ROW.yaml``, then ``ROW/AGENT.yaml``), then the user's layers (a resumed
run's ``config.yaml``, ``--config``, flags). Each layer may hold the family's and the agent's
settings flat, as flags give them (``sticky_actions``, ``lr``), or nested under the family's or
agent's name, as the saved ``config.yaml`` does.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable
from typing import Any

import yaml

from seedbed.agents import AGENTS, check_agent, config_class  # no torch
from seedbed.config import RunConfig, TrainConfig, build, coerce, unknown_message
from seedbed.envs import EnvFamily, families, family_for, settings_owners
from seedbed.errors import ConfigError
from seedbed.loggers import check_loggers
from seedbed.plugins import import_plugins
from seedbed.presets import agent_preset, describe, row_preset

_TRAIN_NAMES = frozenset(f.name for f in dataclasses.fields(TrainConfig))

#: A layer of settings and where it came from (``flags``, ``--config FILE``, ``preset ...``).
Layer = tuple[str, dict[str, Any]]


def resolve(layers: list[dict[str, Any]]) -> RunConfig:
    """Merge setting layers (earlier ones lose) over the env's preset into a validated RunConfig.

    The modules the ``plugins`` setting names are imported first, so what they register is
    known.
    """
    return resolve_with_sources([(f"layer {i + 1}", layer) for i, layer in enumerate(layers)])[0]


def resolve_with_sources(layers: list[Layer]) -> tuple[RunConfig, dict[str, str]]:
    """``resolve`` for named layers, and where each setting's value came from.

    Returns:
        The config, and for each key of its ``to_dict()`` form (``lr`` nested as ``ppo.lr``,
        ``sticky_actions`` as ``atari.sticky_actions``) the name of the last layer that set it,
        a preset file's (``preset atari/ppo.yaml``) or ``built-in``.
    """
    given = _train_values(values for _, values in layers)
    if "plugins" in given:  # first: they may register the env's family, the agent...
        import_plugins(coerce("plugins", given["plugins"], tuple[str, ...]))
    family = family_for(str(given.get("env", TrainConfig.env)))
    env_id = family.canonical_id(str(given.get("env", TrainConfig.env)))  # ALE/Pong-v5: atari:Pong
    row = family.preset(env_id)
    row_file, row_values = row_preset(row, family.presets)
    agent_name = str(given.get("agent", row_values.get("agent", TrainConfig.agent)))
    check_agent(agent_name)
    agent_file, agent_values = agent_preset(row, agent_name, AGENTS[agent_name], family.presets)
    stack = [(describe(row_file), row_values), (describe(agent_file), agent_values), *layers]
    train_values = {**_train_values(values for _, values in stack), "env": env_id}
    agent_cls = config_class(agent_name)
    agent_section, env_section = _sections(
        (values for _, values in stack), agent_name, agent_cls, family
    )
    config = RunConfig(
        build(TrainConfig, train_values),
        build(agent_cls, agent_section),
        build(family.settings_class, env_section),
        family.name,
    )
    config.validate()
    check_loggers(config.train.loggers)
    return config, _sources(config, stack)


def _train_values(layers: Iterable[dict[str, Any]]) -> dict[str, Any]:
    merged: dict[str, Any] = {}
    for layer in layers:
        merged.update({k: v for k, v in layer.items() if k in _TRAIN_NAMES})
    return merged


def _sources(config: RunConfig, stack: list[Layer]) -> dict[str, str]:
    """Where each setting of ``config`` came from: the last layer of ``stack`` that set it."""
    sources = {}
    for key, value in config.to_dict().items():
        if isinstance(value, dict):  # the agent's or the family's section
            for name in value:
                sources[f"{key}.{name}"] = _origin(stack, name, key)
        else:
            sources[key] = _origin(stack, key, None)
    return sources


def _origin(stack: list[Layer], name: str, section: str | None) -> str:
    for origin, values in reversed(stack):
        nested = values.get(section) if section else None
        if name in values or (isinstance(nested, dict) and _has(nested, name)):
            return origin
    return "built-in"


def _has(section: dict[str, Any], name: str) -> bool:
    return any(k.replace("-", "_") == name for k in section)


def explain(config: RunConfig, sources: dict[str, str]) -> str:
    """The resolved settings as a YAML config file (usable as ``--config``), each line with a
    comment naming where its value came from."""
    lines = []
    for key, value in config.to_dict().items():
        if isinstance(value, dict):
            lines.append(f"{key}:")
            for name, inner in value.items():
                lines.append(f"  {name}: {_scalar(inner)}  # {sources[f'{key}.{name}']}")
        else:
            lines.append(f"{key}: {_scalar(value)}  # {sources[key]}")
    return "\n".join(lines)


def _scalar(value: Any) -> str:
    """``value`` as one line of YAML (lists in flow style)."""
    text = yaml.safe_dump(value, default_flow_style=True, width=1_000_000)
    return text.strip().removesuffix("...").strip()


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
