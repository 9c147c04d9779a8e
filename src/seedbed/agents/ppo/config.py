"""Settings of the PPO agent (no torch here: read by the CLI and by actors)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

from seedbed.agents.vtrace.config import FAMILY_DEFAULTS as VTRACE_FAMILY_DEFAULTS
from seedbed.agents.vtrace.config import VTraceConfig
from seedbed.config import setting
from seedbed.errors import ConfigError


@dataclasses.dataclass
class PPOConfig(VTraceConfig):
    """PPO's settings: the V-trace agent's network, optimizer and loss weights, and its own.

    PPO acts as V-trace does (it samples its policy on the same networks: a softmax, or a
    Gaussian for continuous actions); it differs in how it learns from a batch: several epochs
    of shuffled minibatches, each a clipped-surrogate step against the policy that acted
    (Schulman et al. 2017; with ``advantages=vtrace`` the advantages are corrected for policy
    lag, as in Sample Factory's APPO).
    """

    lr: float = setting(5e-4, "learning rate")
    discount: float = setting(0.99, "discount factor gamma")
    td_lambda: float = setting(0.95, "lambda of GAE or of V-trace, mixing in shorter returns")
    normalize_advantages: bool = setting(
        True, "normalize each minibatch's advantages to zero mean and unit standard deviation"
    )
    advantages: Literal["gae", "vtrace"] = setting(
        "gae", "advantages: GAE(lambda), or V-trace's, corrected for the policy lag (APPO)"
    )
    epochs: int = setting(4, "passes over each learner batch")
    minibatches: int = setting(4, "minibatches per epoch; each holds batch / minibatches unrolls")
    clip_ratio: float = setting(0.2, "epsilon: clip of the probability ratio in the surrogate")
    clip_against: Literal["acting", "learner"] = setting(
        "acting",
        "the policy the clipped ratio is taken against: the one that acted (PPO), or the "
        "learner's at the start of the batch, the lag from the acting one weighted in and "
        "truncated at --clip-pg-rho (decoupled PPO, Hilton et al. 2022)",
    )
    value_clip: float | None = setting(
        None, "clip each value update to this far from the value before the batch (none: off)"
    )
    target_kl: float | None = setting(
        None, "stop a batch's epochs early once the mean KL from the acting policy passes this"
    )
    # Continuous actions: a diagonal Gaussian policy (seedbed.agents.policies).
    std_head: bool = setting(
        False, "Gaussian policies: learn the log-std as a head of the features, not one vector"
    )
    init_log_std: float = setting(0.0, "Gaussian policies: the log-std the policy starts with")
    action_squash: Literal["clip", "tanh"] = setting(
        "clip", "Gaussian policies: bring samples into the action bounds by clipping, or tanh"
    )

    def validate(self) -> None:
        """Raise ConfigError on a value that cannot work."""
        super().validate()
        if self.epochs < 1 or self.minibatches < 1:
            raise ConfigError(
                f"--epochs and --minibatches must be >= 1, got {self.epochs} and {self.minibatches}"
            )
        if self.clip_ratio <= 0:
            raise ConfigError(f"--clip-ratio must be positive, got {self.clip_ratio}")
        for name in ("value_clip", "target_kl"):
            value = getattr(self, name)
            if value is not None and value <= 0:
                raise ConfigError(f"--{name.replace('_', '-')} must be positive or none")

    def check_run(self, train: Any) -> None:
        """Raise ConfigError where the run's layout cannot work with this agent."""
        super().check_run(train)
        if self.target_kl is not None and train.learner_replicas > 1:
            raise ConfigError(
                "--target-kl cannot be used with --learner-replicas > 1: each replica would stop "
                "its epochs at its own step; leave it none"
            )
        share = train.replica_shard(0).batch  # what each replica learns from
        if self.minibatches > share:
            where = f" / --learner-replicas = {share}" if share != train.batch else ""
            raise ConfigError(
                f"--minibatches ({self.minibatches}) must be <= --batch ({train.batch}{where}): "
                "a minibatch holds whole unrolls"
            )


CONFIG_CLASS = PPOConfig
ACTIONS = ("discrete", "continuous")  # a softmax or a Gaussian policy, by the env's actions

# V-trace's, for the same networks and preprocessing; and for Gymnasium's classic tasks, what
# reached CartPole's 475 soonest from the command's start: fewer, larger steps, because the
# learner's Python holds the interpreter that inference needs (docs/benchmarks.md).
# On Atari, CleanRL's and Sample Factory's PPO settings with Sample Factory's input and return
# normalization (here per-pixel statistics and PopArt), without which Pong barely left -20
# (docs/benchmarks.md).
FAMILY_DEFAULTS = {
    **VTRACE_FAMILY_DEFAULTS,
    "atari": {
        **VTRACE_FAMILY_DEFAULTS["atari"],
        "optimizer": "adam",
        "lr": 2.5e-4,
        "adam_eps": 1e-5,
        "clip_ratio": 0.1,
        "td_lambda": 0.95,
        "normalize_advantages": True,  # per minibatch, as CleanRL and Sample Factory do
        "normalize_obs": True,
        "popart": True,
        # Four epochs over every frame make the learner the bound; bfloat16, where the CPU or
        # GPU has it natively, learns a Pong batch faster (docs/benchmarks.md).
        "torso_dtype": "auto",
        # The two-convolution torso of DQN 2013 and A3C costs a third of the Nature CNN's
        # arithmetic; on two cores it reached every Pong rung sooner, and ended the hour higher
        # (docs/benchmarks.md).
        "torso": "a3c",
    },
    "classic": {"normalize_obs": True, "epochs": 2, "minibatches": 2, "lr": 2e-3},
    "mujoco": {"normalize_obs": True},
}
# Batches of 16 unrolls of 64 steps: 4 minibatches of 256 steps, as CleanRL's 8 x 128 makes.
# The rate is held through Pong's climb (to about +14) and then falls to 0 at the run's end:
# constant, the mean stayed at +15-16 for the last 7 M frames of an hour; falling from the start,
# the climb itself slowed. Falling to 0 at 15 M frames, three runs ended at +16.2 to +17.7; the
# gain comes while the rate is 0.6-0.3 of its start, and falling to 0 at 20 M keeps it there
# longer: the one run passed +18 at 14.7 M frames, in 45 minutes on two cores (docs/benchmarks.md).
RUN_DEFAULTS = {
    "atari": {
        "unroll": 64,
        "batch": 16,
        "queue_size": 16,
        "total_frames": 20_000_000,
        "lr_schedule": "linear",
        "lr_hold_frames": 6_000_000,
    }
}
