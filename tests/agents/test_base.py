"""What the agents share (``seedbed.agents.base``): the optimizer step and its finiteness check,
gradient and reward clipping, and parameter copies."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from seedbed.agents.base import (
    SKIPPED,
    clip_grad_norm,
    clip_rewards,
    copy_parameters,
    optimizer_step,
)


def _net_with_grads(seed: int, scale: float) -> torch.nn.Module:
    torch.manual_seed(seed)
    net = torch.nn.Sequential(torch.nn.Linear(5, 7), torch.nn.ReLU(), torch.nn.Linear(7, 3))
    net[0].bias.requires_grad_(False)  # a parameter without a gradient is skipped
    (net(torch.randn(11, 5)).pow(2).sum() * scale).backward()
    return net


@pytest.mark.parametrize("max_norm", [0.05, 1e6, float("inf")])
def test_clipping_is_torchs_bit_for_bit(max_norm):
    ours, theirs = _net_with_grads(0, 3.0), _net_with_grads(0, 3.0)
    norm = clip_grad_norm(list(ours.parameters()), max_norm)
    want = torch.nn.utils.clip_grad_norm_(theirs.parameters(), max_norm)
    assert torch.equal(norm, want)
    for a, b in zip(ours.parameters(), theirs.parameters(), strict=True):
        assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)
    clipped = max_norm < float(want)
    assert clipped == (max_norm == 0.05)  # both cases are exercised


def test_clipping_mixed_dtypes_falls_back_to_torch():
    def params():
        float32, float64 = _net_with_grads(1, 1.0), _net_with_grads(2, 1.0).double()
        (float64(torch.randn(3, 5, dtype=torch.float64)).sum()).backward()
        return [*float32.parameters(), *float64.parameters()]

    ours, theirs = params(), params()
    assert torch.equal(clip_grad_norm(ours, 0.1), torch.nn.utils.clip_grad_norm_(theirs, 0.1))
    for a, b in zip(ours, theirs, strict=True):
        assert (a.grad is None and b.grad is None) or torch.equal(a.grad, b.grad)


def test_copy_parameters_copies_parameters_and_buffers():
    src = torch.nn.BatchNorm1d(4)
    src.running_mean.fill_(3.0)
    src.weight.data.fill_(2.0)
    dst = torch.nn.BatchNorm1d(4)
    copy_parameters(src, dst)
    assert torch.equal(dst.weight, src.weight) and torch.equal(dst.running_mean, src.running_mean)
    assert dst.num_batches_tracked.dtype == torch.int64
    with pytest.raises(ValueError, match="parameters and buffers"):
        copy_parameters(src, torch.nn.Linear(4, 4))


def test_reward_clipping_turns_nan_into_zero_and_infinities_into_the_bounds():
    rewards = torch.tensor([float("nan"), float("inf"), -float("inf"), 0.5, -3.0])
    assert clip_rewards(rewards, 1.0).tolist() == [0.0, 1.0, -1.0, 0.5, -1.0]
    assert clip_rewards(rewards, None) is rewards  # unclipped: the step's check catches it


@pytest.mark.parametrize("bad", ["nan_loss", "inf_gradient"])
def test_a_non_finite_step_is_skipped_and_leaves_weights_and_optimizer_as_they_were(bad):
    torch.manual_seed(0)
    net = torch.nn.Linear(3, 2)
    optimizer = torch.optim.Adam(net.parameters(), lr=0.1)
    x = torch.randn(4, 3)
    optimizer_step(net, optimizer, {"loss_a": net(x).square().mean()}, 1.0)  # state to keep
    weights = [p.detach().clone() for p in net.parameters()]
    moments = copy.deepcopy(optimizer.state_dict())
    if bad == "nan_loss":
        term = net(x).square().mean() * float("nan")
    else:  # a finite loss (sqrt(0) = 0) whose gradient is not (sqrt's at 0 is infinite)
        zero = net.weight.sum() - net.weight.sum().detach()
        term = net(x).square().mean() + zero.abs().sqrt()
        assert math.isfinite(term.item())
    metrics = optimizer_step(net, optimizer, {"loss_a": term}, 1.0)
    assert metrics[SKIPPED] == 1.0
    assert all(torch.equal(a, b) for a, b in zip(weights, net.parameters(), strict=True))
    assert all(p.grad is None for p in net.parameters())
    after = optimizer.state_dict()["state"]
    assert all(
        torch.equal(moments["state"][k][name], after[k][name]) for k in after for name in after[k]
    )
    metrics = optimizer_step(net, optimizer, {"loss_a": net(x).square().mean()}, 1.0)
    assert metrics[SKIPPED] == 0.0 and math.isfinite(metrics["loss"])
    assert not all(torch.equal(a, b) for a, b in zip(weights, net.parameters(), strict=True))
