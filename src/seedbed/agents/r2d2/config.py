"""Settings of the R2D2 agent: DQN's, plus recurrence and sequences (no torch here)."""

from __future__ import annotations

import dataclasses
from typing import Any

from seedbed.agents.dqn.config import DQNConfig, ReplayLayout, check_replay
from seedbed.config import setting
from seedbed.errors import ConfigError


@dataclasses.dataclass
class R2D2Config(DQNConfig):
    """Recurrent replay distributed DQN (Kapturowski et al. 2019): stored sequences with the
    recurrent state at their start, a burn-in to refresh it, then n-step double Q-learning."""

    lstm: bool = setting(True, "add an LSTM core fed with the previous action and reward")
    burn_in: int = setting(8, "steps at each sequence's start that only refresh the LSTM state")
    sequence_length: int = setting(16, "steps learned from in each sequence, after the burn-in")
    sequence_overlap: int = setting(8, "learned steps that consecutive sequences share")
    replay_capacity: int = setting(5_000, "replay items (sequences) kept, oldest dropped first")
    min_replay: int = setting(100, "sequences stored before learning starts")
    replay_ratio: float | None = setting(
        2.0,
        "sequences learned per sequence inserted; actors wait when the learner falls "
        "behind (none: no limit)",
    )
    priority_exponent: float = setting(0.9, "alpha: sample items in proportion to priority^alpha")
    importance_exponent: float = setting(0.6, "beta: importance-sampling weights (N P)^-beta")

    def layout(self, unroll: int) -> ReplayLayout:
        """Sequences of burn-in + length steps (and one to bootstrap from), a new one every
        length - overlap steps; ``unroll`` is not used: the sequence settings define it."""
        steps = self.burn_in + self.sequence_length
        shared = self.burn_in + self.sequence_overlap + 1
        return ReplayLayout(steps, shared, 1, steps + 1, self.burn_in, self.sequence_length)

    def validate(self) -> None:
        super().validate()
        if self.burn_in < 0 or self.sequence_length <= 0:
            raise ConfigError("--burn-in must be >= 0 and --sequence-length positive")
        if self.burn_in >= self.sequence_length:
            raise ConfigError(
                f"--burn-in ({self.burn_in}) must be shorter than --sequence-length "
                f"({self.sequence_length}), or most of each sequence is never learned from"
            )
        if not 0 <= self.sequence_overlap < self.sequence_length:
            raise ConfigError(
                f"--sequence-overlap ({self.sequence_overlap}) must be >= 0 and less than "
                f"--sequence-length ({self.sequence_length})"
            )

    def check_run(self, train: Any) -> None:
        check_replay(self, self.layout(train.unroll), train.batch)


CONFIG_CLASS = R2D2Config
