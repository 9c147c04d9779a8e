"""A replicated learner's front door: which replica a new actor goes to (``Placement``), real
gateways on 127.0.0.1 that redirect actors between them (the front door in the learner's
process, or in gateway processes whose learner places the actors), and actors that follow a
redirect or refuse a bad one. The security checks (token, protocol, hello) come before any
redirect."""

from __future__ import annotations

import contextlib
import time
from concurrent import futures

import grpc
import pytest

from seedbed.transport.proto import actor_pb2 as pb
from seedbed.transport.remote import (
    MAX_REDIRECTS,
    PROTOCOL,
    GrpcActorClient,
    Placement,
    Refused,
)
from seedbed.transport.remote.client import redirect_target
from seedbed.transport.remote.placement import choose
from tests.transport import test_remote
from tests.transport.test_remote import TOKEN, _raw_stream, settle, steps

learner = test_remote.learner  # the fixture: a real gateway over real shared memory

#: Parametrize a test over the front door in the learner's process and in two processes.
each_front_door = pytest.mark.parametrize("gateways", [1, 2], ids=["in-process", "2-processes"])


# -- the choice -------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("loads", "counts", "slots", "want"),
    [
        ([0, 0], [0, 0], [2, 2], 0),  # a tie: the front door serves it itself
        ([1, 0], [1, 0], [2, 2], 1),
        ([1, 1, 0], [1, 1, 0], [2, 2, 2], 2),
        ([2, 0], [2, 0], [2, 2], 1),  # the front door is full
        ([0, 3], [0, 0], [1, 2], 0),  # three redirects pending to replica 1
        ([1, 3], [1, 1], [1, 4], 1),  # pending redirects order replicas but never fill one
        ([2, 2], [2, 2], [2, 2], None),  # every slot taken
    ],
)
def test_the_replica_with_the_fewest_actors_takes_the_next(loads, counts, slots, want):
    assert choose(loads, counts, slots) == want


def test_redirects_since_the_last_count_spread_a_burst_of_actors():
    placement = Placement(["front:1", "r1:2", "r2:3"], [4, 4, 4])
    here, sent = 0, []
    for _ in range(6):  # six actors arrive before the replicas meet again
        target = placement.place(here)
        here += target is None  # served at the front door
        sent.append(target)
    assert sent == [None, "r1:2", "r2:3", None, "r1:2", "r2:3"]
    assert placement.loads(here) == [2, 2, 2] and placement.redirects == 4


def test_a_count_covers_the_redirects_marked_before_it_and_no_later_ones():
    placement = Placement(["front:1", "r1:2"], [4, 4])
    assert placement.place(2) == "r1:2"
    mark = placement.mark()
    assert placement.place(2) == "r1:2"  # sent while the replicas were counting
    placement.update([2, 1], mark)  # replica 1 counted the first actor only
    assert placement.loads(2) == [2, 2]  # the second is still pending
    placement.update([2, 2], placement.mark())
    assert placement.loads(2) == [2, 2]
    placement.update([2, 0], placement.mark())  # both left
    assert placement.loads(2) == [2, 0] and placement.place(2) == "r1:2"


def test_a_placement_needs_one_address_and_count_per_replica():
    with pytest.raises(ValueError, match="one address and one slot count per replica"):
        Placement(["a:1"], [1, 2])
    with pytest.raises(ValueError, match="expected 2 counts"):
        Placement(["a:1", "b:2"], [1, 2]).update([1], [0, 0])


# -- real gateways ----------------------------------------------------------------------------


def replicas(learner, n: int = 2, gateways: int = 1):
    """``n`` learners with two slots each; the first is the front door of all of them, served
    by ``gateways`` gateways (more than one: processes)."""
    made = [learner(gateways=gateways)] + [learner() for _ in range(n - 1)]
    placement = Placement([lr.gateway.address for lr in made], [2] * n)
    made[0].gateway.serve_as_front_door(placement)
    return made, placement


@each_front_door
def test_actors_at_the_front_door_spread_over_the_replicas_and_step_there(learner, gateways):
    (front, other), placement = replicas(learner, gateways=gateways)
    clients = [GrpcActorClient(front.gateway.address, token=TOKEN) for _ in range(4)]
    where = [c.address for c in clients]
    assert where == [front.gateway.address, other.gateway.address] * 2
    assert (front.gateway.connected, other.gateway.connected) == (2, 2)
    assert placement.redirects == 2 and front.gateway.connections == 2
    for client in clients:
        steps(client, 3)  # each in its own replica's slot, answered there
    with pytest.raises(ConnectionError, match="slots are taken"):  # every replica is full
        GrpcActorClient(front.gateway.address, token=TOKEN)
    clients[1].close()  # one of replica 1's actors leaves; its gateway learns of it on its loop
    deadline = time.monotonic() + 10
    while other.gateway.connected != 1 and time.monotonic() < deadline:
        time.sleep(0.01)
    placement.update([2, other.gateway.connected], placement.mark())
    again = GrpcActorClient(front.gateway.address, token=TOKEN)
    assert again.address == other.gateway.address
    steps(again, 3)
    for client in [*clients, again]:
        client.close()


