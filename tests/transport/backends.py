"""Every registered transport backend behind one test harness: its server, and actors started
as the backend reaches them (spawned processes, or threads of this process)."""

from __future__ import annotations

import multiprocessing
import threading
from collections.abc import Callable
from typing import Any

import pytest

from seedbed.transport import TRANSPORTS, backend
from seedbed.transport.base import TransportSpec

#: Parametrize a test over every registered backend: ``@each_backend`` then a ``name`` argument.
each_backend = pytest.mark.parametrize("name", TRANSPORTS)


def start(name: str, target: Callable[..., None], *args: Any) -> Any:
    """Run ``target(*args)`` where backend ``name``'s actors run; ``exit_code`` waits for it."""
    if backend(name).actor_processes:
        proc = multiprocessing.get_context("spawn").Process(target=target, args=args)
        proc.start()
        return proc
    return _Thread(target, args)


def exit_code(worker: Any, timeout_s: float = 30.0) -> int | None:
    """The worker's exit code (0: returned, the ``SystemExit`` code, 1: another error)."""
    worker.join(timeout_s)
    return worker.exitcode


class _Thread(threading.Thread):
    """A thread that reports an exit code as a process would."""

    def __init__(self, target: Callable[..., None], args: tuple) -> None:
        super().__init__(daemon=True)
        self._body, self._args = target, args
        self.exitcode: int | None = None
        self.start()

    def run(self) -> None:
        try:
            self._body(*self._args)
            self.exitcode = 0
        except SystemExit as e:
            self.exitcode = e.code
        except BaseException:
            self.exitcode = 1
            raise


class Harness:
    """Backend ``name``'s server for ``spec``, with actors started by ``launch``."""

    def __init__(self, name: str, spec: TransportSpec) -> None:
        self.name = name
        self.server = backend(name).make_server(spec, multiprocessing.get_context("spawn"))
        self.workers: list[Any] = []

    def launch(self, actor: int, target: Callable[..., None], *args: Any) -> None:
        """Start ``target(endpoint, actor, *args)`` with a fresh endpoint for slot ``actor``."""
        endpoint = self.server.connect(actor)
        self.workers.append(start(self.name, target, endpoint, actor, *args))
        endpoint.close_parent_copy()

    def exit_codes(self) -> list[int | None]:
        return [exit_code(w) for w in self.workers]
