"""The Q-learning agent behind ``--agent dqn`` and ``--agent r2d2``: epsilon-greedy acting inside
central inference, and double, dueling, n-step Q-learning from prioritized replay.

R2D2 is this agent with an LSTM and sequences: the settings' ``layout`` says how unrolls are cut
and which steps are learned from, so one loss serves both (DQN: one transition per item, no
burn-in; R2D2: a burn-in without gradient, then every step of the sequence).
"""

from __future__ import annotations

from typing import Any

import torch

from seedbed.agents.base import ReplayLearner, acting_copy, clip_rewards
from seedbed.agents.dqn.config import DQNConfig, ReplayLayout
from seedbed.agents.q_targets import (
    exploration_epsilons,
    inverse_value_rescale,
    n_step_targets,
    sequence_priorities,
    value_rescale,
)
from seedbed.nets import ActorCriticNet, make_actor_critic, torso_dtype
from seedbed.replay import PrioritizedReplay
from seedbed.types import ActOutput, EnvSpec, State, StepInput, Unrolls

_INPUTS = ("obs", "prev_action", "reward", "done")


def q_values(
    net: ActorCriticNet, steps: dict[str, torch.Tensor], state: State
) -> tuple[torch.Tensor, State]:
    """Dueling Q-values [T, B, A] of time-major ``steps``: the network's value head plus its
    action head made zero-mean (Wang et al. 2016), so the two stay identifiable."""
    advantages, values, state = net(*(steps[k] for k in _INPUTS), state)
    q = values.unsqueeze(-1) + advantages - advantages.mean(-1, keepdim=True)
    return q, state


def _slice(steps: dict[str, torch.Tensor], start: int, stop: int | None = None):
    return {k: steps[k][start:stop] for k in _INPUTS}


def q_learning_loss(
    net: ActorCriticNet, target_net: ActorCriticNet, batch: Unrolls, config: DQNConfig
) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
    """The loss terms on a batch of replay items, and the items' new priorities [B].

    The online network runs over the first ``burn_in`` steps without gradient, only to refresh
    the stored recurrent state, then over the rest; the target network runs over all of it.
    Transition t pairs step t with step t + 1 (its reward and episode end); its target is the
    n-step return bootstrapped with the target network's value of the online network's greedy
    action (double Q), in rescaled space when value rescaling is on.
    """
    layout = config.layout(config.n_step)
    burn, learned = layout.burn_in, layout.learn_steps
    s, state = batch.steps, batch.initial_state
    if burn:
        with torch.no_grad():
            _, state = q_values(net, _slice(s, 0, burn), state)
    q, _ = q_values(net, _slice(s, burn), state)
    actions = s["action"][burn:-1]
    q_taken = q[:-1].gather(-1, actions.unsqueeze(-1)).squeeze(-1)  # [T, B]
    with torch.no_grad():
        q_target, _ = q_values(target_net, s, batch.initial_state)
        greedy = q[1:].argmax(-1, keepdim=True)
        bootstrap = q_target[burn + 1 :].gather(-1, greedy).squeeze(-1)
        rewards = s["reward"][burn + 1 :].float()
        rewards = clip_rewards(rewards, config.reward_clip)
        discounts = (~s["done"][burn + 1 :]).float() * config.discount
        if config.value_rescaling:
            bootstrap = inverse_value_rescale(bootstrap, config.rescaling_eps)
        targets = n_step_targets(rewards, discounts, bootstrap, config.n_step)
        if config.value_rescaling:
            targets = value_rescale(targets, config.rescaling_eps)
    td = (targets - q_taken)[:learned]
    weights = torch.ones(td.shape[1], device=td.device)
    if batch.replay is not None:
        weights = batch.replay.weights.to(td.device)
    terms = {"loss_td": 0.5 * (weights * td.square().mean(0)).mean()}
    return terms, sequence_priorities(td.detach(), config.priority_eta)


