"""D4PG's arithmetic against hand and loop-computed values, its acting, and a learning run."""

from __future__ import annotations

import csv
import math

import pytest
import torch

from seedbed.agents import make_agent
from seedbed.agents.categorical import categorical_projection, n_step_distribution
from seedbed.agents.d4pg.learning import d4pg_loss, time_limit_cut
from seedbed.agents.q_targets import geometric_spread, n_step_return_and_discount
from seedbed.errors import ConfigError
from seedbed.resolve import resolve
from seedbed.types import EnvSpec, ReplayInfo, StepInput, Unrolls

SPEC = EnvSpec(
    "test",
    (3,),
    "float32",
    0,
    action_shape=(2,),
    action_dtype="float32",
    action_low=(-1.0, 0.0),
    action_high=(1.0, 4.0),
)


def _loop_projection(values, probs, support):
    """Algorithm 1 of Bellemare et al. (2017), one source atom at a time."""
    v_min, v_max = float(support[0]), float(support[-1])
    dz = (v_max - v_min) / (len(support) - 1)
    out = torch.zeros(values.shape[0], len(support), dtype=torch.float64)
    for b in range(values.shape[0]):
        for j in range(values.shape[1]):
            tz = min(max(float(values[b, j]), v_min), v_max)
            pos = (tz - v_min) / dz
            lower, upper = math.floor(pos), math.ceil(pos)
            p = float(probs[b, j])
            if lower == upper:
                out[b, lower] += p
            else:
                out[b, lower] += p * (upper - pos)
                out[b, upper] += p * (pos - lower)
    return out


def test_projection_by_hand_between_on_and_outside_atoms():
    support = torch.tensor([0.0, 1.0, 2.0, 3.0, 4.0])
    values = torch.tensor([[0.5, 2.0, 5.0, -1.0]])  # between, on an atom, above and below
    probs = torch.tensor([[0.1, 0.2, 0.3, 0.4]])
    got = categorical_projection(values, probs, support)[0]
    torch.testing.assert_close(got, torch.tensor([0.45, 0.05, 0.2, 0.0, 0.3]))


def test_projection_of_a_terminal_step_puts_all_mass_around_the_reward():
    # After an episode end every atom lands on the reward: r = 1.25 between atoms 1 and 2.
    support = torch.linspace(-2.0, 2.0, 5)
    probs = torch.softmax(torch.randn(1, 5), -1)
    got = categorical_projection(torch.full((1, 5), 1.25), probs, support)[0]
    torch.testing.assert_close(got, torch.tensor([0.0, 0.0, 0.0, 0.75, 0.25]))


@pytest.mark.parametrize("seed", range(4))
def test_projection_matches_a_plain_loop(seed):
    torch.manual_seed(seed)
    support = torch.linspace(-10.0, 10.0, 51)
    # Shifted and scaled atoms as n-step targets make them, some past either bound, and a few
    # landing exactly on atoms (scale 1, integer-spaced shift).
    shift = torch.cat([torch.randn(6) * 8.0, torch.tensor([0.0, 0.4, 12.0, -15.0])])
    scale = torch.cat([torch.rand(6), torch.tensor([1.0, 1.0, 0.5, 0.0])])
    values = shift[:, None] + scale[:, None] * support
    probs = torch.softmax(torch.randn(10, 51), -1)
    got = categorical_projection(values, probs, support)
    torch.testing.assert_close(
        got.double(), _loop_projection(values, probs, support), atol=1e-6, rtol=0
    )
    torch.testing.assert_close(got.sum(-1), torch.ones(10))


