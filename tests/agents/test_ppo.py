"""PPO: its targets and loss against plain loops over the papers' equations, its settings, and
that it learns, with central and local inference and a replicated learner."""

from __future__ import annotations

import math

import pytest
import torch
from torch.nn import functional as F

from seedbed.agents import make_agent
from seedbed.agents.base import entropy_cost
from seedbed.agents.policies import GaussianPolicy
from seedbed.agents.ppo.learning import (
    _flat_steps,
    _select_steps,
    batch_targets,
    gae,
    ppo_loss,
    prepared,
    unroll_columns,
)
from seedbed.errors import ConfigError
from seedbed.nets import make_actor_critic
from seedbed.resolve import resolve
from seedbed.runtime.lr_schedule import LearningRates
from seedbed.runtime.train import train
from seedbed.types import EnvSpec
from tests.agents.test_agents import CONTINUOUS, DISCRETE, collect
from tests.conftest import tiny_settings


def gae_by_the_sum(rewards, discounts, values, bootstrap, lam):
    """Schulman et al. 2016, eq. 16: A_t = sum over l of (gamma lambda)^l delta_{t+l}, the
    product of the discounts cutting it where an episode ended."""
    T, B = rewards.shape
    out = torch.zeros(T, B, dtype=torch.float64)
    for b in range(B):
        v = [*values[:, b].tolist(), float(bootstrap[b])]
        deltas = [rewards[t, b] + discounts[t, b] * v[t + 1] - v[t] for t in range(T)]
        for t in range(T):
            weight = 1.0
            for k in range(t, T):
                out[t, b] += weight * deltas[k]
                weight *= float(discounts[k, b]) * lam
    return out


def test_gae_matches_the_papers_sum():
    torch.manual_seed(0)
    T, B = 7, 3
    rewards = torch.randn(T, B, dtype=torch.float64)
    discounts = 0.97 * (torch.rand(T, B) > 0.25).double()  # 0 where an episode ended
    values, bootstrap = torch.randn(T, B, dtype=torch.float64), torch.randn(B, dtype=torch.float64)
    for lam in (0.0, 0.9, 1.0):
        ours = gae(rewards, discounts, values, bootstrap, lam)
        assert torch.allclose(ours, gae_by_the_sum(rewards, discounts, values, bootstrap, lam))


def agent_and_batch(**settings):
    torch.manual_seed(1)
    config = resolve([{"agent": "ppo", **settings}]).agent
    agent = make_agent("ppo", DISCRETE, config, "cpu")
    return agent, collect(agent, DISCRETE, num_envs=4, unroll=6), config


@pytest.mark.parametrize("popart", [False, True])
def test_the_clipped_surrogate_matches_a_loop_over_the_paper(popart):
    """Schulman et al. 2017, eq. 7, with the ratio against the policy that acted; with PopArt
    the value error is measured in units of the targets' deviation (van Hasselt et al. 2016)."""
    agent, batch, config = agent_and_batch(
        normalize_advantages=False, value_clip=0.1, popart=popart
    )
    for _ in range(3):  # move the policy away from the one that acted, so ratios leave 1
        agent.learn(batch)
    ready = prepared(agent.network, batch)
    targets = batch_targets(agent.network, ready, config, agent.policy)
    terms, stats = ppo_loss(
        agent.network, ready, targets, config, agent.policy, config.entropy_cost
    )
    s = batch.steps
    with torch.no_grad():
        logits, values, _ = agent.network(
            s["obs"], s["prev_action"], s["reward"], s["done"], batch.initial_state
        )
    T, B = s["action"].shape[0] - 1, batch.batch_size
    surrogate = value = clipped_count = entropy = 0.0
    for t in range(T):
        for b in range(B):
            a = int(s["action"][t, b])
            probs = F.softmax(logits[t, b], -1).tolist()
            entropy -= sum(p * math.log(p) for p in probs)
            new = float(F.log_softmax(logits[t, b], -1)[a])
            old = float(F.log_softmax(s["logits"][t, b], -1)[a])
            ratio, adv = torch.tensor(new - old).exp().item(), float(targets["advantages"][t, b])
            clipped = min(max(ratio, 0.8), 1.2)
            surrogate += min(ratio * adv, clipped * adv)
            clipped_count += abs(ratio - 1) > 0.2
            ret, before = float(targets["returns"][t, b]), float(targets["values"][t, b])
            v = float(values[t, b])
            v_clipped = before + min(max(v - before, -0.1), 0.1)
            value += max((v - ret) ** 2, (v_clipped - ret) ** 2)
    n = T * B
    sigma = float(agent.network.value.sigma) if popart else 1.0
    assert sigma != 1.0 or not popart  # the statistics moved: the division is tested
    assert terms["loss_policy"].detach().item() == pytest.approx(-surrogate / n, rel=1e-5)
    loss_baseline = 0.5 * 0.5 * value / n / sigma**2
    assert terms["loss_baseline"].detach().item() == pytest.approx(loss_baseline, rel=1e-5)
    assert stats["clip_fraction"] == pytest.approx(clipped_count / n)
    assert 0 < stats["clip_fraction"] < 1
    assert stats["entropy"] == pytest.approx(entropy / n, rel=1e-5)
    want = -config.entropy_cost * entropy / n
    assert terms["loss_entropy"].detach().item() == pytest.approx(want, rel=1e-5)


