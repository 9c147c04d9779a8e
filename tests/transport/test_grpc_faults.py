"""Faults on the gRPC listener: streams that never authenticate or never say hello, slow-loris
connections and connections cut mid-message, against a real gateway on 127.0.0.1 (the
``learner`` of test_remote), with real actors that must be served all the while."""

from __future__ import annotations

import contextlib
import logging
import socket
import subprocess
import sys
import threading
import time

import grpc
import numpy as np
import pytest

from seedbed.transport.checks import REFUSED_IN_A_ROW
from seedbed.transport.remote import MAX_PENDING_HELLOS, METHOD, GrpcActorClient, Refused
from tests.transport import test_remote
from tests.transport.idle_connections import IdleConnections
from tests.transport.test_remote import ENVS, OBS, TOKEN, each_gateway, settle, steps

pytestmark = pytest.mark.faults
learner = test_remote.learner  # the fixture: a real gateway over real shared memory

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"  # what every HTTP/2 client sends first


class SilentStreams:
    """``n`` streams on one channel that open (with ``token``, if given) and send nothing."""

    def __init__(self, address: str, n: int, token: bytes | None = None) -> None:
        self._quiet = threading.Event()
        self._channel = grpc.insecure_channel(address)
        grpc.channel_ready_future(self._channel).result(timeout=10)
        act = self._channel.stream_stream(
            METHOD, request_serializer=None, response_deserializer=None
        )
        metadata = [("authorization", f"Bearer {token.decode()}")] if token else None
        self.calls = [act(self._nothing(), metadata=metadata) for _ in range(n)]

    def _nothing(self):
        self._quiet.wait()
        yield from ()

    def open(self) -> int:
        return sum(not call.done() for call in self.calls)

    def ended(self, within_s: float) -> list[tuple[grpc.StatusCode, str]]:
        """Every stream's status and details, once all have ended; fails past ``within_s``."""
        deadline = time.monotonic() + within_s
        for call in self.calls:
            try:
                call.exception(timeout=max(0.0, deadline - time.monotonic()))
            except grpc.FutureTimeoutError:
                pytest.fail(f"{self.open()} of {len(self.calls)} silent streams still open")
        return [(call.code(), call.details()) for call in self.calls]

    def close(self) -> None:
        self._quiet.set()
        self._channel.close()


@each_gateway
def test_silent_streams_without_the_token_hold_nothing(learner, caplog, gateways):
    lr = learner(token=TOKEN, gateways=gateways)
    with caplog.at_level(logging.WARNING, logger="seedbed.transport.remote"):
        silent = SilentStreams(lr.gateway.address, 50)
        try:
            time.sleep(0.2)  # all 50 reach the gateway first
            client = GrpcActorClient(lr.gateway.address, token=TOKEN)
            steps(client, 5)
            client.close()
            ended = silent.ended(within_s=5)
            settle(lr)
        finally:
            silent.close()
    assert {code for code, _ in ended} == {grpc.StatusCode.UNAUTHENTICATED}
    assert lr.gateway.rejected_total == 50
    warned = [r.getMessage() for r in caplog.records if "refused" in r.getMessage()]
    assert len(warned) == 1 and "token" in warned[0], warned  # the other 49 are counted


@each_gateway
def test_an_actor_with_a_wrong_token_always_reads_why(learner, gateways):
    """Refused at once, while its hello is in flight, an actor would often read INTERNAL."""
    lr = learner(token=TOKEN, gateways=gateways)
    for attempt in range(30):
        with pytest.raises(Refused, match="wrong token"):
            GrpcActorClient(lr.gateway.address, token=b"wrong" if attempt % 2 else None)


@each_gateway
def test_streams_that_never_say_hello_are_closed_after_the_timeout(learner, gateways):
    token = TOKEN
    lr = learner(hello_timeout_s=0.5, gateways=gateways)
    silent = SilentStreams(lr.gateway.address, 40, token)
    try:
        time.sleep(0.1)
        client = GrpcActorClient(lr.gateway.address, token=token)  # while the 40 wait
        steps(client, 5)
        ended = silent.ended(within_s=5)
        steps(client, 5, t0=5)
        client.close()
    finally:
        silent.close()
    assert set(ended) == {(grpc.StatusCode.DEADLINE_EXCEEDED, "no hello within 0.5 s")}


