"""Settings of the DQN agent, which R2D2's extend (no torch here: read by the CLI and by actors)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from seedbed.config import flag, setting
from seedbed.errors import ConfigError


@dataclasses.dataclass(frozen=True)
class ReplayLayout:
    """How unrolls are cut for replay and which of their steps are learned from.

    Actors' steps are gathered into unrolls of ``unroll`` + 1 steps, of which consecutive ones
    share ``overlap`` steps. Each stored unroll holds ``positions`` items of ``window`` steps;
    the learner runs the network over an item, the first ``burn_in`` steps without gradient,
    and learns from the ``learn_steps`` transitions after them.
    """

    unroll: int
    overlap: int
    positions: int
    window: int
    burn_in: int
    learn_steps: int


def transition_layout(unroll: int, n_step: int) -> ReplayLayout:
    """One-transition items with n-step windows: unrolls of ``unroll`` steps sharing ``n_step``
    steps, in which every step starts one item of n + 1 steps (the transition, and the rest of
    its n-step window). DQN and D4PG store their replay this way."""
    return ReplayLayout(unroll, n_step, unroll - n_step + 1, n_step + 1, 0, 1)


def validate_replay(config: Any) -> None:
    """One-line errors for replay settings that cannot work (the fields DQN, R2D2 and D4PG
    share: ``replay_capacity``, ``min_replay``, ``replay_ratio``, ``priority_exponent``,
    ``importance_exponent``)."""
    if config.replay_capacity <= 0:
        raise ConfigError(f"--replay-capacity must be positive, got {config.replay_capacity}")
    if config.min_replay < 0:
        raise ConfigError(f"--min-replay must be >= 0, got {config.min_replay}")
    if config.replay_capacity < config.min_replay:
        raise ConfigError(
            f"--replay-capacity ({config.replay_capacity}) is below --min-replay "
            f"({config.min_replay}): learning would never start; raise the capacity"
        )
    if config.replay_ratio is not None and config.replay_ratio <= 0:
        raise ConfigError(f"--replay-ratio must be positive or none, got {config.replay_ratio}")
    if config.priority_exponent < 0 or config.importance_exponent < 0:
        raise ConfigError("--priority-exponent and --importance-exponent must be >= 0")


def check_replay(config: Any, layout: ReplayLayout, batch: int) -> None:
    """A one-line error where the replay cannot hold --min-replay items and a batch."""
    # Replay keeps whole unrolls: only a multiple of the items per unroll fits.
    usable = config.replay_capacity // layout.positions * layout.positions
    if usable < max(config.min_replay, batch, 1):
        raise ConfigError(
            f"--replay-capacity ({config.replay_capacity}) holds {usable} items in whole "
            f"unrolls of {layout.positions}, fewer than --min-replay ({config.min_replay}) "
            f"or --batch ({batch}); raise the capacity"
        )


def check_n_step_unroll(unroll: int, n_step: int) -> None:
    """A one-line error where an unroll cannot hold an n-step window."""
    if unroll < n_step:
        raise ConfigError(
            f"--unroll ({unroll}) must be >= --n-step ({n_step}): each unroll must hold a "
            "whole n-step window"
        )


@dataclasses.dataclass
class DQNConfig:
    """Double, dueling, n-step Q-learning with prioritized replay (Hessel et al. 2018 parts)."""

    lr: float = setting(1e-3, "learning rate (Adam)")
    adam_eps: float = setting(1e-3, "Adam epsilon (R2D2 and Ape-X use 1e-3)")
    discount: float = setting(0.99, "discount factor gamma")
    n_step: int = setting(3, "steps of reward in each target before bootstrapping")
    target_update_every: int = setting(
        100, "learner steps between copies of the online network into the target network"
    )
    value_rescaling: bool = setting(
        True, "learn h(Q) with h(x) = sign(x)(sqrt(|x|+1)-1) + eps*x, as R2D2 does"
    )
    rescaling_eps: float = setting(1e-3, "the eps of the value rescaling h")
    reward_clip: float | None = setting(None, "clip learner rewards to [-x, x] (none: off)")
    max_grad_norm: float | None = setting(40.0, "clip the global gradient norm (none: off)")
    # Replay. Items are transitions for DQN and sequences for R2D2.
    replay_capacity: int = setting(100_000, "replay items kept (oldest dropped first)")
    min_replay: int = setting(2_000, "replay items stored before learning starts")
    replay_ratio: float | None = setting(
        4.0,
        "items learned per item inserted; actors wait when the learner falls behind "
        "(none: no limit)",
    )
    priority_exponent: float = setting(0.6, "alpha: sample items in proportion to priority^alpha")
    importance_exponent: float = setting(0.4, "beta: importance-sampling weights (N P)^-beta")
    priority_eta: float = setting(
        0.9, "an item's priority: eta * max + (1 - eta) * mean of its |TD errors|"
    )
    # Exploration: env i of N acts eps-greedily with eps_i = base^(1 + alpha * i / (N - 1)).
    epsilon_base: float = setting(0.4, "per-env epsilon: base of Ape-X's schedule")
    epsilon_alpha: float = setting(7.0, "per-env epsilon: exponent spread of Ape-X's schedule")
    torso: Literal["mlp", "nature", "a3c", "impala"] = setting(
        "mlp",
        "network torso: MLP, Nature DQN CNN, A3C's smaller CNN, or IMPALA's deep ResNet (images)",
    )
    torso_dtype: Literal["auto", "float32", "bfloat16"] = setting(
        "float32",
        "torso compute dtype; bfloat16 is mixed precision, fast on GPUs and on CPUs with "
        "AVX-512 or AMX; auto picks it where the device has them",
    )
    hidden_sizes: tuple[int, ...] = setting((128, 128), "MLP torso layer widths")
    lstm: bool = setting(False, "add an LSTM core fed with the previous action and reward")
    lstm_size: int = setting(64, "LSTM hidden units")

    def layout(self, unroll: int) -> ReplayLayout:
        """Unrolls of ``unroll`` steps sharing ``n_step`` steps; each step starts one item of
        n + 1 steps (the transition and its n-step window)."""
        return transition_layout(unroll, self.n_step)

    def validate(self) -> None:
        """Raise ConfigError on a value that cannot work."""
        if self.lr <= 0 or self.adam_eps <= 0:
            raise ConfigError("--lr and --adam-eps must be positive")
        if not 0.0 <= self.discount <= 1.0:
            raise ConfigError(f"--discount must lie in [0, 1], got {self.discount}")
        for name in ("n_step", "target_update_every", "lstm_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{flag(name)} must be positive, got {getattr(self, name)}")
        validate_replay(self)
        if not 0.0 <= self.priority_eta <= 1.0 or not 0.0 <= self.epsilon_base <= 1.0:
            raise ConfigError("--priority-eta and --epsilon-base must lie in [0, 1]")
        if self.rescaling_eps <= 0:
            raise ConfigError(f"--rescaling-eps must be positive, got {self.rescaling_eps}")
        if not self.hidden_sizes or min(self.hidden_sizes) <= 0:
            raise ConfigError("--hidden-sizes needs one or more positive widths, e.g. 128,128")

    def check_run(self, train: Any) -> None:
        """Raise ConfigError where the run's unrolls and batches cannot fit this agent's replay."""
        check_n_step_unroll(train.unroll, self.n_step)
        check_replay(self, self.layout(train.unroll), train.batch)


CONFIG_CLASS = DQNConfig
