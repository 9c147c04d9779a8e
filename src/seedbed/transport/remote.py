"""gRPC transport: actors on other machines, one bidirectional stream each, as in SEED RL.

The learner runs an :class:`ActorGateway`. Each remote actor opens one stream, says hello, and is
given a slot: a block of environment rows in the learner's shared-memory transport, with a fresh
run id (so the learner drops any state the slot had). The stream's handler then acts as that
slot's local actor: it writes each step it receives into the slot's rows and waits for the
actions like any shared-memory actor does. Remote and local actors therefore meet in the very
same inference batches, and the inference server knows nothing of the network.

What crosses the wire is ``proto/actor.proto``: raw array bytes with dtype and shape, checked
against what the learner expects before they are used. Nothing is unpickled. A listener on a
non-loopback address needs a shared token (sent as ``authorization: Bearer TOKEN`` metadata);
TLS is optional. Message sizes are capped at what one step of the slot can hold. A stream without
the token is refused within a second, holding nothing an actor needs, and one that says no hello
within ``HELLO_TIMEOUT_S`` is closed: streams that never become actors cannot lock actors out.

With local inference the actor acts itself: its steps carry what it acted (as shared-memory
actors write it into their rows), and the learner sends it each newer policy from the
``PolicyBoard`` before answering a step.
"""

from __future__ import annotations

import asyncio
import dataclasses
import functools
import hmac
import json
import logging
import math
import os
import socket
import threading
import time
from collections import deque
from collections.abc import AsyncIterator, Callable
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from seedbed.config import check_token_needed
from seedbed.errors import ConfigError, SeedbedError
from seedbed.transport.proto import actor_pb2 as pb

log = logging.getLogger(__name__)

# Bump when actor.proto changes incompatibly. 2: actions may be float arrays (Assignment says).
# 3: local inference (Step.acted, Assignment.local_json, Policy). 4: settings_json holds the env
# family's settings by their flag names (Atari's backend is env_backend).
PROTOCOL = 4
METHOD = "/seedbed.v1.Learner/Act"
_HEADROOM = 64 * 1024  # bytes a message may carry beyond its arrays (field tags, dtype strings)
_READY_POLL_S = 0.02  # how often an actor looks whether its channel has connected
_CLOSE_WAIT_S = 1.0  # how long a closing actor waits for gRPC to finish its calls

# What a stream may hold before it has said hello (see ActorGateway._create).
HELLO_TIMEOUT_S = 5.0  # a stream with no hello by then is closed; a real actor sends it at once
MAX_PENDING_HELLOS = 64  # streams awaiting their hello at once; the next ones are refused
_COURTESY_S = 1.0  # how long a stream without the token may wait to be refused (one at most)
_COURTESIES = 16  # such streams waiting at once; the next ones are refused without a wait
_REFUSING = 16  # room in gRPC's own cap for streams that are being refused right now
_LOG_REFUSALS_EVERY_S = 10.0  # one warning per kind of refusal in this time, then a count
_REASONS_KEPT = 100  # the newest refusal reasons kept, for tests and the run's summary


def read_secret(path: str | None, flag: str) -> bytes | None:
    """The contents of a token or TLS file, with a one-line error when it cannot be read."""
    if path is None:
        return None
    try:
        data = Path(path).read_bytes()
    except OSError as e:
        raise ConfigError(f"{flag} {path}: {e.strerror}") from None
    if not data.strip():
        raise ConfigError(f"{flag} {path} is empty")
    return data


# -- arrays on the wire -----------------------------------------------------------------------


def to_wire(array: np.ndarray) -> pb.Array:
    """An array as raw C-order bytes with its dtype and shape."""
    array = np.ascontiguousarray(array)
    return pb.Array(dtype=array.dtype.str, shape=array.shape, data=array.tobytes())


