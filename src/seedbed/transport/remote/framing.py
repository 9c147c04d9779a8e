"""The socket wire: the actor protocol's messages over a plain TCP or Unix socket.

gRPC in Python costs each end some hundred and more microseconds of CPU per message, whatever its
size (``bench/wire.py``); a step of a few envs is worth less than that. This wire carries the
same protobuf messages (``../proto/actor.proto``), each behind its 4-byte little-endian length,
and nothing else: no HTTP/2. ``seedbed train --wire socket`` serves it and ``seedbed actor
--wire socket`` speaks it; TLS, where given, wraps the socket.

A connection is one actor's stream. The actor first sends one frame holding ``MAGIC`` and its
token (what gRPC carries as metadata), then its hello and steps, each answered as over gRPC. The
learner ends a stream it refuses with a ``Stop`` whose ``status`` is the gRPC status code it
would have sent, then closes the connection.

``FrameProtocol`` is the learner's side, on the gateway's event loop: it reads each frame into
one buffer, with no copy per chunk, and stops reading while an unread frame waits (an actor
sends its next step only once answered, so a second one waiting is a flood). ``FrameSocket`` is
the actor's side, on a blocking socket.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import socket
import struct
from typing import Any

HEADER = struct.Struct("<I")
# The first bytes of an actor's first frame; a gRPC client's first bytes ("PRI * HTTP/2.0")
# read as a length no preamble has, which is how a wrong --wire shows.
MAGIC = b"seedbed-socket-wire-1\n"
MAX_PREAMBLE = len(MAGIC) + 1024  # the magic and a token
# A vanished peer is noticed within a minute: idle seconds, seconds between probes, probes.
_KEEPALIVE = {"TCP_KEEPIDLE": 20, "TCP_KEEPINTVL": 10, "TCP_KEEPCNT": 3}
_WAITING = 2  # unread frames at which the learner stops reading from an actor


def framed(payload: bytes) -> bytes:
    return HEADER.pack(len(payload)) + payload


def preamble(token: bytes | None) -> bytes:
    """An actor's first frame: the magic and its token (none: an empty one, refused)."""
    return framed(MAGIC + (token or b"").strip())


def token_of(first: bytes) -> bytes | None:
    """The token in an actor's first frame, or None if that frame is not a preamble."""
    return first[len(MAGIC) :] if first.startswith(MAGIC) else None


def tune(sock: socket.socket) -> None:
    """No Nagle delay on a step's few bytes, and TCP keepalive (a TCP socket; else nothing)."""
    if sock.family not in (socket.AF_INET, socket.AF_INET6):
        return
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_KEEPALIVE, 1)
    for name, value in _KEEPALIVE.items():
        if hasattr(socket, name):  # Linux's names; other systems keep their defaults
            sock.setsockopt(socket.IPPROTO_TCP, getattr(socket, name), value)


class TooLarge(Exception):
    """A frame longer than the stream's limit: ``size`` bytes announced."""

    def __init__(self, size: int, limit: int) -> None:
        super().__init__(f"message of {size} bytes is over this run's {limit}-byte limit")
        self.size = size


