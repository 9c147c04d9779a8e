"""Idle HTTP/2 connections, as a flood of them looks: each opens, sends the client preface and
its settings, answers the server's pings and settings, and never opens a stream.

Run as ``python -m tests.transport.idle_connections HOST:PORT N HOLD_S``: it holds ``N``
connections to ``HOST:PORT`` (127.0.0.1 only) for at most ``HOLD_S`` seconds, then closes them
and prints one JSON line: how many connected, and how many the server had closed by the end.
"""

from __future__ import annotations

import contextlib
import json
import resource
import selectors
import socket
import sys
import time

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
_SETTINGS, _PING, _ACK = 4, 6, 1


def _frame(kind: int, flags: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([kind, flags]) + bytes(4) + payload


class IdleConnections:
    """``n`` idle HTTP/2 connections to ``address``; ``poll`` answers the server meanwhile."""

    def __init__(self, address: str, n: int) -> None:
        host, port = address.rsplit(":", 1)
        if host not in ("127.0.0.1", "localhost"):
            raise ValueError("idle connections go to 127.0.0.1 only")
        self._selector = selectors.DefaultSelector()
        self._buffers: dict[socket.socket, bytes] = {}
        self.connected = self.closed = 0
        for _ in range(n):
            try:
                sock = socket.create_connection((host, int(port)), timeout=5)
            except OSError:
                continue  # refused or timed out: the server is full, as it may be
            self.connected += 1
            sock.setblocking(False)
            with contextlib.suppress(OSError):
                sock.sendall(PREFACE + _frame(_SETTINGS, 0))
            self._buffers[sock] = b""
            self._selector.register(sock, selectors.EVENT_READ)

    @property
    def open(self) -> int:
        return len(self._buffers)

    def poll(self, seconds: float) -> None:
        """Answer pings and settings for ``seconds``; count connections the server closes."""
        deadline = time.monotonic() + seconds
        while self._buffers and (left := deadline - time.monotonic()) > 0:
            for key, _ in self._selector.select(min(left, 0.1)):
                self._read(key.fileobj)

    def _read(self, sock: socket.socket) -> None:
        try:
            data = sock.recv(65536)
        except BlockingIOError:
            return
        except OSError:
            data = b""
        if not data:
            self._drop(sock)
            self.closed += 1
            return
        buffer = self._buffers[sock] + data
        while len(buffer) >= 9:
            length = int.from_bytes(buffer[:3], "big")
            if len(buffer) < 9 + length:
                break
            kind, flags, payload = buffer[3], buffer[4], buffer[9 : 9 + length]
            buffer = buffer[9 + length :]
            reply = b""
            if kind == _PING and not flags & _ACK:
                reply = _frame(_PING, _ACK, payload)
            elif kind == _SETTINGS and not flags & _ACK:
                reply = _frame(_SETTINGS, _ACK)
            with contextlib.suppress(OSError):
                sock.sendall(reply)
        self._buffers[sock] = buffer

    def _drop(self, sock: socket.socket) -> None:
        self._selector.unregister(sock)
        del self._buffers[sock]
        sock.close()

    def close(self) -> None:
        for sock in list(self._buffers):
            self._drop(sock)
        self._selector.close()


def main(address: str, n: int, hold_s: float) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < n + 64:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(hard, n + 64), hard))
    idle = IdleConnections(address, n)
    try:
        idle.poll(hold_s)
    finally:
        idle.close()
    print(json.dumps({"connected": idle.connected, "closed_by_server": idle.closed}), flush=True)


if __name__ == "__main__":
    main(sys.argv[1], int(sys.argv[2]), float(sys.argv[3]))
