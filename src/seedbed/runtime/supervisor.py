"""Start actor processes, restart the ones that die, and stop them all at the end."""

from __future__ import annotations

import logging
import multiprocessing
import os
import threading
from collections.abc import Callable
from multiprocessing import forkserver
from multiprocessing.connection import wait
from typing import Any

from seedbed.errors import SeedbedError

log = logging.getLogger(__name__)


def actor_context() -> Any:
    """The multiprocessing context actors start from, starting now.

    Where the platform has one, a fork server that imports the actor's code once: each actor,
    and each restart, is then a fork of it, in milliseconds rather than the half second a fresh
    interpreter takes to import numpy and the env libraries. Called before the learner builds
    its networks, the server loads on another core meanwhile. Elsewhere: spawn.
    """
    if "forkserver" not in multiprocessing.get_all_start_methods():
        return multiprocessing.get_context("spawn")
    context = multiprocessing.get_context("forkserver")
    context.set_forkserver_preload(["seedbed.actor"])
    forkserver.ensure_running()
    return context


def _with_environment(environ: dict[str, str], target: Callable[..., None], *args: Any) -> None:
    """An actor's body, run in the learner's environment as it is at the launch (a forked
    actor would otherwise get the fork server's, as it was when the server started)."""
    os.environ.clear()
    os.environ.update(environ)
    target(*args)


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
        proc = self._ctx.Process(
            target=_with_environment,
            args=(dict(os.environ), self._target, endpoint, *self._args, seed),
            name=f"seedbed-actor-{i}",
            daemon=True,
        )
        proc.start()
        endpoint.close_parent_copy()
        self._procs[i] = proc

    def _watch(self) -> None:
        while not self._stop.is_set():
            with self._lock:
                sentinels = {p.sentinel: i for i, p in enumerate(self._procs) if p is not None}
            for sentinel in wait(list(sentinels), timeout=0.2):
                with self._lock:
                    if self._stop.is_set():
                        return
                    self._restart(sentinels[sentinel])

    def _restart(self, i: int) -> None:
        proc = self._procs[i]
        proc.join()
        if self.restarts >= self.max_restarts:
            self.error = SeedbedError(
                f"actor {i} died (exit code {proc.exitcode}) after {self.restarts} restarts; "
                "giving up: check the environment, or raise --max-actor-restarts"
            )
            self._procs[i] = None
            return
        self.restarts += 1
        log.warning(
            "actor %d died (exit code %s); restarting it (restart %d)",
            i,
            proc.exitcode,
            self.restarts,
        )
        self._launch(i)

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
        for p in procs:
            p.join()
        if self._watcher.is_alive():
            self._watcher.join(timeout_s)