class FrameProtocol(asyncio.BufferedProtocol):
    """The learner's end of one connection: whole frames, in order, for ``read``.

    ``on_open(protocol)`` runs when the connection is made (it may refuse it with ``abort``);
    ``on_close(protocol)`` once it is gone. ``limit`` bounds a frame; the first frame is
    bounded by ``MAX_PREAMBLE`` until ``limit`` is raised (``set_limit``).
    """

    def __init__(self, on_open: Any, on_close: Any) -> None:
        self._on_open, self._on_close = on_open, on_close
        self._buffer = bytearray(64 * 1024)
        self._filled = 0
        self._frames: collections.deque[bytes | BaseException] = collections.deque()
        self._waiter: asyncio.Future | None = None
        self._paused = False
        self._limit = MAX_PREAMBLE
        self.transport: asyncio.Transport | None = None
        self.closed = False

    # --- asyncio's calls --------------------------------------------------------------------

    def connection_made(self, transport: Any) -> None:
        self.transport = transport
        sock = transport.get_extra_info("socket")
        if sock is not None:
            tune(sock)
        self._on_open(self)

    def get_buffer(self, sizehint: int) -> memoryview:
        if self._filled == len(self._buffer):  # a frame longer than the buffer: grow it
            self._buffer = self._buffer + bytearray(len(self._buffer))
        return memoryview(self._buffer)[self._filled :]

    def buffer_updated(self, nbytes: int) -> None:
        self._filled += nbytes
        while self._filled >= HEADER.size:
            size = HEADER.unpack_from(self._buffer)[0]
            if size > self._limit:
                self._deliver(TooLarge(size, self._limit))
                self._pause()  # nothing after an oversized frame is read
                return
            end = HEADER.size + size
            if self._filled < end:
                if end > len(self._buffer):
                    grown = bytearray(end)
                    grown[: self._filled] = memoryview(self._buffer)[: self._filled]
                    self._buffer = grown
                return
            self._deliver(bytes(memoryview(self._buffer)[HEADER.size : end]))
            rest = self._filled - end
            if rest:
                self._buffer[:rest] = self._buffer[end : self._filled]
            self._filled = rest
        if len(self._frames) >= _WAITING:
            self._pause()

    def eof_received(self) -> bool:
        return False  # close: an actor that stops sending is done

    def connection_lost(self, exc: Exception | None) -> None:
        self.closed = True
        self._deliver(ConnectionError("the actor closed the connection"))
        self._on_close(self)

    # --- the stream's ------------------------------------------------------------------------

    async def read(self, timeout_s: float | None = None) -> bytes:
        """The next frame; ConnectionError once the connection is gone, TooLarge for a frame
        over the limit, TimeoutError after ``timeout_s`` with none."""
        if not self._frames:
            self._waiter = asyncio.get_running_loop().create_future()
            try:
                await asyncio.wait_for(self._waiter, timeout_s)
            finally:
                self._waiter = None
        frame = self._frames[0]
        if isinstance(frame, BaseException):
            raise frame  # left in place: every later read raises it too
        self._frames.popleft()
        if self._paused and len(self._frames) < _WAITING and not self.closed:
            self._paused = False
            self.transport.resume_reading()
        return frame

    def set_limit(self, limit: int) -> None:
        self._limit = limit

    def write(self, payload: bytes) -> None:
        if not self.closed:
            self.transport.write(framed(payload))

    def close(self) -> None:
        """Close once what was written is sent."""
        if not self.closed:
            self.transport.close()

    def abort(self) -> None:
        """Close at once, dropping what is unsent."""
        if not self.closed:
            self.transport.abort()

    def peer(self) -> str:
        """The peer as gRPC names it: ``ipv4:HOST:PORT``, ``ipv6:[HOST]:PORT`` or ``unix:``."""
        name = self.transport.get_extra_info("peername") if self.transport else None
        if isinstance(name, tuple) and len(name) == 2:
            return f"ipv4:{name[0]}:{name[1]}"
        if isinstance(name, tuple):
            return f"ipv6:[{name[0]}]:{name[1]}"
        return f"unix:{name or ''}"

    def _deliver(self, frame: bytes | BaseException) -> None:
        if self._frames and isinstance(self._frames[-1], BaseException):
            return  # the stream has ended already
        self._frames.append(frame)
        if self._waiter is not None and not self._waiter.done():
            self._waiter.set_result(None)

    def _pause(self) -> None:
        if not self._paused and not self.closed:
            self._paused = True
            self.transport.pause_reading()


class FrameSocket:
    """The actor's end: frames over a connected blocking socket (or an SSL socket on one)."""

    def __init__(self, sock: socket.socket, limit: int) -> None:
        self._sock, self._limit = sock, limit
        self._header = bytearray(HEADER.size)

    def send(self, payload: bytes) -> None:
        self._sock.sendall(framed(payload))

    def receive(self) -> bytes:
        """The next frame. ConnectionError when the learner closed the connection; ValueError
        when what came is not a frame this wire sends."""
        self._fill(memoryview(self._header))
        size = HEADER.unpack(self._header)[0]
        if size > self._limit:
            raise ValueError(f"a message of {size} bytes, over the {self._limit} this wire sends")
        body = bytearray(size)
        self._fill(memoryview(body))
        return bytes(body)

    def _fill(self, view: memoryview) -> None:
        got = 0
        while got < len(view):
            n = self._sock.recv_into(view[got:])
            if n == 0:
                raise ConnectionError("the learner closed the connection")
            got += n

    def close(self) -> None:
        with contextlib.suppress(OSError):  # not connected any more
            self._sock.shutdown(socket.SHUT_RDWR)
        self._sock.close()
