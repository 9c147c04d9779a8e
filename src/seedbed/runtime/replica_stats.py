"""What the learner replicas counted, merged so that all of them see the same numbers; and the
check that they ended with the same parameters.

Every replica serves its own actors, so each counts its own frames, inference batches, episodes
and actor restarts. They merge these with collectives whenever a metrics row is due: every
replica then logs the same counters and reaches the same stop decision. A collective needs the
same shapes on every replica, so episode lists, whose lengths differ, are padded to the longest
and cut back after the gather. With one replica the same code merges nothing.
"""

from __future__ import annotations

import logging

import torch

from seedbed.inference.server import InferenceStats
from seedbed.replicate import ReplicaContext

# The run's messages keep the name they always had in the console.
log = logging.getLogger("seedbed.runtime.train")


def merge_stats(
    replica: ReplicaContext, stats: InferenceStats, restarts: int
) -> tuple[InferenceStats, int]:
    """Every replica's inference counters (``stats``, taken from its server) and actor
    restarts, summed; the episodes of all replicas, in replica order."""
    returns = torch.tensor(stats.episode_returns, dtype=torch.float64)
    lengths = torch.tensor(stats.episode_lengths, dtype=torch.int64)
    counts = replica.all_gather(torch.tensor(len(returns)))
    width = max(1, int(counts.max()))  # padded to the most any replica has
    totals = torch.tensor([stats.frames, stats.batches, stats.batch_envs, stats.resets, restarts])
    all_returns, all_lengths, all_totals = replica.all_gather(
        (_pad(returns, width), _pad(lengths, width), totals)
    )
    counts = counts.tolist()
    frames, batches, batch_envs, resets, restarts = all_totals.sum(0).tolist()
    merged = InferenceStats(
        frames=frames,
        batches=batches,
        batch_envs=batch_envs,
        episode_returns=[
            x for r, n in zip(all_returns, counts, strict=True) for x in r[:n].tolist()
        ],
        episode_lengths=[
            x for r, n in zip(all_lengths, counts, strict=True) for x in r[:n].tolist()
        ],
        resets=resets,
    )
    return merged, restarts


def replicas_in_sync(replica: ReplicaContext, network: torch.nn.Module) -> bool | None:
    """Whether every replica ends with exactly replica 0's parameters and statistics (an
    observation normalizer's, PopArt's), None with one replica."""
    if replica.num_replicas == 1:
        return None
    state = network.state_dict().values()
    values = [t.detach().reshape(-1).double() for t in state if t.is_floating_point()]
    gathered = replica.all_gather(torch.cat(values))
    in_sync = bool((gathered == gathered[0]).all())
    if not in_sync:
        log.warning("the learner replicas' parameters differ; this is a bug, please report it")
    return in_sync


def _pad(values: torch.Tensor, width: int) -> torch.Tensor:
    return torch.cat([values, values.new_zeros(width - len(values))])
