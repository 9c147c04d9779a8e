"""A remote actor's end of its stream to the learner (``seedbed actor --connect``), over gRPC
(``GrpcActorClient``) or the socket wire (``SocketActorClient``, ``framing``); ``open_client``
picks by ``--wire``.

The actor says hello, reads its ``Assignment`` (what to run, in which slot) and then sends one
``Step`` per step of its environments and reads the answer: the actions, or with local inference
a sign that the step was recorded, preceded by any newer policy the learner posted.

A replicated learner's front door may answer the hello with a ``Redirect`` to another replica:
the client then says hello there with the same token, after checking the address as ``--connect``
is checked. It follows at most ``MAX_REDIRECTS`` of them and never one back to where it has been.
"""

from __future__ import annotations

import asyncio
import os
import socket
import ssl
import time
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from seedbed.errors import ConfigError, SeedbedError
from seedbed.transport.address import WILDCARD_HOSTS, check_address
from seedbed.transport.base import ActorTransport
from seedbed.transport.proto import actor_pb2 as pb
from seedbed.transport.remote.framing import MAGIC, FrameSocket, tune
from seedbed.transport.remote.tasks import end_tasks
from seedbed.transport.remote.wire import METHOD, PROTOCOL, Assignment, from_wire, to_wire

_READY_POLL_S = 0.02  # how often an actor looks whether its channel has connected
_CLOSE_WAIT_S = 1.0  # how long a closing actor waits for gRPC to finish its calls
MAX_REDIRECTS = 3  # a front door sends an actor on once; more hops than this are a fault
_MAX_ADDRESS_CHARS = 1024  # a longer redirect address is not one a learner would send
_MAX_MESSAGE = 64 * 1024 * 1024 - 1  # the largest a learner sends: a policy (local inference)
_STATUS = {code.value[0]: code for code in grpc.StatusCode}


class LearnerStopped(ConnectionError):
    """The learner ended the stream on purpose: training is over, do not reconnect."""


class Refused(SeedbedError):
    """The learner refused this actor for a reason retrying cannot fix (token, version)."""


class StreamBoard:
    """A remote actor's policy board (a ``board.BoardReader``, and its own handle): the newest
    policy its stream brought. The first comes with the assignment, later ones before answers."""

    def __init__(self) -> None:
        self._post: tuple[bytes, int] | None = None

    def keep(self, payload: bytes, version: int) -> None:
        """Hold ``payload`` as the newest policy (the client, as a ``Policy`` message comes)."""
        self._post = (payload, version)

    def open(self) -> StreamBoard:
        return self  # the stream fills it; there is nothing to attach to

    def read(self, newer_than: int) -> tuple[bytes, int] | None:
        """The newest policy and its version, if newer than ``newer_than``; else None."""
        if self._post is None or self._post[1] <= newer_than:
            return None
        return self._post

    def close(self) -> None:
        pass  # the stream is the client's to close


def refusal(code: grpc.StatusCode, details: str) -> Exception:
    """The error for a stream the learner ended with ``code``: ``Refused`` where retrying
    cannot help (token, version, a message it rejected), else ConnectionError."""
    if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION):
        return Refused(f"the learner refused this actor: {details}")
    if code == grpc.StatusCode.INVALID_ARGUMENT:
        return Refused(f"the learner rejected a message: {details}")
    return ConnectionError(f"lost the learner ({code.name}: {details})")


