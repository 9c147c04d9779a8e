"""Remote actors: actors on other machines, one bidirectional stream each, as in SEED RL, over
gRPC or over the socket wire (``framing``: the same messages on a plain socket, ``--wire socket``).

``wire`` is what crosses the network (``../proto/actor.proto``, arrays as raw bytes with dtype
and shape, the ``Assignment``) and the secrets that guard it; ``gateway`` the learner's listener,
which bridges each remote actor into a slot of the learner's server transport; ``client`` the
actor's end of the stream (``seedbed actor``); ``placement`` which replica a replicated learner's
front door gives a new actor. The learner's side::

    token, _ = run_token(run_dir)    # where no --token-file was given: every listener has one
    gateway = ActorGateway(address, slots, connect, assign, token, tls, board)
    gateway.start()                  # remote actors now share the inference batches
    ...train...
    gateway.stop()                   # every actor is told that training is over

``gateway_process`` runs the same gateway in K processes on one port (``GatewayProcesses``,
``--gateways K``), writing into the shared-memory transport's rows as local actors do.

A remote actor's side::

    client = open_client(address, wire, token=token, tls_ca=tls_ca)  # hello; .assignment
    actions = client.call(obs, reward, done, truncated)  # per step, as over any ActorTransport
    client.close()
"""

from __future__ import annotations

from seedbed.transport.remote.client import (
    MAX_REDIRECTS,
    GrpcActorClient,
    LearnerStopped,
    Refused,
    SocketActorClient,
    StreamBoard,
    open_client,
)
from seedbed.transport.remote.gateway import HELLO_TIMEOUT_S, MAX_PENDING_HELLOS, ActorGateway
from seedbed.transport.remote.placement import Placement
from seedbed.transport.remote.wire import (
    METHOD,
    PROTOCOL,
    Assignment,
    from_wire,
    read_secret,
    run_token,
    to_wire,
)

__all__ = [
    "HELLO_TIMEOUT_S",
    "MAX_PENDING_HELLOS",
    "MAX_REDIRECTS",
    "METHOD",
    "PROTOCOL",
    "ActorGateway",
    "Assignment",
    "GrpcActorClient",
    "LearnerStopped",
    "Placement",
    "Refused",
    "SocketActorClient",
    "StreamBoard",
    "from_wire",
    "open_client",
    "read_secret",
    "run_token",
    "to_wire",
]
