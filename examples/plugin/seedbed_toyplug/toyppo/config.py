"""``toyppo``'s settings: read to parse flags, so it must not import torch.

The registry reads ``CONFIG_CLASS`` (a dataclass of ``seedbed.config.setting`` fields, each a
flag) and, where present, ``ACTIONS`` ("discrete" and/or "continuous"), ``FAMILY_DEFAULTS`` and
``RUN_DEFAULTS`` (settings that differ per env family). Here all are PPO's.
"""

from __future__ import annotations

import dataclasses

from seedbed.agents.ppo.config import ACTIONS, FAMILY_DEFAULTS, RUN_DEFAULTS, PPOConfig

__all__ = ["ACTIONS", "CONFIG_CLASS", "FAMILY_DEFAULTS", "RUN_DEFAULTS", "ToyPPOConfig"]


@dataclasses.dataclass
class ToyPPOConfig(PPOConfig):
    """PPO's settings, unchanged: a new agent would add fields of its own here."""


CONFIG_CLASS = ToyPPOConfig
