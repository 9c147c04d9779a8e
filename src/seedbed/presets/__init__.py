"""Defaults as data: the settings that differ per environment family and agent, in YAML files.

A run's settings come from four layers, later ones winning: the built-in defaults of the config
dataclasses, the preset, ``--config FILE.yaml``, and flags. The preset is two files of this
folder, for the env's row (its family's name, or ``classic``/``mujoco`` for Gymnasium's ids):

- ``ROW.yaml``: what every run of the row uses, whatever the agent, and the agent it uses when
  ``--agent`` is not given (e.g. ``atari.yaml``: its agent, target return and frame budget);
- ``ROW/AGENT.yaml``: what that agent changes for the row (e.g. ``atari/ppo.yaml``: its network,
  optimizer, layout and schedule). A missing file changes nothing.

Each file holds flat settings, as ``--config`` files do, and may start from another preset of
this folder with ``extends: ROW/AGENT`` (its own settings win), so rows whose tasks are alike
share one tuned file rather than copies of it. A user's env family may ship presets in
a folder of its own (``EnvFamily.presets``), asked before this one; a user's agent may ship
``presets/ROW.yaml`` files inside its package, asked after it. ``seedbed train --env E
--print-config`` shows where each setting of a run comes from.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import Any

from seedbed.config import load_yaml
from seedbed.errors import ConfigError

FOLDER = Path(__file__).parent


def row_preset(row: str, family_folder: Path | None = None) -> tuple[Path | None, dict[str, Any]]:
    """The file of settings every run of ``row`` uses, and its settings ({} where none)."""
    return _first([*_in(family_folder, f"{row}.yaml"), FOLDER / f"{row}.yaml"])


def agent_preset(
    row: str, agent: str, agent_package: str, family_folder: Path | None = None
) -> tuple[Path | None, dict[str, Any]]:
    """The file of settings ``agent`` changes for ``row``, and its settings ({} where none).

    Asked in order: the env family's own folder, seedbed's, then the agent package's
    ``presets/ROW.yaml`` (a user's agent).
    """
    candidates = [*_in(family_folder, f"{row}/{agent}.yaml"), FOLDER / row / f"{agent}.yaml"]
    spec = importlib.util.find_spec(agent_package)
    if spec is not None and spec.submodule_search_locations:
        candidates += [Path(p) / "presets" / f"{row}.yaml" for p in spec.submodule_search_locations]
    return _first(candidates)


def _in(folder: Path | None, name: str) -> list[Path]:
    return [] if folder is None else [Path(folder) / name]


def _first(candidates: list[Path]) -> tuple[Path | None, dict[str, Any]]:
    for path in candidates:
        if path.is_file():
            return path, load_preset(path)
    return None, {}


def load_preset(path: Path) -> dict[str, Any]:
    """A preset file's settings, over those of the preset it ``extends`` (one level: a base
    that extends another would hide where a value comes from)."""
    settings = load_yaml(path)
    base = settings.pop("extends", None)
    if base is None:
        return settings
    base_path = FOLDER / f"{base}.yaml"
    if not isinstance(base, str) or ".." in base or not base_path.is_file():
        raise ConfigError(
            f"preset {path}: extends: {base!r} names no preset; give ROW or ROW/AGENT of {FOLDER}"
        )
    base_settings = load_yaml(base_path)
    if "extends" in base_settings:
        raise ConfigError(f"preset {path}: extends {base}, which extends another; name that one")
    return base_settings | settings


def describe(path: Path | None) -> str:
    """How ``--print-config`` names a preset file: relative to its presets folder."""
    if path is None:
        return "built-in"
    try:
        return f"preset {path.relative_to(FOLDER)}"
    except ValueError:
        return f"preset {path}"
