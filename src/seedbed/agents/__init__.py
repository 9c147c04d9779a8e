"""Agents by name. Each agent is a package with the same files: ``config`` (its settings, no
torch) and ``learning`` (its ``AGENT_CLASS``; networks live there or beside it).

Only the config module is imported to parse settings, so that reading ``--help`` or starting an
actor never imports torch. Seedbed's own agents are packages of this one; a user's agent is a
package of the user's, added with ``register`` by a plug-in module (see ``seedbed.plugins``).
"""

from __future__ import annotations

import dataclasses
import importlib
from typing import Any

from seedbed.config import TrainConfig
from seedbed.errors import ConfigError

BUILTIN = ("vtrace", "ppo", "dqn", "r2d2", "d4pg")
#: name -> the package holding its ``config`` module (``CONFIG_CLASS``, and optionally
#: ``ACTIONS``) and its ``learning`` module (``AGENT_CLASS``); what it changes per env family
#: lives in preset files (``seedbed.presets``). Iterating gives the names, seedbed's own first.
AGENTS: dict[str, str] = {name: f"seedbed.agents.{name}" for name in BUILTIN}


def register(name: str, package: str) -> None:
    """Add agent ``name``, whose code is the package ``package`` (e.g. ``my_rl.agents.a2c``).

    Its ``config`` module is imported now (it must not import torch) to check it; ``learning``
    only when an agent is made. Registering the same package under its name again does nothing.

    Raises:
        ConfigError: One line, when the name is taken by another agent, an env family or a run
            setting, or the package's config module is missing or lacks a ``CONFIG_CLASS``
            dataclass whose settings have names of their own.
    """
    if AGENTS.get(name) == package:
        return
    if not name.isidentifier():
        raise ConfigError(f"agent name {name!r} must be a Python identifier (e.g. my_ppo)")
    if name in AGENTS:
        raise ConfigError(f"an agent named '{name}' is registered already ({AGENTS[name]})")
    _check_free(name, "agent name")
    settings = _config_module(name, package).CONFIG_CLASS
    clash = sorted(_run_names() & {f.name for f in dataclasses.fields(settings)})
    if clash:
        raise ConfigError(f"agent '{name}': settings {', '.join(clash)} are run settings' names")
    AGENTS[name] = package


def unregister(name: str) -> None:
    """Remove the agent ``name`` that ``register`` added (tests add agents and clean up)."""
    if name in BUILTIN:
        raise ConfigError(f"agent '{name}' is one of seedbed's own; it cannot be unregistered")
    AGENTS.pop(name, None)


def _run_names() -> set[str]:
    return {f.name for f in dataclasses.fields(TrainConfig)}


def _check_free(name: str, what: str) -> None:
    """A one-line error when ``name`` is a run setting's or an env family's (config sections)."""
    from seedbed.envs import families

    if name in _run_names():
        raise ConfigError(f"{what} '{name}' is a run setting's name")
    if name in {family.name for family in families()}:
        raise ConfigError(f"{what} '{name}' is an environment family's name")


def _config_module(name: str, package: str) -> Any:
    """``package``'s config module, checked: it must define a ``CONFIG_CLASS`` dataclass."""
    try:
        module = importlib.import_module(f"{package}.config")
    except ImportError as error:
        raise ConfigError(
            f"agent '{name}': cannot import {package}.config ({error}); an agent is a package "
            "with config and learning modules, on PYTHONPATH"
        ) from None
    if not dataclasses.is_dataclass(getattr(module, "CONFIG_CLASS", None)):
        raise ConfigError(f"agent '{name}': {package}.config defines no CONFIG_CLASS dataclass")
    return module


def check_agent(name: str) -> None:
    """Raise a one-line ConfigError when ``name`` is not a registered agent."""
    if not isinstance(name, str) or name not in AGENTS:  # a YAML list or mapping, too
        raise ConfigError(f"unknown agent {name!r}; choose one of {', '.join(AGENTS)}")


def config_class(name: str) -> type:
    """The settings dataclass of agent ``name``."""
    check_agent(name)
    return importlib.import_module(f"{AGENTS[name]}.config").CONFIG_CLASS


def action_kinds(name: str) -> tuple[str, ...]:
    """The actions agent ``name`` can act with, 'discrete' (the default) and/or 'continuous', as
    its config module's ``ACTIONS`` says."""
    check_agent(name)
    kinds = getattr(importlib.import_module(f"{AGENTS[name]}.config"), "ACTIONS", "discrete")
    return (kinds,) if isinstance(kinds, str) else tuple(kinds)


def check_actions(name: str, env_spec: Any) -> None:
    """A one-line ConfigError when agent ``name`` cannot act in ``env_spec``'s action space."""
    kinds = action_kinds(name)
    if env_spec.action_kind in kinds:
        return
    needed = " or ".join(kinds)
    fits = [a for a in AGENTS if env_spec.action_kind in action_kinds(a)]
    choices = " or ".join(filter(None, [", ".join(fits[:-1]), fits[-1]]))
    raise ConfigError(
        f"--agent {name} needs {needed} actions, but {env_spec.env_id} has "
        f"{env_spec.action_kind} ones; use --agent {choices}"
    )


def make_agent(
    name: str, env_spec: Any, config: Any, device: Any, num_envs: int | None = None
) -> Any:
    """Build agent ``name`` (its networks and optimizer) for ``env_spec`` on ``device``.

    ``num_envs`` is how many environments central inference acts for (agents that explore
    per environment need it); None builds an agent for evaluation, which acts greedily where
    the agent's policy is not itself stochastic.
    """
    check_actions(name, env_spec)
    module = importlib.import_module(f"{AGENTS[name]}.learning")
    return module.AGENT_CLASS(env_spec, config, device, num_envs)
