"""The policy board: where local actors (``--inference local``) find the newest policy.

The learner posts an encoded policy (``seedbed.quantize``) every ``--broadcast-every`` updates;
each actor reads the newest post when it next acts. The learner's side::

    board = backend.make_board(capacity)     # the largest payload it will take, in bytes
    ...hand board.handle to each actor...
    board.post(payload, version)             # after learner updates; versions only grow
    board.close()

An actor's side::

    reader = handle.open()
    post = reader.read(newer_than=version)   # (payload, version), or None: nothing newer
    reader.close()

Each backend module brings its board (``Backend.make_board``); this module holds the interface
and the shared-memory board that actor processes on the learner's host read. A remote actor's
board is its gRPC stream (``seedbed.transport.remote.client``).
"""

from __future__ import annotations

import dataclasses
import time
from multiprocessing import shared_memory
from typing import Protocol

import numpy as np


class BoardReader(Protocol):
    """An actor's view of the board."""

    def read(self, newer_than: int) -> tuple[bytes, int] | None:
        """The newest payload and its version, if newer than ``newer_than``; else None."""
        ...

    def close(self) -> None:
        """Let go of the board (the learner's stays)."""
        ...


class BoardHandle(Protocol):
    """What an actor is given to open its reader (picklable where actors are processes)."""

    def open(self) -> BoardReader: ...


class PolicyBoard(Protocol):
    """The learner's end: one writer."""

    @property
    def handle(self) -> BoardHandle:
        """What actors open to read this board."""
        ...

    def post(self, payload: bytes, version: int) -> None:
        """Publish ``payload`` as policy ``version``; ValueError past the board's capacity."""
        ...

    def close(self) -> None:
        """Free the board; actors read nothing newer after it."""
        ...


_BOARD_HEADER = np.dtype([("sequence", "<i8"), ("version", "<i8"), ("size", "<i8")])


@dataclasses.dataclass(frozen=True)
class SharedBoardHandle:
    """What an actor needs to read a ``SharedMemoryBoard`` (plain data, picklable for spawn)."""

    name: str
    capacity: int

    def open(self) -> SharedMemoryBoard:
        return SharedMemoryBoard(self.capacity, name=self.name)


class SharedMemoryBoard:
    """The newest policy broadcast in shared memory: the learner posts, actors read.

    One writer, many readers, no lock: a sequence number is odd while a post is being written,
    and a reader keeps a copy only if the number was even and unchanged around its read (a
    seqlock). A reader that runs into a post retries; the payload's own checksum is a second
    guard against a torn copy.
    """

    def __init__(self, capacity: int, name: str | None = None) -> None:
        """Create a board for payloads of up to ``capacity`` bytes, or attach to ``name``."""
        self.capacity = capacity
        size = _BOARD_HEADER.itemsize + capacity
        self._owner = name is None
        self._block = shared_memory.SharedMemory(name=name, create=self._owner, size=size)
        self._header = np.ndarray((), _BOARD_HEADER, buffer=self._block.buf)
        self._payload = np.ndarray((capacity,), np.uint8, self._block.buf, _BOARD_HEADER.itemsize)
        if self._owner:
            self._header[()] = (0, -1, 0)

    @property
    def handle(self) -> SharedBoardHandle:
        return SharedBoardHandle(self._block.name, self.capacity)

    def post(self, payload: bytes, version: int) -> None:
        """Publish ``payload`` as policy ``version`` (the learner's side)."""
        if len(payload) > self.capacity:
            raise ValueError(f"a {len(payload)}-byte policy exceeds the board's {self.capacity}")
        header = self._header
        header["sequence"] += 1  # odd: being written
        self._payload[: len(payload)] = np.frombuffer(payload, np.uint8)
        header["size"], header["version"] = len(payload), version
        header["sequence"] += 1

    def read(self, newer_than: int) -> tuple[bytes, int] | None:
        """The posted payload and its version, if newer than ``newer_than``; else None."""
        header = self._header
        while True:
            before = int(header["sequence"])
            version = int(header["version"])
            if before % 2 == 0 and version <= newer_than:
                return None
            if before % 2 == 0:
                size = int(header["size"])
                payload = self._payload[:size].tobytes()
                if int(header["sequence"]) == before:
                    return payload, version
            time.sleep(0.0001)  # a post is being written

    def close(self) -> None:
        """Detach; the learner's board is also freed."""
        self._header = self._payload = None
        self._block.close()
        if self._owner:
            self._block.unlink()
