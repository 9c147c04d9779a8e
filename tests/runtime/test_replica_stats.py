"""merge_stats and replicas_in_sync: over one replica in this process, and over two gloo replicas
whose episode lists differ in length (so the padding is cut back)."""

from __future__ import annotations

import pytest
import torch

from seedbed.inference.server import InferenceStats
from seedbed.replicate import ReplicaContext, Replicator, spawn
from seedbed.runtime.replica_stats import merge_stats, replicas_in_sync


def _stats(r: int) -> InferenceStats:
    """Replica ``r``'s counters: r + 1 episodes, so the replicas' lists differ in length."""
    return InferenceStats(
        frames=10 * (r + 1),
        batches=r + 1,
        batch_envs=4 * (r + 1),
        episode_returns=[float(r) + 0.5] * (r + 1),
        episode_lengths=[r + 5] * (r + 1),
        resets=r,
    )


def test_one_replica_merges_to_its_own_counters():
    replica = ReplicaContext(0, 1, torch.device("cpu"), False)
    assert merge_stats(replica, _stats(1), 3) == (_stats(1), 3)
    empty, restarts = merge_stats(replica, InferenceStats(frames=7), 0)
    assert empty == InferenceStats(frames=7) and restarts == 0
    assert replicas_in_sync(replica, torch.nn.Linear(2, 2)) is None


def _merge() -> tuple[InferenceStats, int, bool, bool]:
    with Replicator(device="cpu") as replica:
        r = replica.replica_id
        merged, restarts = merge_stats(replica, _stats(r), r + 1)
        torch.manual_seed(0)
        same = replicas_in_sync(replica, torch.nn.Linear(3, 2))
        torch.manual_seed(r)
        different = replicas_in_sync(replica, torch.nn.Linear(3, 2))
        return merged, restarts, same, different


@pytest.mark.distributed
def test_two_replicas_sum_their_counters_and_join_their_episodes():
    want = InferenceStats(
        frames=30,
        batches=3,
        batch_envs=12,
        episode_returns=[0.5, 1.5, 1.5],
        episode_lengths=[5, 6, 6],
        resets=1,
    )
    for merged, restarts, same, different in spawn(2, _merge):
        assert merged == want and restarts == 3
        assert same is True and different is False