@pytest.mark.parametrize("agent_name", ["ppo", "vtrace"])
def test_an_annealed_entropy_bonus_falls_with_the_learning_rate(agent_name):
    """With --anneal-entropy the bonus's weight is the run's rate schedule's fraction of
    --entropy-cost: held, halfway down, and gone with the rate; without it, constant."""
    torch.manual_seed(1)
    settings = {"agent": agent_name, "lr_schedule": "linear", "entropy_cost": 0.05}
    for anneal in (True, False):
        config = resolve([{**settings, "anneal_entropy": anneal}]).agent
        agent = make_agent(agent_name, DISCRETE, config, "cpu")
        batch = collect(agent, DISCRETE, num_envs=4, unroll=6)
        rates = LearningRates(agent.optimizers(), "linear", 1000, hold_frames=200)
        for frames, fraction in ((100, 1.0), (600, 0.5), (1000, 0.0)):
            rates.update(frames)
            weight = 0.05 * fraction if anneal else 0.05
            assert entropy_cost(config, agent.optimizer) == pytest.approx(weight)
            metrics = agent.learn(batch)
            if agent_name == "ppo":  # the mean entropy over the steps, which the term weighs
                want = -weight * metrics["entropy"]
                assert metrics["loss_entropy"] == pytest.approx(want, rel=1e-5, abs=1e-12)
            assert (metrics["loss_entropy"] == 0.0) == (anneal and fraction == 0.0)


def test_an_annealed_entropy_bonus_needs_a_falling_rate(tmp_path):
    with pytest.raises(ConfigError, match="add --lr-schedule linear, or --no-anneal-entropy"):
        resolve([tiny_settings(tmp_path / "run", agent="ppo", anneal_entropy=True)])


def test_the_decoupled_surrogate_matches_a_loop_over_its_equation():
    """Hilton et al. 2022, decoupled PPO: the ratio against the learner's policy at the start of
    the batch (pi_prox), each step weighted by min(pi_prox / pi_acting, rho-bar)."""
    agent, batch, config = agent_and_batch(
        normalize_advantages=False, clip_against="learner", clip_pg_rho=1.5
    )
    for _ in range(3):  # the acting policy lags the learner's, as under central inference
        agent.learn(batch)
    ready = prepared(agent.network, batch)
    targets = batch_targets(agent.network, ready, config, agent.policy)
    terms, stats = ppo_loss(
        agent.network, ready, targets, config, agent.policy, config.entropy_cost
    )
    # Before the batch's first update the learner's policy is the anchor: nothing is clipped.
    assert stats["clip_fraction"] == 0.0 and abs(stats["approx_kl"]) < 1e-6
    proximal = {k: v.detach().clone() for k, v in agent.network.state_dict().items()}
    agent.learn(batch)  # now the current policy has moved from the anchor
    terms, stats = ppo_loss(
        agent.network, ready, targets, config, agent.policy, config.entropy_cost
    )
    s = batch.steps
    with torch.no_grad():
        inputs = s["obs"], s["prev_action"], s["reward"], s["done"], batch.initial_state
        logits, _, _ = agent.network(*inputs)
        current = {k: v.clone() for k, v in agent.network.state_dict().items()}
        agent.network.load_state_dict(proximal)
        prox_logits, _, _ = agent.network(*inputs)
        agent.network.load_state_dict(current)
    T, B = s["action"].shape[0] - 1, batch.batch_size
    surrogate, weights = 0.0, []
    for t in range(T):
        for b in range(B):
            a = int(s["action"][t, b])
            new = float(F.log_softmax(logits[t, b], -1)[a])
            prox = float(F.log_softmax(prox_logits[t, b], -1)[a])
            acted = float(F.log_softmax(s["logits"][t, b], -1)[a])
            ratio, adv = math.exp(new - prox), float(targets["advantages"][t, b])
            weight = min(math.exp(prox - acted), 1.5)
            weights.append(weight)
            surrogate += weight * min(ratio * adv, min(max(ratio, 0.8), 1.2) * adv)
    assert terms["loss_policy"].detach().item() == pytest.approx(-surrogate / (T * B), rel=1e-4)
    assert min(weights) < 1.0 and max(weights) > 1.0  # the lag weight is not all ones
    assert 0 < stats["clip_fraction"] < 1


