"""The Replicator: joins this process's replica group and runs ``input_fn``/``step_fn`` in it.

Whoever started the processes (``Replicator.spawn``, ``seedbed replicate``, ``torchrun``) said
through environment variables which replica this is; the Replicator reads them, so the same
script runs as one replica, as N on one machine, or on many machines.
"""

from __future__ import annotations

import datetime
import os
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from seedbed.errors import SeedbedError
from seedbed.replicate.context import ReplicaContext
from seedbed.replicate.spawn import DEFAULT_TIMEOUT_S, STORE_ENV, TIMEOUT_ENV, spawn

_END = object()
_current: ReplicaContext | None = None  # the open Replicator of this process, if any


def replica_context() -> ReplicaContext:
    """The replica this process runs as: its open ``Replicator``, else a group of one.

    Code deep inside ``step_fn`` (an agent merging statistics) reaches its collectives here
    without being handed the context, as TF-Replicator's ``get_replica_context`` does.
    """
    return _current or ReplicaContext(0, 1, torch.device("cpu"), False)


@dataclass(frozen=True)
class InputContext:
    """What ``input_fn`` needs to pick its shard of the data."""

    replica_id: int  # this replica's index, 0 to num_replicas - 1
    num_replicas: int  # how many replicas share the data
    device: torch.device  # where the batches will be used


def default_device(local_rank: int, local_replicas: int) -> torch.device:
    """One GPU per replica when this machine has enough of them, else the CPU."""
    if torch.cuda.is_available() and torch.cuda.device_count() >= local_replicas:
        return torch.device("cuda", local_rank)
    return torch.device("cpu")


class Replicator(ReplicaContext):
    """Runs single-device training code on every replica, with collectives between them.

    The loop, on every replica::

        rep = Replicator()                        # join the group (or be the only replica)
        model = rep.wrap_model(make_model())      # and/or opt = rep.wrap_optimizer(opt)
        outputs = rep.run(step_fn, input_fn)      # input_fn(InputContext) -> batches,
                                                  # step_fn(rep, batch) -> outputs, per batch
        summary = rep.reduce_outputs(outputs)     # one number per output, over all replicas
        rep.close()                               # or use ``with Replicator() as rep:``

    Launch N replicas with ``Replicator.spawn(N, main)`` (one machine), ``seedbed replicate
    -n N script.py`` or ``torchrun`` (many machines). A process started without any of them is
    a group of one: no process group, and every collective returns what it was given, shaped
    as for N.
    """

    def __init__(
        self, device: str | torch.device | None = None, timeout: float | None = None
    ) -> None:
        """Join the group the launcher described in the environment.

        Args:
            device: this replica's device; by default ``cuda:LOCAL_RANK`` when every replica
                on this machine has a GPU, else the CPU. CUDA uses NCCL, the CPU gloo.
            timeout: seconds a collective waits for a missing peer before failing; by default
                what the launcher set, else 60.
        """
        env = os.environ
        world = int(env.get("WORLD_SIZE", "1"))
        rank = int(env.get("RANK", "0"))
        local_rank = int(env.get("LOCAL_RANK", str(rank)))
        local_world = int(env.get("LOCAL_WORLD_SIZE", str(world)))
        dev = default_device(local_rank, local_world) if device is None else torch.device(device)
        if timeout is None:
            timeout = float(env.get(TIMEOUT_ENV, DEFAULT_TIMEOUT_S))
        self._owns_group = False
        if dist.is_available() and dist.is_initialized():
            rank, world, distributed = dist.get_rank(), dist.get_world_size(), True
        elif world > 1:
            _init_group(rank, world, dev, timeout)
            self._owns_group = distributed = True
        else:
            distributed = False
        if dev.type == "cuda":
            torch.cuda.set_device(dev)
        super().__init__(rank, world, dev, distributed)
        global _current
        _current = self

    spawn = staticmethod(spawn)

    def run(
        self,
        step_fn: Callable[[ReplicaContext, Any], Any],
        input_fn: Callable[[InputContext], Iterable[Any]],
        steps: int | None = None,
        stop_together: bool = True,
    ) -> list[Any]:
        """Call ``step_fn(self, batch)`` on each of this replica's batches; return its outputs.

        Args:
            step_fn: one training step on one batch; may call collectives and the wrapped
                optimizer; returns any tree of tensors and numbers.
            input_fn: this replica's batches, given its ``InputContext``.
            steps: stop after this many steps (default: when the batches end).
            stop_together: every replica stops at the step where the first replica's batches
                end, so that no replica waits in a collective for one that has finished. It
                costs one tiny all-reduce per step; pass False when all shards are as long.
        """
        batches = iter(input_fn(InputContext(self.replica_id, self.num_replicas, self.device)))
        outputs: list[Any] = []
        while steps is None or len(outputs) < steps:
            batch = next(batches, _END)
            if stop_together and self._distributed:
                have = torch.tensor([batch is not _END], dtype=torch.int32, device=self.device)
                dist.all_reduce(have, dist.ReduceOp.MIN)
                if not have.item():
                    break
            if batch is _END:
                break
            outputs.append(step_fn(self, batch))
        return outputs

    def close(self) -> None:
        """Leave the process group this Replicator joined (a no-op for one replica)."""
        global _current
        if _current is self:
            _current = None
        if self._owns_group and dist.is_initialized():
            dist.destroy_process_group()
        self._owns_group = False

    def __enter__(self) -> Replicator:
        return self

    def __exit__(self, exc_type: type | None, *exc: object) -> None:
        # On an error, stay in the group: leaving would close the connections that the other
        # replicas wait on, and they would report that rather than this replica's error.
        if exc_type is None:
            self.close()


def _init_group(rank: int, world: int, device: torch.device, timeout: float) -> None:
    """Start the process group: from spawn's rendezvous file, else from torchrun's env://."""
    kwargs: dict[str, Any] = {
        "backend": "nccl" if device.type == "cuda" else "gloo",
        "rank": rank,
        "world_size": world,
        "timeout": datetime.timedelta(seconds=timeout),
    }
    if device.type == "cuda":
        kwargs["device_id"] = device
    store = os.environ.get(STORE_ENV)
    if store:
        kwargs["store"] = dist.FileStore(store, world)
    elif "MASTER_ADDR" in os.environ and "MASTER_PORT" in os.environ:
        kwargs["init_method"] = "env://"
    else:
        raise SeedbedError(
            f"WORLD_SIZE is {world} but MASTER_ADDR/MASTER_PORT are not set; start replicas "
            "with Replicator.spawn, `seedbed replicate -n N` or torchrun"
        )
    dist.init_process_group(**kwargs)
