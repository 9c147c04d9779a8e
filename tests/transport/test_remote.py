"""Remote actors over gRPC and over the socket wire: a real gateway on 127.0.0.1 in front of
the real shared-memory transport, answered by a thread that plays central inference with known
actions. Tests marked ``each_wire`` run over both wires; the rest are gRPC's own."""

from __future__ import annotations

import asyncio
import datetime
import functools
import gc
import ipaddress
import logging
import multiprocessing
import os
import re
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import grpc
import numpy as np
import psutil
import pytest

from seedbed.errors import SeedbedError
from seedbed.transport.proto import actor_pb2 as pb
from seedbed.transport.remote import (
    METHOD,
    PROTOCOL,
    ActorGateway,
    Assignment,
    GrpcActorClient,
    Refused,
)
from seedbed.transport.remote.client import open_client
from seedbed.transport.remote.gateway_process import GatewayProcesses
from seedbed.transport.shm import SharedMemoryServer

ENVS, OBS = 3, (4,)
TOKEN = b"s3cret"  # every listener needs one, loopback and Unix sockets included


#: Parametrize a test over the gateway in this process (1) and in two processes (2).
each_gateway = pytest.mark.parametrize("gateways", [1, 2], ids=["in-process", "2-processes"])
#: Parametrize a test over the wires; ``Learner(wire=...)`` and ``connect`` take it.
each_wire = pytest.mark.parametrize("wire", ["grpc", "socket"])


