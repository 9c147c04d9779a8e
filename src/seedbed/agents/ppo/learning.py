"""The PPO agent: V-trace's acting and networks, learning with PPO's clipped surrogate.

Each learner batch of B unrolls is learned from ``epochs`` times, in ``minibatches`` shuffled
minibatches of whole unrolls (so a recurrent core replays each sequence from its stored start
state). Advantages and value targets are computed once per batch, before its first update, with
the network as it then is: GAE(lambda) (Schulman et al. 2016), or V-trace's, which also correct
for the lag between the policy that acted and the learner's (``advantages=vtrace``). The ratio in
the surrogate is taken against the policy that acted, whose logits the unrolls carry.
"""

from __future__ import annotations

from typing import Any

import torch
from torch.nn import functional as F

from seedbed.agents.base import Unrolls, optimizer_step
from seedbed.agents.ppo.config import PPOConfig
from seedbed.agents.vtrace.learning import VTraceAgent, transition_targets, vtrace_targets
from seedbed.nets import ActorCriticNet


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
    advantages = torch.empty_like(deltas)
    running = torch.zeros_like(bootstrap_value)
    for t in range(len(deltas) - 1, -1, -1):
        running = deltas[t] + discounts[t] * lambda_ * running
        advantages[t] = running
    return advantages


def batch_targets(
    net: ActorCriticNet, batch: Unrolls, config: PPOConfig
) -> dict[str, torch.Tensor]:
    """What every minibatch of ``batch`` is learned against, each ``[T, B]``: advantages, value
    targets, the values before the update and the acting policy's log-probabilities."""
    s = batch.steps
    with torch.no_grad():
        logits, values, _ = net(
            s["obs"], s["prev_action"], s["reward"], s["done"], batch.initial_state
        )
        if config.advantages == "vtrace":
            targets, _ = vtrace_targets(s, logits, values, config)
            advantages, returns = targets.pg_advantages, targets.vs
        else:
            rewards, discounts = transition_targets(s, values, config)
            advantages = gae(rewards, discounts, values[:-1], values[-1], config.td_lambda)
            returns = advantages + values[:-1]
        values = values[:-1]
        acted = _log_prob(s["logits"][:-1], s["action"][:-1])
    return {"advantages": advantages, "returns": returns, "values": values, "acted": acted}


def ppo_loss(
    net: ActorCriticNet, batch: Unrolls, targets: dict[str, torch.Tensor], config: PPOConfig
) -> tuple[dict[str, torch.Tensor], dict[str, float]]:
    """PPO's loss on (a minibatch of) unrolls, as named terms whose sum is minimised, and its
    diagnostics: the approximate KL from the acting policy and the fraction of clipped ratios."""
    s = batch.steps
    logits, values, _ = net(s["obs"], s["prev_action"], s["reward"], s["done"], batch.initial_state)
    logits, values = logits[:-1], values[:-1]
    log_policy = F.log_softmax(logits, dim=-1)
    log_ratio = log_policy.gather(-1, s["action"][:-1, ..., None]).squeeze(-1) - targets["acted"]
    ratio = log_ratio.exp()
    advantages = targets["advantages"]
    if config.normalize_advantages:
        advantages = (advantages - advantages.mean()) / (advantages.std() + 1e-8)
    eps = config.clip_ratio
    surrogate = torch.min(ratio * advantages, ratio.clamp(1 - eps, 1 + eps) * advantages)
    value_error = (values - targets["returns"]).pow(2)
    if config.value_clip is not None:
        before = targets["values"]
        clipped = before + (values - before).clamp(-config.value_clip, config.value_clip)
        value_error = torch.max(value_error, (clipped - targets["returns"]).pow(2))
    entropy = -(log_policy.exp() * log_policy).sum(-1).mean()
    terms = {
        "loss_policy": -surrogate.mean(),
        "loss_baseline": config.baseline_cost * 0.5 * value_error.mean(),
        "loss_entropy": -config.entropy_cost * entropy,
    }
    with torch.no_grad():  # Schulman's low-variance estimator of KL(acting || current)
        stats = {
            "approx_kl": float(((ratio - 1) - log_ratio).mean()),
            "clip_fraction": float(((ratio - 1).abs() > eps).float().mean()),
        }
    return terms, stats


def _log_prob(logits: torch.Tensor, actions: torch.Tensor) -> torch.Tensor:
    return F.log_softmax(logits, dim=-1).gather(-1, actions[..., None]).squeeze(-1)


def _select(batch: Unrolls, rows: torch.Tensor) -> Unrolls:
    """The unrolls ``rows`` of ``batch``, with their start states."""
    return Unrolls(
        {k: v[:, rows] for k, v in batch.steps.items()},
        tuple(s[rows] for s in batch.initial_state),
        batch.policy_version[rows.cpu()],
    )


class PPOAgent(VTraceAgent):
    """Acts as the V-trace agent does; learns each batch over several epochs of minibatches."""

    metric_names = (
        "loss",
        "loss_policy",
        "loss_baseline",
        "loss_entropy",
        "grad_norm",
        "approx_kl",
        "clip_fraction",
        "epochs_run",
    )

    config: PPOConfig

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        # The minibatch shuffles have their own generator, saved with the agent: a resumed run
        # (and a reloaded agent) shuffles as the original would have.
        self.shuffles = torch.Generator().manual_seed(int(torch.randint(2**62, ())))

    def learn(self, batch: Unrolls) -> dict[str, float]:
        """``epochs`` passes of ``minibatches`` optimizer steps over ``batch``; returns the
        metrics averaged over those steps, and how many epochs ran (``target_kl`` may stop
        them early)."""
        cfg = self.config
        targets = batch_targets(self.network, batch, cfg)
        sums: dict[str, float] = {}
        steps = epochs = 0
        for _ in range(cfg.epochs):
            kl = 0.0
            order = torch.randperm(batch.batch_size, generator=self.shuffles).to(self.device)
            chunks = order.chunk(cfg.minibatches)
            for rows in chunks:
                minibatch = {k: v[:, rows] for k, v in targets.items()}
                terms, stats = ppo_loss(self.network, _select(batch, rows), minibatch, cfg)
                metrics = optimizer_step(self.network, self.optimizer, terms, cfg.max_grad_norm)
                for key, value in {**metrics, **stats}.items():
                    sums[key] = sums.get(key, 0.0) + value
                kl, steps = kl + stats["approx_kl"], steps + 1
            epochs += 1
            if cfg.target_kl is not None and kl / len(chunks) > cfg.target_kl:
                break
        return {**{k: v / steps for k, v in sums.items()}, "epochs_run": float(epochs)}

    def state_dict(self) -> dict[str, Any]:
        return {**super().state_dict(), "shuffles": self.shuffles.get_state()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        super().load_state_dict(state)
        self.shuffles.set_state(state["shuffles"])


AGENT_CLASS = PPOAgent
