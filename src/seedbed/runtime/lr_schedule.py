"""The learning rate over a run (``--lr-schedule``): constant, or falling linearly to 0 at
``--total-frames``, as CleanRL's and Sample Factory's Atari PPO anneal it, optionally held at
its start for the first ``--lr-hold-frames``.

The schedule is the runtime's, not an agent's: it reads the run's frame count, which no agent
sees, and scales every optimizer the agent declares (``Agent.optimizers``), so one schedule
serves every agent and each of its learning rates (D4PG's actor and critic alike).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch


def lr_fraction(schedule: str, frames: int, total_frames: int, hold_frames: int = 0) -> float:
    """The fraction of its initial learning rate an optimizer takes after ``frames``."""
    if schedule == "constant":
        return 1.0
    if schedule == "linear":
        if frames <= hold_frames:  # also every frame of a run that ends within its hold
            return 1.0
        return max(0.0, 1.0 - (frames - hold_frames) / max(1, total_frames - hold_frames))
    raise ValueError(f"unknown learning-rate schedule {schedule!r}")


class LearningRates:
    """Sets each optimizer's learning rates to their initial values times the schedule's
    fraction at a frame count.

    The initial value is kept in each parameter group as ``initial_lr`` (torch's own
    schedulers' key), so it is saved with the optimizer's state: a resumed run goes on from the
    same rates, not from the decayed ones it stopped at.
    """

    def __init__(
        self,
        optimizers: Sequence[torch.optim.Optimizer],
        schedule: str,
        total_frames: int,
        hold_frames: int = 0,
    ) -> None:
        self._groups = [g for opt in optimizers for g in opt.param_groups]
        self._schedule, self._total, self._hold = schedule, total_frames, hold_frames
        for group in self._groups:
            group.setdefault("initial_lr", group["lr"])

    def update(self, frames: int) -> float:
        """Set the rates for ``frames``; return the fraction set."""
        fraction = lr_fraction(self._schedule, frames, self._total, self._hold)
        for group in self._groups:
            group["lr"] = group["initial_lr"] * fraction
        return fraction
