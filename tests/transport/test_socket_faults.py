"""Faults on the socket wire's listener: connections that never present the token or never say
hello, floods of them, oversized and cut-off messages, clients of the other wire, against a
real gateway on 127.0.0.1 (the ``learner`` of test_remote, ``wire="socket"``), with real actors
that must be served all the while."""

from __future__ import annotations

import contextlib
import logging
import socket
import struct
import time

import grpc
import numpy as np
import pytest

from seedbed.transport.checks import REFUSED_IN_A_ROW
from seedbed.transport.proto import actor_pb2 as pb
from seedbed.transport.remote import (
    MAX_PENDING_HELLOS,
    PROTOCOL,
    GrpcActorClient,
    Refused,
    SocketActorClient,
)
from seedbed.transport.remote.framing import MAGIC
from tests.transport import test_remote
from tests.transport.test_remote import ENVS, OBS, TOKEN, each_gateway, settle, steps

pytestmark = pytest.mark.faults
learner = test_remote.learner  # the fixture: a real gateway over real shared memory


def frame(payload: bytes) -> bytes:
    return struct.pack("<I", len(payload)) + payload


class Raw:
    """A hand-driven connection to a socket-wire gateway: sends what a test says, reads the
    learner's frames."""

    def __init__(self, address: str) -> None:
        host, port = address.rsplit(":", 1)
        self.sock = socket.create_connection((host, int(port)), timeout=10)

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def token(self, token: bytes = TOKEN) -> Raw:
        self.send(frame(MAGIC + token))
        return self

    def hello(self) -> pb.LearnerMessage:
        hello = pb.Hello(protocol=PROTOCOL, actor_name="raw")
        self.send(frame(pb.ActorMessage(hello=hello).SerializeToString()))
        return self.read()

    def read(self, timeout_s: float = 10.0) -> pb.LearnerMessage | None:
        """The learner's next message; None once it has closed the connection."""
        self.sock.settimeout(timeout_s)
        header = self._exactly(4)
        if header is None:
            return None
        body = self._exactly(struct.unpack("<I", header)[0])
        return None if body is None else pb.LearnerMessage.FromString(body)

    def stop(self, timeout_s: float = 10.0) -> tuple[grpc.StatusCode, str]:
        """The Stop the learner ends the stream with, then checks that it closed."""
        message = self.read(timeout_s)
        assert message is not None and message.WhichOneof("kind") == "stop", message
        assert self.read(timeout_s) is None  # and the connection closes
        codes = {code.value[0]: code for code in grpc.StatusCode}
        return codes[message.stop.status], message.stop.reason

    def _exactly(self, n: int) -> bytes | None:
        data = b""
        while len(data) < n:
            try:
                chunk = self.sock.recv(n - len(data))
            except ConnectionResetError:
                return None
            if not chunk:
                return None
            data += chunk
        return data

    def close(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_RDWR)
        self.sock.close()


def socket_learner(learner, **options):
    return learner(wire="socket", **options)


@each_gateway
def test_connections_without_the_token_hold_nothing(learner, caplog, gateways):
    lr = socket_learner(learner, hello_timeout_s=0.5, gateways=gateways)
    with caplog.at_level(logging.WARNING, logger="seedbed.transport.remote"):
        silent = [Raw(lr.gateway.address) for _ in range(50)]
        try:
            time.sleep(0.1)  # all 50 reach the gateway first
            client = SocketActorClient(lr.gateway.address, token=TOKEN)
            steps(client, 5)
            ended = {raw.stop() for raw in silent}
            steps(client, 5, t0=5)
            client.close()
            settle(lr)
        finally:
            for raw in silent:
                raw.close()
    assert ended == {(grpc.StatusCode.DEADLINE_EXCEEDED, "no token within 0.5 s")}
    assert lr.gateway.rejected_total == 50
    warned = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    # One warning per process (the kernel deals the connections among them); the rest counted.
    assert 1 <= len(warned) <= gateways and all("no token" in w for w in warned), warned


@each_gateway
def test_an_actor_with_a_wrong_token_always_reads_why(learner, gateways):
    lr = socket_learner(learner, gateways=gateways)
    for attempt in range(30):
        with pytest.raises(Refused, match="wrong token"):
            SocketActorClient(lr.gateway.address, token=b"wrong" if attempt % 2 else None)


