"""Start N replicas on this machine, collect their results, and stop them all if one fails.

Each replica is a fresh process (the ``spawn`` start method: safe with threads and CUDA). The
replicas meet through a file in a private temporary directory rather than a TCP port: no port to
race for, and no listener at all (torch's TCPStore listens on every interface, not only on
127.0.0.1). Gloo and NCCL are pointed at the loopback interface, so nothing a replica opens is
reachable from other machines.

A replica reports back on its own pipe: its pickled result, or its exception with the time it
was raised. The first failure wins; the other replicas, which may be waiting in a collective
for the failed one, are then terminated, and ``ReplicaError`` names the replica and its error.
"""

from __future__ import annotations

import os
import pickle
import runpy
import signal
import socket
import sys
import tempfile
import threading
import time
import traceback
from collections.abc import Callable, Sequence
from multiprocessing.connection import Connection, wait
from typing import Any

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

from seedbed.errors import SeedbedError

DEFAULT_TIMEOUT_S = 60.0
STORE_ENV = "SEEDBED_REPLICA_STORE"  # the rendezvous file that spawn hands its replicas
TIMEOUT_ENV = "SEEDBED_REPLICA_TIMEOUT"  # seconds a collective waits for a missing peer
_STOP_GRACE_S = 5.0  # how long a terminated replica may take to exit before it is killed
_SETTLE_S = 0.5  # after a first failure, how long to wait for others before naming the cause


class ReplicaError(SeedbedError):
    """A replica raised or died; the message names it and its exception in one line.

    Attributes:
        replica: the failed replica's id.
        traceback: its traceback as text (also printed on its stderr), or "" if it died.
    """

    def __init__(self, message: str, replica: int, traceback: str = "") -> None:
        super().__init__(message)
        self.replica = replica
        self.traceback = traceback


def spawn(
    num_replicas: int, fn: Callable[..., Any], *args: Any, timeout: float = DEFAULT_TIMEOUT_S
) -> list[Any]:
    """Run ``fn(*args)`` as ``num_replicas`` replicas; return their results in replica order.

    Inside ``fn``, ``Replicator()`` joins the group. ``fn`` must be importable by name (a
    module-level function; in a script, guard the call with ``if __name__ == "__main__":``), and
    its arguments and result picklable. A replica that raises, exits non-zero or is killed stops
    all of them, and this raises ``ReplicaError``.

    Args:
        num_replicas: processes to start, one replica each.
        fn: what every replica runs.
        *args: ``fn``'s arguments, the same for every replica.
        timeout: seconds a collective waits for a peer before it fails.
    """
    if num_replicas < 1:
        raise SeedbedError(f"the number of replicas must be positive, got {num_replicas}")
    if not timeout > 0:
        raise SeedbedError(f"the collective timeout must be positive, got {timeout} s")
    if os.environ.get(STORE_ENV) or int(os.environ.get("WORLD_SIZE", "1")) > 1:
        raise SeedbedError("this process is already a replica; start replicas from one parent")
    context = mp.get_context("spawn")
    procs: list[Any] = []
    conns: list[Connection] = []
    with tempfile.TemporaryDirectory(prefix="seedbed-replicas-") as tmp:
        store = os.path.join(tmp, "store")
        try:
            for rank in range(num_replicas):
                reader, writer = context.Pipe(duplex=False)
                proc = context.Process(
                    target=_replica_main,
                    args=(fn, args, rank, num_replicas, store, timeout, writer),
                    name=f"seedbed-replica-{rank}",
                )
                proc.start()
                writer.close()
                procs.append(proc)
                conns.append(reader)
            return _collect(procs, conns)
        finally:
            _stop(procs)
            for conn in conns:
                conn.close()


def run_script(
    path: str, argv: Sequence[str], num_replicas: int, timeout: float = DEFAULT_TIMEOUT_S
) -> None:
    """Run a Python script as ``num_replicas`` replicas, each as ``python path *argv`` would."""
    if not os.path.isfile(path):
        raise SeedbedError(f"no such script: {path}")
    spawn(num_replicas, _run_path, os.path.abspath(path), list(argv), timeout=timeout)


def _run_path(path: str, argv: list[str]) -> None:
    """A script run as ``__main__``, with its own argv and its folder first on sys.path."""
    sys.argv = [path, *argv]
    sys.path.insert(0, os.path.dirname(path))
    runpy.run_path(path, run_name="__main__")


