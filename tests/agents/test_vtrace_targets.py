"""Tests V-trace against the paper's explicit-sum definition, computed with plain Python floats."""

from __future__ import annotations

import math

import pytest
import torch

from seedbed.agents.vtrace_targets import VTraceReturns, vtrace_from_importance_weights

T, B = 7, 5
TOLERANCE = {torch.float64: 1e-5, torch.float32: 1e-4}

# (rho_bar, pg_rho_bar, c_bar, lambda): IMPALA defaults, no clipping, mixed thresholds, lambda < 1.
THRESHOLDS = [
    (1.0, 1.0, 1.0, 1.0),
    (None, None, None, 1.0),
    (2.0, 0.5, 1.5, 1.0),
    (1.0, 1.0, 1.0, 0.9),
    (1.5, None, 0.8, 0.5),
    (1.0, 1.0, 1.0, 0.0),
]


def _min(threshold: float | None, rho: float) -> float:
    return rho if threshold is None else min(threshold, rho)


def reference_vtrace(
    log_rhos, discounts, rewards, values, bootstrap, rho_bar, pg_rho_bar, c_bar, lam
) -> tuple[list[list[float]], list[list[float]]]:
    """v_s = V(x_s) + sum_{t=s}^{T-1} (prod_{i=s}^{t-1} gamma_i c_i) delta_t, written as the sum."""
    log_rhos, discounts, rewards = log_rhos.tolist(), discounts.tolist(), rewards.tolist()
    values, bootstrap = values.tolist(), bootstrap.tolist()
    steps, batch = len(values), len(bootstrap)
    vs = [[0.0] * batch for _ in range(steps)]
    pg = [[0.0] * batch for _ in range(steps)]
    for b in range(batch):
        value = [values[t][b] for t in range(steps)] + [bootstrap[b]]
        rho = [math.exp(log_rhos[t][b]) for t in range(steps)]
        gamma = [discounts[t][b] for t in range(steps)]
        delta = [
            _min(rho_bar, rho[t]) * (rewards[t][b] + gamma[t] * value[t + 1] - value[t])
            for t in range(steps)
        ]
        for s in range(steps):
            total = value[s]
            for t in range(s, steps):
                coefficient = 1.0
                for i in range(s, t):
                    coefficient *= gamma[i] * lam * _min(c_bar, rho[i])
                total += coefficient * delta[t]
            vs[s][b] = total
        for s in range(steps):
            next_v = vs[s + 1][b] if s + 1 < steps else bootstrap[b]
            advantage = rewards[s][b] + gamma[s] * next_v - value[s]
            pg[s][b] = _min(pg_rho_bar, rho[s]) * advantage
    return vs, pg


def _inputs(seed: int, dtype: torch.dtype) -> dict[str, torch.Tensor]:
    gen = torch.Generator().manual_seed(seed)
    # Scale 1.5 makes rhos range from ~0.01 to ~100, so every threshold above clips something.
    log_rhos = 1.5 * torch.randn(T, B, generator=gen, dtype=torch.float64)
    not_done = (torch.rand(T, B, generator=gen, dtype=torch.float64) > 0.25).double()
    return {
        "log_rhos": log_rhos.to(dtype),
        "discounts": (0.9 * not_done).to(dtype),
        "rewards": torch.randn(T, B, generator=gen, dtype=torch.float64).to(dtype),
        "values": torch.randn(T, B, generator=gen, dtype=torch.float64).to(dtype),
        "bootstrap_value": torch.randn(B, generator=gen, dtype=torch.float64).to(dtype),
    }


def _assert_close(actual: torch.Tensor, expected, dtype: torch.dtype) -> None:
    expected = torch.tensor(expected, dtype=torch.float64)
    tol = TOLERANCE[dtype]
    torch.testing.assert_close(actual.double(), expected, rtol=tol, atol=tol)


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(("rho_bar", "pg_rho_bar", "c_bar", "lam"), THRESHOLDS)
def test_matches_explicit_sum_reference(seed, dtype, rho_bar, pg_rho_bar, c_bar, lam):
    inputs = _inputs(seed, dtype)
    rhos = inputs["log_rhos"].exp()
    # Guard the test's power: episode ends and active clipping must both be exercised.
    assert (inputs["discounts"] == 0).any() and (inputs["discounts"] > 0).any()
    for threshold in (rho_bar, pg_rho_bar, c_bar):
        if threshold is not None:
            assert (rhos > threshold).any() and (rhos < threshold).any()

    out = vtrace_from_importance_weights(
        **inputs,
        clip_rho_threshold=rho_bar,
        clip_pg_rho_threshold=pg_rho_bar,
        clip_c_threshold=c_bar,
        lambda_=lam,
    )
    vs, pg = reference_vtrace(*inputs.values(), rho_bar, pg_rho_bar, c_bar, lam)
    assert isinstance(out, VTraceReturns)
    assert out.vs.shape == (T, B) and out.pg_advantages.shape == (T, B)
    assert out.vs.dtype == dtype and out.pg_advantages.dtype == dtype
    _assert_close(out.vs, vs, dtype)
    _assert_close(out.pg_advantages, pg, dtype)


@pytest.mark.parametrize("seed", [0, 1])
def test_on_policy_is_n_step_return(seed):
    inputs = _inputs(seed, torch.float64)
    inputs["log_rhos"] = torch.zeros(T, B, dtype=torch.float64)
    out = vtrace_from_importance_weights(**inputs, lambda_=1.0)

    gamma, reward = inputs["discounts"].tolist(), inputs["rewards"].tolist()
    value, bootstrap = inputs["values"].tolist(), inputs["bootstrap_value"].tolist()
    expected_vs = [[0.0] * B for _ in range(T)]
    expected_pg = [[0.0] * B for _ in range(T)]
    for b in range(B):
        for s in range(T):
            total, discount = 0.0, 1.0
            for t in range(s, T):
                total += discount * reward[t][b]
                discount *= gamma[t][b]
            expected_vs[s][b] = total + discount * bootstrap[b]
        for s in range(T):
            next_v = expected_vs[s + 1][b] if s + 1 < T else bootstrap[b]
            expected_pg[s][b] = reward[s][b] + gamma[s][b] * next_v - value[s][b]
    _assert_close(out.vs, expected_vs, torch.float64)
    _assert_close(out.pg_advantages, expected_pg, torch.float64)


def test_targets_carry_no_grad():
    inputs = {k: v.requires_grad_() for k, v in _inputs(0, torch.float32).items()}
    out = vtrace_from_importance_weights(**inputs)
    for target in (out.vs, out.pg_advantages):
        assert not target.requires_grad and target.grad_fn is None


@pytest.mark.parametrize(
    ("name", "bad"),
    [
        ("log_rhos", torch.zeros(T)),
        ("log_rhos", torch.zeros(T, B, 1)),
        ("discounts", torch.zeros(T, B + 1)),
        ("rewards", torch.zeros(T + 1, B)),
        ("values", torch.zeros(B, T)),
        ("bootstrap_value", torch.zeros(1, B)),
        ("bootstrap_value", torch.zeros(B + 1)),
    ],
)
def test_bad_shapes_raise(name, bad):
    inputs = _inputs(0, torch.float32)
    inputs[name] = bad
    with pytest.raises(ValueError, match=name):
        vtrace_from_importance_weights(**inputs)
