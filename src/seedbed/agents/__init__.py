"""Agents by name. Each agent is a package with the same files: config, networks, learning.

Only the config module is imported to parse settings, so that reading ``--help`` or starting an
actor never imports torch.
"""

from __future__ import annotations

import importlib
from typing import Any

from seedbed.errors import ConfigError

AGENTS = ("vtrace", "ppo", "dqn", "r2d2", "d4pg")


def check_agent(name: str) -> None:
    """Raise a one-line ConfigError when ``name`` is not a registered agent."""
    if name not in AGENTS:
        raise ConfigError(f"unknown agent '{name}'; choose one of {', '.join(AGENTS)}")


def config_class(name: str) -> type:
    """The settings dataclass of agent ``name``."""
    check_agent(name)
    return importlib.import_module(f"seedbed.agents.{name}.config").CONFIG_CLASS


def family_defaults(name: str, family: str) -> dict[str, Any]:
    """Agent ``name``'s settings that differ from its defaults for an environment family."""
    return _family_table(name, "FAMILY_DEFAULTS", family)


def run_defaults(name: str, family: str) -> dict[str, Any]:
    """Run settings (batch, unroll, ...) whose defaults agent ``name`` changes for a family:
    a batch counts unrolls for V-trace but transitions for DQN, so their best sizes differ."""
    return _family_table(name, "RUN_DEFAULTS", family)


def action_kinds(name: str) -> tuple[str, ...]:
    """The actions agent ``name`` can act with, 'discrete' (the default) and/or 'continuous', as
    its config module's ``ACTIONS`` says."""
    check_agent(name)
    kinds = getattr(importlib.import_module(f"seedbed.agents.{name}.config"), "ACTIONS", "discrete")
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


def _family_table(name: str, table: str, family: str) -> dict[str, Any]:
    check_agent(name)
    module = importlib.import_module(f"seedbed.agents.{name}.config")
    return getattr(module, table, {}).get(family, {})


def make_agent(
    name: str, env_spec: Any, config: Any, device: Any, num_envs: int | None = None
) -> Any:
    """Build agent ``name`` (its networks and optimizer) for ``env_spec`` on ``device``.

    ``num_envs`` is how many environments central inference acts for (agents that explore
    per environment need it); None builds an agent for evaluation, which acts greedily where
    the agent's policy is not itself stochastic.
    """
    check_actions(name, env_spec)
    module = importlib.import_module(f"seedbed.agents.{name}.learning")
    return module.AGENT_CLASS(env_spec, config, device, num_envs)
