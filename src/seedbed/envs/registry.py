"""The environment families seedbed knows, and which family an env id belongs to.

Adding a family is one module that defines an ``EnvFamily`` (see ``seedbed.envs.base``) and one
line in ``BUILTIN`` below. A user's family registers itself with ``register`` from its own
module, a plug-in that the run's ``plugins`` setting names, so that it is imported wherever the
env is made (learner and actors), as a ``module:EnvId`` module is. Families are asked in
registration order; plain Gymnasium ids, which no other family owns, are asked last.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from seedbed.config import TrainConfig, build
from seedbed.envs.atari import FAMILY as ATARI
from seedbed.envs.base import EnvFamily
from seedbed.envs.dmc import FAMILY as DMC
from seedbed.envs.dmlab import FAMILY as DMLAB
from seedbed.envs.football import FAMILY as FOOTBALL
from seedbed.envs.gym import FAMILY as GYM
from seedbed.envs.noop import FAMILY as NOOP
from seedbed.errors import ConfigError

BUILTIN: tuple[EnvFamily, ...] = (ATARI, DMC, FOOTBALL, DMLAB, NOOP)
FALLBACK: EnvFamily = GYM  # Gymnasium ids and users' module:EnvId

_FAMILIES: dict[str, EnvFamily] = {}


def register(family: EnvFamily) -> None:
    """Add ``family``; a one-line error when its name, prefix or settings clash with another's.

    Its settings' field names become flags (``--sticky-actions``) and YAML keys beside the run's
    and the agents', so they must be new names; its name becomes a YAML section (the config
    resolver refuses one that is an agent's name: envs know nothing of agents). Registering the
    same family object again does nothing.
    """
    if _FAMILIES.get(family.name) is family:
        return
    if not family.name or not dataclasses.is_dataclass(family.settings_class):
        raise ConfigError(f"{family!r}: a family needs a name and a settings dataclass")
    if family.name in _FAMILIES or family.name == FALLBACK.name:
        raise ConfigError(f"an environment family named '{family.name}' is registered already")
    run_names = {f.name for f in dataclasses.fields(TrainConfig)}
    if family.name in run_names:
        raise ConfigError(f"family name '{family.name}' is a run setting's name")
    for other in _FAMILIES.values():
        if family.prefix and family.prefix == other.prefix:
            raise ConfigError(f"prefix '{family.prefix}' belongs to family '{other.name}'")
    taken = run_names | set(settings_owners())
    clash = sorted(taken & {f.name for f in dataclasses.fields(family.settings_class)})
    if clash:
        raise ConfigError(f"family '{family.name}': settings {', '.join(clash)} exist already")
    _FAMILIES[family.name] = family


def unregister(name: str) -> None:
    """Remove the family ``name`` (tests register families of their own and clean up)."""
    _FAMILIES.pop(name, None)


def families() -> tuple[EnvFamily, ...]:
    """Every family, in the order ids are matched against them, the fallback last."""
    return (*_FAMILIES.values(), FALLBACK)


def family_for(env_id: str) -> EnvFamily:
    """The family that owns ``env_id``: the first registered that does, else Gymnasium's."""
    for family in _FAMILIES.values():
        if family.owns(env_id):
            return family
    return FALLBACK


def settings_owners() -> dict[str, EnvFamily]:
    """Each settings field name of every family (``sticky_actions``...), with its family."""
    return {
        f.name: family for family in families() for f in dataclasses.fields(family.settings_class)
    }


def make_settings(env_id: str, values: dict[str, Any] | None = None) -> Any:
    """The settings of ``env_id``'s family from plain values (a remote actor's assignment, a
    saved config), defaults for the rest; a one-line error on an unknown or invalid value."""
    settings = build(family_for(env_id).settings_class, dict(values or {}))
    if hasattr(settings, "validate"):
        settings.validate()
    return settings


for _family in BUILTIN:
    register(_family)
