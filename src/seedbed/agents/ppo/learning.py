"""The PPO agent: V-trace's acting and networks, learning with PPO's clipped surrogate.

Each learner batch of B unrolls is learned from ``epochs`` times, in ``minibatches`` shuffled
minibatches of whole unrolls (so a recurrent core replays each sequence from its stored start
state) or, with ``minibatch_of=steps`` (or ``auto``) and no recurrent core, of single
transitions drawn from all the unrolls, as CleanRL and SB3 draw them. Advantages and value
targets are computed once per batch, before its first update, with the network as it then is:
GAE(lambda) (Schulman et al. 2016), or V-trace's, which also correct for the lag between the
policy that acted and the learner's (``advantages=vtrace``). The ratio in the surrogate is taken
against the policy that acted, whose parameters the unrolls carry (logits, or a Gaussian's mean
and log-std: ``seedbed.agents.policies``); or, with ``clip_against=learner``, against the
learner's policy at the start of the batch, each step weighted by that policy's probability over
the acting one's, truncated (decoupled PPO: Hilton et al. 2022, "Batch size-invariance for
policy optimization"). Central inference acts with parameters one or more batches old, so
against the acting policy a ratio may be clipped before the batch has moved the policy at all,
and its step then teaches nothing.
"""

from __future__ import annotations

import math
from typing import Any

import torch

from seedbed.agents.base import SKIPPED, entropy_cost, optimizer_step
from seedbed.agents.policies import Policy, make_policy
from seedbed.agents.ppo.config import PPOConfig
from seedbed.agents.vtrace.learning import (
    VTraceAgent,
    make_networks,
    observe,
    rescale_values,
    transition_targets,
    value_scale,
    vtrace_targets,
)
from seedbed.nets import ActorCriticNet
from seedbed.types import EnvSpec, Unrolls


def gae(
    rewards: torch.Tensor,
    discounts: torch.Tensor,
    values: torch.Tensor,
    bootstrap_value: torch.Tensor,
    lambda_: float,
) -> torch.Tensor:
    """Generalized advantage estimates, ``[T, B]``, of T transitions of B unrolls.

    ``A_t = delta_t + discount_t * lambda * A_{t+1}`` with
    ``delta_t = r_t + discount_t * V(x_{t+1}) - V(x_t)``; ``discount_t`` is 0 where the episode
    ended after step t, which cuts the sum there, and ``bootstrap_value`` is ``V(x_T)``.
    """
    next_values = torch.cat([values[1:], bootstrap_value[None]])
    deltas = rewards + discounts * next_values - values
    # The recursion step by step, as written above (a scan would round differently), with the
    # per-step rows taken and the results stacked once rather than indexed at every step.
    running, backwards = torch.zeros_like(bootstrap_value), []
    for delta, decay in zip(
        deltas.unbind(0)[::-1], (discounts * lambda_).unbind(0)[::-1], strict=True
    ):
        running = delta + decay * running
        backwards.append(running)
    return torch.stack(backwards[::-1])


def batch_targets(
    net: ActorCriticNet, batch: Unrolls, config: PPOConfig, policy: Policy
) -> dict[str, torch.Tensor]:
    """What every minibatch of ``batch`` (its observations prepared: ``prepared``) is learned
    against, each ``[T, B]``: advantages, value targets, the values before the update, the
    log-probabilities of the policy the ratio is taken against (``anchor``) and, with
    ``clip_against=learner``, each step's weight for the lag between the acting policy and that
    one (``lag_weight``; against the acting policy it would be all ones, and is left out)."""
    s = batch.steps
    with torch.no_grad():
        params, values, _ = net(
            s["obs"], s["prev_action"], s["reward"], s["done"], batch.initial_state, prepared=True
        )
        if config.advantages == "vtrace":
            targets, _ = vtrace_targets(s, params, values, config, policy)
            advantages, returns = targets.pg_advantages, targets.vs
        else:
            rewards, discounts = transition_targets(s, values, config)
            advantages = gae(rewards, discounts, values[:-1], values[-1], config.td_lambda)
            returns = advantages + values[:-1]
        values = values[:-1]
        anchor = acted = policy.log_prob(policy.behaviour(s)[:-1], s)
        targets = {"advantages": advantages, "returns": returns, "values": values}
        if config.clip_against == "learner":
            anchor = policy.log_prob(params[:-1].float(), s)
            targets["lag_weight"] = (anchor - acted).exp().clamp(max=config.clip_pg_rho)
    return {**targets, "anchor": anchor}


