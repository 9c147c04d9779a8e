"""Torch modules the agents are built from: torsos, an LSTM core, policy and value heads.

Networks take time-major inputs ``[T, B, ...]`` so that the same module serves central inference
(T = 1) and learning on unrolls (T + 1 steps), and the recurrent state is carried batch-first,
one row per environment, so inference can index it by environment id.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from seedbed.envs import EnvSpec

State = tuple[torch.Tensor, ...]


class MLPTorso(nn.Module):
    """Flattened observation -> ReLU layers."""

    def __init__(self, obs_shape: tuple[int, ...], hidden_sizes: tuple[int, ...]) -> None:
        super().__init__()
        layers: list[nn.Module] = []
        width = math.prod(obs_shape)
        for size in hidden_sizes:
            layers += [nn.Linear(width, size), nn.ReLU()]
            width = size
        self.layers = nn.Sequential(*layers)
        self.out_size = width

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """[N, *obs_shape] in any dtype (uint8 frames are scaled to [0, 1]) -> [N, out_size]."""
        x = obs.flatten(1)
        x = x.float() / 255.0 if x.dtype == torch.uint8 else x.float()
        return self.layers(x)


class LSTMCore(nn.Module):
    """An LSTM over time that resets each environment's state where its episode starts."""

    def __init__(self, input_size: int, hidden_size: int) -> None:
        super().__init__()
        self.cell = nn.LSTMCell(input_size, hidden_size)
        self.hidden_size = hidden_size

    def initial_state(self, batch_size: int, device: torch.device | None = None) -> State:
        zeros = torch.zeros(batch_size, self.hidden_size, device=device)
        return (zeros, zeros.clone())

    def forward(
        self, x: torch.Tensor, done: torch.Tensor, state: State
    ) -> tuple[torch.Tensor, State]:
        """x [T, B, D], done [T, B] -> outputs [T, B, H] and the state after the last step."""
        h, c = state
        outputs = []
        for t in range(x.shape[0]):
            keep = (~done[t]).unsqueeze(-1).to(h.dtype)
            h, c = self.cell(x[t], (h * keep, c * keep))
            outputs.append(h)
        return torch.stack(outputs), (h, c)


class ActorCriticNet(nn.Module):
    """Torso, optional LSTM core (fed the previous action and reward), policy and value heads."""

    def __init__(
        self,
        torso: nn.Module,
        num_actions: int,
        lstm_size: int | None,
        value_torso: nn.Module | None = None,
    ) -> None:
        super().__init__()
        self.torso = torso
        # A separate value torso keeps large value-regression gradients out of the policy's
        # features; only feed-forward networks use one (a recurrent core is shared).
        self.value_torso = value_torso if lstm_size is None else None
        self.num_actions = num_actions
        core_in = torso.out_size
        self.core = None
        if lstm_size:
            self.core = LSTMCore(core_in + num_actions + 1, lstm_size)
            core_in = lstm_size
        self.policy = nn.Linear(core_in, num_actions)
        self.value = nn.Linear(core_in, 1)

    def initial_state(self, batch_size: int, device: torch.device | None = None) -> State:
        return () if self.core is None else self.core.initial_state(batch_size, device)

    def forward(
        self,
        obs: torch.Tensor,
        prev_action: torch.Tensor,
        reward: torch.Tensor,
        done: torch.Tensor,
        state: State,
    ) -> tuple[torch.Tensor, torch.Tensor, State]:
        """Inputs [T, B, ...] -> policy logits [T, B, A], values [T, B], next state."""
        steps, batch = obs.shape[:2]
        flat = obs.reshape(steps * batch, *obs.shape[2:])
        x = self.torso(flat).view(steps, batch, -1)
        if self.core is not None:
            # The previous action and reward belong to the last episode where a new one starts.
            keep = (~done).unsqueeze(-1).to(x.dtype)
            one_hot = F.one_hot(prev_action, self.num_actions).to(x.dtype) * keep
            clipped = reward.clamp(-1.0, 1.0).unsqueeze(-1).to(x.dtype) * keep
            x, state = self.core(torch.cat([x, one_hot, clipped], dim=-1), done, state)
        v = x if self.value_torso is None else self.value_torso(flat).view(steps, batch, -1)
        return self.policy(x), self.value(v).squeeze(-1), state


def make_actor_critic(
    env_spec: EnvSpec,
    hidden_sizes: tuple[int, ...],
    lstm_size: int | None,
    shared_torso: bool = True,
) -> ActorCriticNet:
    """The actor-critic network for ``env_spec``: an MLP torso for vector observations."""
    torso = MLPTorso(env_spec.obs_shape, hidden_sizes)
    value_torso = None if shared_torso else MLPTorso(env_spec.obs_shape, hidden_sizes)
    return ActorCriticNet(torso, env_spec.num_actions, lstm_size, value_torso)