@each_gateway
def test_streams_that_never_say_hello_are_closed_after_the_timeout(learner, gateways):
    lr = socket_learner(learner, hello_timeout_s=0.5, gateways=gateways)
    # Each stream is a connection on this wire: one address holds at most max_per_peer.
    silent = [Raw(lr.gateway.address).token() for _ in range(12)]
    try:
        time.sleep(0.1)
        client = SocketActorClient(lr.gateway.address, token=TOKEN)  # while the 40 wait
        steps(client, 5)
        ended = {raw.stop() for raw in silent}
        steps(client, 5, t0=5)
        client.close()
    finally:
        for raw in silent:
            raw.close()
    assert ended == {(grpc.StatusCode.DEADLINE_EXCEEDED, "no hello within 0.5 s")}


def test_streams_past_the_pending_cap_are_refused_at_once_in_our_words(learner):
    lr = socket_learner(learner, hello_timeout_s=2.0)
    lr.gateway.max_per_peer = 10 * MAX_PENDING_HELLOS  # as if they came from many machines
    extra = 6
    waiting = [Raw(lr.gateway.address).token() for _ in range(MAX_PENDING_HELLOS + extra)]
    try:
        started = time.monotonic()
        ended = [raw.stop() for raw in waiting]
    finally:
        for raw in waiting:
            raw.close()
    refused = [e for e in ended if e[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert len(refused) == extra
    assert all("waiting to say hello" in reason for _, reason in refused)
    waited = [e for e in ended if e[0] == grpc.StatusCode.DEADLINE_EXCEEDED]
    assert len(waited) == MAX_PENDING_HELLOS and time.monotonic() - started >= 1.5
    client = SocketActorClient(lr.gateway.address, token=TOKEN)
    steps(client, 3)
    client.close()


@each_gateway
def test_an_oversized_message_is_refused_before_it_is_read(learner, gateways):
    lr = socket_learner(learner, gateways=gateways)
    raw = Raw(lr.gateway.address).token()
    try:
        assert raw.hello().WhichOneof("kind") == "assignment"
        raw.send(struct.pack("<I", 100 * 2**20))  # 100 MiB announced; none of it sent
        code, reason = raw.stop()
    finally:
        raw.close()
    assert code == grpc.StatusCode.INVALID_ARGUMENT
    assert f"message of {100 * 2**20} bytes is over this run's" in reason
    clients = [SocketActorClient(lr.gateway.address, token=TOKEN) for _ in range(2)]  # freed
    for client in clients:
        steps(client, 3)
        client.close()


@each_gateway
def test_an_actor_cut_off_mid_message_frees_its_slot(learner, gateways):
    lr = socket_learner(learner, gateways=gateways)
    other = SocketActorClient(lr.gateway.address, token=TOKEN)
    raw = Raw(lr.gateway.address).token()
    assert raw.hello().WhichOneof("kind") == "assignment"  # the second slot
    obs = np.zeros((ENVS, *OBS), np.float32)
    step = pb.Step(obs=pb.Array(dtype="<f4", shape=obs.shape, data=obs.tobytes()))
    whole = frame(pb.ActorMessage(step=step).SerializeToString())
    raw.send(whole[: len(whole) // 2])
    raw.close()
    deadline = time.monotonic() + 5
    while True:  # the gateway notices the lost connection and frees the slot
        try:
            newcomer = SocketActorClient(lr.gateway.address, token=TOKEN)
            break
        except ConnectionError:
            assert time.monotonic() < deadline, "the cut-off actor's slot was never freed"
            time.sleep(0.1)
    steps(newcomer, 5)
    steps(other, 5)  # never noticed
    newcomer.close()
    other.close()


def test_a_client_of_the_other_wire_is_told_which_wire(learner):
    socket_wire = socket_learner(learner)
    with pytest.raises(ConnectionError):
        GrpcActorClient(socket_wire.gateway.address, token=TOKEN, timeout_s=2)
    assert any("start the actor with --wire socket" in r for r in socket_wire.gateway.rejected)
    grpc_wire = learner()
    with pytest.raises((Refused, ConnectionError), match="socket wire|--wire socket"):
        SocketActorClient(grpc_wire.gateway.address, token=TOKEN, timeout_s=2)
    for lr in (socket_wire, grpc_wire):  # both still serve their own
        client = test_remote.connect(lr, token=TOKEN)
        steps(client, 3)
        client.close()


def test_connections_past_the_cap_are_closed_at_once_and_actors_served_after(learner):
    lr = socket_learner(learner, max_connections=4, hello_timeout_s=1.0)
    held = [Raw(lr.gateway.address) for _ in range(4)]
    time.sleep(0.1)
    past = Raw(lr.gateway.address)
    try:
        assert past.read(timeout_s=2) is None  # closed, no word: the cap is a backstop
        ended = {raw.stop() for raw in held}  # the held ones, at their timeout
    finally:
        for raw in [*held, past]:
            raw.close()
    assert ended == {(grpc.StatusCode.DEADLINE_EXCEEDED, "no token within 1 s")}
    client = SocketActorClient(lr.gateway.address, token=TOKEN)
    steps(client, 5)
    client.close()


@each_gateway
def test_an_actor_that_keeps_sending_non_finite_steps_is_disconnected(learner, gateways):
    lr = socket_learner(learner, gateways=gateways)
    good = SocketActorClient(lr.gateway.address, token=TOKEN)
    hostile = SocketActorClient(lr.gateway.address, token=TOKEN)
    done, reward = np.zeros(ENVS, bool), np.zeros(ENVS, np.float32)
    inf = np.full((ENVS, *OBS), np.inf, np.float32)
    with pytest.raises(Refused, match=f"{REFUSED_IN_A_ROW} steps in a row were refused"):
        for t in range(2 * REFUSED_IN_A_ROW):
            hostile.call(inf, reward, done, done)
            steps(good, 1, t0=t)  # served all the while
    hostile.close()
    assert lr.gateway.disconnected == 1
    steps(good, 3, t0=REFUSED_IN_A_ROW + 1)
    good.close()


def test_one_address_holds_streams_on_a_bounded_number_of_connections(learner):
    lr = socket_learner(learner, hello_timeout_s=1.0)
    cap = lr.gateway.max_per_peer  # the 2 slots and 16 more
    raws = [Raw(lr.gateway.address).token() for _ in range(cap + 3)]
    try:
        time.sleep(0.3)
        client = None
        with pytest.raises(ConnectionError, match=f"on {cap} connections already"):
            client = SocketActorClient(lr.gateway.address, token=TOKEN)
        ended = [raw.stop() for raw in raws]
    finally:
        for raw in raws:
            raw.close()
        if client is not None:
            client.close()
    refused = [e for e in ended if e[0] == grpc.StatusCode.RESOURCE_EXHAUSTED]
    assert len(refused) == 3 and all(f"on {cap} connections already" in r for _, r in refused)


def test_a_flood_of_steps_is_answered_one_at_a_time(learner):
    """An actor that sends many steps without waiting gets each answered in turn; the learner
    reads no further ahead than the next one (the rest wait in the sockets' buffers)."""
    lr = socket_learner(learner)
    raw = Raw(lr.gateway.address).token()
    try:
        assert raw.hello().WhichOneof("kind") == "assignment"
        flood = 200
        for t in range(flood):
            obs = np.full((ENVS, *OBS), t, np.float32)
            step = pb.Step(
                obs=pb.Array(dtype="<f4", shape=obs.shape, data=obs.tobytes()),
                reward=pb.Array(dtype="<f4", shape=[ENVS], data=np.full(ENVS, t, "<f4").tobytes()),
                done=pb.Array(dtype="|b1", shape=[ENVS], data=bytes(ENVS)),
                truncated=pb.Array(dtype="|b1", shape=[ENVS], data=bytes(ENVS)),
            )
            raw.send(frame(pb.ActorMessage(step=step).SerializeToString()))
        answers = [raw.read() for _ in range(flood)]
    finally:
        raw.close()
    assert [a.WhichOneof("kind") for a in answers] == ["actions"] * flood
    last = np.frombuffer(answers[-1].actions.data, "<i8")
    assert (last % 10 == (flood - 1) % 10).all()  # known actions: env * 10 + t