def ppo_loss(
    net: ActorCriticNet,
    batch: Unrolls,
    targets: dict[str, torch.Tensor],
    config: PPOConfig,
    policy: Policy,
    entropy_cost: float,
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """PPO's loss on (a minibatch of) unrolls, their observations prepared (``prepared``), as
    named terms whose sum is minimised, and its diagnostics: the approximate KL from the policy
    the ratio is taken against, the fraction of clipped ratios and the policy's mean entropy
    (the bonus weighs ``entropy_cost``, which may be annealed to 0). With PopArt, value errors
    are measured in units of the targets' running deviation."""
    s = batch.steps
    inputs = s["obs"], s["prev_action"], s["reward"], s["done"], batch.initial_state
    params, values, _ = net(*inputs, prepared=True)
    # Unrolls carry a bootstrap step past their T transitions; a minibatch of steps does not.
    transitions = len(targets["advantages"])
    params, values = params[:transitions], values[:transitions]
    log_ratio = policy.log_prob(params, s) - targets["anchor"]
    ratio = log_ratio.exp()
    advantages = targets["advantages"]
    if config.normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    eps = config.clip_ratio
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)
    if "lag_weight" in targets:
        surrogate = targets["lag_weight"] * surrogate
    value_error = (values - targets["returns"]).pow(2)
    if config.value_clip is not None:
        before = targets["values"]
        clipped = before + (values - before).clamp(-config.value_clip, config.value_clip)
        value_error = torch.max(value_error, (clipped - targets["returns"]).pow(2))
    scale = value_scale(net)
    if isinstance(scale, torch.Tensor):  # PopArt: in units of the targets' deviation
        value_error = value_error / scale**2
    entropy = policy.entropy(params).mean()
    terms = {
        "loss_policy": -surrogate.mean(),
        "loss_baseline": config.baseline_cost * 0.5 * value_error.mean(),
        "loss_entropy": -entropy_cost * entropy,
    }
    with torch.no_grad():  # Schulman's low-variance estimator of KL(anchor || current)
        approx_kl = ((ratio - 1) - log_ratio).mean()
        clip_fraction = ((ratio - 1).abs() > eps).float().mean()
        stats = torch.stack([approx_kl, clip_fraction, entropy]).tolist()  # one read
    return terms, dict(zip(("approx_kl", "clip_fraction", "entropy"), stats, strict=True))


def prepared(net: ActorCriticNet, batch: Unrolls) -> Unrolls:
    """``batch`` with its observations as ``net``'s torso reads them, so that the epochs over
    it normalize them once."""
    steps = {**batch.steps, "obs": net.prepare(batch.steps["obs"])}
    return Unrolls(steps, batch.initial_state, batch.policy_version)


def unroll_columns(x: torch.Tensor, rows: torch.Tensor) -> torch.Tensor:
    """``x[:, rows]``: the unrolls ``rows`` of ``[T, B, ...]`` steps, in ``x``'s own layout.

    Prepared frames (``[T, B, C, H, W]``, each stack channels-last) are copied a whole stack
    at a time by ``index_select`` over a flat view of the stacks. Indexing the 5-d frames
    gathers value by value, in twice the time, and ``index_select`` on them directly would
    give up their channels-last layout.
    """
    if x.is_contiguous():
        return x.index_select(1, rows)
    steps, batch, *stack = x.shape
    size = math.prod(stack)
    frames = x.dim() == 5 and x.stride(0) == batch * x.stride(1) == batch * size
    if not (frames and x[0].is_contiguous(memory_format=torch.channels_last)):
        return x[:, rows]
    out = x.as_strided((steps, batch, size), (batch * size, size, 1)).index_select(1, rows)
    return out.as_strided((steps, len(rows), *stack), (len(rows) * size, size, *x.stride()[2:]))


def _select(
    batch: Unrolls, targets: dict[str, torch.Tensor], rows: torch.Tensor
) -> tuple[Unrolls, dict[str, torch.Tensor]]:
    """The unrolls ``rows`` of ``batch``, with their start states, and their targets."""
    part = Unrolls(
        {k: unroll_columns(v, rows) for k, v in batch.steps.items()},
        tuple(s[rows] for s in batch.initial_state),
        batch.policy_version[rows.cpu()],
    )
    return part, {k: unroll_columns(v, rows) for k, v in targets.items()}


