"""The replicas' side of placing remote actors, over two gloo replicas with real gateways: one
token for all (made by replica 0, kept on resume), every gateway's address, and the meeting
after a learner step that brings each replica's actors to the front door's placement."""

from __future__ import annotations

import ipaddress
from pathlib import Path

import pytest
import torch

from seedbed.replicate import Replicator, spawn
from seedbed.runtime.front_door import FrontDoor, advertised, shared_token
from seedbed.transport.address import replica_address
from seedbed.transport.remote import GrpcActorClient
from tests.transport.test_remote import Learner, steps

pytestmark = [pytest.mark.distributed, pytest.mark.xdist_group("replicas")]


def _replica(run_dir: str, listen: str, gateways: int = 1) -> dict:
    """One replica: its gateway (more than one: processes) beside the others', two actors
    dialling the front door."""
    with Replicator(device="cpu") as replica:
        r = replica.replica_id
        token, path = shared_token(replica, Path(run_dir))
        learner = Learner(token=token, address=replica_address(listen, r), gateways=gateways)
        try:
            door = FrontDoor(replica, learner.gateway, [2, 2])
            replica.barrier()  # every gateway serves
            clients, where, loads = [], [], None
            if replica.is_primary:
                clients = [GrpcActorClient(door.addresses[0], token=token) for _ in range(2)]
                where = [c.address for c in clients]
                for client in clients:
                    steps(client, 2)
            replica.barrier()  # the actors are in their slots
            decided = door.meet(torch.tensor([1 - r, 0, r], dtype=torch.int32)).tolist()
            if door.placement is not None:
                loads = door.placement.loads(learner.gateway.connected)
            for client in clients:
                client.close()
            tally = door.tally()
        finally:
            learner.close()
        return {
            "token": token,
            "path": str(path),
            "addresses": door.addresses,
            "where": where,
            "decided": decided,
            "loads": loads,
            "tally": tally,
        }


@pytest.mark.parametrize(
    ("unix", "gateways"),
    [(False, 1), (True, 1), (False, 2)],
    ids=["loopback", "unix-socket", "2-gateway-processes"],
)
def test_replicas_share_a_token_and_their_addresses_and_count_their_actors(
    tmp_path, unix, gateways, no_leaks
):
    listen = f"unix:{tmp_path}/l.sock" if unix else "127.0.0.1:0"
    first, second = spawn(2, _replica, str(tmp_path), listen, gateways)
    token = (tmp_path / "actor-token").read_bytes().strip()
    assert first["token"] == second["token"] == token  # one token, from replica 0's file
    assert first["path"] == second["path"] == str(tmp_path / "actor-token")
    assert first["addresses"] == second["addresses"]
    front, other = first["addresses"]
    if unix:
        assert (front, other) == (listen, f"{listen}.replica-1")
    else:
        assert front.startswith("127.0.0.1:") and other.startswith("127.0.0.1:")
        assert other != front  # a free port of its own
    assert first["where"] == [front, other]  # the second actor was redirected
    assert first["decided"] == second["decided"] == [1, 0, 1]  # the most: any replica's stop
    assert first["loads"] == [1, 1]  # replica 1's actor, as the meeting counted it
    assert first["tally"] == second["tally"]
    assert [(t["address"], t["connections"]) for t in first["tally"]] == [(front, 1), (other, 1)]
    again, _ = spawn(2, _replica, str(tmp_path), listen)  # a resumed run keeps its token
    assert again["token"] == token


@pytest.mark.parametrize(
    "address, rendezvous, expected",
    [
        ("0.0.0.0:0", None, "0.0.0.0:0"),  # one machine: the actor swaps in the host it dialled
        ("0.0.0.0:5001", "127.0.0.1", "0.0.0.0:5001"),
        ("127.0.0.1:5001", "192.0.2.1", "127.0.0.1:5001"),  # a host of its own stays
        ("unix:/tmp/x.sock.replica-1", "192.0.2.1", "unix:/tmp/x.sock.replica-1"),
    ],
)
def test_a_gateway_is_advertised_as_it_listens_unless_on_every_interface(
    address, rendezvous, expected, monkeypatch
):
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    assert advertised(address, rendezvous) == expected


def test_a_gateway_on_every_interface_is_advertised_at_its_route_to_the_rendezvous_host():
    """Under torchrun a replica may be on another machine than the front door: it tells actors
    its own address, the one its route to the rendezvous host leaves from."""
    host, _, port = advertised("0.0.0.0:5001", "127.0.0.2").rpartition(":")
    assert port == "5001" and host not in ("0.0.0.0", "") and ipaddress.ip_address(host)
