"""The interface every agent implements, and what the agents share; the batches that flow
through it (``StepInput``, ``ActOutput``, ``Unrolls``) are in ``seedbed.types``.

The call loop, in the order the runtime uses it::

    agent = make_agent(name, env_spec, config, device, num_envs)  # networks and optimizer
    agent.optimizers()                                    # a replicated learner wraps each
    buffer = agent.make_buffer(unroll, queue_size, batch, seed)   # FIFO or prioritized replay
    length, overlap = agent.unroll_layout(unroll)         # how unrolls are cut
    net = agent.acting_network()                          # a copy that inference acts with
    state = agent.initial_state(num_envs)                 # per-env recurrent state
    out = agent.act(net, step, state_rows)                # central inference, no grad
    ...unrolls of length+1 steps are built from ``step`` and ``out`` and put in ``buffer``...
    batch = buffer.get(batch_size)                        # the next unrolls, or a sample
    metrics = agent.learn(batch)                          # one learner update
    buffer.learned(batch)                                 # replay takes the new priorities
    copy_parameters(agent.network, net)                   # inference acts with the newest
    agent.acting_outputs(net, step, state_rows)           # no sampling: a broadcast's error
    agent.state_dict() / agent.load_state_dict(...)       # checkpoints

An agent never sees a transport, a process or a queue, so the same object runs in one process, on
many actors, or replicated.
"""

from __future__ import annotations

import copy
import math
from typing import Any, Protocol

import torch

from seedbed.types import ActOutput, Buffer, State, StepInput, Unrolls


class Agent(Protocol):
    """What inference and the learner call; see the module docstring for the order."""

    network: torch.nn.Module
    metric_names: tuple[str, ...]  # the keys learn() returns: the metrics' CSV columns
    # Submodules of ``network`` that ``act`` never reads: policy broadcasts leave them out.
    acting_skips: tuple[str, ...]
    # The dtype ``network``'s torso computes in (the agent's ``torso_dtype`` setting, ``auto``
    # resolved), which summary.json records; None where the network has no such setting.
    torso_dtype: torch.dtype | None

    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        """Every optimizer ``learn`` steps: a replicated learner averages their gradients over
        the replicas (``ReplicaContext.wrap_optimizer``)."""
        ...

    def unroll_layout(self, unroll: int) -> tuple[int, int]: ...

    def make_buffer(self, unroll: int, queue_size: int, batch: int, seed: int) -> Buffer: ...

    def acting_network(self) -> torch.nn.Module: ...

    def initial_state(self, batch_size: int) -> State: ...

    def act(self, net: torch.nn.Module, step: StepInput, state: State) -> ActOutput: ...

    def acting_outputs(
        self, net: torch.nn.Module, step: StepInput, state: State
    ) -> tuple[torch.Tensor, State]:
        """The outputs of ``net`` that ``act`` picks actions by, before any sampling or
        exploration ([N, ...]: logits or a Gaussian's parameters, Q-value advantages, actions
        without noise), and the next state. Deterministic, so that two copies of a network can
        be compared on it (a broadcast's quantization error). Its callers hold ``no_grad``."""
        ...

    def learn(self, batch: Unrolls) -> dict[str, float]: ...

    def state_dict(self) -> dict[str, Any]: ...

    def load_state_dict(self, state: dict[str, Any]) -> None: ...


@torch.no_grad()
def copy_parameters(src: torch.nn.Module, dst: torch.nn.Module) -> None:
    """Copy ``src``'s parameters and buffers into ``dst`` in place (same architecture), in one
    op: the learner publishes after every step, holding the lock inference acts under."""
    sources, targets = [*src.parameters(), *src.buffers()], [*dst.parameters(), *dst.buffers()]
    if len(sources) != len(targets):
        raise ValueError(f"{len(sources)} parameters and buffers to copy into {len(targets)}")
    if targets:
        torch._foreach_copy_(targets, sources, non_blocking=True)


def acting_copy(network: torch.nn.Module) -> torch.nn.Module:
    """A frozen copy of ``network`` for inference, so acting never reads a half-applied update."""
    net = copy.deepcopy(network)
    net.requires_grad_(False)
    return net


# The key ``optimizer_step`` (and so ``learn``) reports skipped optimizer steps under: a count,
# summed over an update's steps, never averaged. Not a CSV column: the runtime counts it.
SKIPPED = "skipped_steps"


