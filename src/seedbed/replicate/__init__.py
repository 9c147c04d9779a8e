"""Replication (TF-Replicator on torch.distributed): single-device code, run on N replicas.

A researcher writes an ``input_fn`` (this replica's batches) and a ``step_fn`` (one step on one
batch, with MPI-style collectives when it needs them); a ``Replicator`` runs them on every
replica, one process per device::

    def main():
        with Replicator() as rep:
            model = make_model().to(rep.device)
            opt = rep.wrap_optimizer(torch.optim.SGD(model.parameters(), lr=0.1))

            def input_fn(ctx: InputContext):      # this replica's shard
                return my_batches(shard=ctx.replica_id, of=ctx.num_replicas)

            def step_fn(ctx: ReplicaContext, batch):
                loss = loss_fn(model, batch)
                opt.zero_grad()
                loss.backward()
                opt.step()                        # gradients averaged over replicas first
                return {"loss": loss.detach()}

            outputs = rep.run(step_fn, input_fn)
            print(rep.reduce_outputs(outputs))    # mean over steps and replicas

    Replicator.spawn(4, main)                     # or: main() under torchrun/seedbed replicate

Launchers: ``Replicator.spawn(n, fn, *args)`` on one machine; ``seedbed replicate -n N
script.py`` for a script; ``torchrun --nnodes 2 --nproc-per-node K --rdzv-backend c10d
--rdzv-endpoint HOST:PORT script.py`` across machines. Without a launcher the same code is one
replica, with no process group. Gloo on CPUs, NCCL on GPUs. This package knows nothing of RL.
"""

from __future__ import annotations

from seedbed.replicate.context import Op, ReplicaContext
from seedbed.replicate.replicator import (
    InputContext,
    Replicator,
    default_device,
    group_failure,
    launched_replicas,
    lost_replicas,
    replica_context,
)
from seedbed.replicate.spawn import ReplicaError, run_script, spawn

__all__ = [
    "InputContext",
    "Op",
    "ReplicaContext",
    "ReplicaError",
    "Replicator",
    "default_device",
    "group_failure",
    "launched_replicas",
    "lost_replicas",
    "replica_context",
    "run_script",
    "spawn",
]