def test_n_step_distributional_targets_by_hand():
    # n = 2, gamma = 0.5, atoms 0, 10, 20; next distribution (0.5, 0.25, 0.25) everywhere.
    support = torch.tensor([0.0, 10.0, 20.0])
    rewards = torch.tensor([[1.0, 3.0, 30.0], [2.0, 9.0, 30.0]])  # [n, B]
    # Window 1's episode ends with its first transition (discount 0 there).
    discounts = torch.tensor([[0.5, 0.0, 0.5], [0.5, 0.5, 0.5]])
    next_probs = torch.tensor([[0.5, 0.25, 0.25]]).expand(3, 3)
    returns, scales = n_step_return_and_discount(rewards, discounts, 2)
    assert returns[0].tolist() == pytest.approx([2.0, 3.0, 45.0])
    assert scales[0].tolist() == pytest.approx([0.25, 0.0, 0.25])
    got = n_step_distribution(rewards, discounts, next_probs, support)
    # Window 0: the atoms land on 2 + 0.25 z = 2, 4.5, 7, all between 0 and 10.
    first = [0.5 * 0.8 + 0.25 * 0.55 + 0.25 * 0.3, 0.5 * 0.2 + 0.25 * 0.45 + 0.25 * 0.7, 0.0]
    expected = torch.tensor([first, [0.7, 0.3, 0.0], [0.0, 0.0, 1.0]])  # ended; clipped to 20
    torch.testing.assert_close(got, expected)


