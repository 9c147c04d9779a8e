"""Settings of the V-trace agent (no torch here: read by the CLI and by actors)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from seedbed.config import setting
from seedbed.errors import ConfigError


@dataclasses.dataclass
class VTraceConfig:
    """IMPALA's loss, optimizer and network settings."""

    lr: float = setting(1.4e-3, "learning rate")
    optimizer: Literal["adam", "rmsprop"] = setting("adam", "optimizer")
    adam_eps: float = setting(1e-8, "Adam epsilon")
    rmsprop_alpha: float = setting(0.99, "RMSProp smoothing constant")
    rmsprop_eps: float = setting(0.01, "RMSProp epsilon (IMPALA used 0.01)")
    discount: float = setting(0.995, "discount factor gamma")
    td_lambda: float = setting(1.0, "V-trace lambda, mixing in shorter returns")
    clip_rho: float = setting(1.0, "rho-bar: clip of importance weights in the value targets")
    clip_pg_rho: float = setting(1.0, "clip of importance weights in the policy gradient")
    clip_c: float = setting(1.0, "c-bar: clip of the trace-cutting weights")
    baseline_cost: float = setting(0.5, "weight of the value (baseline) loss")
    entropy_cost: float = setting(0.01, "weight of the entropy bonus")
    anneal_entropy: bool = setting(
        False,
        "scale the entropy bonus as --lr-schedule scales the learning rate, so that it falls "
        "to 0 with the rate and the policy may grow certain as learning ends",
    )
    normalize_advantages: bool = setting(
        True, "scale policy-gradient advantages by their batch standard deviation"
    )
    # Off by default: bootstrapping the cuts learned slower on classic control (docs/benchmarks.md,
    # Defaults).
    bootstrap_time_limits: bool = setting(
        False, "bootstrap episodes cut by a time limit instead of treating them as failures"
    )
    reward_clip: float | None = setting(None, "clip learner rewards to [-x, x] (none: off)")
    max_grad_norm: float | None = setting(0.5, "clip the global gradient norm (none: off)")
    torso: Literal["mlp", "nature", "a3c", "impala", "football"] = setting(
        "mlp",
        "network torso: MLP, Nature DQN CNN, A3C's smaller CNN, IMPALA's deep ResNet, or SEED "
        "RL's four-stack ResNet for Football's Super Mini Map (images)",
    )
    torso_dtype: Literal["auto", "float32", "bfloat16"] = setting(
        "float32",
        "torso compute dtype; bfloat16 is mixed precision, fast on GPUs and on CPUs with "
        "AVX-512 or AMX; auto picks it where the device has them",
    )
    hidden_sizes: tuple[int, ...] = setting((64, 64), "MLP torso layer widths")
    shared_torso: bool = setting(
        False, "policy and value share the torso (a separate one is steadier, and costs twice)"
    )
    lstm: bool = setting(False, "add an LSTM core fed with the previous action and reward")
    lstm_size: int = setting(64, "LSTM hidden units")
    normalize_obs: bool = setting(
        False, "normalize observations by their running mean and variance (clipped to +-5)"
    )
    popart: bool = setting(
        False, "PopArt: learn values normalized by the running mean and std of their targets"
    )
    popart_beta: float = setting(3e-4, "step size of PopArt's statistics, per learner update")

    def validate(self) -> None:
        """Raise ConfigError on a value that cannot work."""
        if self.lr <= 0:
            raise ConfigError(f"--lr must be positive, got {self.lr}")
        if not 0.0 <= self.discount <= 1.0 or not 0.0 <= self.td_lambda <= 1.0:
            raise ConfigError("--discount and --td-lambda must lie in [0, 1]")
        for name in ("clip_rho", "clip_pg_rho", "clip_c", "lstm_size"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive")
        if self.baseline_cost < 0 or self.entropy_cost < 0:
            raise ConfigError("--baseline-cost and --entropy-cost must be >= 0")
        if not 0.0 < self.popart_beta <= 1.0:
            raise ConfigError(f"--popart-beta must lie in (0, 1], got {self.popart_beta}")
        if not self.hidden_sizes or min(self.hidden_sizes) <= 0:
            raise ConfigError("--hidden-sizes needs one or more positive widths, e.g. 64,64")

    def check_run(self, train: Any) -> None:
        """Raise ConfigError where the run's layout cannot work with this agent."""
        if self.anneal_entropy and train.lr_schedule == "constant":
            raise ConfigError(
                "--anneal-entropy follows the learning rate's schedule, and a constant one never "
                "moves it: add --lr-schedule linear, or --no-anneal-entropy"
            )
        if train.queue_size < train.batch:
            raise ConfigError(
                f"--queue-size ({train.queue_size}) must be >= --batch ({train.batch}), "
                "or the learner could never take a full batch"
            )


CONFIG_CLASS = VTraceConfig
