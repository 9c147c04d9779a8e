"""gRPC transport: actors on other machines, one bidirectional stream each, as in SEED RL.

The learner runs an :class:`ActorGateway`. Each remote actor opens one stream, says hello, and is
given a slot: a block of environment rows in the learner's shared-memory transport, with a fresh
run id (so the learner drops any state the slot had). The stream's handler thread then acts as
that slot's local actor: it writes each step it receives into the slot's rows and waits for the
actions like any shared-memory actor does. Remote and local actors therefore meet in the very
same inference batches, and the inference server knows nothing of the network.

What crosses the wire is ``proto/actor.proto``: raw array bytes with dtype and shape, checked
against what the learner expects before they are used. Nothing is unpickled. A listener on a
non-loopback address needs a shared token (sent as ``authorization: Bearer TOKEN`` metadata);
TLS is optional. Message sizes are capped at what one step of the slot can hold.
"""

from __future__ import annotations

import dataclasses
import functools
import hmac
import json
import logging
import math
import queue
import socket
import threading
from collections.abc import Callable, Iterator
from concurrent import futures
from pathlib import Path
from typing import Any

import grpc
import numpy as np
from google.protobuf.message import DecodeError

from seedbed.config import is_local_address
from seedbed.errors import ConfigError, SeedbedError
from seedbed.transport.proto import actor_pb2 as pb

log = logging.getLogger(__name__)

PROTOCOL = 1  # bump when actor.proto changes incompatibly
METHOD = "/seedbed.v1.Learner/Act"
_HEADROOM = 64 * 1024  # bytes a message may carry beyond its arrays (field tags, dtype strings)


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
    settings: dict[str, Any] | None  # the env's preprocessing (Atari), as plain values
    slot: int
    obs_dtype: str
    obs_shape: tuple[int, ...]

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
    refused, and a slot is free again the moment its stream ends.
    """

    def __init__(
        self,
        address: str,
        slots: list[int],
        connect: Callable[[int], Any],
        assign: Callable[[int, int], Assignment],
        token: bytes | None = None,
        tls: tuple[bytes, bytes] | None = None,
    ) -> None:
        if token is None and not is_local_address(address):
            raise ConfigError(
                f"--listen {address} accepts actors from other machines: give --token-file "
                "FILE holding a shared secret (e.g. made with `openssl rand -hex 32 > FILE`)"
            )
        self._token = token.strip() if token else None
        self._connect = connect
        self._assign = assign
        self._free = list(slots)
        self._num_slots = len(slots)
        self.connections = 0
        self._lock = threading.Lock()
        self._stopping = threading.Event()
        self.rejected: list[str] = []  # reasons, for tests and the end-of-run summary
        probe = assign(slots[0], 0) if slots else None
        self._max_bytes = _HEADROOM + (self._step_bytes(probe) if probe else 0)
        self._server = grpc.server(
            futures.ThreadPoolExecutor(
                max_workers=len(slots) + 4, thread_name_prefix="actor-stream"
            ),
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
            ],
            # One stream per slot; the few extra threads answer refused connections.
            maximum_concurrent_rpcs=len(slots) + 4,
        )
        if tls is not None:
            credentials = grpc.ssl_server_credentials([(tls[1], tls[0])])  # (key, cert)
            port = self._server.add_secure_port(address, credentials)
        else:
            port = self._server.add_insecure_port(address)
        if port == 0 and not address.startswith("unix:"):
            raise SeedbedError(f"--listen {address}: cannot listen there (in use, or no such host)")
        self.address = address if address.startswith("unix:") else _with_port(address, port)

    @staticmethod
    def _step_bytes(assignment: Assignment) -> int:
        obs = math.prod(assignment.obs_shape) * np.dtype(assignment.obs_dtype).itemsize
        return assignment.num_envs * (obs + 4 + 1 + 1)

    def start(self) -> None:
        self._server.start()
        log.info("listening for actors on %s", self.address)

    def stop(self, grace_s: float = 2.0) -> None:
        """Refuse new actors and end every stream (their actors are told training is over)."""
        self._stopping.set()
        self._server.stop(grace_s).wait()

    def _serve(
        self, requests: Iterator[pb.ActorMessage], context: grpc.ServicerContext
    ) -> Iterator[pb.LearnerMessage]:
        peer = context.peer()
        slot = None
        try:
            self._check_token(context)
            hello = next(requests, None)
            if _kind(hello) != "hello":
                raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, "first message must be hello")
            if hello.hello.protocol != PROTOCOL:
                raise _Rejected(
                    grpc.StatusCode.FAILED_PRECONDITION,
                    f"actor speaks protocol {hello.hello.protocol}, this learner {PROTOCOL}: "
                    "run the same seedbed version on both",
                )
            slot, connection = self._take_slot()
            assignment = self._assign(slot, connection)
            yield from self._bridge(assignment, hello.hello.actor_name or peer, requests)
        except _Rejected as e:
            reason = str(e)
            self.rejected.append(reason)
            log.warning("refused actor %s: %s", peer, reason)
            context.abort(e.code, reason)
        finally:
            if slot is not None:
                with self._lock:
                    self._free.append(slot)

    def _check_token(self, context: grpc.ServicerContext) -> None:
        if self._token is None:
            return
        sent = dict(context.invocation_metadata()).get("authorization", "")
        if not hmac.compare_digest(sent.encode(), b"Bearer " + self._token):
            raise _Rejected(
                grpc.StatusCode.UNAUTHENTICATED,
                "missing or wrong token: give the actor --token-file with the learner's token",
            )

    def _take_slot(self) -> tuple[int, int]:
        """A free slot and this connection's number, or a refusal."""
        with self._lock:
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

    def _bridge(
        self, assignment: Assignment, name: str, requests: Iterator[pb.ActorMessage]
    ) -> Iterator[pb.LearnerMessage]:
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
        try:
            yield assignment.to_message()
            for message in requests:
                if _kind(message) != "step":
                    raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, "expected a step")
                try:
                    arrays = [from_wire(getattr(message.step, n), n, d, s) for n, d, s in fields]
                except ValueError as err:
                    raise _Rejected(grpc.StatusCode.INVALID_ARGUMENT, f"bad step: {err}") from None
                try:
                    actions = client.call(*arrays)
                except ConnectionError:
                    yield pb.LearnerMessage(stop=pb.Stop(reason="training is over"))
                    return
                yield pb.LearnerMessage(actions=to_wire(actions))
            log.info("actor %s left slot %d", name, slot)
        finally:
            client.close()


