"""Settings of the PPO agent (no torch here: read by the CLI and by actors)."""

from __future__ import annotations

import dataclasses
from typing import Any, Literal

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
    minibatches: int = setting(4, "minibatches per epoch; each holds 1 / minibatches of the batch")
    minibatch_of: Literal["unrolls", "steps", "auto"] = setting(
        "unrolls",
        "what minibatches are drawn from: whole unrolls (a recurrent core replays each from its "
        "start state), single steps from all the batch's unrolls, as CleanRL and SB3 draw them "
        "(networks without --lstm), or auto: steps without --lstm, unrolls with it",
    )
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

    @property
    def minibatches_of_steps(self) -> bool:
        """Whether minibatches are single steps (``minibatch_of``, resolved for ``lstm``)."""
        return self.minibatch_of == "steps" or (self.minibatch_of == "auto" and not self.lstm)

    def validate(self) -> None:
        """Raise ConfigError on a value that cannot work."""
        super().validate()
        if self.epochs < 1 or self.minibatches < 1:
            raise ConfigError(
                f"--epochs and --minibatches must be >= 1, got {self.epochs} and {self.minibatches}"
            )
        if self.clip_ratio <= 0:
            raise ConfigError(f"--clip-ratio must be positive, got {self.clip_ratio}")
        if self.minibatch_of == "steps" and self.lstm:
            raise ConfigError(
                "--minibatch-of steps cannot be used with --lstm: a recurrent core needs whole "
                "unrolls to replay its state; use --minibatch-of unrolls or auto"
            )
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
        if self.minibatches_of_steps:
            # A minibatch's advantages are normalized over its steps: one step has no spread.
            steps = share * train.unroll
            most = steps // 2 if self.normalize_advantages else steps
            if self.minibatches > most:
                why = ", two a minibatch to normalize advantages over" if most < steps else ""
                raise ConfigError(
                    f"--minibatches ({self.minibatches}) must be <= {most} with --minibatch-of "
                    f"steps: a replica's batch holds {steps} steps{why}"
                )
        elif self.minibatches > share:
            where = f" / --learner-replicas = {share}" if share != train.batch else ""
            raise ConfigError(
                f"--minibatches ({self.minibatches}) must be <= --batch ({train.batch}{where}): "
                f"a minibatch holds whole unrolls; set --minibatches {share} or fewer"
            )


CONFIG_CLASS = PPOConfig
ACTIONS = ("discrete", "continuous")  # a softmax or a Gaussian policy, by the env's actions