@each_gateway
def test_streams_past_the_pending_cap_are_refused_at_once_in_our_words(learner, gateways):
    lr = learner(hello_timeout_s=2.0, gateways=gateways)  # the cap holds per process
    extra = 6
    silent = SilentStreams(lr.gateway.address, MAX_PENDING_HELLOS + extra, TOKEN)
    try:
        deadline = time.monotonic() + 1.5  # well before the first hello is due
        while silent.open() > MAX_PENDING_HELLOS and time.monotonic() < deadline:
            time.sleep(0.02)
        refused = [call for call in silent.calls if call.done()]
        assert len(refused) == extra
        assert {c.code() for c in refused} == {grpc.StatusCode.RESOURCE_EXHAUSTED}
        assert all("waiting to say hello" in c.details() for c in refused)  # not gRPC's cap
        ended = silent.ended(within_s=5)
    finally:
        silent.close()
    waited = [e for e in ended if e[0] == grpc.StatusCode.DEADLINE_EXCEEDED]
    assert len(waited) == MAX_PENDING_HELLOS
    client = GrpcActorClient(lr.gateway.address, token=TOKEN)
    steps(client, 3)
    client.close()


def _drip(sockets: list[socket.socket], data: bytes, stop: threading.Event) -> None:
    """Send ``data`` a byte at a time to each socket, slowly, until the peer drops it."""
    for byte in data:
        for s in sockets:
            with contextlib.suppress(OSError):
                s.send(bytes([byte]))
        if stop.wait(0.05):
            return


def _hung_up(sock: socket.socket, within_s: float) -> bool:
    """Whether the peer closes ``sock`` in time (whatever it says before: gRPC says goodbye)."""
    sock.settimeout(within_s)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        pass
    except TimeoutError:
        return False
    return True


def test_slow_loris_connections_are_dropped_and_actors_served(learner):
    lr = learner(hello_timeout_s=0.5)
    host, port = lr.gateway.address.rsplit(":", 1)
    loris = [socket.create_connection((host, int(port))) for _ in range(4)]
    half_frame = PREFACE + bytes([0, 0, 6, 4, 0])  # the first 5 of a settings frame's 9 bytes
    stop = threading.Event()
    drips = [
        threading.Thread(target=_drip, args=(loris[:2], PREFACE[:-1], stop)),
        threading.Thread(target=_drip, args=(loris[2:], half_frame, stop)),
    ]
    for t in drips:
        t.start()
    silent = SilentStreams(lr.gateway.address, 8, TOKEN)  # more than today's spare 4 places
    try:
        client = GrpcActorClient(lr.gateway.address, token=TOKEN)
        steps(client, 10)
        ended = silent.ended(within_s=5)
        for s in loris:
            assert _hung_up(s, within_s=5)
        steps(client, 5, t0=10)
        client.close()
    finally:
        stop.set()
        for t in drips:
            t.join()
        for s in loris:
            s.close()
        silent.close()
    assert {code for code, _ in ended} == {grpc.StatusCode.DEADLINE_EXCEEDED}


