"""What the agents share (``seedbed.agents.base``): gradient clipping and parameter copies."""

from __future__ import annotations

import pytest
import torch

from seedbed.agents.base import clip_grad_norm, copy_parameters


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