def test_vtrace_advantages_on_policy_give_the_gae_returns():
    """With the acting policy the learner's, V-trace's targets are GAE(lambda)'s returns."""
    agent, batch, config = agent_and_batch(advantages="vtrace", td_lambda=0.9)
    s = batch.steps
    with torch.no_grad():
        logits, _, _ = agent.network(
            s["obs"], s["prev_action"], s["reward"], s["done"], batch.initial_state
        )
    s["logits"] = logits  # on-policy: every importance weight is 1
    ready = prepared(agent.network, batch)
    vtrace = batch_targets(agent.network, ready, config, agent.policy)
    config.advantages = "gae"
    plain = batch_targets(agent.network, ready, config, agent.policy)
    assert torch.allclose(vtrace["returns"], plain["returns"], atol=1e-5)


def test_a_minibatch_of_steps_is_the_surrogate_over_just_those_steps():
    """``minibatch_of=steps``: a minibatch of transitions drawn from every unroll gives the
    clipped surrogate and value error of exactly those (t, b), as a loop over them does; and
    all T x B of them give the whole batch's loss."""
    agent, batch, config = agent_and_batch(
        normalize_advantages=False, value_clip=0.1, popart=False, minibatch_of="steps"
    )
    for _ in range(3):  # ratios leave 1
        agent.learn(batch)
    ready = prepared(agent.network, batch)
    targets = batch_targets(agent.network, ready, config, agent.policy)
    flat, flat_targets = _flat_steps(ready, targets)
    T, B = targets["advantages"].shape
    everything = _select_steps(flat, flat_targets, torch.arange(T * B))
    whole, _ = ppo_loss(agent.network, ready, targets, config, agent.policy, 0.0)
    all_steps, _ = ppo_loss(agent.network, *everything, config, agent.policy, 0.0)
    for name, value in whole.items():
        assert all_steps[name].item() == pytest.approx(value.item(), rel=1e-5), name

    rows = torch.tensor([5, 0, 17, 9, 22])
    part, minibatch = _select_steps(flat, flat_targets, rows)
    assert part.batch_size == len(rows) and len(part.steps["obs"]) == 1
    terms, _ = ppo_loss(agent.network, part, minibatch, config, agent.policy, 0.0)
    s = batch.steps
    with torch.no_grad():
        logits, values, _ = agent.network(
            s["obs"], s["prev_action"], s["reward"], s["done"], batch.initial_state
        )
    surrogate = value = 0.0
    for i in rows.tolist():
        t, b = divmod(i, B)
        a = int(s["action"][t, b])
        new = float(F.log_softmax(logits[t, b], -1)[a])
        old = float(F.log_softmax(s["logits"][t, b], -1)[a])
        ratio, adv = math.exp(new - old), float(targets["advantages"][t, b])
        surrogate += min(ratio * adv, min(max(ratio, 0.8), 1.2) * adv)
        v, ret = float(values[t, b]), float(targets["returns"][t, b])
        before = float(targets["values"][t, b])
        value += max((v - ret) ** 2, (before + min(max(v - before, -0.1), 0.1) - ret) ** 2)
    n = len(rows)
    assert terms["loss_policy"].item() == pytest.approx(-surrogate / n, rel=1e-5)
    assert terms["loss_baseline"].item() == pytest.approx(0.25 * value / n, rel=1e-5)


