"""StopRules: the target return counts once the window holds enough episodes, the frame budget
stops the run, and a stop request set in one thread is seen in another."""

from __future__ import annotations

import threading

from seedbed.resolve import resolve
from seedbed.runtime.progress import Progress
from seedbed.runtime.stopping import StopRules


def rules(**settings) -> tuple[StopRules, Progress]:
    progress = Progress()
    return StopRules(resolve([settings]).train, progress), progress


def test_the_target_counts_once_the_window_holds_enough_episodes():
    stop, progress = rules(target_return=10.0, target_episodes=3, total_frames=1000)
    progress.window.add([20.0, 20.0], [5, 5])
    progress.frames = 100
    assert stop.check(1.0) is None and progress.target_reached is None
    progress.window.add([20.0], [5])
    progress.frames = 150
    assert stop.check(2.5) == "target_return"
    assert progress.target_reached == {"frames": 150, "wall_s": 2.5, "mean_return": 20.0}
    progress.frames = 200
    assert stop.check(3.0) == "target_return"
    assert progress.target_reached["frames"] == 150  # when it was first reached


def test_a_return_below_the_target_goes_on_until_the_frame_budget():
    stop, progress = rules(target_return=10.0, target_episodes=1, total_frames=1000)
    progress.window.add([5.0], [5])
    progress.frames = 999
    assert stop.check(1.0) is None
    progress.frames = 1000
    assert stop.check(2.0) == "total_frames"
    assert progress.target_reached is None


def test_a_stop_request_from_another_thread_is_seen():
    stop, _ = rules()
    assert not stop.requested.is_set()
    thread = threading.Thread(target=stop.request)
    thread.start()
    thread.join()
    assert stop.requested.is_set()


def test_a_window_holding_an_inf_or_nan_never_reaches_the_target():
    """The server keeps such returns out; a window restored from an older checkpoint may not."""
    for bad in (float("inf"), float("nan")):
        stop, progress = rules(target_return=10.0, target_episodes=1, total_frames=1000)
        progress.window.add([bad, 20.0], [5, 5])
        progress.frames = 100
        assert stop.check(1.0) is None and progress.target_reached is None
