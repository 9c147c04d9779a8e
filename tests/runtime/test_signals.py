"""``StopSignals``: the first signal asks, the second is noted, the third (or the grace) ends."""

from __future__ import annotations

import os
import signal
import time

import pytest

from seedbed.runtime.signals import StopNow, StopSignals


def wait_for(condition, timeout_s: float = 5.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline
        time.sleep(0.01)


def test_the_first_signal_asks_the_second_is_noted_the_third_stops_at_once():
    asked = []
    before = signal.getsignal(signal.SIGTERM)
    with pytest.raises(StopNow), StopSignals(lambda: asked.append(1)) as signals:
        assert signal.getsignal(signal.SIGXFSZ) == signal.SIG_IGN
        os.kill(os.getpid(), signal.SIGTERM)
        wait_for(lambda: signals.received == 1)
        os.kill(os.getpid(), signal.SIGINT)
        wait_for(lambda: signals.received == 2)
        assert asked == [1]  # asked once, and nothing raised
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(5)  # the third raises here
    assert signal.getsignal(signal.SIGTERM) is before  # restored on the way out


def test_a_stop_that_outlives_its_grace_period_is_ended():
    started = time.monotonic()
    with pytest.raises(StopNow), StopSignals(lambda: None, grace_s=0.3):
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(10)  # an orderly stop that hangs
    assert time.monotonic() - started < 5


def test_a_stop_within_its_grace_period_is_left_alone():
    with StopSignals(lambda: None, grace_s=0.5):
        os.kill(os.getpid(), signal.SIGTERM)
        time.sleep(0.1)
    time.sleep(0.6)  # the grace watcher is gone: nothing is raised now
