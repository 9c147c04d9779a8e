"""The V-trace agent: acting by sampling its policy, learning with the IMPALA loss."""

from __future__ import annotations

from typing import Any

import torch

from seedbed.agents.base import SKIPPED, acting_copy, clip_rewards, entropy_cost, optimizer_step
from seedbed.agents.policies import CategoricalPolicy, Policy
from seedbed.agents.vtrace.config import VTraceConfig
from seedbed.agents.vtrace_targets import VTraceReturns, vtrace_from_importance_weights
from seedbed.nets import ActorCriticNet, make_actor_critic, torso_dtype
from seedbed.normalize import PopArtValue
from seedbed.replay import UnrollQueue
from seedbed.replicate import replica_context
from seedbed.types import ActOutput, EnvSpec, State, StepInput, Unrolls

CATEGORICAL = CategoricalPolicy()


def make_networks(
    env_spec: EnvSpec,
    config: VTraceConfig,
    device: torch.device | str = "cpu",
    **policy_head: Any,
) -> ActorCriticNet:
    """The actor-critic network V-trace learns, to run on ``device``; ``policy_head`` goes to
    ``make_actor_critic`` (a Gaussian's settings, for continuous actions)."""
    lstm_size = config.lstm_size if config.lstm else None
    return make_actor_critic(
        env_spec,
        config.hidden_sizes,
        lstm_size,
        config.shared_torso,
        config.torso,
        torso_dtype(config.torso_dtype, torch.device(device)),
        normalize_obs=config.normalize_obs,
        popart_beta=config.popart_beta if config.popart else None,
        **policy_head,
    )


