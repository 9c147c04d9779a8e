"""The V-trace agent: acting by sampling its policy, learning with the IMPALA loss."""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from seedbed.agents.base import (
    ActOutput,
    State,
    StepInput,
    Unrolls,
    acting_copy,
    optimizer_step,
)
from seedbed.agents.vtrace.config import VTraceConfig
from seedbed.agents.vtrace_targets import VTraceReturns, vtrace_from_logits
from seedbed.envs import EnvSpec
from seedbed.nets import ActorCriticNet, make_actor_critic, torso_dtype
from seedbed.replay import UnrollQueue


def make_networks(
    env_spec: EnvSpec, config: VTraceConfig, device: torch.device | str = "cpu"
) -> ActorCriticNet:
    """The actor-critic network V-trace learns, to run on ``device``."""
    lstm_size = config.lstm_size if config.lstm else None
    return make_actor_critic(
        env_spec,
        config.hidden_sizes,
        lstm_size,
        config.shared_torso,
        config.torso,
        torso_dtype(config.torso_dtype, torch.device(device)),
    )


def transition_targets(
    steps: dict[str, torch.Tensor], values: torch.Tensor, config: VTraceConfig
) -> tuple[torch.Tensor, torch.Tensor]:
    """Rewards and discounts of the T transitions of an unroll (step t to step t + 1).

    Where step t + 1 starts a new episode the trace is cut (discount 0). If a time limit cut that
    episode, the task itself did not end: its unseen last state is worth about what the last seen
    one is, so ``gamma * V(x_t)`` is added to the reward in place of the missing bootstrap
    (partial-episode bootstrapping, Pardo et al. 2018).
    """
    rewards = steps["reward"][1:]
    if config.reward_clip is not None:
        rewards = rewards.clamp(-config.reward_clip, config.reward_clip)
    discounts = (~steps["done"][1:]).to(values.dtype) * config.discount
    if config.bootstrap_time_limits:
        cut = steps["truncated"][1:].to(values.dtype)
        rewards = rewards + cut * config.discount * values[:-1].detach()
    return rewards, discounts


def vtrace_targets(
    steps: dict[str, torch.Tensor],
    logits: torch.Tensor,
    values: torch.Tensor,
    config: VTraceConfig,
) -> tuple[VTraceReturns, torch.Tensor]:
    """V-trace's targets for the T transitions of unrolls whose T + 1 steps the learner's
    network gave ``logits`` and ``values``, as ``config`` sets them up; and the learner's
    log-probabilities of the actions taken."""
    rewards, discounts = transition_targets(steps, values, config)
    return vtrace_from_logits(
        behaviour_logits=steps["logits"][:-1],
        target_logits=logits[:-1],
        actions=steps["action"][:-1],
        discounts=discounts,
        rewards=rewards,
        values=values[:-1],
        bootstrap_value=values[-1],
        clip_rho_threshold=config.clip_rho,
        clip_pg_rho_threshold=config.clip_pg_rho,
        clip_c_threshold=config.clip_c,
        lambda_=config.td_lambda,
    )


def vtrace_loss(
    net: ActorCriticNet, batch: Unrolls, config: VTraceConfig
) -> dict[str, torch.Tensor]:
    """IMPALA's loss on a batch of unrolls, as named terms whose sum is minimised.

    Step t of an unroll holds the observation and the action taken there; step t + 1 holds the
    reward for that action and whether the episode ended, so transitions pair ``[:-1]`` with
    ``[1:]`` and the last step's value bootstraps the returns.
    """
    s = batch.steps
    logits, values, _ = net(s["obs"], s["prev_action"], s["reward"], s["done"], batch.initial_state)
    targets, target_log_probs = vtrace_targets(s, logits, values, config)
    advantages = targets.pg_advantages
    if config.normalize_advantages:
        advantages = advantages / (advantages.std() + 1e-8)
    log_policy = F.log_softmax(logits[:-1], dim=-1)
    entropy = -(log_policy.exp() * log_policy).sum(-1).mean()
    return {
        "loss_policy": -(target_log_probs * advantages).mean(),
        "loss_baseline": config.baseline_cost * 0.5 * (targets.vs - values[:-1]).pow(2).mean(),
        "loss_entropy": -config.entropy_cost * entropy,
    }


class VTraceAgent:
    """Acts by sampling the softmax policy; learns with V-trace-corrected actor-critic updates."""

    metric_names = ("loss", "loss_policy", "loss_baseline", "loss_entropy", "grad_norm")
    acting_skips = ("value_torso", "value")  # act samples from the logits alone

    def __init__(
        self,
        env_spec: EnvSpec,
        config: VTraceConfig,
        device: torch.device,
        num_envs: int | None = None,
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        self.network = make_networks(env_spec, config, self.device).to(self.device)
        params = self.network.parameters()
        if config.optimizer == "adam":
            # The fused kernel updates all parameters in one op: for small networks the
            # per-tensor overhead of the default Adam is most of the step.
            self.optimizer = torch.optim.Adam(params, lr=config.lr, eps=config.adam_eps, fused=True)
        else:
            self.optimizer = torch.optim.RMSprop(
                params, lr=config.lr, alpha=config.rmsprop_alpha, eps=config.rmsprop_eps
            )

    def unroll_layout(self, unroll: int) -> tuple[int, int]:
        """Unrolls of ``unroll`` steps; consecutive ones share one (it bootstraps the first)."""
        return unroll, 1

    def make_buffer(self, unroll: int, queue_size: int, batch: int, seed: int) -> UnrollQueue:
        """On-policy: a FIFO of at most ``queue_size`` unrolls, learned from once each."""
        return UnrollQueue(queue_size)

    def acting_network(self) -> ActorCriticNet:
        return acting_copy(self.network)

    def initial_state(self, batch_size: int) -> State:
        return self.network.initial_state(batch_size, self.device)

    @torch.no_grad()
    def act(self, net: ActorCriticNet, step: StepInput, state: State) -> ActOutput:
        """Sample an action per environment from the policy (Gumbel-max on the logits)."""
        logits, _, state = net(
            step.obs[None],
            step.prev_action[None],
            step.reward[None],
            step.done[None],
            state,
            values=False,  # acting needs only the policy
        )
        logits = logits[0]
        gumbel = -torch.empty_like(logits).exponential_().log()
        action = (logits + gumbel).argmax(-1)
        return ActOutput(action, {"logits": logits}, state)

    def learn(self, batch: Unrolls) -> dict[str, float]:
        """One optimizer step on ``batch``; returns the loss terms and diagnostics."""
        terms = vtrace_loss(self.network, batch, self.config)
        return optimizer_step(self.network, self.optimizer, terms, self.config.max_grad_norm)

    def state_dict(self) -> dict[str, Any]:
        return {"network": self.network.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])


AGENT_CLASS = VTraceAgent
