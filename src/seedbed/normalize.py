"""Running statistics a network normalizes with: observations, and PopArt's value targets.

Both live in the network's buffers, so checkpoints, acting copies, policy broadcasts and
evaluation carry them with the weights, and every place that acts normalizes alike. The learner
updates them from each batch it learns from; on a replicated learner ``reduce`` sums the batch's
moments over replicas first (``ReplicaContext.all_reduce``), so each replica makes the same update
and the replicas stay identical.
"""

from __future__ import annotations

from collections.abc import Callable

import torch
from torch import nn

# Sums a list of tensors element-wise over learner replicas; the identity on one.
Reduce = Callable[[list[torch.Tensor]], list[torch.Tensor]]


def _alone(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return tensors


class ObsNormalizer(nn.Module):
    """Observations less their running mean, over their running standard deviation, clipped.

    The mean and variance are those of every observation given to ``update`` so far, merged
    batch by batch (Chan et al. 1979), exactly what one pass over all of them would give.
    """

    # On a CPU a learner batch goes through in chunks of about this many values, whose float32
    # temporaries stay in the core's cache, where a pass over the whole batch at once would go
    # to memory for each temporary. A GPU takes it in one go.
    CHUNK_VALUES = 1 << 17

    def __init__(self, obs_shape: tuple[int, ...], clip: float = 5.0, eps: float = 1e-8) -> None:
        super().__init__()
        self.clip, self.eps = clip, eps
        self.register_buffer("count", torch.zeros((), dtype=torch.float64))
        self.register_buffer("mean", torch.zeros(obs_shape))
        self.register_buffer("var", torch.ones(obs_shape))

    def forward(
        self,
        obs: torch.Tensor,
        dtype: torch.dtype = torch.float32,
        out: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """[..., *obs_shape] in any dtype -> normalized (computed in float32), in ``dtype``, or
        written into ``out`` (of ``obs``'s shape, in any memory layout) and returned."""
        mean, scale = self.mean, torch.rsqrt(self.var + self.eps)
        rows = obs.reshape(-1, *mean.shape)
        chunks = self._chunks(rows)
        if out is None and len(chunks) == 1:  # what acting gives: fewer ops, no copy
            return self._normalized(obs, mean, scale).to(dtype)
        if out is None:
            out = torch.empty(obs.shape, dtype=dtype, device=obs.device)
        for part, into in zip(chunks, self._chunks(out.view(rows.shape)), strict=True):
            into.copy_(self._normalized(part, mean, scale))
        return out

    def _normalized(self, x: torch.Tensor, mean: torch.Tensor, scale: torch.Tensor) -> torch.Tensor:
        return torch.sub(x, mean).mul_(scale).clamp_(-self.clip, self.clip)

    @torch.no_grad()
    def update(self, obs: torch.Tensor, reduce: Reduce = _alone) -> None:
        """Merge observations ``[..., *obs_shape]`` (over every replica) into the statistics;
        one holding a NaN or an infinity is left out, which would poison them for good."""
        x = obs.reshape(-1, *self.mean.shape)
        if x.is_floating_point():
            finite = torch.isfinite(x.reshape(len(x), -1)).all(1)
            if not bool(finite.all()):
                x = x[finite]
        count, total, squares = reduce(
            [self.mean.new_tensor(len(x), dtype=torch.float64), *self._sums(x)]
        )
        if count <= 0:
            return
        batch_mean = total / count
        batch_var = (squares / count - batch_mean.pow(2)).clamp_min(0.0)
        old, mean, var = self.count, self.mean.double(), self.var.double()
        new = old + count
        delta = batch_mean - mean
        self.mean.copy_(mean + delta * (count / new))
        self.var.copy_((var * old + batch_var * count + delta.pow(2) * (old * count / new)) / new)
        self.count.copy_(new)

    def _sums(self, x: torch.Tensor) -> list[torch.Tensor]:
        """The sums of ``x``'s rows and of their squares, float64, for ``update``'s merge."""
        if x.dtype != torch.uint8 or len(x) == 0:
            # The batch's moments in float32 (Welford's, so stable), then its sums: the
            # observations in float64, squared, would double the copies.
            if len(x) == 0:  # a replica with nothing to add still takes part in the reduce
                var = mean = torch.zeros_like(self.mean, dtype=torch.float64)
            else:
                var, mean = (m.double() for m in torch.var_mean(x.float(), dim=0, correction=0))
            return [mean * len(x), (var + mean.pow(2)) * len(x)]
        # Frames are summed exactly: a chunk's sums in float32 hold every integer below
        # 2 ** 24, and a chunk of up to 258 squares of 255 stays below that.
        total = torch.zeros(self.mean.shape, dtype=torch.float64, device=x.device)
        squares = torch.zeros_like(total)
        for part in self._chunks(x, limit=(1 << 24) // 255**2):
            values = part.float()
            total += values.sum(0)
            squares += values.square_().sum(0)
        return [total, squares]

    def _chunks(self, rows: torch.Tensor, limit: int | None = None) -> tuple[torch.Tensor, ...]:
        """``rows`` split along the first dimension into chunks of about ``CHUNK_VALUES``
        values on a CPU (one chunk on other devices), each at most ``limit`` rows."""
        size = len(rows) or 1
        if rows.device.type == "cpu":
            size = max(1, self.CHUNK_VALUES // max(1, self.mean.numel()))
        return rows.split(min(size, limit or size))


class PopArtValue(nn.Linear):
    """A value head whose output is ``sigma * (w x + b) + mu``: the normalized value, rescaled by
    running estimates of the value targets' mean ``mu`` and standard deviation ``sigma``.

    PopArt (van Hasselt et al. 2016; Hessel et al. 2019): ``update`` moves ``mu`` and ``sigma``
    towards a batch of targets ("adaptively rescaling targets") and changes ``w`` and ``b`` so
    that every output stays what it was ("preserving outputs precisely"). The value loss divided
    by ``sigma ** 2`` is then the loss of the normalized value, whose scale does not depend on the
    task's rewards.
    """

    def __init__(self, in_features: int, beta: float = 3e-4) -> None:
        super().__init__(in_features, 1)
        self.beta = beta
        self.register_buffer("mu", torch.zeros(()))
        self.register_buffer("nu", torch.ones(()))  # the targets' running second moment

    @property
    def sigma(self) -> torch.Tensor:
        return (self.nu - self.mu.pow(2)).clamp_min(1e-8).sqrt().clamp(1e-4, 1e6)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return super().forward(x) * self.sigma + self.mu

    @torch.no_grad()
    def update(self, targets: torch.Tensor, reduce: Reduce = _alone) -> None:
        """Move the statistics a step of ``beta`` towards the (all replicas') batch of value
        targets, keeping every output as it was; targets that are not finite are left out."""
        t = targets.detach().double().reshape(-1)
        t = t[torch.isfinite(t)]  # a NaN or an infinity would poison the statistics for good
        count, total, squares = reduce([t.new_tensor(len(t)), t.sum(), t.pow(2).sum()])
        if count <= 0:
            return
        old_mu, old_sigma = self.mu.clone(), self.sigma.clone()
        self.mu.lerp_((total / count).float(), self.beta)
        self.nu.lerp_((squares / count).float(), self.beta)
        sigma = self.sigma
        self.weight.mul_(old_sigma / sigma)
        self.bias.mul_(old_sigma).add_(old_mu - self.mu).div_(sigma)