def from_wire(message: pb.Array, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The array ``message`` holds, if it is exactly ``dtype`` and ``shape``; else ValueError."""
    if message.dtype != dtype.str or tuple(message.shape) != shape:
        got = f"{message.dtype or '?'} {tuple(message.shape)}"
        raise ValueError(f"{name} is {got}, expected {dtype.str} {shape}")
    if len(message.data) != math.prod(shape) * dtype.itemsize:
        raise ValueError(f"{name} carries {len(message.data)} bytes for {dtype.str} {shape}")
    return np.frombuffer(message.data, dtype).reshape(shape)


@dataclasses.dataclass(frozen=True)
class Assignment:
    """What a remote actor runs, as the learner assigns it on connect."""

    env_id: str
    num_envs: int
    seed: int
    settings: dict[str, Any] | None  # the env family's settings (e.g. Atari's), plain values
    slot: int
    obs_dtype: str
    obs_shape: tuple[int, ...]
    action_dtype: str = "int64"  # what the actions carry: int64 scalars for discrete envs
    action_shape: tuple[int, ...] = ()  # one env's action
    # Local inference, as plain values: "agent", "agent_config", "num_envs" (the run's),
    # "first_env" (this slot's first env id) and "acted" ([name, shape, dtype] per field).
    local: dict[str, Any] | None = None

    def acted(self) -> tuple[tuple[str, tuple[int, ...], str], ...]:
        """The fields each step carries besides its arrays (none in central mode)."""
        local = self.local or {}
        return tuple((name, tuple(shape), dtype) for name, shape, dtype in local.get("acted", ()))

    def to_message(self) -> pb.LearnerMessage:
        settings = json.dumps(self.settings) if self.settings is not None else ""
        return pb.LearnerMessage(
            assignment=pb.Assignment(
                env_id=self.env_id,
                num_envs=self.num_envs,
                seed=self.seed,
                settings_json=settings,
                slot=self.slot,
                obs_dtype=self.obs_dtype,
                obs_shape=self.obs_shape,
                action_dtype=self.action_dtype,
                action_shape=self.action_shape,
                local_json=json.dumps(self.local) if self.local is not None else "",
            )
        )

    @classmethod
    def from_message(cls, message: pb.Assignment) -> Assignment:
        return cls(
            env_id=message.env_id,
            num_envs=message.num_envs,
            seed=message.seed,
            settings=json.loads(message.settings_json) if message.settings_json else None,
            slot=message.slot,
            obs_dtype=message.obs_dtype,
            obs_shape=tuple(message.obs_shape),
            action_dtype=message.action_dtype or "int64",
            action_shape=tuple(message.action_shape),
            local=json.loads(message.local_json) if message.local_json else None,
        )


# -- the learner's end ------------------------------------------------------------------------


class _Malformed:
    """Stands in for a message that did not parse, so the handler can say so and refuse it."""

    def __init__(self, error: str) -> None:
        self.error = error


def _parse(data: bytes, limit: int) -> pb.ActorMessage | _Malformed:
    if len(data) > limit:
        return _Malformed(f"message of {len(data)} bytes is over this run's {limit}-byte limit")
    try:
        return pb.ActorMessage.FromString(data)
    except DecodeError as e:
        return _Malformed(f"malformed message of {len(data)} bytes ({e})")


def _kind(message: pb.ActorMessage | _Malformed | None) -> str | None:
    """The message's kind; a malformed one is refused right here."""
    if isinstance(message, _Malformed):
        raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, message.error)
    return None if message is None else message.WhichOneof("kind")


class _Rejected(Exception):
    """A message the gateway refuses; ends that actor's stream with ``code``."""

    def __init__(self, code: grpc.StatusCode, reason: str) -> None:
        super().__init__(reason)
        self.code = code