def _collect(procs: list[Any], conns: list[Connection]) -> list[Any]:
    """Every replica's result, or ReplicaError for the replica that failed first."""
    n = len(procs)
    results: dict[int, Any] = {}
    failures: list[dict] = []
    unread = {conn: rank for rank, conn in enumerate(conns)}
    running = {proc.sentinel: rank for rank, proc in enumerate(procs)}
    deadline = None
    while len(results) < n and unread and (deadline is None or time.monotonic() < deadline):
        timeout = None if deadline is None else max(0.0, deadline - time.monotonic())
        ready = wait([*unread, *running], timeout)
        reports = [(unread.pop(c), c) for c in ready if c in unread]
        for sentinel in [s for s in ready if s in running]:
            rank = running.pop(sentinel)
            if conns[rank] in unread:  # it exited before its report was read (or never sent one)
                del unread[conns[rank]]
                reports.append((rank, conns[rank]))
        for rank, conn in reports:
            kind, value = _receive(conn, procs[rank])
            if kind == "ok":
                results[rank] = value
            else:
                failures.append({**value, "replica": rank})
        if failures and deadline is None:  # let the failures it caused come in, to tell them apart
            deadline = time.monotonic() + _SETTLE_S
    if not failures:
        return [results[rank] for rank in range(n)]
    # A replica that died without a word (killed, os._exit) usually broke the collectives the
    # others then failed in; otherwise the first error raised is the cause.
    first = min(failures, key=lambda f: (not f.get("died", False), f["time"]))
    lines = first["error"].strip().splitlines() or [""]
    message = f"replica {first['replica']} of {n} failed: {lines[0][:300]}"
    raise ReplicaError(message, first["replica"], first.get("traceback", ""))


def _receive(conn: Connection, proc: Any) -> tuple[str, Any]:
    """A replica's report, or a failure saying how it died without one."""
    try:
        if conn.poll():
            return pickle.loads(conn.recv_bytes())
    except (EOFError, OSError):
        pass
    except Exception as e:  # a result this process cannot unpickle
        return "error", {"time": time.time(), "error": f"its result could not be read: {e!r}"}
    proc.join(_STOP_GRACE_S)
    code = proc.exitcode
    how = f"killed by {signal.Signals(-code).name}" if code and code < 0 else f"exit code {code}"
    return "error", {"time": time.time(), "error": f"died without a result ({how})", "died": True}


def _stop(procs: list[Any]) -> None:
    """Terminate replicas still running (waiting for a failed peer, say); kill the stubborn."""
    for proc in procs:
        if proc.is_alive():
            proc.terminate()
    deadline = time.monotonic() + _STOP_GRACE_S
    for proc in procs:
        proc.join(max(0.0, deadline - time.monotonic()))
        if proc.is_alive():
            proc.kill()
            proc.join()


def _replica_main(
    fn: Callable[..., Any],
    args: tuple,
    rank: int,
    num_replicas: int,
    store: str,
    timeout: float,
    conn: Connection,
) -> None:
    """One replica: describe the group in the environment, run ``fn``, report back."""
    os.environ.update(
        {
            "RANK": str(rank),
            "WORLD_SIZE": str(num_replicas),
            "LOCAL_RANK": str(rank),
            "LOCAL_WORLD_SIZE": str(num_replicas),
            STORE_ENV: store,
            TIMEOUT_ENV: str(timeout),
        }
    )
    loopback = _loopback_interface()
    if loopback:
        os.environ.setdefault("GLOO_SOCKET_IFNAME", loopback)
        os.environ.setdefault("NCCL_SOCKET_IFNAME", loopback)
    if "OMP_NUM_THREADS" not in os.environ:  # share the cores, as torchrun does
        torch.set_num_threads(max(1, (os.cpu_count() or 1) // num_replicas))
    _exit_with_parent()
    try:
        try:
            value = fn(*args)
        except SystemExit as e:
            if e.code not in (None, 0):
                raise
            value = None
        report = pickle.dumps(("ok", value))
    except BaseException as e:
        text = traceback.format_exc()
        sys.stderr.write(f"replica {rank} of {num_replicas} failed:\n{text}")
        sys.stderr.flush()
        error = {"time": time.time(), "error": f"{type(e).__name__}: {e}", "traceback": text}
        conn.send_bytes(pickle.dumps(("error", error)))
        # Stay until the parent stops everyone: exiting now would close our connections, and
        # the replicas waiting for us would report that instead of our error.
        time.sleep(_STOP_GRACE_S)
        sys.exit(1)
    conn.send_bytes(report)
    if dist.is_initialized():
        dist.destroy_process_group()


def _loopback_interface() -> str | None:
    """The loopback interface's name (``lo`` on Linux, ``lo0`` on macOS), if there is one."""
    try:
        names = {name for _, name in socket.if_nameindex()}
    except (OSError, AttributeError):
        return None
    return next((name for name in ("lo", "lo0") if name in names), None)


def _exit_with_parent() -> None:
    """End this replica if its parent dies, so that no replica outlives its launcher."""
    parent = os.getppid()

    def watch() -> None:
        while os.getppid() == parent:
            time.sleep(1.0)
        os._exit(1)

    threading.Thread(target=watch, name="seedbed-parent-watch", daemon=True).start()