def optimizer_step(
    network: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    terms: dict[str, torch.Tensor],
    max_grad_norm: float | None,
) -> dict[str, float]:
    """Minimise the sum of the loss ``terms`` by one step; return them, the total, the
    gradient norm (before clipping to ``max_grad_norm``, where one is set) as floats, and
    ``SKIPPED``: 1.0 where the loss or the gradient norm was not finite, and the step was not
    taken (the parameters and the optimizer's state are left as they were), else 0.0."""
    loss = sum(terms.values())
    optimizer.zero_grad(set_to_none=True)
    loss.backward()
    sync = getattr(optimizer, "sync_gradients", None)  # a replicated learner's (wrap_optimizer)
    if sync is not None:
        sync()  # average over replicas before clipping, so the clip sees the whole batch's
    limit = float("inf") if max_grad_norm is None else max_grad_norm
    grad_norm = clip_grad_norm(list(network.parameters()), limit)
    names = (*terms, "loss", "grad_norm")
    # Read before the step (one read), which must not be taken on non-finite values: one NaN
    # step turns every weight, and every later checkpoint, into NaN.
    values = torch.stack([*terms.values(), loss, grad_norm]).detach().tolist()
    metrics = dict(zip(names, values, strict=True))
    # Replicas decide on the gradient norm alone, which they share (averaged above): each one's
    # loss is its own, and one replica stepping without the others would part them for good.
    finite = math.isfinite(metrics["grad_norm"]) and (
        sync is not None or math.isfinite(metrics["loss"])
    )
    if finite:
        optimizer.step()
    else:
        optimizer.zero_grad(set_to_none=True)
    metrics[SKIPPED] = 0.0 if finite else 1.0
    return metrics


def clip_rewards(rewards: torch.Tensor, clip: float | None) -> torch.Tensor:
    """``rewards`` clipped to ``[-clip, clip]`` (None: as they are); a NaN becomes 0 and an
    infinity the bound of its sign, where a clamp alone would keep the NaN."""
    if clip is None:
        return rewards
    return torch.nan_to_num(rewards, nan=0.0).clamp(-clip, clip)


def entropy_cost(config: Any, optimizer: torch.optim.Optimizer) -> float:
    """The weight of the entropy bonus for the next step: ``config.entropy_cost``, or with
    ``config.anneal_entropy`` that times the fraction of its initial rate the run's schedule
    has left ``optimizer`` at (``seedbed.runtime.lr_schedule`` keeps the initial one, as
    torch's own schedulers do, under ``initial_lr``)."""
    if not config.anneal_entropy:
        return config.entropy_cost
    group = optimizer.param_groups[0]
    return config.entropy_cost * group["lr"] / group.get("initial_lr", group["lr"])


@torch.no_grad()
def clip_grad_norm(params: list[torch.Tensor], max_norm: float) -> torch.Tensor:
    """``torch.nn.utils.clip_grad_norm_(params, max_norm)``: scale the gradients so that their
    total 2-norm is at most ``max_norm``; return the norm before scaling.

    The same ops on the same values as torch's (its foreach path), without the grouping by
    device and dtype it repeats on every call, which cost a small network's learner step more
    than the clipping itself; gradients of several devices or dtypes go to torch's.
    """
    grads = [p.grad for p in params if p.grad is not None]
    if not grads:
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    first = grads[0]
    if any(
        type(g) is not torch.Tensor or g.device != first.device or g.dtype != first.dtype
        for g in grads
    ):
        return torch.nn.utils.clip_grad_norm_(params, max_norm)
    total_norm = torch.linalg.vector_norm(torch.stack(torch._foreach_norm(grads, 2.0)), 2.0)
    clip_coef = float(max_norm) / (total_norm + 1e-6)
    torch._foreach_mul_(grads, torch.clamp(clip_coef, max=1.0))
    return total_norm


class ReplayLearner:
    """The update and checkpoints of agents that learn from replay against a target network
    (DQN, R2D2, D4PG). A subclass sets ``network``, ``target_network``, ``optimizer``,
    ``config`` (with ``max_grad_norm`` and ``target_update_every``) and ``steps``, and says how
    its loss is computed (``loss``)."""

    network: torch.nn.Module
    target_network: torch.nn.Module
    optimizer: torch.optim.Optimizer
    config: Any
    steps: int

    def optimizers(self) -> tuple[torch.optim.Optimizer, ...]:
        return (self.optimizer,)

    def loss(self, batch: Unrolls) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        """The loss terms on ``batch`` and each item's new priority."""
        raise NotImplementedError

    def learn(self, batch: Unrolls) -> dict[str, float]:
        """One optimizer step on replay items; sets ``batch.replay.priorities`` (not where the
        step was skipped as not finite)."""
        terms, priorities = self.loss(batch)
        metrics = optimizer_step(self.network, self.optimizer, terms, self.config.max_grad_norm)
        self.steps += 1
        if self.steps % self.config.target_update_every == 0:
            copy_parameters(self.network, self.target_network)
        # A skipped step's priorities are not to be trusted: its items keep theirs.
        if batch.replay is not None and not metrics[SKIPPED]:
            batch.replay.priorities = priorities
        metrics["priority"] = float(priorities.mean())
        return metrics

    def state_dict(self) -> dict[str, Any]:
        return {
            "network": self.network.state_dict(),
            "target_network": self.target_network.state_dict(),
            "optimizer": self.optimizer.state_dict(),
            "steps": self.steps,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.network.load_state_dict(state["network"])
        self.target_network.load_state_dict(state["target_network"])
        self.optimizer.load_state_dict(state["optimizer"])
        self.steps = int(state["steps"])
