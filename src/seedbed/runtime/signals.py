"""Ctrl-C and SIGTERM during a run: the first stops it in order, a second is only noted.

A terminal's Ctrl-C pressed twice, or ``timeout`` signalling a child and then its group, sends
two signals within milliseconds. Raising KeyboardInterrupt at each one would break off the
final checkpoint and summary that the first one asked for, so ``StopSignals`` turns the first
into a request (``on_stop``), notes the second, and only the third (or a stop that outlives its
grace period) raises ``StopNow``, a KeyboardInterrupt, in the main thread. Writes are atomic, so
even then the previous complete checkpoint stays; the caller's cleanup still releases its
shared memory.

It also ignores SIGXFSZ: past a file-size limit a write then fails with EFBIG, which the run
reports in one line, instead of the kernel ending the process without a word.
"""

from __future__ import annotations

import logging
import signal
import threading
from collections.abc import Callable
from typing import Any

log = logging.getLogger(__name__)

STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM)
ABORT_AFTER = 3  # the signal that ends the process at once


class StopNow(KeyboardInterrupt):
    """Raised in the main thread by the third signal, or when the orderly stop ran out of time."""


class StopSignals:
    """While entered (in the main thread), SIGINT and SIGTERM ask ``on_stop`` for an orderly stop.

    Args:
        on_stop: Called from the signal handler at the first signal; must only set a flag, or
            raise (a KeyboardInterrupt) to stop at once.
        grace_s: How long the orderly stop may take after the first signal before the main
            thread is interrupted as a third signal would; None waits for ever.
    """

    def __init__(self, on_stop: Callable[[], None], grace_s: float | None = None) -> None:
        self._on_stop = on_stop
        self._grace_s = grace_s
        self.received = 0
        self._done = threading.Event()
        self._watcher: threading.Thread | None = None
        self._previous: list[Any] = []

    def __enter__(self) -> StopSignals:
        if threading.current_thread() is threading.main_thread():
            self._previous = [(s, signal.signal(s, self._handle)) for s in STOP_SIGNALS]
            self._previous.append((signal.SIGXFSZ, signal.signal(signal.SIGXFSZ, signal.SIG_IGN)))
        return self

    def __exit__(self, *exc_info: object) -> None:
        self._done.set()
        if self._watcher is not None:
            # Joined, not left to end as the interpreter exits: a daemon thread that drops the
            # last reference to torch tensors during finalization aborts the process.
            self._watcher.join()
        for sig, handler in self._previous:
            signal.signal(sig, handler)
        self._previous = []

    def _handle(self, signum: int, frame: Any) -> None:
        self.received += 1
        name = signal.Signals(signum).name
        if self.received == 1:
            self._on_stop()  # first: it may raise, to stop at once
            log.warning(
                "%s: stopping after the final checkpoint and summary (signal %d more times to "
                "stop at once)",
                name,
                ABORT_AFTER - 1,
            )
            if self._grace_s is not None:
                self._watcher = threading.Thread(target=self._watch, name="stop-grace", daemon=True)
                self._watcher.start()
        elif self.received < ABORT_AFTER:
            log.warning("%s again: still writing the final checkpoint and summary", name)
        else:
            log.warning(
                "%s a third time: stopping at once; the newest complete checkpoint stays", name
            )
            raise StopNow

    def _watch(self) -> None:
        if not self._done.wait(self._grace_s):
            log.warning(
                "the stop took longer than its %.0f s grace period: stopping at once; the newest "
                "complete checkpoint stays",
                self._grace_s,
            )
            self.received = ABORT_AFTER - 1
            # A real signal to the main thread, so that a blocking call there is interrupted
            # too; the handler then raises as at a third signal.
            signal.pthread_kill(threading.main_thread().ident, signal.SIGINT)
