"""``toyppo``'s networks, loss and acting: the registry makes ``AGENT_CLASS(env_spec, config,
device, num_envs)``, an ``seedbed.agents.base.Agent``. Here PPO's, under a name of its own."""

from __future__ import annotations

from seedbed.agents.ppo.learning import PPOAgent


class ToyPPOAgent(PPOAgent):
    """PPO: a new agent would override ``learn``, ``act`` and the rest of the interface."""


AGENT_CLASS = ToyPPOAgent