def _flat_steps(
    batch: Unrolls, targets: dict[str, torch.Tensor]
) -> tuple[dict[str, torch.Tensor], dict[str, torch.Tensor]]:
    """The T x B transitions of ``batch`` (without the bootstrap step) and their targets, each
    ``[T * B, ...]``, step t of unroll b at ``t * B + b``; for a network without memory, whose
    every step stands on its own."""
    steps = {k: v[:-1].flatten(0, 1) for k, v in batch.steps.items()}
    steps["policy_version"] = batch.policy_version.repeat(len(batch.steps["action"]) - 1)
    return steps, {k: v.flatten(0, 1) for k, v in targets.items()}


def _select_steps(
    steps: dict[str, torch.Tensor], targets: dict[str, torch.Tensor], rows: torch.Tensor
) -> tuple[Unrolls, dict[str, torch.Tensor]]:
    """The transitions ``rows`` of ``_flat_steps``, as one step of ``len(rows)`` unrolls."""
    picked = {k: v.index_select(0, rows.to(v.device))[None] for k, v in steps.items()}
    version = picked.pop("policy_version")[0]
    return Unrolls(picked, (), version), {k: v[rows][None] for k, v in targets.items()}


class PPOAgent(VTraceAgent):
    """Acts as the V-trace agent does (with a Gaussian policy for continuous actions); learns
    each batch over several epochs of minibatches."""

    metric_names = (
        "loss",
        "loss_policy",
        "loss_baseline",
        "loss_entropy",
        "grad_norm",
        "approx_kl",
        "clip_fraction",
        "entropy",
        "epochs_run",
    )

    config: PPOConfig

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The minibatch shuffles have their own generator, saved with the agent: a resumed run
        # (and a reloaded agent) shuffles as the original would have.
        self.shuffles = torch.Generator().manual_seed(int(torch.randint(2**62, ())))

    def make_policy(self, env_spec: EnvSpec) -> Policy:
        return make_policy(env_spec, self.config.action_squash)

    def make_network(self, env_spec: EnvSpec) -> ActorCriticNet:
        cfg = self.config
        head = {"std_head": cfg.std_head, "init_log_std": cfg.init_log_std}
        return make_networks(env_spec, cfg, self.device, **head)

    def learn(self, batch: Unrolls) -> dict[str, float]:
        """``epochs`` passes of ``minibatches`` optimizer steps over ``batch``; returns the
        metrics averaged over those steps, and how many epochs ran (``target_kl`` may stop
        them early). The normalizers take in the batch first: the observations, then (with
        the targets computed) PopArt's statistics, so all its epochs see the same ones."""
        cfg = self.config
        observe(self.network, batch)
        batch = prepared(self.network, batch)
        targets = batch_targets(self.network, batch, cfg, self.policy)
        rescale_values(self.network, targets["returns"])
        sums: dict[str, float] = {}
        steps = epochs = 0
        cost = entropy_cost(cfg, self.optimizer)
        by_steps = cfg.minibatches_of_steps
        if by_steps:
            flat, flat_targets = _flat_steps(batch, targets)
        draws = len(flat_targets["advantages"]) if by_steps else batch.batch_size
        for _ in range(cfg.epochs):
            kl = 0.0
            order = torch.randperm(draws, generator=self.shuffles).to(self.device)
            chunks = order.chunk(cfg.minibatches)
            for rows in chunks:
                if by_steps:
                    part, minibatch = _select_steps(flat, flat_targets, rows)
                else:
                    part, minibatch = _select(batch, targets, rows)
                terms, stats = ppo_loss(self.network, part, minibatch, cfg, self.policy, cost)
                metrics = optimizer_step(self.network, self.optimizer, terms, cfg.max_grad_norm)
                for key, value in {**metrics, **stats}.items():
                    sums[key] = sums.get(key, 0.0) + value
                kl, steps = kl + stats["approx_kl"], steps + 1
            epochs += 1
            if cfg.target_kl is not None and kl / len(chunks) > cfg.target_kl:
                break
        means = {k: v / steps for k, v in sums.items()}
        return {**means, SKIPPED: sums[SKIPPED], "epochs_run": float(epochs)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "shuffles": self.shuffles.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.shuffles.set_state(state["shuffles"])


AGENT_CLASS = PPOAgent