def over_replicas(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    """Sums over a replicated learner's replicas (the same tensors on one)."""
    return replica_context().all_reduce(tensors, "sum")


def observe(net: ActorCriticNet, batch: Unrolls) -> None:
    """Merge the batch's observations (all replicas') into the network's normalizer, if any;
    each step once (the last one is the next unroll's first)."""
    if net.obs_norm is not None:
        net.obs_norm.update(batch.steps["obs"][:-1], over_replicas)


def value_scale(net: ActorCriticNet) -> torch.Tensor | float:
    """PopArt's sigma, by which value errors and advantages are divided; 1 without PopArt."""
    return net.value.sigma if isinstance(net.value, PopArtValue) else 1.0


def rescale_values(net: ActorCriticNet, targets: torch.Tensor) -> None:
    """Move PopArt's statistics towards this batch's value targets (all replicas'), if any."""
    if isinstance(net.value, PopArtValue):
        net.value.update(targets, over_replicas)


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
    rewards = clip_rewards(rewards, config.reward_clip)
    discounts = (~steps["done"][1:]).to(values.dtype) * config.discount
    if config.bootstrap_time_limits:
        cut = steps["truncated"][1:].to(values.dtype)
        rewards = rewards + cut * config.discount * values[:-1].detach()
    return rewards, discounts


def vtrace_targets(
    steps: dict[str, torch.Tensor],
    params: torch.Tensor,
    values: torch.Tensor,
    config: VTraceConfig,
    policy: Policy = CATEGORICAL,
) -> tuple[VTraceReturns, torch.Tensor]:
    """V-trace's targets for the T transitions of unrolls whose T + 1 steps the learner's
    network gave policy parameters ``params`` (of ``policy``) and ``values``, as ``config``
    sets them up; and the learner's log-probabilities of the actions taken (with gradient)."""
    rewards, discounts = transition_targets(steps, values, config)
    log_probs = policy.log_prob(params[:-1], steps)
    behaviour = policy.log_prob(policy.behaviour(steps)[:-1], steps)
    returns = vtrace_from_importance_weights(
        log_rhos=log_probs.detach() - behaviour,
        discounts=discounts,
        rewards=rewards,
        values=values[:-1],
        bootstrap_value=values[-1],
        clip_rho_threshold=config.clip_rho,
        clip_pg_rho_threshold=config.clip_pg_rho,
        clip_c_threshold=config.clip_c,
        lambda_=config.td_lambda,
    )
    return returns, log_probs


def vtrace_loss(
    net: ActorCriticNet, batch: Unrolls, config: VTraceConfig, entropy_cost: float
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """IMPALA's loss on a batch of unrolls, as named terms whose sum is minimised, and the
    value targets ``[T, B]``; the entropy bonus weighs ``entropy_cost`` (the config's, or
    annealed: ``seedbed.agents.base.entropy_cost``).

    Step t of an unroll holds the observation and the action taken there; step t + 1 holds the
    reward for that action and whether the episode ended, so transitions pair ``[:-1]`` with
    ``[1:]`` and the last step's value bootstraps the returns. With PopArt, value errors and
    advantages are measured in units of the targets' running standard deviation.
    """
    s = batch.steps
    logits, values, _ = net(s["obs"], s["prev_action"], s["reward"], s["done"], batch.initial_state)
    targets, target_log_probs = vtrace_targets(s, logits, values, config)
    scale = value_scale(net)
    advantages = targets.pg_advantages / scale
    if config.normalize_advantages:
        advantages = advantages / (advantages.std() + 1e-8)
    value_error = ((targets.vs - values[:-1]) / scale).pow(2)
    terms = {
        "loss_policy": -(target_log_probs * advantages).mean(),
        "loss_baseline": config.baseline_cost * 0.5 * value_error.mean(),
        "loss_entropy": -entropy_cost * CATEGORICAL.entropy(logits[:-1]).mean(),
    }
    return terms, targets.vs


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
        self.policy = self.make_policy(env_spec)
        self.network = self.make_network(env_spec).to(self.device)
        self.torso_dtype = self.network.torso_dtype
        params = self.network.parameters()
        if config.optimizer == "adam":
            # The fused kernel updates all parameters in one op: for small networks the
            # per-tensor overhead of the default Adam is most of the step.
            self.optimizer = torch.optim.Adam(params, lr=config.lr, eps=config.adam_eps, fused=True)
        else:
            self.optimizer = torch.optim.RMSprop(
                params, lr=config.lr, alpha=config.rmsprop_alpha, eps=config.rmsprop_eps
            )

    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        return (self.optimizer,)

    def make_policy(self, env_spec: EnvSpec) -> Policy:
        """The action distribution: a softmax over the logits."""
        return CATEGORICAL

    def make_network(self, env_spec: EnvSpec) -> ActorCriticNet:
        return make_networks(env_spec, self.config, self.device)

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
        """Sample an action per environment from the policy."""
        params, state = self.acting_outputs(net, step, state)
        action, extras = self.policy.sample(params)
        return ActOutput(action, extras, state)

    def acting_outputs(
        self, net: ActorCriticNet, step: StepInput, state: State
    ) -> tuple[torch.Tensor, State]:
        """The policy's parameters [N, P] (logits, or a Gaussian's mean and log-std) and the
        next state."""
        params, _, state = net(
            step.obs[None],
            step.prev_action[None],
            step.reward[None],
            step.done[None],
            state,
            values=False,  # acting needs only the policy
        )
        return params[0], state

    def learn(self, batch: Unrolls) -> dict[str, float]:
        """One optimizer step on ``batch``; returns the loss terms and diagnostics. The
        normalizers' statistics take in the batch: observations before the step, PopArt's value
        targets after it (moving them earlier would change weights the step's gradient reads)."""
        observe(self.network, batch)
        cost = entropy_cost(self.config, self.optimizer)
        terms, value_targets = vtrace_loss(self.network, batch, self.config, cost)
        metrics = optimizer_step(self.network, self.optimizer, terms, self.config.max_grad_norm)
        if not metrics[SKIPPED]:  # a skipped step leaves the weights PopArt would rescale
            rescale_values(self.network, value_targets)
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {"network": self.network.state_dict(), "optimizer": self.optimizer.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_state_dict(state["network"])
        self.optimizer.load_state_dict(state["optimizer"])


AGENT_CLASS = VTraceAgent
