"""The env family ``toyplug``: ids ``toyplug:GYM_ID`` are Gymnasium's ``GYM_ID`` with rewards
multiplied by the family's one setting, ``reward_scale`` (``--reward-scale``, or ``toyplug:
{reward_scale: ...}`` in a config file)."""

from __future__ import annotations

import dataclasses
import difflib
from pathlib import Path
from typing import Any

import gymnasium as gym

from seedbed.config import setting
from seedbed.envs import EnvFamily
from seedbed.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ToyplugSettings:
    """The family's settings: each field is a flag, and a key of its config section."""

    reward_scale: float = setting(1.0, "multiply every reward of toyplug: envs by this")

    def validate(self) -> None:
        if self.reward_scale <= 0:
            raise ConfigError(f"--reward-scale must be positive, got {self.reward_scale}")


class ToyplugFamily(EnvFamily):
    """``toyplug:CartPole-v1`` and the like: any Gymnasium id, behind a prefix of our own."""

    name = "toyplug"
    prefix = "toyplug:"
    settings_class = ToyplugSettings
    presets = Path(__file__).parent / "presets"  # toyplug.yaml: the settings its envs differ in

    def check(self, env_id: str) -> None:
        inner = env_id.removeprefix(self.prefix)
        if inner not in gym.registry:
            close = difflib.get_close_matches(inner, list(gym.registry), n=3, cutoff=0.5)
            hint = f"; did you mean {', '.join(self.prefix + c for c in close)}?" if close else ""
            raise ConfigError(f"unknown environment '{env_id}'{hint}")

    def make(self, env_id: str, settings: Any, render_mode: str | None = None) -> gym.Env:
        kwargs = {"render_mode": render_mode} if render_mode else {}
        env = gym.make(env_id.removeprefix(self.prefix), **kwargs)
        scale = settings.reward_scale
        return env if scale == 1.0 else gym.wrappers.TransformReward(env, lambda r: r * scale)

    def spec_extra(self, env_id: str, settings: Any) -> dict[str, Any]:
        return {"protocol": f"rewards x {settings.reward_scale:g}"}


FAMILY = ToyplugFamily()