class _StreamClient(ActorTransport):
    """An actor's end of one stream: the ``ActorTransport`` that ``act`` calls. What both
    wires share: the hello and its redirects, steps, answers and policies; a wire's subclass
    opens, writes, reads and ends the stream. With local inference, ``board`` holds the
    policies the learner sent.
    """

    def __init__(
        self,
        address: str,
        token: bytes | None = None,
        tls_ca: bytes | None = None,
        name: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        """``timeout_s``: how long to wait for the connection (a refused one fails at once).
        ``address`` is where the actor dials; ``self.address`` where it ended up (another
        replica's gateway, when the front door redirected it)."""
        self.address = address
        try:
            first = self._hello(address, token, tls_ca, name, timeout_s)
        except BaseException:
            self.close()
            raise
        if first.WhichOneof("kind") != "assignment":
            self.close()
            raise ConnectionError(f"the learner answered hello with {first.WhichOneof('kind')}")
        self.assignment = Assignment.from_message(first.assignment)
        self.board = StreamBoard()
        if self.assignment.local is not None:
            self._take(self._receive(), want="policy")  # before the first step

    def _hello(
        self,
        address: str,
        token: bytes | None,
        tls_ca: bytes | None,
        name: str | None,
        timeout_s: float,
    ) -> pb.LearnerMessage:
        """Say hello at ``address`` and return the learner's answer, following its redirects.

        Raises:
            Refused: A redirect to a malformed address, back to one already visited, or one
                more than ``MAX_REDIRECTS``.
        """
        visited = [address]
        while True:
            first = self._open(address, token, tls_ca, name, timeout_s)
            if first.WhichOneof("kind") != "redirect":
                self.address = address
                return first
            target = redirect_target(address, first.redirect.address)
            hops = " -> ".join([*visited, target])
            if target in visited or len(visited) > MAX_REDIRECTS:
                how = "in a loop" if target in visited else f"more than {MAX_REDIRECTS} times"
                raise Refused(
                    f"the learner redirected this actor {how} ({hops}); check that --connect "
                    "names the learner's listen_address"
                )
            visited.append(target)
            self._end_stream()  # this stream has ended
            address = target

    def submit(
        self,
        obs: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        truncated: np.ndarray,
        acted: dict[str, np.ndarray] | None = None,
    ) -> None:
        """Send one step (with local inference, with what the actor ``acted``)."""
        step = pb.Step(
            obs=to_wire(obs),
            reward=to_wire(np.asarray(reward, np.float32)),
            done=to_wire(np.asarray(done, np.bool_)),
            truncated=to_wire(np.asarray(truncated, np.bool_)),
        )
        for name, value in (acted or {}).items():
            step.acted[name].CopyFrom(to_wire(value))
        self._send(pb.ActorMessage(step=step))

    def collect(self) -> np.ndarray:
        """The answer to the last step: its actions (taking any newer policy sent first)."""
        while True:
            reply = self._receive()
            if self._take(reply, want="actions"):
                break
        job = self.assignment
        shape, dtype = (job.num_envs, *job.action_shape), np.dtype(job.action_dtype)
        try:
            return from_wire(reply.actions, "actions", dtype, shape).copy()
        except ValueError as e:
            raise ConnectionError(f"the learner sent malformed actions: {e}") from None

    def _take(self, reply: pb.LearnerMessage, want: str) -> bool:
        """Keep a policy; True when ``reply`` is what is ``want``ed. Raises on a stop."""
        kind = reply.WhichOneof("kind")
        if kind == "stop":
            raise LearnerStopped(reply.stop.reason)
        if kind == "policy" and self.assignment.local is not None:
            self.board.keep(reply.policy.payload, reply.policy.version)
            return want == "policy"
        if kind != want:
            raise ConnectionError(f"the learner sent {kind} where {want} was due")
        return True

    # --- what a wire provides ----------------------------------------------------------------

    def _open(
        self,
        address: str,
        token: bytes | None,
        tls_ca: bytes | None,
        name: str | None,
        timeout_s: float,
    ) -> pb.LearnerMessage:
        """Connect to ``address``, present the token, say hello; the learner's answer."""
        raise NotImplementedError

    def _send(self, message: pb.ActorMessage) -> None:
        raise NotImplementedError

    def _receive(self) -> pb.LearnerMessage:
        raise NotImplementedError

    def _end_stream(self) -> None:
        """End this stream (after a redirect), leaving the client ready to open another."""
        raise NotImplementedError

    def close(self) -> None:
        raise NotImplementedError


class GrpcActorClient(_StreamClient):
    """An actor's stream over gRPC. It drives gRPC's asyncio API from a private event loop in
    the calling thread, so a step's round trip needs no helper threads on the actor's side (the
    threaded API passes each message through two)."""

    def __init__(
        self,
        address: str,
        token: bytes | None = None,
        tls_ca: bytes | None = None,
        name: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._loop = asyncio.new_event_loop()
        self._channel: Any = None
        super().__init__(address, token, tls_ca, name, timeout_s)

    def _run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` to completion, translating gRPC's errors into ours."""
        try:
            return self._loop.run_until_complete(coroutine)
        except grpc.aio.AioRpcError as e:
            raise refusal(e.code(), e.details()) from None

    def _open(self, *args: Any) -> pb.LearnerMessage:
        return self._run(self._open_stream(*args))

    def _send(self, message: pb.ActorMessage) -> None:
        self._run(self._write(message))

    def _receive(self) -> pb.LearnerMessage:
        return self._run(self._read())

    def _end_stream(self) -> None:
        self._loop.run_until_complete(self._channel.close())
        self._channel = None

    async def _open_stream(
        self,
        address: str,
        token: bytes | None,
        tls_ca: bytes | None,
        name: str | None,
        timeout_s: float,
    ) -> pb.LearnerMessage:
        options = [
            # Policies (local inference) are the largest messages a learner sends.
            ("grpc.max_receive_message_length", 64 * 1024 * 1024),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
            # A connection of its own, as an actor on its own machine has: gRPC would otherwise
            # share one among the clients of a process (tests, bench/ingest.py), and every
            # stream would reach one gateway process.
            ("grpc.use_local_subchannel_pool", 1),
        ]
        if tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=tls_ca)
            self._channel = grpc.aio.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.aio.insecure_channel(address, options=options)
        await _until_ready(self._channel, address, timeout_s)
        act = self._channel.stream_stream(
            METHOD,
            request_serializer=pb.ActorMessage.SerializeToString,
            response_deserializer=pb.LearnerMessage.FromString,
        )
        metadata = [("authorization", "Bearer " + token.strip().decode())] if token else None
        self._stream = act(metadata=metadata)
        hello = pb.Hello(protocol=PROTOCOL, actor_name=name or _default_name())
        return await self._roundtrip(pb.ActorMessage(hello=hello))

    async def _roundtrip(self, message: pb.ActorMessage) -> pb.LearnerMessage:
        await self._write(message)
        return await self._read()

    async def _write(self, message: pb.ActorMessage) -> None:
        try:
            await self._stream.write(message)
        except (grpc.aio.AioRpcError, asyncio.InvalidStateError):
            await self._raise_status()  # the learner ended the stream first: say why it did

    async def _read(self) -> pb.LearnerMessage:
        reply = await self._stream.read()
        if reply is grpc.aio.EOF:
            await self._raise_status()
        return reply

    async def _raise_status(self) -> None:
        """Raise the stream's final status as an error (``_run`` translates it)."""
        code, details = await self._stream.code(), await self._stream.details()
        if code == grpc.StatusCode.OK:
            raise ConnectionError("the learner closed the stream")
        raise grpc.aio.AioRpcError(code, grpc.aio.Metadata(), grpc.aio.Metadata(), details)

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._channel is not None:
            self._loop.run_until_complete(self._channel.close())
        self._loop.run_until_complete(end_tasks(_CLOSE_WAIT_S))  # gRPC's, for each call
        self._loop.close()


class SocketActorClient(_StreamClient):
    """An actor's stream over the socket wire (``framing``): the same messages, on one blocking
    TCP or Unix socket, optionally in TLS."""

    def __init__(
        self,
        address: str,
        token: bytes | None = None,
        tls_ca: bytes | None = None,
        name: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        self._frames: FrameSocket | None = None
        super().__init__(address, token, tls_ca, name, timeout_s)

    def _open(
        self,
        address: str,
        token: bytes | None,
        tls_ca: bytes | None,
        name: str | None,
        timeout_s: float,
    ) -> pb.LearnerMessage:
        host = address.rpartition(":")[0].strip("[]")
        try:
            if address.startswith("unix:"):
                sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
                sock.settimeout(timeout_s)
                sock.connect(address[len("unix:") :])
            else:
                sock = socket.create_connection((host, int(address.rpartition(":")[2])), timeout_s)
            tune(sock)
            if tls_ca is not None:
                context = ssl.create_default_context(cadata=tls_ca.decode())
                sock = context.wrap_socket(sock, server_hostname=host)
        except ssl.SSLError as e:
            raise Refused(f"TLS with the learner at {address} failed: {e.reason}") from None
        except OSError as e:
            raise ConnectionError(f"cannot reach a learner at {address} ({e})") from None
        sock.settimeout(None)  # a step waits as long as the learner takes; keepalive sees a loss
        self._frames = FrameSocket(sock, _MAX_MESSAGE)
        hello = pb.Hello(protocol=PROTOCOL, actor_name=name or _default_name())
        try:
            self._frames.send(MAGIC + (token or b"").strip())
            self._send(pb.ActorMessage(hello=hello))
            return self._receive()
        except _Closed as e:
            raise ConnectionError(
                f"{e} before answering hello: does the learner at {address} listen with "
                "--wire socket?"
            ) from None

    def _send(self, message: pb.ActorMessage) -> None:
        try:
            self._frames.send(message.SerializeToString())
        except OSError:
            # The learner ended the stream first: its Stop, if it sent one, says why.
            message = self._receive()
            if message.WhichOneof("kind") == "stop":
                raise LearnerStopped(message.stop.reason) from None
            raise _Closed("the learner closed the connection") from None

    def _receive(self) -> pb.LearnerMessage:
        try:
            data = self._frames.receive()
        except ValueError as e:
            raise Refused(
                f"the learner at {self.address} does not speak the socket wire ({e}): give the "
                "actor the learner's --wire"
            ) from None
        except OSError as e:  # ConnectionError included
            raise _Closed(f"lost the learner ({e})") from None
        try:
            message = pb.LearnerMessage.FromString(data)
        except DecodeError:
            raise ConnectionError("the learner sent a malformed message") from None
        if message.WhichOneof("kind") == "stop" and message.stop.status:
            code = _STATUS.get(message.stop.status, grpc.StatusCode.UNKNOWN)
            raise refusal(code, message.stop.reason)
        return message

    def _end_stream(self) -> None:
        self._frames.close()
        self._frames = None

    def close(self) -> None:
        if self._frames is not None:
            self._end_stream()


class _Closed(ConnectionError):
    """The socket wire's connection ended without a word from the learner."""


WIRES = {"grpc": GrpcActorClient, "socket": SocketActorClient}


def open_client(address: str, wire: str = "grpc", **options: Any) -> _StreamClient:
    """A connected client of ``wire`` (``grpc`` or ``socket``) for the learner at ``address``;
    ``options`` as ``GrpcActorClient`` takes them."""
    return WIRES[wire](address, **options)


def redirect_target(dialed: str, address: str) -> str:
    """Where a redirect from the learner at ``dialed`` sends this actor: ``address``, checked as
    ``--connect`` is and of the same kind as ``dialed`` (TCP to TCP, a Unix socket to a Unix
    socket), with a wildcard host (a replica listening on every interface) replaced by the host
    the actor dialed.

    Raises:
        Refused: One line saying why the address cannot be followed.
    """
    shown = address[:100] + ("..." if len(address) > 100 else "")
    why = None
    try:
        check_address(address, "redirect")
    except ConfigError:
        why = "not HOST:PORT or unix:PATH"
    if len(address) > _MAX_ADDRESS_CHARS:
        why = "longer than any address a learner sends"
    if why is None and address.startswith("unix:") != dialed.startswith("unix:"):
        why = "not the kind of address the actor dialed"
    if why is not None:
        raise Refused(
            f"the learner at {dialed} redirected this actor to {shown!r}, {why}: run the same "
            "seedbed version on the learner and the actor"
        )
    if address.startswith("unix:"):
        return address
    host, _, port = address.rpartition(":")
    if host in WILDCARD_HOSTS:
        host = dialed.rpartition(":")[0]
    return f"{host}:{port}"


async def _until_ready(channel: grpc.aio.Channel, address: str, timeout_s: float) -> None:
    """Wait for ``channel`` to connect; ConnectionError at its first failure or at the timeout.

    This polls the state rather than awaiting ``channel_ready``: that leaves a connectivity
    watch in gRPC's core which completes only when the channel closes, after this client's loop
    is closed, and gRPC then prints "Event loop is closed" from whichever loop runs next. A
    failed attempt ends at once, so the caller's own backoff decides when to try again.
    """
    deadline = time.monotonic() + timeout_s
    state = channel.get_state(try_to_connect=True)
    while state != grpc.ChannelConnectivity.READY:
        if state == grpc.ChannelConnectivity.TRANSIENT_FAILURE or time.monotonic() > deadline:
            raise ConnectionError(f"cannot reach a learner at {address}")
        await asyncio.sleep(_READY_POLL_S)
        state = channel.get_state(try_to_connect=True)


def _default_name() -> str:
    return f"{socket.gethostname()}:{os.getpid()}"