def _with_port(address: str, port: int) -> str:
    return f"{address.rsplit(':', 1)[0]}:{port}"


# -- the actor's end --------------------------------------------------------------------------


class LearnerStopped(ConnectionError):
    """The learner ended the stream on purpose: training is over, do not reconnect."""


class Refused(SeedbedError):
    """The learner refused this actor for a reason retrying cannot fix (token, version)."""


class GrpcActorClient:
    """An actor's end of one stream: the ``ActorTransport`` ``run_actor`` calls."""

    def __init__(
        self,
        address: str,
        token: bytes | None = None,
        tls_ca: bytes | None = None,
        name: str | None = None,
        timeout_s: float = 10.0,
    ) -> None:
        options = [
            ("grpc.max_receive_message_length", 16 * 1024 * 1024),
            ("grpc.keepalive_time_ms", 20_000),
            ("grpc.keepalive_timeout_ms", 10_000),
        ]
        if tls_ca is not None:
            credentials = grpc.ssl_channel_credentials(root_certificates=tls_ca)
            self._channel = grpc.secure_channel(address, credentials, options=options)
        else:
            self._channel = grpc.insecure_channel(address, options=options)
        try:
            grpc.channel_ready_future(self._channel).result(timeout=timeout_s)
        except grpc.FutureTimeoutError:
            self._channel.close()
            raise ConnectionError(f"cannot reach a learner at {address}") from None
        act = self._channel.stream_stream(
            METHOD,
            request_serializer=pb.ActorMessage.SerializeToString,
            response_deserializer=pb.LearnerMessage.FromString,
        )
        self._outbox: queue.SimpleQueue = queue.SimpleQueue()
        metadata = [("authorization", "Bearer " + token.strip().decode())] if token else None
        self._replies = act(iter(self._outbox.get, None), metadata=metadata)
        hello = pb.Hello(protocol=PROTOCOL, actor_name=name or _default_name())
        self._outbox.put(pb.ActorMessage(hello=hello))
        first = self._next()
        if first.WhichOneof("kind") != "assignment":
            raise ConnectionError(f"the learner answered hello with {first.WhichOneof('kind')}")
        self.assignment = Assignment.from_message(first.assignment)

    def _next(self) -> pb.LearnerMessage:
        try:
            return next(self._replies)
        except StopIteration:
            raise ConnectionError("the learner closed the stream") from None
        except grpc.RpcError as e:
            code, details = e.code(), e.details()
            if code in (grpc.StatusCode.UNAUTHENTICATED, grpc.StatusCode.FAILED_PRECONDITION):
                raise Refused(f"the learner refused this actor: {details}") from None
            if code == grpc.StatusCode.INVALID_ARGUMENT:
                raise Refused(f"the learner rejected a message: {details}") from None
            raise ConnectionError(f"lost the learner ({code.name}: {details})") from None

    def call(
        self, obs: np.ndarray, reward: np.ndarray, done: np.ndarray, truncated: np.ndarray
    ) -> np.ndarray:
        step = pb.Step(
            obs=to_wire(obs),
            reward=to_wire(np.asarray(reward, np.float32)),
            done=to_wire(np.asarray(done, np.bool_)),
            truncated=to_wire(np.asarray(truncated, np.bool_)),
        )
        self._outbox.put(pb.ActorMessage(step=step))
        reply = self._next()
        kind = reply.WhichOneof("kind")
        if kind == "stop":
            raise LearnerStopped(reply.stop.reason)
        if kind != "actions":
            raise ConnectionError(f"the learner sent {kind} where actions were due")
        shape = (self.assignment.num_envs,)
        try:
            return from_wire(reply.actions, "actions", np.dtype(np.int64), shape).copy()
        except ValueError as e:
            raise ConnectionError(f"the learner sent malformed actions: {e}") from None

    def close(self) -> None:
        self._outbox.put(None)
        self._channel.close()


def _default_name() -> str:
    import os

    return f"{socket.gethostname()}:{os.getpid()}"