class ActorGateway:
    """Serves remote actors on ``address`` and bridges each one to a shared-memory slot.

    ``connect(slot)`` returns a fresh in-process endpoint of the learner's shared-memory
    transport for ``slot`` (a new run id); ``assign(slot, connection)`` what the actor in it
    runs. Slots are handed out first come, first served; an actor arriving when all are taken is
    refused, and a slot is free again the moment its stream ends. Refusals are counted
    (``rejected_total``; the newest reasons in ``rejected``) and logged at most once per kind
    in ``_LOG_REFUSALS_EVERY_S``, so a flood of them neither floods the log nor goes unsaid.

    All streams are served by gRPC's asyncio API on one event loop in its own thread, which
    waits for the shared-memory answers on their reply pipes: many actors cost no thread each
    in this process, where the inference and learner threads need the interpreter too.
    """

    def __init__(
        self,
        address: str,
        slots: list[int],
        connect: Callable[[int], Any],
        assign: Callable[[int, int], Assignment],
        token: bytes | None = None,
        tls: tuple[bytes, bytes] | None = None,
        board: Any = None,
        hello_timeout_s: float = HELLO_TIMEOUT_S,
    ) -> None:
        """``board``: with local inference, the ``BoardHandle`` of the policy actors act with.
        ``hello_timeout_s``: how long a new stream may take to say hello before it is closed."""
        check_token_needed(address, token is not None)
        self._board = board.open() if board is not None else None
        self._token = token.strip() if token else None
        self._connect = connect
        self._assign = assign
        self._free = list(slots)
        self._num_slots = len(slots)
        self.connections = 0
        self._stopping = threading.Event()
        self._hello_timeout_s = hello_timeout_s
        self._pending = 0  # streams with the token awaiting their hello
        self._courtesies = 0  # streams without it awaiting their refusal
        # Refusals: the newest reasons and how many in all, for tests and the run's summary.
        self.rejected: deque[str] = deque(maxlen=_REASONS_KEPT)
        self.rejected_total = 0
        self._last_warned: dict[grpc.StatusCode, float] = {}
        self._unwarned: dict[grpc.StatusCode, int] = {}  # refusals since that warning
        probe = assign(slots[0], 0) if slots else None
        self._max_bytes = _HEADROOM + (self._step_bytes(probe) if probe else 0)
        self._loop = asyncio.new_event_loop()
        self._thread = threading.Thread(
            target=self._loop.run_forever, name="actor-gateway", daemon=True
        )
        self._thread.start()
        try:
            port = self._on_loop(self._create(address, tls, len(slots)))
        except BaseException:
            self._close_loop()
            raise
        if port == 0 and not address.startswith("unix:"):
            self._close_loop()
            raise SeedbedError(f"--listen {address}: cannot listen there (in use, or no such host)")
        self.address = address if address.startswith("unix:") else _with_port(address, port)

    def _on_loop(self, coroutine: Any, timeout_s: float | None = 30.0) -> Any:
        return asyncio.run_coroutine_threadsafe(coroutine, self._loop).result(timeout_s)

    async def _create(self, address: str, tls: tuple[bytes, bytes] | None, slots: int) -> int:
        self._server = grpc.aio.server(
            handlers=[
                grpc.method_handlers_generic_handler(
                    "seedbed.v1.Learner",
                    {
                        "Act": grpc.stream_stream_rpc_method_handler(
                            self._serve,
                            request_deserializer=functools.partial(_parse, limit=self._max_bytes),
                            response_serializer=pb.LearnerMessage.SerializeToString,
                        )
                    },
                )
            ],
            options=[
                # gRPC itself drops messages past 4x the limit, before they cost memory; up to
                # there _parse refuses them with a reason in the log.
                ("grpc.max_receive_message_length", 4 * self._max_bytes),
                ("grpc.so_reuseport", 0),
                # Notice a vanished actor machine within a minute, not at TCP's hours.
                ("grpc.keepalive_time_ms", 20_000),
                ("grpc.keepalive_timeout_ms", 10_000),
                ("grpc.http2.min_ping_interval_without_data_ms", 10_000),
                ("grpc.keepalive_permit_without_calls", 1),
                # A connection that has not finished its TLS and HTTP/2 handshakes by then is
                # dropped (gRPC's default is 120 s): slow connections cost sockets too.
                ("grpc.server_handshake_timeout_ms", max(1, round(1000 * self._hello_timeout_s))),
            ],
            # Our own limits bound what a stream can hold: a slot (at most `slots` streams),
            # or a wait for its hello (at most MAX_PENDING_HELLOS, hello_timeout_s each), or
            # without the token a wait to be refused (_COURTESIES, _COURTESY_S each); the rest
            # are refused as they come. gRPC's cap, which refuses without a word in our log,
            # is a backstop above all of these, never what turns a real actor away.
            maximum_concurrent_rpcs=slots + MAX_PENDING_HELLOS + _COURTESIES + _REFUSING,
        )
        if tls is not None:
            credentials = grpc.ssl_server_credentials([(tls[1], tls[0])])  # (key, cert)
            return self._server.add_secure_port(address, credentials)
        return self._server.add_insecure_port(address)

    @staticmethod
    def _step_bytes(assignment: Assignment) -> int:
        obs = math.prod(assignment.obs_shape) * np.dtype(assignment.obs_dtype).itemsize
        acted = sum(math.prod(s) * np.dtype(d).itemsize for _, s, d in assignment.acted())
        return assignment.num_envs * (obs + 4 + 1 + 1 + acted)

    def start(self) -> None:
        self._on_loop(self._server.start())
        log.info("listening for actors on %s", self.address)

    def stop(self, grace_s: float = 2.0) -> None:
        """Refuse new actors and end every stream (their actors are told training is over)."""
        if self._loop.is_closed():
            return
        self._stopping.set()
        self._on_loop(self._server.stop(grace_s), timeout_s=grace_s + 10.0)
        self._close_loop()
        for code, count in self._unwarned.items():
            log.warning(
                "refused %d more streams with %s since the last such warning", count, code.name
            )
        if self._board is not None:
            self._board.close()

    def _close_loop(self) -> None:
        self._loop.call_soon_threadsafe(self._loop.stop)
        self._thread.join()
        self._loop.close()

    async def _serve(
        self, requests: AsyncIterator[pb.ActorMessage], context: grpc.aio.ServicerContext
    ) -> AsyncIterator[pb.LearnerMessage]:
        peer = context.peer()
        slot = None
        try:
            # The token comes with the stream's headers: check it before reading anything, so
            # that a stream without it holds nothing an actor with it needs.
            if not self._authenticated(context):
                await self._refuse_unauthenticated(requests)
            hello = await self._read_hello(requests)
            slot, connection = self._take_slot()
            assignment = self._assign(slot, connection)
            async for reply in self._bridge(assignment, hello.actor_name or peer, requests):
                yield reply
        except _Rejected as e:
            self._refused(peer, e)
            await context.abort(e.code, str(e))
        finally:
            if slot is not None:
                self._free.append(slot)

    async def _read_hello(self, requests: AsyncIterator[pb.ActorMessage]) -> pb.Hello:
        """The stream's first message, if it is a hello of our protocol sent in time."""
        if self._pending >= MAX_PENDING_HELLOS:
            raise _Rejected(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"{MAX_PENDING_HELLOS} other streams are waiting to say hello; try again",
            )
        self._pending += 1
        try:
            first = await _first(requests, self._hello_timeout_s)
        finally:
            self._pending -= 1
        if first is _TIMED_OUT:
            raise _Rejected(
                grpc.StatusCode.DEADLINE_EXCEEDED, f"no hello within {self._hello_timeout_s:g} s"
            )
        if _kind(first) != "hello":
            raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, "first message must be hello")
        if first.hello.protocol != PROTOCOL:
            raise _Rejected(
                grpc.StatusCode.FAILED_PRECONDITION,
                f"actor speaks protocol {first.hello.protocol}, this learner {PROTOCOL}: "
                "run the same seedbed version on both",
            )
        return first.hello

    def _refused(self, peer: str, refusal: _Rejected) -> None:
        """Count a refusal; warn of it unless one of its kind was warned of lately.

        A flood of bad streams must neither flood the log nor hide in it: the first of each
        status code is logged, then one in every _LOG_REFUSALS_EVERY_S with how many more
        there were meanwhile (the rest are told at ``stop``).
        """
        reason, code = str(refusal), refusal.code
        self.rejected.append(reason)
        self.rejected_total += 1
        now = time.monotonic()
        if now - self._last_warned.get(code, -math.inf) < _LOG_REFUSALS_EVERY_S:
            self._unwarned[code] = self._unwarned.get(code, 0) + 1
            return
        self._last_warned[code] = now
        more = self._unwarned.pop(code, 0)
        also = f" (and {more} more with {code.name} since the last such warning)" if more else ""
        log.warning("refused actor %s: %s%s", peer, reason, also)

    def _authenticated(self, context: grpc.aio.ServicerContext) -> bool:
        if self._token is None:
            return True
        sent = dict(context.invocation_metadata() or ()).get("authorization", "")
        return hmac.compare_digest(sent.encode(), b"Bearer " + self._token)

    async def _refuse_unauthenticated(self, requests: AsyncIterator[pb.ActorMessage]) -> None:
        """Refuse a stream without the token, after a moment's wait for its first message.

        Refused while its hello is still in flight, a real actor with a wrong token would read
        INTERNAL (its write fails first) instead of the reason. A few such streams at a time may
        wait up to _COURTESY_S; a flood of them finds no room and is refused at once.
        """
        if self._courtesies < _COURTESIES:
            self._courtesies += 1
            try:
                await _first(requests, min(_COURTESY_S, self._hello_timeout_s))
            finally:
                self._courtesies -= 1
        raise _Rejected(
            grpc.StatusCode.UNAUTHENTICATED,
            "missing or wrong token: give the actor --token-file with the learner's token",
        )

    def _take_slot(self) -> tuple[int, int]:
        """A free slot and this connection's number, or a refusal (on the loop: no lock)."""
        if self._stopping.is_set():
            raise _Rejected(grpc.StatusCode.UNAVAILABLE, "training is over")
        if not self._free:
            raise _Rejected(
                grpc.StatusCode.RESOURCE_EXHAUSTED,
                f"all {self._num_slots} remote actor slots are taken; start the learner "
                "with a larger --remote-actors",
            )
        self.connections += 1
        return self._free.pop(0), self.connections

    async def _bridge(
        self, assignment: Assignment, name: str, requests: AsyncIterator[pb.ActorMessage]
    ) -> AsyncIterator[pb.LearnerMessage]:
        """Relay one actor's steps into its slot and the actions back, until either end stops."""
        slot = assignment.slot
        client = self._connect(slot).open()
        log.info("actor %s connected to slot %d", name, slot)
        e, dtype = assignment.num_envs, np.dtype(assignment.obs_dtype)
        fields = (
            ("obs", dtype, (e, *assignment.obs_shape)),
            ("reward", np.dtype(np.float32), (e,)),
            ("done", np.dtype(np.bool_), (e,)),
            ("truncated", np.dtype(np.bool_), (e,)),
        )
        acted_fields = [(n, np.dtype(d), (e, *s)) for n, s, d in assignment.acted()]
        sent = -1  # the newest policy version this actor was sent
        try:
            yield assignment.to_message()
            if acted_fields:
                sent, policy = self._newer_policy(sent)
                if policy is not None:
                    yield policy  # the actor acts from its first step on
            async for message in requests:
                if _kind(message) != "step":
                    raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, "expected a step")
                step = message.step
                try:
                    arrays = [from_wire(getattr(step, n), n, d, s) for n, d, s in fields]
                    if set(step.acted) != {n for n, _, _ in acted_fields}:
                        raise ValueError(f"acted fields {sorted(step.acted)} are not the assigned")
                    acted = {n: from_wire(step.acted[n], n, d, s) for n, d, s in acted_fields}
                except ValueError as err:
                    raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"bad step: {err}") from None
                try:
                    actions = await self._call(client, arrays, acted or None)
                except ConnectionError:
                    yield pb.LearnerMessage(stop=pb.Stop(reason="training is over"))
                    return
                if acted_fields:
                    sent, policy = self._newer_policy(sent)
                    if policy is not None:
                        yield policy
                yield pb.LearnerMessage(actions=to_wire(actions))
            log.info("actor %s left slot %d", name, slot)
        finally:
            client.close()

    def _newer_policy(self, sent: int) -> tuple[int, pb.LearnerMessage | None]:
        """The board's policy as a message if it is newer than version ``sent``."""
        post = self._board.read(sent)
        if post is None:
            return sent, None
        payload, version = post
        return version, pb.LearnerMessage(policy=pb.Policy(version=version, payload=payload))

    async def _call(
        self, client: Any, arrays: list[np.ndarray], acted: dict[str, np.ndarray] | None = None
    ) -> np.ndarray:
        """``client.call`` without blocking the loop: await the reply pipe, then collect."""
        client.submit(*arrays, acted)
        answered = self._loop.create_future()
        fd = client.reply_fd
        self._loop.add_reader(fd, lambda: answered.done() or answered.set_result(None))
        try:
            await answered
        finally:
            self._loop.remove_reader(fd)
        return client.collect()


