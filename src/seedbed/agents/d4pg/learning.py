"""The D4PG agent behind ``--agent d4pg`` (Barth-Maron et al. 2018), for continuous actions.

A deterministic policy maps observations to actions in [-1, 1] (tanh), scaled onto the env's
bounds. Central inference adds each env's own Gaussian noise to them. A critic learns the
categorical distribution of n-step returns of an (observation, action) pair over fixed atoms;
its target is the target networks' distribution at the window's last observation, shifted and
scaled by the n-step rewards and discount and projected back onto the atoms. The policy climbs
the critic's expected value. Replay, its layout and the n-step arithmetic are DQN's.
"""

from __future__ import annotations

import math

import torch
from torch import nn
from torch.nn import functional as F

from seedbed.agents.base import ReplayLearner, acting_copy, clip_rewards
from seedbed.agents.categorical import atoms, expected_value, n_step_distribution
from seedbed.agents.d4pg.config import D4PGConfig
from seedbed.agents.dqn.learning import make_replay
from seedbed.agents.q_targets import geometric_spread
from seedbed.errors import ConfigError
from seedbed.nets import MLPTorso, _scaled
from seedbed.replay import PrioritizedReplay
from seedbed.types import ActOutput, EnvSpec, State, StepInput, Unrolls


class DeterministicPolicy(nn.Module):
    """Observation -> MLP -> an action in [-1, 1] per dimension (tanh)."""

    def __init__(self, obs_shape: tuple[int, ...], action_size: int, hidden: tuple[int, ...]):
        super().__init__()
        self.torso = MLPTorso(obs_shape, hidden)
        self.head = nn.Linear(self.torso.out_size, action_size)

    def forward(self, obs: torch.Tensor) -> torch.Tensor:
        """[N, *obs_shape] -> [N, A] in [-1, 1]."""
        return torch.tanh(self.head(self.torso(obs)))


class DistributionalCritic(nn.Module):
    """(Observation, action in [-1, 1]) -> logits of the return distribution over the atoms."""

    def __init__(
        self, obs_shape: tuple[int, ...], action_size: int, hidden: tuple[int, ...], atoms: int
    ):
        super().__init__()
        self.torso = MLPTorso((math.prod(obs_shape) + action_size,), hidden)
        self.head = nn.Linear(self.torso.out_size, atoms)

    def forward(self, obs: torch.Tensor, action: torch.Tensor) -> torch.Tensor:
        """[N, *obs_shape], [N, A] -> [N, K] logits."""
        return self.head(self.torso(torch.cat([_scaled(obs.flatten(1)), action], -1)))


class D4PGNetwork(nn.Module):
    """The policy and the critic, and the maps between the policy's [-1, 1] and the env's
    action bounds. The critic sees actions in [-1, 1] too, so its input scale does not depend
    on the env's units."""

    def __init__(self, env_spec: EnvSpec, config: D4PGConfig) -> None:
        super().__init__()
        self.action_shape = env_spec.action_shape
        size = math.prod(env_spec.action_shape)
        low = torch.tensor(env_spec.action_low, dtype=torch.float32)
        high = torch.tensor(env_spec.action_high, dtype=torch.float32)
        if not (torch.isfinite(low).all() and torch.isfinite(high).all()):
            raise ConfigError(
                f"--agent d4pg needs finite action bounds; {env_spec.env_id} has "
                f"[{env_spec.action_low}, {env_spec.action_high}]: wrap it to bound its actions"
            )
        self.register_buffer("low", low)
        self.register_buffer("high", high)
        self.register_buffer("support", atoms(config.v_min, config.v_max, config.num_atoms))
        self.policy = DeterministicPolicy(env_spec.obs_shape, size, config.policy_hidden_sizes)
        self.critic = DistributionalCritic(
            env_spec.obs_shape, size, config.critic_hidden_sizes, config.num_atoms
        )

    def to_env(self, unit: torch.Tensor) -> torch.Tensor:
        """Actions [N, A] in [-1, 1] -> the env's [N, *action_shape] within its bounds."""
        action = self.low + (unit + 1.0) * 0.5 * (self.high - self.low)
        return action.view(-1, *self.action_shape)

    def to_unit(self, action: torch.Tensor) -> torch.Tensor:
        """The env's actions [N, *action_shape] -> [N, A] in [-1, 1]."""
        return 2.0 * (action.flatten(1) - self.low) / (self.high - self.low) - 1.0


def time_limit_cut(done: torch.Tensor, truncated: torch.Tensor) -> torch.Tensor:
    """[B] whether each window's first episode end (over its [n, B] steps) is a time-limit cut.

    Such a window's target would bootstrap from the final observation of the cut episode, which
    same-step autoreset never sends, so the loss leaves it out instead of treating the cut as
    the end of the task (which would teach the critic that a state near the time limit is
    worth its last rewards only).
    """
    alive = torch.ones_like(done[:1])
    no_end_before = torch.cumprod(torch.cat([alive, ~done[:-1]]).float(), 0)
    return ((done & truncated).float() * no_end_before).amax(0) > 0


