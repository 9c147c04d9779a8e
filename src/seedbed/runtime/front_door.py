"""Remote actors of a replicated learner: one gateway per replica, replica 0's the front door.

Every replica listens on its own address (``TrainConfig.replica_shard``) with its share of the
remote slots, and with the same token: the run's own token is made by replica 0 and sent to
the others over the replicas' process group, so nothing here needs a shared file system or
host. The replicas then exchange their gateways' addresses, and replica 0's gateway places
each new actor with a ``Placement`` of them (``transport.remote.placement``).

The placement needs every replica's connected actors. The replicas already meet after each
learner step, where replica 0 says whether to log, checkpoint or stop; with remote actors that
meeting is one gather instead of a broadcast, which brings replica 0's decision to all and
every replica's count of actors to replica 0 (``FrontDoor.meet``). At the end ``tally`` gathers
how many actors each replica served, for ``summary.json``.
"""

from __future__ import annotations

import os
import socket
from pathlib import Path
from typing import Any

import torch

from seedbed.replicate import ReplicaContext
from seedbed.transport.address import WILDCARD_HOSTS
from seedbed.transport.remote import ActorGateway, Placement, run_token
from seedbed.transport.remote.gateway_process import GatewayProcesses
from seedbed.transport.remote.wire import TOKEN_FILE


def shared_token(replica: ReplicaContext, run_dir: Path) -> tuple[bytes, Path]:
    """The run's own token (``wire.run_token``) and its file: made by replica 0, sent to the
    others, which read no file (replica 0 may still be writing it, or on another host)."""
    if replica.is_primary:
        token, path = run_token(run_dir)
    else:
        token, path = b"", Path(run_dir) / TOKEN_FILE
    if replica.num_replicas > 1:
        token = _broadcast_bytes(replica, token)
    return token, path


def gather_addresses(replica: ReplicaContext, address: str) -> list[str]:
    """Every replica's gateway address, in replica order, as other machines reach it."""
    own = advertised(address).encode()
    return [_bytes_of(row).decode() for row in _gather_bytes(replica, own)]


def advertised(address: str, rendezvous: str | None = None) -> str:
    """Where actors reach a gateway listening on ``address``. A wildcard host (0.0.0.0, [::])
    becomes this machine's address on its route to the process group's rendezvous host
    (``rendezvous``, else torchrun's ``MASTER_ADDR``): under torchrun the replicas may be on
    other machines than the front door. With no rendezvous host, or a loopback one, the
    replicas share the front door's machine and the wildcard stays: an actor puts the host it
    dialled in its place."""
    host, _, port = address.rpartition(":")
    rendezvous = rendezvous or os.environ.get("MASTER_ADDR")
    if host not in WILDCARD_HOSTS or not rendezvous or rendezvous in ("localhost", "127.0.0.1"):
        return address
    family = socket.AF_INET6 if host != "0.0.0.0" else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as probe:
            probe.connect((rendezvous, 9))  # a UDP connect sends nothing: it picks the route
            own = probe.getsockname()[0]
    except OSError:  # no route in that family: keep the wildcard, as on one machine
        return address
    return f"[{own}]:{port}" if ":" in own else f"{own}:{port}"


class FrontDoor:
    """A replica's part in placing remote actors: its gateway (in this process, or its
    ``--gateways`` processes: either has ``connected`` and ``serve_as_front_door``), and on
    replica 0 the placement.

    The call loop, on every replica (each call is a collective)::

        door = FrontDoor(replica, gateway, slots)   # after the gateway is made, before it starts
        decided = door.meet(flags)                  # after each learner step: replica 0's flags
        door.tally()                                # at the end: what each replica served
    """

    def __init__(
        self,
        replica: ReplicaContext,
        gateway: ActorGateway | GatewayProcesses,
        slots: list[int],
    ) -> None:
        """``slots``: every replica's remote slots, in replica order."""
        self.replica, self.gateway = replica, gateway
        addresses = gather_addresses(replica, gateway.address)
        self.addresses = addresses
        self.placement: Placement | None = None
        if replica.is_primary:
            self.placement = Placement(addresses, slots)
            gateway.serve_as_front_door(self.placement)
        # Per replica, once ``tally`` ran: its address, actors served and streams refused.
        self.replicas: list[dict[str, Any]] | None = None

    def meet(self, flags: torch.Tensor) -> torch.Tensor:
        """``flags``' maximum over the replicas on every replica, as ``all_reduce(flags, "max")``
        gives it; on the way, replica 0 learns every replica's connected actors."""
        mark = self.placement.mark() if self.placement is not None else None
        here = torch.tensor([self.gateway.connected], dtype=flags.dtype)
        gathered = self.replica.all_gather(torch.cat([flags, here]))
        if self.placement is not None:
            self.placement.update(gathered[:, -1].tolist(), mark)
        return gathered[:, :-1].amax(0)

    def tally(self) -> list[dict[str, Any]]:
        """What each replica's gateway did, gathered on every replica: its address, the actors
        it served (``connections``) and the streams it refused."""
        gateway = self.gateway
        counts = self.replica.all_gather(
            torch.tensor([gateway.connections, gateway.rejected_total], dtype=torch.int64)
        ).tolist()
        self.replicas = [
            {"address": address, "connections": served, "refused": refused}
            for address, (served, refused) in zip(self.addresses, counts, strict=True)
        ]
        return self.replicas


def _broadcast_bytes(replica: ReplicaContext, data: bytes) -> bytes:
    size = replica.broadcast(torch.tensor([len(data)], dtype=torch.int64))
    buffer = torch.zeros(int(size[0]), dtype=torch.uint8)
    if replica.is_primary:
        buffer = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    return _bytes_of(replica.broadcast(buffer))


def _gather_bytes(replica: ReplicaContext, data: bytes) -> list[torch.Tensor]:
    """Every replica's ``data``, each cut back to its own length."""
    sizes = replica.all_gather(torch.tensor([len(data)], dtype=torch.int64))[:, 0].tolist()
    padded = torch.zeros(max(sizes), dtype=torch.uint8)
    padded[: len(data)] = torch.frombuffer(bytearray(data), dtype=torch.uint8)
    rows = replica.all_gather(padded)
    return [row[:size] for row, size in zip(rows, sizes, strict=True)]


def _bytes_of(values: torch.Tensor) -> bytes:
    return bytes(values.tolist())
