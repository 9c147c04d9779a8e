"""The interface every agent implements, and the batches that flow through it.

The call loop, in the order the runtime uses it::

    agent = make_agent(name, env_spec, config, device)   # networks and optimizer
    net = agent.acting_network()                          # a copy that inference acts with
    state = agent.initial_state(num_envs)                 # per-env recurrent state
    out = agent.act(net, step, state_rows)                # central inference, no grad
    ...unrolls of T+1 steps are built from ``step`` and ``out``...
    metrics = agent.learn(batch)                          # one learner update
    copy_parameters(agent.network, net)                   # inference acts with the newest
    agent.state_dict() / agent.load_state_dict(...)       # checkpoints

An agent never sees a transport, a process or a queue, so the same object runs in one process, on
many actors, or replicated.
"""

from __future__ import annotations

import dataclasses
from typing import Any, Protocol

import torch

State = tuple[torch.Tensor, ...]  # recurrent state, each tensor [num_envs, ...]; () when none


@dataclasses.dataclass
class StepInput:
    """One step of a batch of environments, as central inference hands it to ``act``.

    ``done[i]`` says that ``obs[i]`` is the first observation of a new episode: ``reward[i]``
    then is the last reward of the episode that ended, and recurrent state must be reset.
    """

    obs: torch.Tensor  # [N, *obs_shape] in the env's dtype
    prev_action: torch.Tensor  # [N] int64, the action taken before obs
    reward: torch.Tensor  # [N] float32, the reward that arrived with obs
    done: torch.Tensor  # [N] bool
    env_ids: torch.Tensor  # [N] int64, which environments these rows are


@dataclasses.dataclass
class ActOutput:
    """What ``act`` returns: actions, extras recorded in the unroll, and the next state."""

    action: torch.Tensor  # [N] int64
    extras: dict[str, torch.Tensor]  # e.g. {"logits": [N, A]}, stored per step in unrolls
    state: State


@dataclasses.dataclass
class Unrolls:
    """B unrolls of T+1 steps each, time-major; step t+1 holds what followed step t's action.

    Consecutive unrolls of one environment share a step: the last step of one is the first of the
    next, so every transition is learned from once and the final value can bootstrap.
    """

    # obs, prev_action, reward, done, truncated, action and the agent's extras: [T+1, B, ...]
    steps: dict[str, torch.Tensor]
    initial_state: State  # recurrent state before step 0, each [B, ...]
    policy_version: torch.Tensor  # [B] int64, learner version that acted each unroll's first step

    @property
    def batch_size(self) -> int:
        return int(self.steps["action"].shape[1])

    def to(self, device: torch.device) -> Unrolls:
        return Unrolls(
            {k: v.to(device, non_blocking=True) for k, v in self.steps.items()},
            tuple(s.to(device, non_blocking=True) for s in self.initial_state),
            self.policy_version,
        )


class Agent(Protocol):
    """What inference and the learner call; see the module docstring for the order."""

    network: torch.nn.Module

    def acting_network(self) -> torch.nn.Module: ...

    def initial_state(self, batch_size: int) -> State: ...

    def act(self, net: torch.nn.Module, step: StepInput, state: State) -> ActOutput: ...

    def learn(self, batch: Unrolls) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@torch.no_grad()
def copy_parameters(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    """Copy ``src``'s parameters and buffers into ``dst`` in place (same architecture)."""
    for s, d in zip(src.parameters(), dst.parameters(), strict=True):
        d.copy_(s, non_blocking=True)
    for s, d in zip(src.buffers(), dst.buffers(), strict=True):
        d.copy_(s, non_blocking=True)