class CuttingProxy:
    """A TCP proxy to ``target``; after ``cut()`` it forwards half of the next chunk the
    client sends (one that holds a whole message, not a lone control frame) and then closes
    both sockets, as a network failing mid-message would."""

    def __init__(self, target: str) -> None:
        host, port = target.rsplit(":", 1)
        self._target = (host, int(port))
        self._listener = socket.create_server(("127.0.0.1", 0))
        self.address = f"127.0.0.1:{self._listener.getsockname()[1]}"
        self._cut, self.was_cut = threading.Event(), threading.Event()
        self._sockets: list[socket.socket] = []
        self._threads = [threading.Thread(target=self._accept, daemon=True)]
        self._threads[0].start()

    def cut(self) -> None:
        self._cut.set()

    def _accept(self) -> None:
        try:
            client, _ = self._listener.accept()
        except OSError:
            return  # closed before anyone came
        upstream = socket.create_connection(self._target)
        self._sockets += [client, upstream]
        for src, dst in ((client, upstream), (upstream, client)):
            thread = threading.Thread(target=self._pump, args=(src, dst), daemon=True)
            self._threads.append(thread)
            thread.start()

    def _pump(self, src: socket.socket, dst: socket.socket) -> None:
        from_client = src is self._sockets[0]
        try:
            while data := src.recv(65536):
                if from_client and self._cut.is_set() and len(data) >= 64:
                    dst.sendall(data[: len(data) // 2])
                    self.was_cut.set()
                    break
                dst.sendall(data)
        except OSError:
            pass
        for s in self._sockets:
            _hang_up(s)

    def close(self) -> None:
        for s in (self._listener, *self._sockets):
            _hang_up(s)
        for t in self._threads:
            t.join(timeout=5)


def _hang_up(sock: socket.socket) -> None:
    """Close ``sock`` now: a plain close waits for a recv blocked on it in another thread."""
    with contextlib.suppress(OSError):
        sock.shutdown(socket.SHUT_RDWR)
    sock.close()


@each_gateway
def test_an_actor_cut_off_mid_message_frees_its_slot(learner, gateways):
    lr = learner(gateways=gateways)
    proxy = CuttingProxy(lr.gateway.address)
    try:
        cut_off = GrpcActorClient(proxy.address, token=TOKEN)
        other = GrpcActorClient(lr.gateway.address, token=TOKEN)  # the two slots are taken
        steps(cut_off, 5)
        steps(other, 5)
        proxy.cut()
        with pytest.raises(ConnectionError):
            steps(cut_off, 1, t0=5)
        assert proxy.was_cut.is_set()
        cut_off.close()
        deadline = time.monotonic() + 5
        while True:  # the gateway notices the lost connection and frees the slot
            try:
                newcomer = GrpcActorClient(lr.gateway.address, token=TOKEN)
                break
            except ConnectionError:
                assert time.monotonic() < deadline, "the cut-off actor's slot was never freed"
                time.sleep(0.1)
        assert newcomer.assignment.slot == cut_off.assignment.slot
        assert lr.gateway.connections == 3
        steps(newcomer, 5)
        steps(other, 5, t0=5)  # never noticed
        newcomer.close()
        other.close()
    finally:
        proxy.close()


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def test_an_actor_with_no_learner_says_one_line_per_attempt():
    address = f"127.0.0.1:{_free_port()}"  # nothing listens there
    done = subprocess.run(
        [sys.executable, "-m", "seedbed", "actor", "--connect", address, "--reconnect-for", "1"],
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert done.returncode == 2
    assert "Traceback" not in done.stderr and "Event loop is closed" not in done.stderr
    *retries, last = done.stderr.strip().splitlines()
    assert retries and all("; retrying in" in line for line in retries), done.stderr
    assert last.startswith(f"seedbed: error: no learner at {address}")
    assert last.endswith("giving up")


def test_idle_connections_are_capped_and_closed_and_actors_served_after(learner):
    """Connections that answer pings and never open a stream: gRPC holds no more than the cap
    (it closes the rest at once) and closes the ones it holds once idle for the timeout."""
    lr = learner(max_connections=8, idle_timeout_s=1.0)
    idle = IdleConnections(lr.gateway.address, 30)
    try:
        idle.poll(0.5)
        assert idle.connected == 30 and idle.open <= 8, (idle.connected, idle.open)
        idle.poll(3.0)
        assert idle.open == 0  # the held ones too: idle past the timeout
    finally:
        idle.close()
    client = GrpcActorClient(lr.gateway.address, token=TOKEN)
    steps(client, 5)
    client.close()


@each_gateway
def test_an_actor_that_keeps_sending_non_finite_steps_is_disconnected(learner, gateways):
    lr = learner(gateways=gateways)
    good = GrpcActorClient(lr.gateway.address, token=TOKEN)
    hostile = GrpcActorClient(lr.gateway.address, token=TOKEN)
    obs, done = np.zeros((ENVS, *OBS), np.float32), np.zeros(ENVS, bool)
    reward, inf = np.zeros(ENVS, np.float32), np.full((ENVS, *OBS), np.inf, np.float32)
    with pytest.raises(Refused, match=f"{REFUSED_IN_A_ROW} steps in a row were refused"):
        for t in range(2 * REFUSED_IN_A_ROW):
            # One finite step starts the count over: an env that is wrong now and then is not
            # sent away (the inference server refuses each of its wrong steps).
            hostile.call(inf if t != REFUSED_IN_A_ROW // 2 else obs, reward, done, done)
            steps(good, 1, t0=t)  # served all the while
    assert t == REFUSED_IN_A_ROW // 2 + REFUSED_IN_A_ROW
    hostile.close()
    assert lr.gateway.disconnected == 1
    steps(good, 3, t0=REFUSED_IN_A_ROW + 1)
    good.close()


def test_one_address_holds_streams_on_a_bounded_number_of_connections(learner):
    lr = learner(hello_timeout_s=3.0)
    cap = lr.gateway.max_per_peer  # the 2 slots and 16 more
    # Each channel its own connection: gRPC shares one between like channels otherwise.
    channels = [
        grpc.insecure_channel(lr.gateway.address, [("grpc.use_local_subchannel_pool", 1)])
        for _ in range(cap + 3)
    ]
    quiet = threading.Event()

    def nothing():
        quiet.wait()
        yield from ()

    metadata = [("authorization", f"Bearer {TOKEN.decode()}")]
    try:
        calls = []
        for channel in channels:
            grpc.channel_ready_future(channel).result(timeout=10)
            act = channel.stream_stream(METHOD)
            calls.append(act(nothing(), metadata=metadata))
            time.sleep(0.01)  # in order: the last ones find the address's connections taken
        deadline = time.monotonic() + 2.0
        while sum(c.done() for c in calls) < 3 and time.monotonic() < deadline:
            time.sleep(0.02)
        refused = [c for c in calls if c.done()]
        assert len(refused) == 3, len(refused)
        assert all(c.code() == grpc.StatusCode.RESOURCE_EXHAUSTED for c in refused)
        assert all(f"on {cap} connections already" in c.details() for c in refused)
    finally:
        quiet.set()
        for channel in channels:
            channel.close()
