"""The wire's own cost: a learner-side process's CPU per round trip of one step, before any of
seedbed's work.

For each message size (``--sizes``: the bytes a remote actor's step of that size sends, as
``bench/ingest.py`` reports them) it serves one stream from a client in this process, which sends
a step, waits for the reply (81 bytes, a reply of 8 actions) and sends the next, and reports the
server process's CPU (user and system, all its threads) per round trip:

- ``grpc_aio``: a gRPC bidirectional stream served by gRPC's asyncio API, as ``ActorGateway``
  serves actors (the same protobuf-free bytes in and out, so this is gRPC and HTTP/2 alone);
- ``socket``: a plain TCP socket on a selector, each step read with ``recv_into`` straight into
  a preallocated buffer behind a 4-byte length: the least any wire on TCP costs in Python.

The difference is the floor the gateway sits on: ``bench/ingest.py`` measures the learner host's
whole CPU per step, and no work in seedbed's own code can take it below ``grpc_aio`` here.

    python bench/wire.py
    python bench/wire.py --sizes 765,56560 --steps 5000 --out ../docs/results/wire.json
"""

from __future__ import annotations

import argparse
import asyncio
import multiprocessing
import multiprocessing.connection
import queue
import selectors
import socket
import struct
import sys
import time
from pathlib import Path

import grpc

sys.path.insert(0, str(Path(__file__).resolve().parent))
from machine import machine  # noqa: E402
from results import add_out, emit  # noqa: E402

REPLY = b"r" * 81
_METHOD = "/bench.Wire/Act"


def _cpu_s() -> float:
    return time.process_time()  # every thread of this process


def serve_grpc(ready: multiprocessing.connection.Connection, size: int) -> None:
    """One gRPC asyncio server; sends its port, then its CPU seconds when told."""

    async def act(requests, context):  # noqa: ANN001, ANN202 (gRPC calls it)
        async for _ in requests:
            yield REPLY

    async def main() -> None:
        handler = grpc.stream_stream_rpc_method_handler(act)
        server = grpc.aio.server(
            handlers=[grpc.method_handlers_generic_handler("bench.Wire", {"Act": handler})],
            options=[("grpc.max_receive_message_length", 2 * size + 1024)],
        )
        port = server.add_insecure_port("127.0.0.1:0")
        await server.start()
        ready.send(port)
        loop = asyncio.get_running_loop()
        while True:
            command = await loop.run_in_executor(None, ready.recv)
            if command == "cpu":
                ready.send(_cpu_s())
            else:
                break
        await server.stop(0)

    asyncio.run(main())


def serve_socket(ready: multiprocessing.connection.Connection, size: int) -> None:
    """One plain TCP server on a selector: length-prefixed steps read into one buffer."""
    listener = socket.create_server(("127.0.0.1", 0))
    ready.send(listener.getsockname()[1])
    conn, _ = listener.accept()
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    conn.setblocking(False)
    buffer = memoryview(bytearray(size + 4))
    header = struct.Struct("<I")
    reply = header.pack(len(REPLY)) + REPLY
    selector = selectors.DefaultSelector()
    selector.register(conn, selectors.EVENT_READ, "conn")
    selector.register(ready.fileno(), selectors.EVENT_READ, "control")
    got = 0
    while True:
        for key, _ in selector.select():
            if key.data == "control":
                if ready.recv() != "cpu":
                    return
                ready.send(_cpu_s())
                continue
            try:
                n = conn.recv_into(buffer[got:])
            except BlockingIOError:
                continue
            if n == 0:
                selector.unregister(conn)
                continue
            got += n
            if got >= 4 and got == 4 + header.unpack_from(buffer)[0]:
                got = 0
                conn.sendall(reply)


def _grpc_client(port: int, payload: bytes, rounds: list[int], between) -> None:  # noqa: ANN001
    channel = grpc.insecure_channel(
        f"127.0.0.1:{port}", options=[("grpc.max_send_message_length", 2 * len(payload) + 1024)]
    )
    sent: queue.SimpleQueue = queue.SimpleQueue()

    def requests():  # noqa: ANN202
        while (item := sent.get()) is not None:
            yield item

    replies = channel.stream_stream(_METHOD)(requests())
    for steps in rounds:
        for _ in range(steps):
            sent.put(payload)
            next(replies)
        between()
    sent.put(None)
    channel.close()


def _socket_client(port: int, payload: bytes, rounds: list[int], between) -> None:  # noqa: ANN001
    conn = socket.create_connection(("127.0.0.1", port))
    conn.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    framed = struct.pack("<I", len(payload)) + payload
    reply = memoryview(bytearray(4 + len(REPLY)))
    for steps in rounds:
        for _ in range(steps):
            conn.sendall(framed)
            got = 0
            while got < len(reply):
                got += conn.recv_into(reply[got:])
        between()
    conn.close()


WIRES = {"grpc_aio": (serve_grpc, _grpc_client), "socket": (serve_socket, _socket_client)}


def measure(wire: str, size: int, steps: int, warmup: int) -> dict:
    """The server's CPU per round trip over ``steps`` after ``warmup`` on the same stream."""
    serve, client = WIRES[wire]
    ctx = multiprocessing.get_context("spawn")
    here, there = ctx.Pipe()
    server = ctx.Process(target=serve, args=(there, size), daemon=True)
    server.start()
    port = here.recv()
    marks: list[tuple[float, float]] = []

    def between() -> None:
        here.send("cpu")
        marks.append((here.recv(), time.perf_counter()))

    client(port, bytes(size), [warmup, steps], between)
    here.send("stop")
    server.join(10)
    if server.is_alive():
        server.kill()
    (cpu0, t0), (cpu1, t1) = marks
    return {
        "wire": wire,
        "bytes_per_step": size,
        "bytes_per_reply": len(REPLY),
        "steps": steps,
        "server_cpu_us_per_round_trip": round(1e6 * (cpu1 - cpu0) / steps, 1),
        "wall_us_per_round_trip": round(1e6 * (t1 - t0) / steps, 1),
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--sizes", default="765,56560,225904", help="bytes a step sends")
    p.add_argument("--steps", type=int, default=10_000, help="round trips measured per point")
    p.add_argument("--warmup", type=int, default=1_000, help="round trips before the window")
    add_out(p)
    args = p.parse_args()
    points = [
        measure(wire, int(size), args.steps, args.warmup)
        for size in args.sizes.split(",")
        for wire in WIRES
    ]
    emit({"bench": "wire", "machine": machine(), "points": points}, args.out)


if __name__ == "__main__":
    main()