def make_replay(config: Any, layout: ReplayLayout, batch: int, seed: int) -> PrioritizedReplay:
    """Prioritized replay laid out by ``layout``, from an agent's replay settings (DQN's, R2D2's
    and D4PG's share their names). Its rate limiter lets the learner fall two batches behind
    the replay ratio before the actors wait."""
    return PrioritizedReplay(
        config.replay_capacity,
        layout.positions,
        layout.window,
        alpha=config.priority_exponent,
        beta=config.importance_exponent,
        min_fill=config.min_replay,
        samples_per_insert=config.replay_ratio,
        slack=2 * batch,
        seed=seed,
    )


class QAgent(ReplayLearner):
    """Acts epsilon-greedily on dueling Q-values; learns double n-step Q from replay."""

    metric_names = ("loss", "loss_td", "grad_norm", "priority")
    acting_skips = ()  # the dueling value joins the advantages in act's Q-values

    def __init__(
        self,
        env_spec: EnvSpec,
        config: DQNConfig,
        device: torch.device,
        num_envs: int | None = None,
    ) -> None:
        self.config = config
        self.device = torch.device(device)
        lstm_size = config.lstm_size if config.lstm else None
        self.torso_dtype = torso_dtype(config.torso_dtype, self.device)
        self.network = make_actor_critic(
            env_spec, config.hidden_sizes, lstm_size, True, config.torso, self.torso_dtype
        ).to(self.device)
        self.target_network = self.acting_network()
        self.optimizer = torch.optim.Adam(
            self.network.parameters(), lr=config.lr, eps=config.adam_eps, fused=True
        )
        self.num_actions = env_spec.num_actions
        self.steps = 0
        # Each env explores with its own epsilon; without envs (evaluation) acting is greedy.
        self.epsilons = None
        if num_envs:
            self.epsilons = exploration_epsilons(
                num_envs, config.epsilon_base, config.epsilon_alpha
            ).to(self.device)

    def unroll_layout(self, unroll: int) -> tuple[int, int]:
        """Steps per unroll and steps consecutive unrolls share, for ``--unroll``."""
        layout = self.config.layout(unroll)
        return layout.unroll, layout.overlap

    def make_buffer(self, unroll: int, queue_size: int, batch: int, seed: int) -> PrioritizedReplay:
        """Prioritized replay of the run's unrolls (``queue_size`` is V-trace's)."""
        return make_replay(self.config, self.config.layout(unroll), batch, seed)

    def acting_network(self) -> ActorCriticNet:
        return acting_copy(self.network)

    def initial_state(self, batch_size: int) -> State:
        return self.network.initial_state(batch_size, self.device)

    @torch.no_grad()
    def act(self, net: ActorCriticNet, step: StepInput, state: State) -> ActOutput:
        """The greedy action, or with each env's epsilon a uniformly random one."""
        inputs = {k: getattr(step, k)[None] for k in _INPUTS}
        q, state = q_values(net, inputs, state)
        action = q[0].argmax(-1)
        if self.epsilons is not None:
            explore = torch.rand(action.shape, device=action.device) < self.epsilons[step.env_ids]
            random = torch.randint_like(action, self.num_actions)
            action = torch.where(explore, random, action)
        return ActOutput(action, {}, state)

    def acting_outputs(
        self, net: ActorCriticNet, step: StepInput, state: State
    ) -> tuple[torch.Tensor, State]:
        """The Q-value advantages [N, A] (the greedy action is their argmax: the dueling value
        adds the same to every action) and the next state."""
        advantages, _, state = net(*(getattr(step, k)[None] for k in _INPUTS), state, values=False)
        return advantages[0], state

    def loss(self, batch: Unrolls) -> tuple[dict[str, torch.Tensor], torch.Tensor]:
        return q_learning_loss(self.network, self.target_network, batch, self.config)


AGENT_CLASS = QAgent
