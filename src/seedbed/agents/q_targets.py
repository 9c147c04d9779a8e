"""The arithmetic of Q-learning from replay: value rescaling, n-step double-Q targets (and their
return and discount apart, for distributional critics), sequence priorities and per-env
exploration. Pure functions on time-major tensors; ``tests/agents/test_q_targets.py``
checks them against plain loops over the papers' equations.
"""

from __future__ import annotations

import torch


def value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h(x) = sign(x) (sqrt(|x| + 1) - 1) + eps x (Pohlen et al. 2018), which squashes large
    returns so one network and learning rate serve games with very different score scales."""
    return torch.sign(x) * (torch.sqrt(x.abs() + 1.0) - 1.0) + eps * x


def inverse_value_rescale(x: torch.Tensor, eps: float = 1e-3) -> torch.Tensor:
    """h^-1(x) = sign(x) (((sqrt(1 + 4 eps (|x| + 1 + eps)) - 1) / (2 eps))^2 - 1)."""
    root = (torch.sqrt(1.0 + 4.0 * eps * (x.abs() + 1.0 + eps)) - 1.0) / (2.0 * eps)
    return torch.sign(x) * (root.square() - 1.0)


def n_step_targets(
    rewards: torch.Tensor, discounts: torch.Tensor, bootstrap: torch.Tensor, n: int
) -> torch.Tensor:
    """n-step returns of the T transitions of a sequence, each [T, B].

    Transition t has reward ``rewards[t]``, discount ``discounts[t]`` (0 where the episode ended
    with it) and ``bootstrap[t]``, the value of the state it led to. Its target is

        G_t = sum_{k<m} (prod_{j<k} d_{t+j}) r_{t+k} + (prod_{j<m} d_{t+j}) bootstrap_{t+m-1}

    with m = min(n, T - t): near the sequence's end the window shrinks to what is there.
    """
    steps = rewards.shape[0]
    t = torch.arange(steps, device=rewards.device).view(-1, *([1] * (rewards.dim() - 1)))
    pad = (0, 0) * (rewards.dim() - 1) + (0, n)  # n zero steps after the end

    def ahead(x: torch.Tensor, k: int) -> torch.Tensor:  # x[t + k], zero past the end
        return torch.nn.functional.pad(x, pad)[k : k + steps]

    targets = torch.zeros_like(rewards)
    scale = torch.ones_like(rewards)  # prod_{j<k} d_{t+j}
    for k in range(n):  # n is a handful of steps; each is vectorized over t and the batch
        inside = (t + k < steps).to(rewards.dtype)
        last = inside * ((t + k == steps - 1) | (k == n - 1)).to(rewards.dtype)
        targets = targets + inside * scale * ahead(rewards, k)
        scale = scale * ahead(discounts, k)
        targets = targets + last * scale * ahead(bootstrap, k)
    return targets


def sequence_priorities(td: torch.Tensor, eta: float) -> torch.Tensor:
    """R2D2's priority of each sequence from its TD errors [T, B]: eta * max + (1 - eta) * mean
    of |TD| over time (a single transition's is its |TD|)."""
    magnitude = td.abs()
    return eta * magnitude.max(0).values + (1.0 - eta) * magnitude.mean(0)


def n_step_return_and_discount(
    rewards: torch.Tensor, discounts: torch.Tensor, n: int
) -> tuple[torch.Tensor, torch.Tensor]:
    """For each transition t of [T, B] rewards and discounts, its n-step reward sum R_t and the
    discount D_t its bootstrap gets, so that ``n_step_targets`` = R_t + D_t * bootstrap.

    Distributional agents need the two apart: they shift and scale a whole value distribution,
    R_t + D_t * z, rather than add one bootstrap value.
    """
    zeros, ones = torch.zeros_like(rewards), torch.ones_like(rewards)
    return n_step_targets(rewards, discounts, zeros, n), n_step_targets(zeros, discounts, ones, n)


def geometric_spread(num_envs: int, first: float, last: float) -> torch.Tensor:
    """``num_envs`` values from ``first`` to ``last`` in equal ratios (one value: ``first``):
    per-env exploration, so a few envs explore hard and most act near the policy."""
    spread = torch.arange(num_envs, dtype=torch.float64) / max(num_envs - 1, 1)
    first_, last_ = (
        torch.tensor(first, dtype=torch.float64),
        torch.tensor(last, dtype=torch.float64),
    )
    return (first_ ** (1.0 - spread) * last_**spread).float()  # well defined at 0, unlike a ratio


def exploration_epsilons(num_envs: int, base: float = 0.4, alpha: float = 7.0) -> torch.Tensor:
    """Ape-X's and R2D2's per-env epsilons: eps_i = base^(1 + alpha * i / (N - 1))."""
    return geometric_spread(num_envs, base, base ** (1.0 + alpha))