@pytest.mark.parametrize(
    ("settings", "of_steps"),
    [
        ({}, True),  # CartPole's preset: auto, and no LSTM
        ({"lstm": True}, False),  # auto with an LSTM: whole unrolls, which it replays
        ({"minibatch_of": "unrolls"}, False),
        ({"env": "HalfCheetah-v5"}, True),  # MuJoCo's preset: auto
        ({"env": "Pendulum-v1"}, True),  # the continuous preset: MuJoCo's auto
    ],
)
def test_auto_draws_steps_only_for_a_network_without_memory(settings, of_steps):
    assert resolve([{"agent": "ppo", **settings}]).agent.minibatches_of_steps is of_steps


def test_minibatch_columns_are_indexing_in_the_batchs_layout():
    """``unroll_columns`` is ``x[:, rows]``; prepared frames stay channels-last, so no pass
    over a minibatch copies it to that layout again."""
    torch.manual_seed(0)
    atari = EnvSpec("atari:Pong", (4, 84, 84), "uint8", 6)
    net = make_actor_critic(atari, (), None, torso="a3c", normalize_obs=True)
    frames = torch.randint(0, 256, (5, 6, 4, 84, 84), dtype=torch.uint8)
    net.obs_norm.update(frames)
    prepared = net.prepare(frames)
    rows = torch.tensor([4, 1, 3])
    tensors = {
        "frames": prepared,
        "done": torch.rand(5, 6) < 0.5,
        "logits": torch.randn(5, 6, 3),
        "transposed": torch.randn(6, 5, 3).transpose(0, 1),  # not one block a step: indexed
        "a frame per step": frames[:, :, :1],  # one channel of four: indexed
        "single": torch.randn(5, 6, 1, 2),
    }
    for name, x in tensors.items():
        columns = unroll_columns(x, rows)
        assert torch.equal(columns, x[:, rows]), name
    columns = unroll_columns(prepared, rows).reshape(-1, *atari.obs_shape)
    assert columns.is_contiguous(memory_format=torch.channels_last)


def test_gaussian_scores_match_torch_distributions():
    """Log-probabilities and entropies of the unbounded samples, against torch's Normal."""
    torch.manual_seed(0)
    policy = GaussianPolicy(CONTINUOUS, "clip")
    params = torch.randn(7, 3, 4)  # [T, B, 2A] for A = 2
    steps = {"sample": torch.randn(8, 3, 2) * 2}  # T + 1 steps, as in unrolls
    mean, log_std = params[..., :2], params[..., 2:]
    normal = torch.distributions.Normal(mean, log_std.exp())
    want = normal.log_prob(steps["sample"][:7]).sum(-1)
    torch.testing.assert_close(policy.log_prob(params, steps), want)
    torch.testing.assert_close(policy.entropy(params), normal.entropy().sum(-1))


@pytest.mark.parametrize("squash", ["clip", "tanh"])
def test_gaussian_actions_stay_in_bounds_and_record_the_sample(squash):
    torch.manual_seed(0)
    policy = GaussianPolicy(CONTINUOUS, squash)  # bounds [-1, 1] and [-2, 2]
    params = torch.cat([torch.full((5000, 2), 0.5), torch.full((5000, 2), 0.7)], -1)
    action, extras = policy.sample(params)
    assert action.shape == (5000, 2) and set(extras) == {"gaussian", "sample"}
    assert (action.abs() <= torch.tensor([1.0, 2.0])).all()
    u = extras["sample"]
    assert u.mean(0).tolist() == pytest.approx([0.5, 0.5], abs=0.1)
    assert u.std(0).tolist() == pytest.approx([math.exp(0.7)] * 2, rel=0.05)
    high = torch.tensor([1.0, 2.0])
    if squash == "clip":
        torch.testing.assert_close(action, torch.maximum(torch.minimum(u, high), -high))
    else:
        torch.testing.assert_close(action, torch.tanh(u) * high)


def test_tanh_squash_needs_bounded_actions():
    inf = float("inf")
    unbounded = EnvSpec(
        "Free-v0",
        (3,),
        "float32",
        0,
        action_shape=(1,),
        action_dtype="float32",
        action_low=(-inf,),
        action_high=(inf,),
    )
    with pytest.raises(ConfigError, match="needs bounded actions.*use --action-squash clip"):
        GaussianPolicy(unbounded, "tanh")