_TIMED_OUT = object()


async def _first(requests: AsyncIterator[pb.ActorMessage], timeout_s: float) -> Any:
    """A stream's first message: None if it ended first, _TIMED_OUT if none came in time."""
    try:
        return await asyncio.wait_for(anext(aiter(requests), None), timeout_s)
    except asyncio.TimeoutError:
        return _TIMED_OUT


def _with_port(address: str, port: int) -> str:
    return f"{address.rsplit(':', 1)[0]}:{port}"


# -- the actor's end --------------------------------------------------------------------------


class LearnerStopped(ConnectionError):
    """The learner ended the stream on purpose: training is over, do not reconnect."""


class Refused(SeedbedError):
    """The learner refused this actor for a reason retrying cannot fix (token, version)."""


class GrpcActorClient:
    """An actor's end of one stream: the ``ActorTransport`` that ``act`` calls.

    It drives gRPC's asyncio API from a private event loop in the calling thread, so a step's
    round trip needs no helper threads on the actor's side (the threaded API passes each
    message through two).

    With local inference it is also the actor's policy board: ``read`` gives the newest policy
    the learner sent (the first arrives with the assignment, later ones before the answers).
    """

    def __init__(
        self,
        address: str,
        token: bytes | None = None,
        tls_ca: bytes | None = None,
        name: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        """``timeout_s``: how long to wait for the connection (a refused one fails at once)."""
        self._loop = asyncio.new_event_loop()
        self._channel: Any = None
        try:
            first = self._run(self._open(address, token, tls_ca, name, timeout_s))
        except BaseException:
            self.close()
            raise
        if first.WhichOneof("kind") != "assignment":
            self.close()
            raise ConnectionError(f"the learner answered hello with {first.WhichOneof('kind')}")
        self.assignment = Assignment.from_message(first.assignment)
        self._policy: tuple[bytes, int] | None = None
        if self.assignment.local is not None:
            self._take(self._run(self._read()), want="policy")  # before the first step

    def _run(self, coroutine: Any) -> Any:
        """Run ``coroutine`` to completion, translating gRPC's errors into ours."""
        try:
            return self._loop.run_until_complete(coroutine)
        except grpc.aio.AioRpcError as e:
            code, details = e.code(), e.details()
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION):
                raise Refused(f"the learner refused this actor: {details}") from None
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise Refused(f"the learner rejected a message: {details}") from None
            raise ConnectionError(f"lost the learner ({code.name}: {details})") from None

    async def _open(
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

    def call(
        self,
        obs: np.ndarray,
        reward: np.ndarray,
        done: np.ndarray,
        truncated: np.ndarray,
        acted: dict[str, np.ndarray] | None = None,
    ) -> np.ndarray:
        self.submit(obs, reward, done, truncated, acted)
        return self.collect()

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
        self._run(self._write(pb.ActorMessage(step=step)))

    def collect(self) -> np.ndarray:
        """The answer to the last step: its actions (taking any newer policy sent first)."""
        while True:
            reply = self._run(self._read())
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
            self._policy = (reply.policy.payload, reply.policy.version)
            return want == "policy"
        if kind != want:
            raise ConnectionError(f"the learner sent {kind} where {want} was due")
        return True

    def read(self, newer_than: int) -> tuple[bytes, int] | None:
        """The newest policy the learner sent and its version, if newer than ``newer_than``
        (a ``PolicyBoard``'s read, for ``LocalPolicy``)."""
        if self._policy is None or self._policy[1] <= newer_than:
            return None
        return self._policy

    def open(self) -> GrpcActorClient:
        return self  # a LocalPolicy opens its board; this one is the stream itself

    def close(self) -> None:
        if self._loop.is_closed():
            return
        if self._channel is not None:
            self._loop.run_until_complete(self._channel.close())
        # gRPC leaves a task per call that ends when the core reports the cancelled call.
        # Let it end on this loop: cancelled here, the core's report would still come, after
        # the loop is closed, and another loop would print "Event loop is closed" for it.
        pending = asyncio.all_tasks(self._loop)
        if pending:
            _, late = self._loop.run_until_complete(asyncio.wait(pending, timeout=_CLOSE_WAIT_S))
            for task in late:
                task.cancel()
            if late:
                self._loop.run_until_complete(asyncio.wait(late))
        self._loop.close()


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
