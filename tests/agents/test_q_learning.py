"""DQN's and R2D2's arithmetic against plain loops over the papers' equations."""

from __future__ import annotations

import pytest
import torch

from seedbed.agents import make_agent
from seedbed.agents.dqn.learning import q_learning_loss, q_values
from seedbed.agents.q_targets import (
    exploration_epsilons,
    inverse_value_rescale,
    n_step_targets,
    sequence_priorities,
    value_rescale,
)
from seedbed.resolve import resolve
from seedbed.types import EnvSpec, ReplayInfo, Unrolls

SPEC = EnvSpec("test", (3,), "float32", 4)


def test_value_rescaling_round_trips_and_squashes():
    x = torch.cat([torch.linspace(-1e4, 1e4, 2001), torch.tensor([0.0, 1e-3, -1e-3, 0.5])])
    x = x.double()
    for eps in (1e-3, 1e-2):
        torch.testing.assert_close(inverse_value_rescale(value_rescale(x, eps), eps), x)
        torch.testing.assert_close(value_rescale(inverse_value_rescale(x, eps), eps), x)
    # h(x) = sign(x)(sqrt(|x|+1)-1) + eps x, written out for one value
    assert value_rescale(torch.tensor(99.0), 1e-3).item() == pytest.approx(9.0 + 0.099)
    assert value_rescale(torch.tensor(-3.0), 0.0).item() == pytest.approx(-1.0)


def test_n_step_targets_by_hand_with_an_episode_end():
    # Transition 1 ends its episode (discount 0); n = 2; gamma = 0.5.
    rewards = torch.tensor([[1.0], [2.0], [3.0], [4.0]])
    discounts = torch.tensor([[0.5], [0.0], [0.5], [0.5]])
    bootstrap = torch.tensor([[10.0], [20.0], [30.0], [40.0]])
    got = n_step_targets(rewards, discounts, bootstrap, n=2)[:, 0].tolist()
    # G0 = 1 + .5*2 (then the episode ends); G1 = 2; G2 = 3 + .5*4 + .25*40; G3 = 4 + .5*40
    assert got == pytest.approx([2.0, 2.0, 15.0, 24.0])


def _reference_targets(rewards, discounts, bootstrap, n):
    steps, batch = rewards.shape
    out = torch.empty(steps, batch)
    for b in range(batch):
        for t in range(steps):
            m, total, scale = min(n, steps - t), 0.0, 1.0
            for k in range(m):
                total += scale * float(rewards[t + k, b])
                scale *= float(discounts[t + k, b])
            out[t, b] = total + scale * float(bootstrap[t + m - 1, b])
    return out


@pytest.mark.parametrize("n", [1, 3, 5, 12])
def test_n_step_targets_match_a_plain_loop(n):
    torch.manual_seed(n)
    rewards, bootstrap = torch.randn(9, 5), torch.randn(9, 5)
    discounts = 0.9 * (torch.rand(9, 5) > 0.25).float()
    torch.testing.assert_close(
        n_step_targets(rewards, discounts, bootstrap, n),
        _reference_targets(rewards, discounts, bootstrap, n),
    )


def test_priorities_and_epsilons_follow_the_papers():
    td = torch.tensor([[1.0, -2.0], [-3.0, 0.0], [2.0, 1.0]])
    expected = [0.9 * 3 + 0.1 * 2, 0.9 * 2 + 0.1 * 1]
    assert sequence_priorities(td, 0.9).tolist() == pytest.approx(expected)
    eps = exploration_epsilons(8)
    assert eps[0].item() == pytest.approx(0.4) and eps[-1].item() == pytest.approx(0.4**8)
    assert eps[3].item() == pytest.approx(0.4 ** (1 + 7 * 3 / 7))
    assert torch.all(eps[1:] < eps[:-1])


def _sequence(agent_name: str, overrides: dict, batch: int = 3, seed: int = 0):
    torch.manual_seed(seed)
    config = resolve([{"agent": agent_name, **overrides}]).agent
    agent = make_agent(agent_name, SPEC, config, "cpu")
    layout = config.layout(8)
    steps = layout.window
    done = torch.rand(steps, batch) < 0.2
    unrolls = Unrolls(
        {
            "obs": torch.randn(steps, batch, 3),
            "prev_action": torch.randint(0, 4, (steps, batch)),
            "reward": torch.randn(steps, batch),
            "done": done,
            "truncated": torch.zeros(steps, batch, dtype=torch.bool),
            "action": torch.randint(0, 4, (steps, batch)),
        },
        agent.initial_state(batch),
        torch.zeros(batch, dtype=torch.int64),
        ReplayInfo(
            torch.arange(batch), torch.rand(batch) + 0.5, torch.zeros(batch, dtype=torch.int64)
        ),
    )
    # A target network that differs from the online one, so double Q is visible.
    for p in agent.target_network.parameters():
        p.data.add_(0.1 * torch.randn_like(p))
    return agent, config, unrolls


