"""Categorical value distributions (Bellemare et al. 2017), as D4PG's critic learns them.

A distribution is a probability vector over K fixed, evenly spaced atoms z_0 < ... < z_{K-1}
spanning [v_min, v_max]. Pure functions; ``tests/agents/test_d4pg.py`` checks them against plain
loops over the paper's Algorithm 1.
"""

from __future__ import annotations

import torch

from seedbed.agents.q_targets import n_step_return_and_discount


def atoms(v_min: float, v_max: float, num_atoms: int, device: torch.device | None = None):
    """The support: ``num_atoms`` evenly spaced values from ``v_min`` to ``v_max``."""
    return torch.linspace(v_min, v_max, num_atoms, device=device)


def categorical_projection(
    values: torch.Tensor, probs: torch.Tensor, support: torch.Tensor
) -> torch.Tensor:
    """Project the distribution with mass ``probs[b, j]`` at ``values[b, j]`` onto ``support``.

    Each value is clipped to [z_0, z_{K-1}] and its mass split between the two atoms around it,
    in proportion to closeness (all of it to one atom when it falls on that atom). That is
    Algorithm 1 of Bellemare et al. (2017), written as a hat function: atom i receives
    sum_j clamp(1 - |clip(values_j) - z_i| / dz, 0, 1) probs_j, which needs no scatter and treats
    values that land exactly on an atom without the floor == ceil special case.

    Args:
        values: [B, J] where each source atom lands, e.g. r + gamma * z for n-step targets.
        probs: [B, J] the source probabilities.
        support: [K] the target atoms, evenly spaced.

    Returns:
        [B, K] probabilities on ``support``; each row sums to its row of ``probs``.
    """
    spacing = support[1] - support[0]
    clipped = values.clamp(support[0], support[-1])
    distance = (clipped.unsqueeze(-1) - support).abs() / spacing  # [B, J, K]
    weights = (1.0 - distance).clamp(min=0.0)
    return torch.einsum("bjk,bj->bk", weights, probs)


def expected_value(logits: torch.Tensor, support: torch.Tensor) -> torch.Tensor:
    """The mean of the distributions given by ``logits`` [..., K] over ``support``."""
    return (torch.softmax(logits, -1) * support).sum(-1)


def n_step_distribution(
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    next_probs: torch.Tensor,
    support: torch.Tensor,
) -> torch.Tensor:
    """The n-step target distribution of windows of n transitions, projected onto ``support``.

    Each of the B windows has rewards and discounts [n, B] (discount 0 where an episode ended)
    and the distribution ``next_probs`` [B, K] at the state after its last transition. Its
    return is R + D Z with R the discounted reward sum and D the discount product up to the
    first episode end, so every atom z_k moves to R + D z_k (all to R after an end) and is
    projected back onto the atoms (D4PG, Barth-Maron et al. 2018, eq. 7).
    """
    returns, scales = n_step_return_and_discount(rewards, discounts, rewards.shape[0])
    shifted = returns[0].unsqueeze(-1) + scales[0].unsqueeze(-1) * support
    return categorical_projection(shifted, next_probs, support)
