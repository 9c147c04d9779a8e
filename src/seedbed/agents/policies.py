"""The action distributions that policy-gradient agents sample from and score actions with.

A network's policy head gives each step's distribution parameters (``ActorCriticNet``): logits
for a categorical policy over discrete actions, a mean and a log standard deviation per action
dimension for a diagonal Gaussian over continuous ones. A policy object turns them into actions
and the extras an unroll records (``sample``), reads back the acting policy's parameters from an
unroll (``behaviour``) and scores what was done (``log_prob``, ``entropy``).

A Gaussian samples an unbounded ``u``; the environment gets ``u`` clipped to the action bounds
or squashed into them by ``tanh``, and the unroll records ``u`` itself. Log-probabilities and
entropies are the Gaussian's, of ``u``: the squash's Jacobian is the same under the acting and the
learning policy, so it cancels from their ratio, and the entropy bonus needs no estimate.
"""

from __future__ import annotations

import math
from typing import Literal, Protocol

import torch
from torch.nn import functional as F

from seedbed.errors import ConfigError
from seedbed.types import EnvSpec

Squash = Literal["clip", "tanh"]


class Policy(Protocol):
    """What an agent needs of its action distribution; see the module docstring."""

    def sample(self, params: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]: ...

    def behaviour(self, steps: dict[str, torch.Tensor]) -> torch.Tensor: ...

    def log_prob(self, params: torch.Tensor, steps: dict[str, torch.Tensor]) -> torch.Tensor: ...

    def entropy(self, params: torch.Tensor) -> torch.Tensor: ...


class CategoricalPolicy:
    """A softmax over the logits; unrolls record the acting logits as ``logits``."""

    def sample(self, params: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """One action per row of logits ``[N, A]`` (Gumbel-max: one kernel, no softmax)."""
        gumbel = -torch.empty_like(params).exponential_().log()
        return (params + gumbel).argmax(-1), {"logits": params}

    def behaviour(self, steps: dict[str, torch.Tensor]) -> torch.Tensor:
        return steps["logits"]

    def log_prob(self, params: torch.Tensor, steps: dict[str, torch.Tensor]) -> torch.Tensor:
        """``log pi(a_t)`` of the actions taken, ``[T, B]``, under logits ``[T, B, A]``."""
        actions = steps["action"][: len(params)]
        return F.log_softmax(params, dim=-1).gather(-1, actions[..., None]).squeeze(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        log_policy = F.log_softmax(params, dim=-1)
        return -(log_policy.exp() * log_policy).sum(-1)


class GaussianPolicy:
    """A diagonal Gaussian; params ``[..., 2A]`` are the mean and log-std of A dimensions.

    Unrolls record the acting parameters as ``gaussian`` and the unbounded sample as ``sample``.
    """

    def __init__(self, spec: EnvSpec, squash: Squash) -> None:
        self.shape = tuple(spec.action_shape)
        self.low = torch.tensor(spec.action_low, dtype=torch.float32)
        self.high = torch.tensor(spec.action_high, dtype=torch.float32)
        if squash == "tanh" and not (self.low.isfinite().all() and self.high.isfinite().all()):
            raise ConfigError(
                f"--action-squash tanh needs bounded actions, but {spec.env_id}'s reach "
                f"[{spec.action_low}, {spec.action_high}]; use --action-squash clip"
            )
        self.squash = squash

    def sample(self, params: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        """Actions ``[N, *action_shape]`` within the bounds, for params ``[N, 2A]``."""
        mean, log_std = params.chunk(2, dim=-1)
        u = mean + log_std.exp() * torch.randn_like(mean)
        low, high = self.low.to(u.device), self.high.to(u.device)
        if self.squash == "tanh":
            action = low + (torch.tanh(u) + 1.0) * 0.5 * (high - low)
        else:
            action = torch.maximum(torch.minimum(u, high), low)
        return action.reshape(len(u), *self.shape), {"gaussian": params, "sample": u}

    def behaviour(self, steps: dict[str, torch.Tensor]) -> torch.Tensor:
        return steps["gaussian"]

    def log_prob(self, params: torch.Tensor, steps: dict[str, torch.Tensor]) -> torch.Tensor:
        """``log N(u_t; mean, std)`` of the samples taken, summed over dimensions, ``[T, B]``."""
        mean, log_std = params.chunk(2, dim=-1)
        u = steps["sample"][: len(params)]
        z = (u - mean) * torch.exp(-log_std)
        return (-0.5 * z.pow(2) - log_std - 0.5 * math.log(2 * math.pi)).sum(-1)

    def entropy(self, params: torch.Tensor) -> torch.Tensor:
        log_std = params.chunk(2, dim=-1)[1]
        return (log_std + 0.5 * math.log(2 * math.pi * math.e)).sum(-1)


def make_policy(spec: EnvSpec, squash: Squash = "clip") -> Policy:
    """The distribution for ``spec``'s actions: categorical if discrete, else Gaussian."""
    return GaussianPolicy(spec, squash) if spec.continuous else CategoricalPolicy()
