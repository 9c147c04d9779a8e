"""What crosses the wire between a remote actor and the learner, and the secrets that guard it.

The schema is ``../proto/actor.proto``: arrays travel as raw C-order bytes with their dtype and
shape, and are used only once they are exactly what the learner expects. Nothing is unpickled.
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import secrets
from pathlib import Path
from typing import Any

import numpy as np
from google.protobuf.message import DecodeError

from seedbed.errors import ConfigError
from seedbed.transport.proto import actor_pb2 as pb

# Bump when actor.proto changes incompatibly. 2: actions may be float arrays (Assignment says).
# 3: local inference (Step.acted, Assignment.local_json, Policy). 4: settings_json holds the env
# family's settings by their flag names (Atari's backend is env_backend). 5: Assignment.plugins,
# the modules an actor imports first (an actor of 4 would not, and fail on a plug-in's env).
# 6: LearnerMessage.redirect, a replicated learner's front door sending an actor to another
# replica (an actor of 5 would take it for a broken assignment).
PROTOCOL = 6
METHOD = "/seedbed.v1.Learner/Act"


TOKEN_FILE = "actor-token"  # in the run directory, where no --token-file was given


def run_token(run_dir: Path) -> tuple[bytes, Path]:
    """The run's token for remote actors and its file, ``run_dir``/``TOKEN_FILE``: a random one,
    written with mode 0600, where the run has none yet (a resumed run keeps its own, so actors
    given the file reconnect). Every listener needs a token, loopback and Unix sockets included."""
    path = Path(run_dir) / TOKEN_FILE
    if path.exists():
        return read_secret(str(path), "the run's token file").strip(), path
    token = secrets.token_hex(32).encode()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(token + b"\n")
    return token, path


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


def to_wire(array: np.ndarray) -> pb.Array:
    """An array as raw C-order bytes with its dtype and shape."""
    array = np.ascontiguousarray(array)
    return pb.Array(dtype=array.dtype.str, shape=array.shape, data=array.tobytes())


def from_wire(message: pb.Array, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> np.ndarray:
    """The array ``message`` holds, if it is exactly ``dtype`` and ``shape``; else ValueError."""
    return _Field(name, dtype, shape)(message)


class _Field:
    """One array a message must hold, with what checking it needs worked out once."""

    def __init__(self, name: str, dtype: np.dtype, shape: tuple[int, ...]) -> None:
        self.name, self.dtype, self.shape = name, dtype, shape
        self.dtype_str, self.nbytes = dtype.str, math.prod(shape) * dtype.itemsize
        self.bool = dtype == np.bool_

    def __call__(self, message: pb.Array) -> np.ndarray:
        if message.dtype != self.dtype_str or tuple(message.shape) != self.shape:
            got = f"{message.dtype or '?'} {tuple(message.shape)}"
            raise ValueError(f"{self.name} is {got}, expected {self.dtype_str} {self.shape}")
        data = message.data  # each read of a bytes field copies it out of the message: read once
        if len(data) != self.nbytes:
            raise ValueError(
                f"{self.name} carries {len(data)} bytes for {self.dtype_str} {self.shape}"
            )
        if self.bool and data.translate(None, b"\x00\x01"):
            raise ValueError(f"{self.name} holds bytes other than 0 and 1 in a bool array")
        return np.frombuffer(data, self.dtype).reshape(self.shape)


class ActionsReply:
    """``LearnerMessage(actions=to_wire(actions))`` serialized, for one assignment's actions:
    their dtype and shape never change, so the message is a fixed prefix and the raw bytes,
    without building a message per step."""

    def __init__(self, assignment: Assignment) -> None:
        self._dtype = np.dtype(assignment.action_dtype)
        self._shape = (assignment.num_envs, *assignment.action_shape)
        size = math.prod(self._shape) * self._dtype.itemsize
        head = pb.Array(dtype=self._dtype.str, shape=self._shape).SerializeToString()
        head += b"\x1a" + _varint(size)  # field 3 (data), length-delimited; fields go in order
        self._prefix = b"\x12" + _varint(len(head) + size) + head  # field 2 (actions)

    def __call__(self, actions: np.ndarray) -> bytes:
        actions = np.ascontiguousarray(actions, self._dtype).reshape(self._shape)
        return self._prefix + actions.tobytes()


def serialize(message: pb.LearnerMessage | bytes) -> bytes:
    """gRPC's serializer for the learner's messages: ``ActionsReply``'s bytes pass as they are."""
    return message if isinstance(message, bytes) else message.SerializeToString()


def _varint(n: int) -> bytes:
    out = bytearray()
    while True:
        byte, n = n & 0x7F, n >> 7
        out.append(byte | (0x80 if n else 0))
        if not n:
            return bytes(out)


class StepDecoder:
    """Decodes one assignment's steps, with the fields it expects worked out
    once, as ``ActionsReply`` does for the answers: a gateway decodes every step of a stream."""

    def __init__(self, assignment: Assignment) -> None:
        e = assignment.num_envs
        self._arrays = (
            _Field("obs", np.dtype(assignment.obs_dtype), (e, *assignment.obs_shape)),
            _Field("reward", np.dtype(np.float32), (e,)),
            _Field("done", np.dtype(np.bool_), (e,)),
            _Field("truncated", np.dtype(np.bool_), (e,)),
        )
        self._acted = {n: _Field(n, np.dtype(d), (e, *s)) for n, s, d in assignment.acted()}

    def __call__(self, step: pb.Step) -> tuple[list[np.ndarray], dict[str, np.ndarray]]:
        """A step's ``[obs, reward, done, truncated]`` and acted fields (none in central mode),
        if each is exactly what the assignment says; else ValueError saying which is not."""
        arrays = [field(getattr(step, field.name)) for field in self._arrays]
        if len(step.acted) != len(self._acted) or any(n not in self._acted for n in step.acted):
            raise ValueError(f"acted fields {sorted(step.acted)} are not the assigned")
        return arrays, {n: field(step.acted[n]) for n, field in self._acted.items()}


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
    # The run's plug-in modules (``--plugins``), imported before anything else is read.
    plugins: tuple[str, ...] = ()

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
                plugins=self.plugins,
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
            plugins=tuple(message.plugins),
        )


class Malformed:
    """Stands in for a message that did not parse, so the gateway can say so and refuse it."""

    def __init__(self, error: str) -> None:
        self.error = error


def parse(data: bytes, limit: int) -> pb.ActorMessage | Malformed:
    """An actor's message from its bytes, or why it is refused (over ``limit`` bytes, or not
    protobuf); gRPC calls this before the handler sees the message."""
    if len(data) > limit:
        return Malformed(f"message of {len(data)} bytes is over this run's {limit}-byte limit")
    try:
        return pb.ActorMessage.FromString(data)
    except DecodeError as e:
        return Malformed(f"malformed message of {len(data)} bytes ({e})")
