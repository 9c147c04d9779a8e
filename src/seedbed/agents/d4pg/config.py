"""Settings of the D4PG agent (no torch here: read by the CLI and by actors)."""

from __future__ import annotations

import dataclasses
from typing import Any

from seedbed.agents.dqn.config import (
    ReplayLayout,
    check_n_step_unroll,
    check_replay,
    transition_layout,
    validate_replay,
)
from seedbed.config import flag, setting
from seedbed.errors import ConfigError

ACTIONS = "continuous"  # seedbed.agents.check_actions refuses discrete envs with one line


@dataclasses.dataclass
class D4PGConfig:
    """Distributed distributional deterministic policy gradients (Barth-Maron et al. 2018):
    a tanh-bounded deterministic policy, a critic that learns a categorical distribution of
    n-step returns (Bellemare et al. 2017), target networks and replay."""

    policy_lr: float = setting(5e-4, "policy learning rate (Adam)")
    critic_lr: float = setting(5e-4, "critic learning rate (Adam)")
    adam_eps: float = setting(1e-8, "Adam epsilon")
    discount: float = setting(0.99, "discount factor gamma")
    n_step: int = setting(5, "steps of reward in each target before bootstrapping")
    num_atoms: int = setting(51, "atoms of the critic's categorical return distribution")
    v_min: float = setting(-150.0, "lowest return the critic's atoms cover")
    v_max: float = setting(150.0, "highest return the critic's atoms cover")
    target_update_every: int = setting(
        100, "learner steps between copies of the online networks into the target networks"
    )
    reward_clip: float | None = setting(None, "clip learner rewards to [-x, x] (none: off)")
    max_grad_norm: float | None = setting(
        None, "clip the global gradient norm of policy and critic together (none: off)"
    )
    replay_capacity: int = setting(1_000_000, "replay items (transitions) kept, oldest first out")
    min_replay: int = setting(1_000, "transitions stored before learning starts")
    replay_ratio: float | None = setting(
        16.0,
        "transitions learned per transition inserted; actors wait when the learner falls "
        "behind (none: no limit)",
    )
    priority_exponent: float = setting(
        0.0, "alpha: sample transitions in proportion to priority^alpha (0: uniform replay)"
    )
    importance_exponent: float = setting(0.4, "beta: importance-sampling weights (N P)^-beta")
    # Exploration: env i of N adds Gaussian noise of sigma_i to the policy's action in [-1, 1],
    # sigma_i spread in equal ratios from --noise-sigma down to --noise-sigma-min.
    noise_sigma: float = setting(0.3, "per-env exploration noise: the largest sigma")
    noise_sigma_min: float = setting(0.05, "per-env exploration noise: the smallest sigma")
    policy_hidden_sizes: tuple[int, ...] = setting((256, 256), "policy MLP layer widths")
    critic_hidden_sizes: tuple[int, ...] = setting((256, 256), "critic MLP layer widths")

    def layout(self, unroll: int) -> ReplayLayout:
        """Items of one transition and its n-step window, as DQN's."""
        return transition_layout(unroll, self.n_step)

    def validate(self) -> None:
        """Raise ConfigError on a value that cannot work."""
        if min(self.policy_lr, self.critic_lr, self.adam_eps) <= 0:
            raise ConfigError("--policy-lr, --critic-lr and --adam-eps must be positive")
        if not 0.0 <= self.discount <= 1.0:
            raise ConfigError(f"--discount must lie in [0, 1], got {self.discount}")
        for name in ("n_step", "target_update_every"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{flag(name)} must be positive, got {getattr(self, name)}")
        if self.num_atoms < 2:
            raise ConfigError(f"--num-atoms must be at least 2, got {self.num_atoms}")
        if self.v_min >= self.v_max:
            raise ConfigError(f"--v-min ({self.v_min}) must be below --v-max ({self.v_max})")
        validate_replay(self)
        if not 0.0 <= self.noise_sigma_min <= self.noise_sigma:
            raise ConfigError(
                f"--noise-sigma-min ({self.noise_sigma_min}) must lie in [0, --noise-sigma "
                f"({self.noise_sigma})]"
            )
        for name in ("policy_hidden_sizes", "critic_hidden_sizes"):
            sizes = getattr(self, name)
            if not sizes or min(sizes) <= 0:
                raise ConfigError(f"--{flag(name)} needs one or more positive widths, e.g. 256,256")

    def check_run(self, train: Any) -> None:
        """Raise ConfigError where the run's unrolls and batches cannot fit the replay."""
        check_n_step_unroll(train.unroll, self.n_step)
        check_replay(self, self.layout(train.unroll), train.batch)


CONFIG_CLASS = D4PGConfig