@each_front_door
@pytest.mark.parametrize("sent", [None, b"not-the-token"], ids=["missing", "wrong"])
def test_the_front_door_checks_the_token_before_it_redirects(learner, sent, gateways):
    (front, _), placement = replicas(learner, gateways=gateways)
    first = GrpcActorClient(front.gateway.address, token=TOKEN)  # the next would go to replica 1
    with pytest.raises(Refused, match="token"):
        GrpcActorClient(front.gateway.address, token=sent)
    settle(front)
    assert placement.redirects == 0 and front.gateway.rejected_total == 1
    first.close()


@each_front_door
def test_the_front_door_refuses_an_old_protocol_and_a_missing_hello_before_it_redirects(
    learner, gateways
):
    (front, _), placement = replicas(learner, gateways=gateways)
    first = GrpcActorClient(front.gateway.address, token=TOKEN)
    old = pb.ActorMessage(hello=pb.Hello(protocol=PROTOCOL - 1)).SerializeToString()
    code, details = _raw_stream(front.gateway.address, old)
    assert code == grpc.StatusCode.FAILED_PRECONDITION and f"protocol {PROTOCOL - 1}" in details
    step = pb.ActorMessage(step=pb.Step()).SerializeToString()
    code, details = _raw_stream(front.gateway.address, step)
    assert code == grpc.StatusCode.INVALID_ARGUMENT and "first message must be hello" in details
    assert placement.redirects == 0
    first.close()


# -- hostile learners: redirects an actor must not follow ------------------------------------


@contextlib.contextmanager
def redirecting(*targets: str):
    """Learners that answer every hello with a redirect: the i-th to ``targets[i]``, where
    ``"{next}"`` stands for the next one's address and ``"{self}"`` for its own."""
    servers, addresses = [], []
    for _ in targets:
        server = grpc.server(futures.ThreadPoolExecutor(2))
        addresses.append(f"127.0.0.1:{server.add_insecure_port('127.0.0.1:0')}")
        servers.append(server)
    for i, (server, target) in enumerate(zip(servers, targets, strict=True)):
        address = target.format(self=addresses[i], next=addresses[(i + 1) % len(addresses)])
        answer = pb.LearnerMessage(redirect=pb.Redirect(address=address))

        def act(requests, context, answer=answer):
            next(requests)
            yield answer

        handler = grpc.stream_stream_rpc_method_handler(
            act,
            request_deserializer=pb.ActorMessage.FromString,
            response_serializer=pb.LearnerMessage.SerializeToString,
        )
        server.add_generic_rpc_handlers(
            [grpc.method_handlers_generic_handler("seedbed.v1.Learner", {"Act": handler})]
        )
        server.start()
    try:
        yield addresses
    finally:
        for server in servers:
            server.stop(0)


@pytest.mark.parametrize(
    ("targets", "reason"),
    [
        (["{self}"], "in a loop"),
        (["{next}", "{next}"], "in a loop"),
        (["{next}"] * (MAX_REDIRECTS + 2), f"more than {MAX_REDIRECTS} times"),
        (["nonsense"], "not HOST:PORT or unix:PATH"),
        (["127.0.0.1:99999"], "not HOST:PORT or unix:PATH"),
        (["unix:/tmp/seedbed-elsewhere.sock"], "not the kind of address the actor dialed"),
        (["h" * 2000 + ":1"], "longer than any address"),
    ],
    ids=["to-itself", "a-to-b-to-a", "too-many-hops", "no-port", "bad-port", "unix", "long"],
)
def test_an_actor_refuses_a_bad_or_looping_redirect_in_one_line(targets, reason, no_leaks):
    with redirecting(*targets) as addresses, pytest.raises(Refused, match=reason) as refused:
        GrpcActorClient(addresses[0], token=TOKEN, timeout_s=5)
    assert "\n" not in str(refused.value) and len(str(refused.value)) < 600


@pytest.mark.parametrize(
    ("dialed", "sent", "want"),
    [
        ("learner.example:7000", "0.0.0.0:41000", "learner.example:41000"),
        ("[::1]:7000", "[::]:41000", "[::1]:41000"),
        ("10.0.0.5:7000", "10.0.0.6:41000", "10.0.0.6:41000"),  # replicas on other hosts
        ("unix:/run/l.sock", "unix:/run/l.sock.replica-1", "unix:/run/l.sock.replica-1"),
    ],
)
def test_a_wildcard_host_in_a_redirect_is_the_host_the_actor_dialed(dialed, sent, want):
    assert redirect_target(dialed, sent) == want
