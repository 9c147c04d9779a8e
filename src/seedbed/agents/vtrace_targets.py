"""V-trace off-policy value targets and policy-gradient advantages (IMPALA).

Implements eq. 1 of Espeholt et al. 2018, "IMPALA: Scalable Distributed Deep-RL with Importance
Weighted Actor-Learner Architectures", together with the advantage used in its policy-gradient
loss. Tensors are time-major: ``[T, B]`` for a batch of ``B`` trajectories of ``T`` steps.
"""

from __future__ import annotations

import dataclasses

import torch


@dataclasses.dataclass(frozen=True)
class VTraceReturns:
    """Outputs of V-trace; neither carries gradient.

    Attributes:
        vs: ``[T, B]`` v-trace value targets ``v_s``.
        pg_advantages: ``[T, B]`` ``min(pg_rho_bar, rho_s) * (r_s + gamma_s * v_{s+1} - V(x_s))``.
    """

    vs: torch.Tensor
    pg_advantages: torch.Tensor


def _check_shape(name: str, tensor: torch.Tensor, shape: tuple[int, ...]) -> None:
    if tuple(tensor.shape) != shape:
        dims = ", ".join("T" if i == 0 else "B" if i == 1 else "A" for i in range(len(shape)))
        raise ValueError(f"{name} must be [{dims}] = {list(shape)}, got {list(tensor.shape)}")


def _clip(rhos: torch.Tensor, threshold: float | None) -> torch.Tensor:
    return rhos if threshold is None else torch.clamp(rhos, max=threshold)


def vtrace_from_importance_weights(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    clip_rho_threshold: float | None = 1.0,
    clip_pg_rho_threshold: float | None = 1.0,
    clip_c_threshold: float | None = 1.0,
    lambda_: float = 1.0,
) -> VTraceReturns:
    """Computes V-trace targets from log importance weights.

    Args:
        log_rhos: ``[T, B]`` ``log(pi(a_t|x_t) / mu(a_t|x_t))``, target over behaviour policy.
        discounts: ``[T, B]`` ``gamma_t``, the discount from step t to t+1; 0 where the episode
            ended after step t.
        rewards: ``[T, B]`` rewards ``r_t``.
        values: ``[T, B]`` value estimates ``V(x_t)``.
        bootstrap_value: ``[B]`` value estimate ``V(x_T)`` of the state after the last step.
        clip_rho_threshold: ``rho_bar`` clipping the rhos in the temporal differences; None
            disables clipping.
        clip_pg_rho_threshold: ``rho_bar`` clipping the rhos of the policy-gradient advantage;
            None disables clipping.
        clip_c_threshold: ``c_bar`` clipping the trace coefficients; None disables clipping.
        lambda_: Mixing parameter; the trace coefficients are ``lambda_ * min(c_bar, rho_i)``.

    Returns:
        The value targets and policy-gradient advantages, both ``[T, B]`` and without gradient.

    Raises:
        ValueError: If the inputs do not have the shapes above.
    """
    _check_inputs(log_rhos, discounts, rewards, values, bootstrap_value)
    # Targets are regression labels and advantage weights: gradient must not flow through them.
    with torch.no_grad():
        rhos = torch.exp(log_rhos)
        clipped_rhos = _clip(rhos, clip_rho_threshold)
        cs = lambda_ * _clip(rhos, clip_c_threshold)
        next_values = torch.cat([values[1:], bootstrap_value.unsqueeze(0)], dim=0)
        deltas = clipped_rhos * (rewards + discounts * next_values - values)

        # Backward recursion: vs_t - V(x_t) = delta_t + gamma_t c_t (vs_{t+1} - V(x_{t+1})).
        vs_minus_values = torch.empty_like(deltas)
        acc = torch.zeros_like(deltas[0])
        for t in reversed(range(len(deltas))):
            acc = deltas[t] + discounts[t] * cs[t] * acc
            vs_minus_values[t] = acc
        vs = vs_minus_values + values

        next_vs = torch.cat([vs[1:], bootstrap_value.unsqueeze(0)], dim=0)
        pg_rhos = _clip(rhos, clip_pg_rho_threshold)
        pg_advantages = pg_rhos * (rewards + discounts * next_vs - values)
    return VTraceReturns(vs=vs, pg_advantages=pg_advantages)


def _check_inputs(
    log_rhos: torch.Tensor,
    discounts: torch.Tensor,
    rewards: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
) -> None:
    """Raise ValueError unless the step tensors are all ``[T, B]`` and the bootstrap ``[B]``."""
    if log_rhos.dim() != 2:
        raise ValueError(f"log_rhos must be [T, B], got {list(log_rhos.shape)}")
    steps, batch = log_rhos.shape
    for name, tensor in (("discounts", discounts), ("rewards", rewards), ("values", values)):
        _check_shape(name, tensor, (steps, batch))
    if tuple(bootstrap_value.shape) != (batch,):
        raise ValueError(
            f"bootstrap_value must be [B] = [{batch}], got {list(bootstrap_value.shape)}"
        )