def d4pg_loss(
    net: D4PGNetwork, target_net: D4PGNetwork, batch: Unrolls, config: D4PGConfig
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The loss terms on a batch of replay items of n + 1 steps, and the items' priorities [B].

    ``loss_critic``: the cross-entropy of the critic's distribution at (obs_0, action_0) against
    the projected target R + D z, where R and D are the n-step reward sum and discount and z
    the atoms, with probabilities from the target critic at (obs_n, target policy(obs_n)).
    ``loss_policy``: minus the critic's expected value at the policy's own action, with the
    critic's parameters held fixed. Priorities are the KL divergence behind ``loss_critic``.
    """
    s, support = batch.steps, net.support
    rewards = s["reward"][1:].float()
    rewards = clip_rewards(rewards, config.reward_clip)
    discounts = (~s["done"][1:]).float() * config.discount
    keep = (~time_limit_cut(s["done"][1:], s["truncated"][1:])).float()
    with torch.no_grad():
        last = s["obs"][-1]  # the state after the window's n transitions
        next_probs = torch.softmax(target_net.critic(last, target_net.policy(last)), -1)
        target = n_step_distribution(rewards, discounts, next_probs, support)
    obs = s["obs"][0]
    log_probs = F.log_softmax(net.critic(obs, net.to_unit(s["action"][0].float())), -1)
    cross_entropy = -(target * log_probs).sum(-1)
    weights = torch.ones_like(keep) if batch.replay is None else batch.replay.weights.to(keep)
    # The policy's gradient flows through the action into a critic whose weights it must not
    # move: call the critic with detached copies of its parameters.
    fixed = {k: v.detach() for k, v in net.critic.named_parameters()}
    q = expected_value(
        torch.func.functional_call(net.critic, fixed, (obs, net.policy(obs))), support
    )
    terms = {
        "loss_critic": (weights * keep * cross_entropy).mean(),
        "loss_policy": -q.mean(),
    }
    with torch.no_grad():
        entropy = -(target * target.clamp(min=1e-12).log()).sum(-1)
        priorities = keep * (cross_entropy - entropy).clamp(min=0.0)
    return terms, priorities


class D4PGAgent(ReplayLearner):
    """Acts with the deterministic policy plus per-env noise; learns D4PG from replay."""

    metric_names = ("loss", "loss_critic", "loss_policy", "grad_norm", "priority")
    acting_skips = ("critic",)  # act runs the policy alone
    torso_dtype = None  # MLPs in float32: no torso dtype setting

    def __init__(
        self,
        env_spec: EnvSpec,
        config: D4PGConfig,
        device: torch.device,
        num_envs: int | None = None,
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.network = D4PGNetwork(env_spec, config).to(self.device)
        self.target_network = self.acting_network()
        self.optimizer = torch.optim.Adam(
            [
                {"params": self.network.policy.parameters(), "lr": config.policy_lr},
                {"params": self.network.critic.parameters(), "lr": config.critic_lr},
            ],
            eps=config.adam_eps,
            fused=True,
        )
        self.steps = 0
        # Each env explores with its own sigma; without envs (evaluation) acting is noiseless.
        self.sigmas = None
        if num_envs:
            self.sigmas = geometric_spread(num_envs, config.noise_sigma, config.noise_sigma_min)
            self.sigmas = self.sigmas.to(self.device)

    def unroll_layout(self, unroll: int) -> tuple[int, int]:
        """Steps per unroll and steps consecutive unrolls share, for ``--unroll``."""
        layout = self.config.layout(unroll)
        return layout.unroll, layout.overlap

    def make_buffer(self, unroll: int, queue_size: int, batch: int, seed: int) -> PrioritizedReplay:
        """Replay of n-step transitions, uniform unless --priority-exponent is above 0."""
        return make_replay(self.config, self.config.layout(unroll), batch, seed)

    def acting_network(self) -> D4PGNetwork:
        return acting_copy(self.network)

    def initial_state(self, batch_size: int) -> State:
        return ()  # feed-forward

    @torch.no_grad()
    def act(self, net: D4PGNetwork, step: StepInput, state: State) -> ActOutput:
        """The policy's action plus each env's Gaussian noise, clipped to the bounds."""
        unit, state = self.acting_outputs(net, step, state)
        if self.sigmas is not None:
            noise = self.sigmas[step.env_ids].unsqueeze(-1) * torch.randn_like(unit)
            unit = (unit + noise).clamp(-1.0, 1.0)
        return ActOutput(net.to_env(unit), {}, state)

    def acting_outputs(
        self, net: D4PGNetwork, step: StepInput, state: State
    ) -> tuple[torch.Tensor, State]:
        """The policy's actions [N, A] in [-1, 1], before noise, and the (empty) state."""
        return net.policy(step.obs), state

    def loss(self, batch: Unrolls) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """Policy and critic terms (one optimizer steps both) and each item's priority."""
        return d4pg_loss(self.network, self.target_network, batch, self.config)


AGENT_CLASS = D4PGAgent