class Learner:
    """A gateway with two slots over a shared-memory server; actions are env_id * 10 + t, or
    with ``action_shape`` float32 vectors of that plus 0.5, 1.0, ... (continuous actions).
    ``gateways``: 1, an ``ActorGateway`` in this process; more, ``GatewayProcesses``.
    ``gateway_options`` go to the gateway as they are."""

    def __init__(
        self,
        token: bytes = TOKEN,
        tls=None,
        address: str = "127.0.0.1:0",
        action_shape: tuple = (),
        gateways: int = 1,
        wire: str = "grpc",
        **gateway_options,
    ):
        dtype = "float32" if action_shape else "int64"
        self.action_shape, self.wire = action_shape, wire
        self.server = SharedMemoryServer(
            2, ENVS, OBS, "float32", multiprocessing.get_context(), action_shape, dtype
        )

        def assign(slot: int, n: int) -> Assignment:
            return Assignment("CartPole-v1", ENVS, n, None, slot, "<f4", OBS, dtype, action_shape)

        if gateways > 1:
            self.gateway = GatewayProcesses(
                gateways,
                address,
                [0, 1],
                self.server,
                assign,
                token,
                tls,
                wire=wire,
                **gateway_options,
            )
        else:
            self.gateway = ActorGateway(
                address,
                [0, 1],
                functools.partial(self.server.connect, in_process=True),
                assign,
                token=token,
                tls=tls,
                wire=wire,
                **gateway_options,
            )
        self.run_ids: dict[int, set[int]] = {0: set(), 1: set()}
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._answer, daemon=True)
        self._thread.start()
        self.gateway.start()

    def _answer(self) -> None:
        while not self._stop.is_set():
            request = self.server.recv(2 * ENVS, 0.001)
            if request is None:
                continue
            for env, run in zip(request.env_ids, request.run_id, strict=True):
                self.run_ids[int(env) // ENVS].add(int(run))
            self.server.send(
                request, known_actions(request.env_ids, request.reward, self.action_shape)
            )

    def close(self) -> None:
        self._stop.set()
        self._thread.join()
        self.server.close()
        self.gateway.stop(0)


@pytest.fixture
def learner(no_leaks):
    """Learners made in a test; closed after it, before the leak check."""
    made = []

    def make(**kwargs) -> Learner:
        made.append(Learner(**kwargs))
        return made[-1]

    yield make
    for one in made:
        one.close()


def known_actions(env_ids: np.ndarray, t: np.ndarray, action_shape: tuple = ()) -> np.ndarray:
    base = env_ids * 10 + t.astype(np.int64)
    if not action_shape:
        return base
    fractions = (np.arange(int(np.prod(action_shape))) + 1) / 2.0
    return (base[:, None] + fractions).reshape(-1, *action_shape).astype(np.float32)


def settle(lr: Learner) -> None:
    """Let gateway processes' refusals and log lines reach this process (the in-process
    gateway's are here already)."""
    if isinstance(lr.gateway, GatewayProcesses):
        lr.gateway.sync()


def connect(lr: Learner, **options):
    """A client of the learner's wire at its gateway's address."""
    return open_client(lr.gateway.address, lr.wire, **options)


def steps(client: GrpcActorClient, n: int, t0: int = 0) -> None:
    """``n`` calls whose answers must be exactly the known actions of the client's slot."""
    env_ids = client.assignment.slot * ENVS + np.arange(ENVS)
    done = np.zeros(ENVS, bool)
    shape = client.assignment.action_shape
    for t in range(t0, t0 + n):
        obs = np.full((ENVS, *OBS), t, np.float32)
        actions = client.call(obs, np.full(ENVS, t, np.float32), done, done)
        want = known_actions(env_ids, np.full(ENVS, t), shape)
        assert actions.dtype == want.dtype
        np.testing.assert_array_equal(actions, want)


@each_wire
@each_gateway
def test_steps_round_trip_and_a_reconnect_is_a_new_run(learner, gateways, wire):
    lr = learner(gateways=gateways, wire=wire)
    first = connect(lr, token=TOKEN)
    assert first.assignment.env_id == "CartPole-v1" and first.assignment.num_envs == ENVS
    steps(first, 20)
    first.close()
    second = connect(lr, token=TOKEN)  # the freed slot, a new run id
    steps(second, 5)
    second.close()
    slot = second.assignment.slot
    assert len(lr.run_ids[slot]) == 1 + (slot == first.assignment.slot)
    assert lr.gateway.connections == 2


@each_wire
def test_continuous_actions_travel_as_float32_vectors(learner, wire):
    lr = learner(action_shape=(2,), wire=wire)
    client = connect(lr, token=TOKEN)
    assert client.assignment.action_dtype == "float32"
    assert client.assignment.action_shape == (2,)
    steps(client, 10)
    client.close()


@each_wire
@each_gateway
def test_all_slots_taken_refuses_the_next_actor(learner, gateways, wire):
    lr = learner(gateways=gateways, wire=wire)
    clients = [connect(lr, token=TOKEN) for _ in range(2)]
    with pytest.raises(ConnectionError, match="slots are taken"):
        connect(lr, token=TOKEN)
    for c in clients:
        c.close()


@each_wire
@each_gateway
@pytest.mark.parametrize("sent", [None, b"not-the-token"], ids=["missing", "wrong"])
def test_a_client_without_the_right_token_is_refused(learner, sent, gateways, wire):
    lr = learner(token=b"s3cret\n", gateways=gateways, wire=wire)
    with pytest.raises(Refused, match="token"):
        connect(lr, token=sent)
    good = connect(lr, token=TOKEN)
    steps(good, 3)
    good.close()
    settle(lr)
    assert len(lr.gateway.rejected) == 1 and lr.gateway.rejected_total == 1


@pytest.mark.parametrize("token", [None, b"", b" \n"], ids=["none", "empty", "blank"])
def test_every_listener_needs_a_token(token):
    with pytest.raises(ValueError, match="needs a token"):
        ActorGateway("127.0.0.1:0", [0], lambda s: None, lambda s, n: None, token=token)


def test_an_error_that_ends_the_gateways_loop_is_reported_and_it_still_stops():
    failures: list[BaseException] = []
    nothing = (lambda s: None, lambda s, n: None)  # no actor connects in this test
    gateway = ActorGateway("127.0.0.1:0", [0], *nothing, token=b"t", on_failure=failures.append)
    gateway.start()

    def fail() -> None:
        raise SystemExit("the loop's end")  # what no handler catches: it ends run_forever

    gateway._loop.call_soon_threadsafe(fail)  # the fault, injected into the real loop
    gateway._thread.join(timeout=10)
    assert not gateway._thread.is_alive()
    assert isinstance(gateway.error, SystemExit) and failures == [gateway.error]
    started = time.monotonic()
    gateway.stop()  # at the run's end: no wait on a loop that runs nothing more
    assert time.monotonic() - started < 5


@pytest.mark.parametrize("wire", ["grpc", "socket"])
def test_a_stopping_gateway_unwinds_what_its_stop_left_pending(caplog, wire):
    nothing = (lambda s: None, lambda s, n: None)  # no actor connects in this test
    gateway = ActorGateway("127.0.0.1:0", [0], *nothing, token=b"t", wire=wire)
    gateway.start()

    async def pending() -> None:
        # What an RPC whose actor vanished as the server stopped may leave: a task waiting
        # on a task, on a future still open when the loop is told to end.
        never = asyncio.get_running_loop().create_future()

        async def waiting() -> None:
            await never

        asyncio.ensure_future(asyncio.ensure_future(waiting()))

    asyncio.run_coroutine_threadsafe(pending(), gateway._loop).result(5)
    with caplog.at_level(logging.ERROR, logger="asyncio"):
        gateway.stop(0)
        gc.collect()  # a task destroyed pending logs here
    assert not [r for r in caplog.records if r.name == "asyncio"], caplog.text


@pytest.mark.parametrize("unix", [False, True], ids=["loopback", "unix-socket"])
def test_loopback_and_unix_sockets_refuse_a_client_without_the_token(learner, tmp_path, unix):
    lr = learner(address=f"unix:{tmp_path}/l.sock" if unix else "127.0.0.1:0")
    with pytest.raises(Refused, match="token"):
        GrpcActorClient(lr.gateway.address)


def _raw_stream(address: str, *messages: bytes):
    """Send ``messages`` as they are on one stream; return the status it ended with."""
    channel = grpc.insecure_channel(address)
    act = channel.stream_stream(METHOD, request_serializer=None, response_deserializer=None)
    try:
        list(act(iter(messages), timeout=10, metadata=[("authorization", "Bearer s3cret")]))
        return None
    except grpc.RpcError as e:
        return e.code(), e.details()
    finally:
        channel.close()


def _hello() -> bytes:
    return pb.ActorMessage(hello=pb.Hello(protocol=PROTOCOL)).SerializeToString()


def _step(shape, data: bytes) -> bytes:
    obs = pb.Array(dtype="<f4", shape=shape, data=data)
    return pb.ActorMessage(step=pb.Step(obs=obs)).SerializeToString()


def _step_with_done(done: bytes) -> bytes:
    """A step of the right shapes whose ``done`` carries ``done`` as its bytes."""
    step = pb.Step(
        obs=pb.Array(dtype="<f4", shape=[ENVS, *OBS], data=bytes(4 * ENVS * 4)),
        reward=pb.Array(dtype="<f4", shape=[ENVS], data=bytes(4 * ENVS)),
        done=pb.Array(dtype="|b1", shape=[ENVS], data=done),
        truncated=pb.Array(dtype="|b1", shape=[ENVS], data=bytes(ENVS)),
    )
    return pb.ActorMessage(step=step).SerializeToString()


@pytest.mark.parametrize(
    ("messages", "reason"),
    [
        ([b"\xff\xff\xff not protobuf"], "malformed message"),
        ([_hello(), _step([2, 4], bytes(32))], "obs is <f4 \\(2, 4\\), expected <f4 \\(3, 4\\)"),
        ([_hello(), _step([3, 4], bytes(47))], "carries 47 bytes"),
        ([_hello(), _step([3, 4], bytes(200_000))], "over this run's .*-byte limit"),
        ([pb.ActorMessage(hello=pb.Hello(protocol=99)).SerializeToString()], "protocol 99"),
        ([_hello(), _step_with_done(b"\x00\x02\x01")], "done holds bytes other than 0 and 1"),
    ],
    ids=["garbage", "wrong-shape", "short-data", "oversized", "old-protocol", "bool-byte-2"],
)
@each_gateway
def test_a_bad_message_is_refused_and_everyone_else_is_still_served(
    learner, messages, reason, caplog, gateways
):
    lr = learner(gateways=gateways)
    good = GrpcActorClient(lr.gateway.address, token=TOKEN)
    steps(good, 3)
    with caplog.at_level(logging.WARNING, logger="seedbed.transport.remote"):
        code, details = _raw_stream(lr.gateway.address, *messages)
        settle(lr)
    assert code in (grpc.StatusCode.INVALID_ARGUMENT, grpc.StatusCode.FAILED_PRECONDITION)
    assert re.search(reason, details), details
    assert any("refused actor" in r.getMessage() for r in caplog.records)
    steps(good, 3, t0=3)  # the well-behaved actor never noticed
    good.close()


@each_gateway
def test_an_actors_name_is_logged_printable_and_bounded(learner, caplog, gateways):
    lr = learner(gateways=gateways)
    name = "evil\nINFO forged line\x1b[31m" + "x" * 10_000
    hello = pb.ActorMessage(hello=pb.Hello(protocol=PROTOCOL, actor_name=name))
    with caplog.at_level(logging.INFO, logger="seedbed.transport.remote"):
        _raw_stream(lr.gateway.address, hello.SerializeToString())
        settle(lr)
    lines = [r.getMessage() for r in caplog.records if "connected to slot" in r.getMessage()]
    assert len(lines) == 1, lines
    assert "\n" not in lines[0] and "\x1b" not in lines[0] and len(lines[0]) < 200
    assert lines[0].startswith("actor evil?INFO forged line?[31mxxx")


def _self_signed() -> tuple[bytes, bytes]:
    """A certificate for localhost and 127.0.0.1, and its key, as PEM."""
    from cryptography import x509
    from cryptography.hazmat.primitives import hashes, serialization
    from cryptography.hazmat.primitives.asymmetric import ec
    from cryptography.x509.oid import NameOID

    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = datetime.datetime.now(datetime.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - datetime.timedelta(minutes=1))
        .not_valid_after(now + datetime.timedelta(days=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    key_pem = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )
    return cert.public_bytes(serialization.Encoding.PEM), key_pem


@each_wire
@each_gateway
def test_tls_with_a_self_signed_certificate(learner, gateways, wire):
    cert, key = _self_signed()
    lr = learner(tls=(cert, key), token=b"tok", gateways=gateways, wire=wire)
    client = connect(lr, token=b"tok", tls_ca=cert)
    steps(client, 5)
    client.close()
    # Plaintext cannot talk to TLS: gRPC cannot reach it; on the socket wire the TLS end
    # reads no preamble, and the actor's hello finds the connection closed.
    with pytest.raises(ConnectionError, match="cannot reach|closed the connection"):
        connect(lr, token=b"tok", timeout_s=2)


@each_wire
def test_unix_socket(learner, tmp_path, wire):
    lr = learner(address=f"unix:{tmp_path}/learner.sock", wire=wire)
    client = connect(lr, token=TOKEN)
    steps(client, 5)
    client.close()


@each_wire
@each_gateway
def test_local_actors_send_what_they_acted_and_get_each_newer_policy(no_leaks, gateways, wire):
    """Local inference over either wire: steps carry the acted fields into shared memory; the policy
    comes with the assignment and again before the answer once the learner posts a newer one."""
    from seedbed.transport.board import SharedMemoryBoard

    acted_fields = (("action", (), "int64"), ("version", (), "int64"), ("logits", (2,), "<f4"))
    server = SharedMemoryServer(
        2, ENVS, OBS, "float32", multiprocessing.get_context(), acted=acted_fields
    )
    board = SharedMemoryBoard(64)
    board.post(b"policy one", 1)
    local = {"agent": "vtrace", "agent_config": {}, "num_envs": 2 * ENVS, "first_env": 0}
    local["acted"] = [list(f) for f in acted_fields]

    def assign(slot: int, n: int) -> Assignment:
        return Assignment("CartPole-v1", ENVS, n, None, slot, "<f4", OBS, local=local)

    if gateways > 1:  # the processes read the shared-memory board themselves
        gateway = GatewayProcesses(
            gateways, "127.0.0.1:0", [0, 1], server, assign, TOKEN, board=board.handle, wire=wire
        )
    else:
        connect = functools.partial(server.connect, in_process=True)
        gateway = ActorGateway(
            "127.0.0.1:0", [0, 1], connect, assign, token=TOKEN, board=board.handle, wire=wire
        )
    received, stop = [], threading.Event()

    def answer() -> None:
        while not stop.is_set():
            request = server.recv(2 * ENVS, 0.001)
            if request is not None:
                received.append({k: v.copy() for k, v in request.acted.items()})
                server.send(request, request.acted["action"])

    thread = threading.Thread(target=answer, daemon=True)
    thread.start()
    gateway.start()
    client = None
    try:
        client = open_client(gateway.address, wire, token=TOKEN)
        assert client.assignment.local["first_env"] == 0
        assert client.board.read(-1) == (b"policy one", 1) and client.board.read(1) is None
        obs, zeros = np.zeros((ENVS, *OBS), np.float32), np.zeros(ENVS, bool)
        for t in range(3):
            acted = {
                "action": np.arange(ENVS) + t,
                "version": np.full(ENVS, 1),
                "logits": np.full((ENVS, 2), t, np.float32),
            }
            if t == 2:
                board.post(b"policy two", 2)
            assert client.call(obs, zeros.astype(np.float32), zeros, zeros, acted).tolist() == (
                acted["action"].tolist()
            )
            assert received[-1]["logits"].tolist() == acted["logits"].tolist()
        assert client.board.read(1) == (b"policy two", 2)
        with pytest.raises(Refused, match="bad step: acted fields"):
            client.call(obs, zeros.astype(np.float32), zeros, zeros)  # nothing acted
    finally:
        if client is not None:
            client.close()
        stop.set()
        thread.join()
        server.close()
        gateway.stop(0)
        board.close()


def test_both_gateway_processes_serve_and_the_learner_keeps_the_slots(learner):
    """Connections spread over the processes (the kernel deals them); wherever an actor lands
    it gets one of the learner's slots, and its steps reach the same rows."""
    lr = learner(gateways=2)
    tries = 0
    while min(lr.gateway.served) == 0 and tries < 40:  # all 40 in one process: 2**-39
        client = GrpcActorClient(lr.gateway.address, token=TOKEN)
        steps(client, 3)
        client.close()
        tries += 1
    assert min(lr.gateway.served) > 0 and sum(lr.gateway.served) == tries
    held = [GrpcActorClient(lr.gateway.address, token=TOKEN) for _ in range(2)]
    assert {c.assignment.slot for c in held} == {0, 1}
    with pytest.raises(ConnectionError, match="slots are taken"):  # in whichever process
        GrpcActorClient(lr.gateway.address, token=TOKEN)
    for i, client in enumerate(held):
        steps(client, 3, t0=i)
        client.close()
    assert lr.gateway.connections == tries + 2


def test_gateway_processes_refuse_a_unix_socket(no_leaks):
    server = SharedMemoryServer(1, ENVS, OBS, "float32", multiprocessing.get_context())
    try:
        with pytest.raises(SeedbedError, match="Unix socket cannot be shared"):
            GatewayProcesses(2, "unix:/tmp/x.sock", [0], server, lambda s, n: None, TOKEN)
    finally:
        server.close()


def test_gateway_processes_refuse_a_port_in_use(no_leaks):
    server = SharedMemoryServer(1, ENVS, OBS, "float32", multiprocessing.get_context())
    taken = socket.create_server(("127.0.0.1", 0))
    try:
        address = f"127.0.0.1:{taken.getsockname()[1]}"
        with pytest.raises(SeedbedError, match="cannot listen there"):
            GatewayProcesses(2, address, [0], server, lambda s, n: None, TOKEN)
    finally:
        taken.close()
        server.close()


def test_a_killed_gateway_process_is_one_line_and_the_rest_stop(learner):
    failures: list[BaseException] = []
    lr = learner(gateways=2, on_failure=failures.append)
    client = GrpcActorClient(lr.gateway.address, token=TOKEN)
    steps(client, 3)
    victim = lr.gateway.pids[1]
    os.kill(victim, signal.SIGKILL)
    deadline = time.monotonic() + 10
    while not failures:
        assert time.monotonic() < deadline, "the dead gateway process went unnoticed"
        time.sleep(0.05)
    (error,) = failures
    assert str(error).startswith(f"gateway process 1 (pid {victim}) exited with code -9")
    assert "\n" not in str(error)
    client.close()
    started = time.monotonic()
    lr.close()  # the other process stops; no_leaks finds none left
    assert time.monotonic() - started < 15


_ORPHANED = """
import os, sys, time
sys.path.insert(0, {root!r})
from tests.transport.test_remote import Learner
if __name__ == "__main__":
    lr = Learner(gateways=2)
    print(*lr.gateway.pids, flush=True)
    time.sleep(600)
"""


def test_gateway_processes_never_outlive_their_learner(tmp_path, no_leaks):
    script = tmp_path / "learner.py"
    script.write_text(_ORPHANED.format(root=str(Path(__file__).resolve().parents[2])))
    proc = subprocess.Popen([sys.executable, str(script)], stdout=subprocess.PIPE, text=True)
    try:
        pids = [int(p) for p in proc.stdout.readline().split()]
        assert len(pids) == 2
    finally:
        proc.kill()  # no goodbye: the learner is gone at once
        proc.wait()
    _, alive = psutil.wait_procs([psutil.Process(p) for p in pids if psutil.pid_exists(p)], 10)
    assert not alive, f"gateway processes outlived their learner: {[p.pid for p in alive]}"
