"""Start actor processes, restart the ones that die, and stop them all at the end."""

from __future__ import annotations

import contextlib
import logging
import multiprocessing
import os
import signal
import sys
import threading
import time
import traceback
from collections.abc import Callable
from multiprocessing import forkserver
from multiprocessing.connection import wait
from typing import Any

from seedbed.errors import SeedbedError

log = logging.getLogger(__name__)

# An actor that fails this soon after its launch failed at start: the same error twice so is
# no accident a restart would mend (an env the actors cannot make, a missing package).
START_S = 10.0


def actor_context() -> Any:
    """The multiprocessing context actors start from, starting now.

    Where the platform has one, a fork server that imports the actor's code once: each actor,
    and each restart, is then a fork of it, instead of a fresh interpreter that imports numpy
    and the env libraries again. Called before the learner builds
    its networks, the server loads on another core meanwhile. Elsewhere: spawn.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["seedbed.actor"])
    forkserver.ensure_running()
    return context


def _with_environment(
    environ: dict[str, str], report: Any, target: Callable[..., None], *args: Any
) -> None:
    """An actor's body, run in the learner's environment as it is at the launch (a forked
    actor would otherwise get the fork server's, as it was when the server started). Its error
    goes to the supervisor through ``report`` (one line and the traceback), which says it once,
    rather than to stderr from every actor and every restart."""
    os.environ.clear()
    os.environ.update(environ)
    try:
        target(*args)
    except Exception as e:
        with contextlib.suppress(OSError, ValueError):
            report.send((one_line(e), traceback.format_exc()))
        sys.exit(1)


def one_line(error: BaseException) -> str:
    """``Type: the message's first line``."""
    text = str(error).strip()
    return f"{type(error).__name__}: {text.splitlines()[0]}" if text else type(error).__name__


class ActorSupervisor:
    """Keeps ``num_actors`` actor processes alive.

    ``connect(i)`` returns a fresh transport endpoint for actor slot ``i`` (a new run id, so the
    learner resets that actor's environments); ``target(endpoint, seed)`` is the process body.
    A watcher thread waits on the processes' sentinels and restarts one as soon as it dies.
    """

    def __init__(
        self,
        num_actors: int,
        connect: Callable[[int], Any],
        target: Callable[..., None],
        args: tuple,
        seed: int,
        context: Any,
        max_restarts: int,
    ) -> None:
        self.num_actors = num_actors
        self._connect = connect
        self._target = target
        self._args = args
        self._seed = seed
        self._ctx = context
        self.max_restarts = max_restarts
        self.restarts = 0
        self.error: SeedbedError | None = None
        self._procs: list[Any] = [None] * num_actors
        self._reports: list[Any] = [None] * num_actors  # where each actor says its error
        self._launched_at = [0.0] * num_actors
        self._failed_at_start: str | None = None  # the last error an actor failed at start with
        self._orphans: list[int] = []  # actors alive but no longer watched (see _restart)
        self._launches = 0
        self._stop = threading.Event()
        self._lock = threading.Lock()
        self._watcher = threading.Thread(target=self._watch, name="actor-watcher", daemon=True)

    def start(self) -> None:
        for i in range(self.num_actors):
            self._launch(i)
        self._watcher.start()

    def _launch(self, i: int) -> None:
        endpoint = self._connect(i)
        seed = self._seed + 1_000_003 * self._launches + i  # a restarted actor sees new episodes
        self._launches += 1
        reader, writer = self._ctx.Pipe(duplex=False)
        proc = self._ctx.Process(
            target=_with_environment,
            args=(dict(os.environ), writer, self._target, endpoint, *self._args, seed),
            name=f"seedbed-actor-{i}",
            daemon=True,
        )
        proc.start()
        writer.close()
        endpoint.close_parent_copy()
        if self._reports[i] is not None:
            self._reports[i].close()
        self._procs[i], self._reports[i] = proc, reader
        self._launched_at[i] = time.monotonic()

    def _watch(self) -> None:
        try:
            while not self._stop.is_set():
                with self._lock:
                    sentinels = {p.sentinel: i for i, p in enumerate(self._procs) if p is not None}
                for sentinel in wait(list(sentinels), timeout=0.2):
                    with self._lock:
                        if self._stop.is_set():
                            return
                        self._restart(sentinels[sentinel])
        except Exception as e:  # e.g. no actor can be launched: the run's error, in one line
            log.debug("the actor watcher failed", exc_info=e)
            self.error = SeedbedError(
                f"the actor watcher failed ({one_line(e)}); the run stopped with a final "
                "checkpoint: fix the cause, then --resume"
            )

    def _restart(self, i: int) -> None:
        proc = self._procs[i]
        proc.join()
        if proc.exitcode == 255 and _alive(proc.pid):
            # The fork server, which tells an actor's exit, is gone and the actor is not: a
            # signal to the whole process group (a scheduler's stop, Ctrl-C), which actors
            # ignore, ended the server. No actor died: the run is stopping, or goes on with it.
            log.debug("the fork server ended; actor %d (pid %d) goes on unwatched", i, proc.pid)
            self._orphans.append(proc.pid)
            self._procs[i] = None
            return
        error = self._error_of(i)
        if error is not None and time.monotonic() - self._launched_at[i] < START_S:
            if error[0] == self._failed_at_start:
                log.debug("actor %d failed at start:\n%s", i, error[1])
                self.error = SeedbedError(
                    f"actor {i} failed at start twice with the same error ({error[0]}); "
                    "stopped: fix the env or its settings (`seedbed -v train ...` shows the "
                    "traceback)"
                )
                self._procs[i] = None
                return
            self._failed_at_start = error[0]
        if self.restarts >= self.max_restarts:
            self.error = SeedbedError(
                f"actor {i} died (exit code {proc.exitcode}) after {self.restarts} restarts; "
                "giving up: check the environment, or raise --max-actor-restarts"
            )
            self._procs[i] = None
            return
        self.restarts += 1
        if error is not None:
            log.debug("actor %d failed:\n%s", i, error[1])
        log.warning(
            "actor %d died (%s); restarting it (restart %d)",
            i,
            error[0] if error else f"exit code {proc.exitcode}",
            self.restarts,
        )
        self._launch(i)

    def _error_of(self, i: int) -> tuple[str, str] | None:
        """The error actor ``i`` reported before it ended (one line, traceback), if any."""
        report = self._reports[i]
        try:
            return report.recv() if report.poll(0) else None
        except (EOFError, OSError):
            return None

    def kill(self, i: int) -> int:
        """Kill actor ``i`` at once (for tests and fault drills); returns its pid."""
        proc = self._procs[i]
        proc.kill()
        return proc.pid

    def pids(self) -> list[int]:
        with self._lock:
            return [p.pid for p in self._procs if p is not None]

    def stop(self, timeout_s: float = 5.0) -> None:
        """Stop every actor; leaves no process behind.

        Actors ignore SIGTERM (the learner decides when they stop) and hold nothing to save, so
        they are killed outright.
        """
        self._stop.set()
        with self._lock:
            procs = [p for p in self._procs if p is not None]
        for p in procs:
            if p.is_alive():
                p.kill()
        for pid in self._orphans:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        for p in procs:
            p.join()
        if self._watcher.is_alive():
            self._watcher.join(timeout_s)
        for report in self._reports:
            if report is not None:
                report.close()


def _alive(pid: int) -> bool:
    """Whether process ``pid`` still runs (not merely waits to be reaped)."""
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        pass
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except OSError:
        return True
    return True
