"""When a training run stops: at the target return, at the frame budget, or when asked to.

The learner loop checks the rules with each metrics row (every ``--log-every-s``), on counters
merged over every learner replica, so all replicas reach the same decision. A stop request (the
first Ctrl-C or SIGTERM, ``TrainingRun.request_stop``) is read after every learner step; with
several replicas replica 0's decides for all.
"""

from __future__ import annotations

import math
import threading

from seedbed.config import TrainConfig
from seedbed.runtime.progress import Progress


class StopRules:
    """The stop rules of one run, over its ``Progress``."""

    def __init__(self, cfg: TrainConfig, progress: Progress) -> None:
        self.target_return = cfg.target_return  # the mean return of the latest 100 episodes
        self.target_episodes = cfg.target_episodes  # how many the window holds at least
        self.total_frames = cfg.total_frames
        self.requested = threading.Event()  # set from any thread: stop in order
        self._progress = progress

    def request(self) -> None:
        """Stop as Ctrl-C would (final checkpoint and summary), from any thread."""
        self.requested.set()

    def check(self, wall_s: float) -> str | None:
        """Why the run stops now, ``target_return`` or ``total_frames``, or None to go on.

        The first time the target is reached, ``Progress.target_reached`` records the frames,
        ``wall_s`` and the mean return at that row.
        """
        progress = self._progress
        mean_return = progress.window.mean_return()
        reached = (
            self.target_return is not None
            and mean_return is not None
            # A window that holds an inf (one saved before returns were checked) reaches nothing.
            and math.isfinite(mean_return)
            and mean_return >= self.target_return
            and progress.window.count >= self.target_episodes
        )
        if reached and progress.target_reached is None:
            progress.target_reached = {
                "frames": progress.frames,
                "wall_s": round(wall_s, 3),
                "mean_return": mean_return,
            }
        if reached:
            return "target_return"
        if progress.frames >= self.total_frames:
            return "total_frames"
        return None