def test_target_kl_stops_the_epochs_early():
    agent, batch, _ = agent_and_batch(epochs=8, target_kl=1e-6, lr=1e-2)
    agent.learn(batch)
    assert agent.learn(batch)["epochs_run"] < 8
    agent, batch, _ = agent_and_batch(epochs=3)
    assert agent.learn(batch)["epochs_run"] == 3


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        ({"epochs": 0}, "--epochs and --minibatches must be >= 1"),
        ({"minibatches": 0}, "--epochs and --minibatches must be >= 1"),
        (
            {"minibatches": 9, "batch": 8, "minibatch_of": "unrolls"},
            "--minibatches (9) must be <= --batch (8)",
        ),
        (
            {"minibatches": 4, "batch": 4, "learner_replicas": 2, "minibatch_of": "unrolls"},
            "--minibatches (4) must be <= --batch (4 / --learner-replicas = 2)",
        ),
        (  # MuJoCo's 32 minibatches are single steps; an LSTM replays whole unrolls
            {"env": "HalfCheetah-v5", "lstm": True},
            "a minibatch holds whole unrolls; set --minibatches 16 or fewer",
        ),
        (
            {"minibatch_of": "steps", "minibatches": 65, "batch": 8, "unroll": 16},
            "--minibatches (65) must be <= 64 with --minibatch-of steps",
        ),
        (
            {"minibatch_of": "steps", "lstm": True},
            "--minibatch-of steps cannot be used with --lstm",
        ),
        ({"clip_ratio": 0}, "--clip-ratio must be positive"),
        ({"td_lambda": 1.5}, "--td-lambda must lie in [0, 1]"),
        ({"value_clip": -1.0}, "--value-clip must be positive or none"),
        ({"target_kl": 0.01, "learner_replicas": 2}, "--target-kl cannot be used with"),
    ],
)
def test_invalid_settings_are_one_line(settings, message):
    with pytest.raises(ConfigError) as caught:
        resolve([{"agent": "ppo", **settings}])
    assert message in str(caught.value) and "\n" not in str(caught.value)


@pytest.mark.parametrize(
    "settings",
    [
        {"inference": "local", "actor_precision": "int8", "hidden_sizes": "256,256"},
        {"learner_replicas": 2, "batch": 8},
        {"lstm": True},
        {"env": "Pendulum-v1", "inference": "local", "actor_precision": "int8", "lstm": True}
        | {"minibatches": 2},  # the continuous preset's 8 would not fit the tiny batch of 4
        # More minibatches than unrolls: steps allow it (CartPole's preset draws steps too).
        {"env": "Pendulum-v1", "minibatch_of": "steps", "minibatches": 8, "batch": 4, "epochs": 2},
    ],
    ids=["local-int8", "replicated", "lstm", "gaussian-local-int8-lstm", "gaussian-steps"],
)
def test_ppo_runs_unchanged_on_every_layout(tmp_path, no_leaks, settings):
    summary = train(resolve([tiny_settings(tmp_path / "run", agent="ppo", **settings)]))
    assert summary["stop_reason"] == "total_frames" and summary["learner_steps"] > 0
    if "learner_replicas" in settings:
        assert summary["replicas_in_sync"] is True


@pytest.mark.slow
def test_a_gaussian_ppo_swings_the_pendulum_up_within_budget(tmp_path, no_leaks):
    """Pendulum-v1: a random policy scores about -1,200 an episode, a swing-up about -150.
    Observations normalized, so the test also covers the normalizer in a learning run. The
    continuous preset reaches -276 in under 70k frames on seeds 0-2 (docs/defaults.md); the
    budget is that of the discrete classic settings, whose ten seeds reached -400 at 175-493k
    frames, three times the worst."""
    settings = {
        "env": "Pendulum-v1",
        "agent": "ppo",
        "normalize_obs": True,
        "run_dir": str(tmp_path / "run"),
        "progress": False,
        "target_return": -400.0,
        "total_frames": 1_500_000,
    }
    summary = train(resolve([settings]))
    assert summary["stop_reason"] == "target_return", summary
    assert summary["target_reached_mean_return"] >= -400.0


@pytest.mark.slow
def test_ppo_solves_cartpole_within_budget(tmp_path, no_leaks):
    settings = {
        "agent": "ppo",
        "run_dir": str(tmp_path / "run"),
        "progress": False,
        "target_return": 475.0,
        "total_frames": 1_000_000,
    }
    summary = train(resolve([settings]))
    assert summary["stop_reason"] == "target_return", summary
    assert summary["target_reached_mean_return"] >= 475.0