@pytest.mark.parametrize(
    "agent_name, overrides",
    [
        ("dqn", {"n_step": 3, "value_rescaling": False}),
        ("dqn", {"n_step": 2, "value_rescaling": True}),
        (
            "r2d2",
            {
                "burn_in": 2,
                "sequence_length": 5,
                "sequence_overlap": 2,
                "n_step": 3,
                "lstm_size": 8,
            },
        ),
    ],
)
def test_double_q_loss_matches_a_plain_loop(agent_name, overrides):
    agent, config, batch = _sequence(agent_name, overrides)
    layout = config.layout(config.n_step)
    terms, priorities = q_learning_loss(agent.network, agent.target_network, batch, config)
    s = batch.steps
    with torch.no_grad():  # both networks over the whole item, from its stored state
        q_online, _ = q_values(agent.network, s, batch.initial_state)
        q_target, _ = q_values(agent.target_network, s, batch.initial_state)
    h = (lambda x: value_rescale(x, config.rescaling_eps)) if config.value_rescaling else None
    h_inv = (lambda x: inverse_value_rescale(x, config.rescaling_eps)) if h else None
    steps, nb = s["reward"].shape
    burn, learned = layout.burn_in, layout.learn_steps
    td = torch.empty(learned, nb)
    for b in range(nb):
        for i in range(learned):
            t = burn + i
            total, scale, k = 0.0, 1.0, 0
            while True:  # rewards until n steps, the episode's end, or the item's end
                total += scale * float(s["reward"][t + k + 1, b])
                ended = bool(s["done"][t + k + 1, b])
                scale *= 0.0 if ended else config.discount
                k += 1
                if ended or k == config.n_step or t + k + 1 == steps:
                    break
            greedy = int(q_online[t + k, b].argmax())  # double Q: online picks, target values
            value = q_target[t + k, b, greedy]
            value = h_inv(value) if h_inv else value
            target = total + scale * float(value)
            target = float(h(torch.tensor(target))) if h else target
            td[i, b] = target - float(q_online[t, b, int(s["action"][t, b])])
    weights = batch.replay.weights
    assert terms["loss_td"].item() == pytest.approx(
        float((0.5 * weights * td.square().mean(0)).mean()), rel=1e-4
    )
    eta = config.priority_eta
    expected = eta * td.abs().max(0).values + (1 - eta) * td.abs().mean(0)
    torch.testing.assert_close(priorities, expected, rtol=1e-4, atol=1e-5)


def test_burn_in_steps_get_no_gradient_but_set_the_state():
    agent, config, batch = _sequence(
        "r2d2", {"burn_in": 3, "sequence_length": 4, "sequence_overlap": 2, "lstm_size": 8}, batch=2
    )
    obs = batch.steps["obs"].clone().requires_grad_(True)
    batch.steps["obs"] = obs
    terms, _ = q_learning_loss(agent.network, agent.target_network, batch, config)
    terms["loss_td"].backward()
    assert torch.all(obs.grad[:3] == 0), "burn-in steps must not be learned from"
    assert obs.grad[3:].abs().sum() > 0
    # ...yet the burn-in is not ignored: it sets the state the learned steps start from.
    changed = obs.detach().clone()
    changed[:3] += 1.0
    batch.steps["obs"] = changed
    again, _ = q_learning_loss(agent.network, agent.target_network, batch, config)
    assert again["loss_td"].item() != pytest.approx(terms["loss_td"].item())


def test_acting_explores_per_environment_and_evaluation_is_greedy():
    from seedbed.types import StepInput

    config = resolve([{"agent": "dqn"}]).agent
    explorer = make_agent("dqn", SPEC, config, "cpu", num_envs=2)
    greedy = make_agent("dqn", SPEC, config, "cpu")
    greedy.load_state_dict(explorer.state_dict())
    obs = torch.randn(1, 3).expand(2000, 3)
    ids = torch.tensor([0, 1]).repeat(1000)  # env 0 has eps 0.4, env 1 eps 0.4^8
    zeros = torch.zeros(2000, dtype=torch.int64)
    step = StepInput(obs, zeros, zeros.float(), zeros.bool(), ids)
    best = greedy.act(greedy.network, step, ()).action
    assert torch.all(best == best[0])
    acted = explorer.act(explorer.network, step, ()).action
    off = acted != best
    # env 0 explores with 0.4, a random action differing from the greedy one 3/4 of those times
    assert 0.22 < off[ids == 0].float().mean() < 0.38
    assert off[ids == 1].float().mean() < 0.01