def test_time_limit_cuts_are_found_where_they_end_the_window():
    # [n=3, B=4]: a cut at step 2; a task end at step 1 before a cut; no end; a cut at step 1.
    done = torch.tensor([[0, 1, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.bool)
    truncated = torch.tensor([[0, 0, 0, 1], [1, 0, 0, 0], [0, 1, 0, 0]], dtype=torch.bool)
    assert time_limit_cut(done, truncated).tolist() == [True, False, False, True]


def _items(batch: int, n: int, seed: int = 0) -> Unrolls:
    g = torch.Generator().manual_seed(seed)
    steps = {
        "obs": torch.randn(n + 1, batch, 3, generator=g),
        "reward": torch.rand(n + 1, batch, generator=g),
        "done": torch.zeros(n + 1, batch, dtype=torch.bool),
        "truncated": torch.zeros(n + 1, batch, dtype=torch.bool),
        "action": torch.rand(n + 1, batch, 2, generator=g) * torch.tensor([2.0, 4.0])
        - torch.tensor([1.0, 0.0]),
    }
    steps["prev_action"] = torch.zeros_like(steps["action"])
    replay = ReplayInfo(
        torch.arange(batch), torch.ones(batch), torch.zeros(batch, dtype=torch.int64)
    )
    return Unrolls(steps, (), torch.zeros(batch, dtype=torch.int64), replay)


def test_loss_leaves_out_windows_cut_by_a_time_limit():
    config = resolve([{"env": "dmc:cartpole-balance", "agent": "d4pg", "n_step": 3}]).agent
    agent = make_agent("d4pg", SPEC, config, "cpu")
    batch = _items(4, 3)
    batch.steps["done"][2, 0] = batch.steps["truncated"][2, 0] = True  # item 0 is cut
    terms, priorities = d4pg_loss(agent.network, agent.target_network, batch, config)
    assert priorities[0] == 0 and (priorities[1:] > 0).all()
    # The same loss with item 0 weighted out by hand instead.
    batch.steps["done"][2, 0] = batch.steps["truncated"][2, 0] = False
    batch.replay.weights = torch.tensor([0.0, 1.0, 1.0, 1.0])
    again, _ = d4pg_loss(agent.network, agent.target_network, batch, config)
    torch.testing.assert_close(terms["loss_critic"], again["loss_critic"])
    torch.testing.assert_close(terms["loss_policy"], again["loss_policy"])


def test_policy_loss_moves_only_the_policy_and_critic_loss_only_the_critic():
    config = resolve([{"env": "dmc:cartpole-balance", "agent": "d4pg"}]).agent
    agent = make_agent("d4pg", SPEC, config, "cpu")
    terms, _ = d4pg_loss(agent.network, agent.target_network, _items(8, config.n_step), config)
    net = agent.network
    policy = torch.autograd.grad(terms["loss_policy"], list(net.parameters()), allow_unused=True)
    critic = torch.autograd.grad(terms["loss_critic"], list(net.parameters()), allow_unused=True)
    names = [name for name, _ in net.named_parameters()]
    for name, p, c in zip(names, policy, critic, strict=True):
        if name.startswith("policy."):
            assert p is not None and c is None, name
        else:
            assert p is None and c is not None, name


def test_acting_adds_each_envs_noise_within_the_bounds_and_evaluation_adds_none():
    config = resolve([{"env": "dmc:cartpole-balance", "agent": "d4pg"}]).agent
    agent = make_agent("d4pg", SPEC, config, "cpu", num_envs=4)
    torch.testing.assert_close(agent.sigmas, geometric_spread(4, 0.3, 0.05))
    assert agent.sigmas[0] == pytest.approx(0.3) and agent.sigmas[-1] == pytest.approx(0.05)
    obs = torch.randn(1, 3).expand(4000, 3)
    ids = torch.arange(4).repeat(1000)
    zeros = torch.zeros(4000, 2)
    step = StepInput(obs, zeros, torch.zeros(4000), torch.zeros(4000, dtype=torch.bool), ids)
    action = agent.act(agent.network, step, ()).action
    assert action.shape == (4000, 2) and action.dtype == torch.float32
    low, high = torch.tensor([-1.0, 0.0]), torch.tensor([1.0, 4.0])
    assert (action >= low).all() and (action <= high).all()
    spread = torch.stack([agent.network.to_unit(action[ids == i]).std(0).mean() for i in range(4)])
    assert torch.all(spread[1:] < spread[:-1])  # env 0 explores most
    greedy = make_agent("d4pg", SPEC, config, "cpu")  # num_envs None: evaluation
    greedy.network.load_state_dict(agent.network.state_dict())
    first = greedy.act(greedy.network, step, ()).action
    assert torch.equal(first, greedy.act(greedy.network, step, ()).action)
    unit = greedy.network.policy(obs)
    torch.testing.assert_close(greedy.network.to_unit(first), unit)


def test_discrete_envs_are_refused_in_one_line():
    config = resolve([{"agent": "d4pg"}]).agent
    with pytest.raises(
        ConfigError, match="needs continuous actions.*use --agent vtrace, ppo, dqn or r2d2"
    ):
        make_agent("d4pg", EnvSpec("CartPole-v1", (4,), "float32", 2), config, "cpu")
    dqn = resolve([{"agent": "dqn"}]).agent
    with pytest.raises(ConfigError, match="needs discrete actions.*use --agent ppo or d4pg"):
        make_agent("dqn", SPEC, dqn, "cpu")


def test_dmc_defaults_cover_its_returns():
    config = resolve([{"env": "dmc:walker-walk", "agent": "d4pg"}])
    assert (config.agent.v_min, config.agent.v_max) == (0.0, 100.0)  # rewards in [0, 1]
    assert config.train.target_return is None and config.train.batch == 64
    other = resolve([{"env": "HalfCheetah-v5", "agent": "d4pg"}])
    assert (other.agent.v_min, other.agent.v_max) == (-150.0, 150.0)
    assert other.train.target_return is None
    with pytest.raises(ConfigError, match="--v-min"):
        resolve([{"agent": "d4pg", "v_min": 5.0, "v_max": 5.0}])


@pytest.mark.slow
def test_d4pg_learns_dmc_cartpole_balance_within_budget(tmp_path, no_leaks):
    from seedbed.runtime.train import train

    # Random actions score about 370 here and the untrained policy with its noise about 260;
    # the run must reach a mean of 600 over its last 8 episodes of 1,000 steps, one from each
    # env (with exploration noise; the noiseless policy then scores about 999). Layers of 128
    # rather than the default 256 take about as many frames in cheaper updates; 100,000 frames
    # leave room for a slow seed.
    settings = {
        "env": "dmc:cartpole-balance",
        "agent": "d4pg",
        "policy_hidden_sizes": (128, 128),
        "critic_hidden_sizes": (128, 128),
        "run_dir": str(tmp_path / "run"),
        "progress": False,
        "target_return": 600.0,
        "target_episodes": 8,
        "total_frames": 100_000,
        "energy": False,
    }
    summary = train(resolve([settings]))
    with open(tmp_path / "run" / "metrics.csv") as f:
        returns = [float(r["mean_return"]) for r in csv.DictReader(f) if r["mean_return"]]
    assert returns[0] < 450.0  # the first episodes: near random
    assert summary["stop_reason"] == "target_return", summary
    assert summary["target_reached_mean_return"] >= 600.0 and summary["episodes"] >= 8
    assert summary["replay"]["sampled"] > 0
