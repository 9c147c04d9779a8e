"""``toyppo``'s settings: read to parse flags, so it must not import torch.

The registry reads ``CONFIG_CLASS`` (a dataclass of ``seedbed.config.setting`` fields, each a
flag) and, where present, ``ACTIONS`` ("discrete" and/or "continuous"). Here both are PPO's; what
the agent changes per env family lives in ``presets/ROW.yaml`` beside this file.
"""

from __future__ import annotations

import dataclasses

from seedbed.agents.ppo.config import ACTIONS, PPOConfig

__all__ = ["ACTIONS", "CONFIG_CLASS", "ToyPPOConfig"]


@dataclasses.dataclass
class ToyPPOConfig(PPOConfig):
    """PPO's settings, unchanged: a new agent would add fields of its own here."""


CONFIG_CLASS = ToyPPOConfig
