"""The Replicator: joins this process's replica group and runs ``input_fn``/``step_fn`` in it.

Whoever started the processes (``Replicator.spawn``, ``seedbed replicate``, ``torchrun``) said
through environment variables which replica this is; the Replicator reads them, so the same
script runs as one replica, as N on one machine, or on many machines.
"""

from __future__ import annotations

import datetime
import os
import time
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
# After a collective failed: how long the replicas still alive have to answer the roll call that
# tells them from the lost ones. A survivor whose own peer died notices at once; the others once
# the survivors leave the group, a moment later.
ROLL_CALL_S = 5.0


def launched_replicas() -> int:
    """How many replicas a launcher that describes the group in env://'s variables (torchrun,
    SLURM scripts, seedbed's Ray launcher) started this process among: ``WORLD_SIZE``, or 1.

    ``Replicator.spawn``'s replicas are not counted: their launcher is in this package.
    """
    env = os.environ
    if STORE_ENV in env or "RANK" not in env:
        return 1
    return int(env.get("WORLD_SIZE", "1"))


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


def group_failure(error: BaseException) -> bool:
    """Whether ``error`` is a collective failing because the group broke (a peer that died, or
    did not come within the timeout), rather than a bug of the caller's."""
    if not (dist.is_available() and dist.is_initialized()):
        return False
    return isinstance(error, dist.DistError) or (
        isinstance(error, RuntimeError) and "gloo" in str(error)
    )


def lost_replicas(wait_s: float = ROLL_CALL_S) -> list[int] | None:
    """After a collective failed (``group_failure``): leave the group, and name the replicas that
    do not answer a roll call held through the group's store within ``wait_s`` seconds.

    Every replica still alive calls this once its own collective fails. Returns the lost
    replicas' ids in order, or None when the store itself is gone with its host (torchrun's
    agent, or replica 0 of env://), so that no roll call can be held.
    """
    store = dist.distributed_c10d._get_default_store()
    rank, world = dist.get_rank(), dist.get_world_size()
    # Leaving closes this replica's connections, so that replicas still waiting on it in a
    # collective fail now rather than at the timeout, and come to the roll call.
    dist.destroy_process_group()
    key = "seedbed-roll-call/{}".format
    try:
        store.set(key(rank), b"here")
        deadline = time.monotonic() + wait_s
        while True:
            missing = [r for r in range(world) if not store.check([key(r)])]
            if not missing or time.monotonic() >= deadline:
                return missing
            time.sleep(0.1)
    except (RuntimeError, dist.DistError):
        return None


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
