"""The standard test every registered agent passes: act, learn a few steps, checkpoint, reload.

Registered agents include a plug-in's: the example plug-in (examples/plugin) is registered while
the agents are listed and while each test runs."""

from __future__ import annotations

import copy
import math

import pytest
import torch

from seedbed.agents import AGENTS, action_kinds, config_class, make_agent
from seedbed.agents.base import SKIPPED
from seedbed.inference.acting import ActingTable
from seedbed.inference.unrolls import UnrollBuilder
from seedbed.resolve import resolve
from seedbed.runtime.checkpoint import load_checkpoint, save_checkpoint
from seedbed.types import EnvSpec, StepInput
from tests.conftest import toyplug_registered

DISCRETE = EnvSpec("test", (5,), "float32", 3)
CONTINUOUS = EnvSpec(
    "test",
    (5,),
    "float32",
    0,
    action_shape=(2,),
    action_dtype="float32",
    action_low=(-1.0, -2.0),
    action_high=(1.0, 2.0),
)
SPECS = {"discrete": DISCRETE, "continuous": CONTINUOUS}


def collect(agent, spec: EnvSpec, num_envs: int = 4, unroll: int = 6):
    """Unrolls from acting on random observations with random rewards and episode ends, cut as
    the agent cuts them."""
    length, overlap = agent.unroll_layout(unroll)
    builder = UnrollBuilder(num_envs, length, overlap)
    net, ids = agent.acting_network(), torch.arange(num_envs)
    table = ActingTable(agent.initial_state, num_envs, spec.action_shape, spec.action_dtype)
    for t in range(length + 1):
        done = torch.rand(num_envs) < 0.2 if t else torch.ones(num_envs, dtype=torch.bool)
        obs, reward = torch.randn(num_envs, 5), torch.randn(num_envs)
        step, state = table.inputs(ids, obs, reward, done)
        out = agent.act(net, step, state)
        prev = step.prev_action
        assert out.action.shape == prev.shape
        assert out.action.dtype == getattr(torch, spec.action_dtype)
        if spec.continuous:
            low, high = torch.tensor(spec.action_low), torch.tensor(spec.action_high)
            assert (out.action >= low).all() and (out.action <= high).all()
        else:
            assert out.action.max() < spec.num_actions
        record = {
            "obs": step.obs,
            "prev_action": prev,
            "reward": step.reward,
            "done": done,
            "truncated": done & (torch.rand(num_envs) < 0.5),
            "action": out.action,
            **out.extras,
        }
        unrolls = builder.append(ids, record, state, version=0)
        table.record(ids, out.action, out.state)
    assert unrolls is not None and unrolls.batch_size == num_envs
    return unrolls


# Every agent, in every action space it acts in: seedbed's and the example plug-in's.
with toyplug_registered():
    AGENT_KINDS = [(name, kind) for name in AGENTS for kind in action_kinds(name)]


@pytest.fixture(autouse=True)
def _plugin_agents():
    """The plug-in's agent registered while each test runs, as it was when they were listed."""
    with toyplug_registered():
        yield


@pytest.mark.parametrize(("name", "kind"), AGENT_KINDS)
@pytest.mark.parametrize("lstm", [False, True])
def test_agent_learns_and_checkpoints(name, kind, lstm, tmp_path):
    if lstm and not hasattr(config_class(name), "lstm"):
        pytest.skip(f"{name} has no recurrent core")
    torch.manual_seed(0)
    spec = SPECS[kind]
    config = resolve([{"agent": name, "lstm": lstm} if lstm else {"agent": name}])
    agent = make_agent(name, spec, config.agent, "cpu")
    batch = collect(agent, spec)
    before = [p.clone() for p in agent.network.parameters()]
    for _ in range(20):
        metrics = agent.learn(batch)
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert any(k.startswith("loss_") for k in metrics)
    after = list(agent.network.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    path = save_checkpoint(tmp_path, 1, {"agent": agent.state_dict()}, keep=1)
    again = make_agent(name, spec, config.agent, "cpu")
    again.load_state_dict(load_checkpoint(path)["agent"])
    saved, loaded = agent.state_dict()["network"], again.state_dict()["network"]
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    assert agent.learn(batch)["loss"] == pytest.approx(again.learn(batch)["loss"], rel=1e-5)


@pytest.mark.parametrize(("name", "kind"), AGENT_KINDS)
def test_agent_skips_a_non_finite_batch_and_keeps_its_weights(name, kind):
    """A batch with NaN observations and rewards: every step it makes is skipped and counted,
    the weights and the optimizer's state stay as they were, and the next batch learns."""
    torch.manual_seed(0)
    spec = SPECS[kind]
    agent = make_agent(name, spec, resolve([{"agent": name}]).agent, "cpu")
    batch = collect(agent, spec)
    agent.learn(batch)  # an optimizer with state of its own to keep
    before = copy.deepcopy(agent.state_dict())
    bad = copy.deepcopy(batch)
    bad.steps["obs"][:] = float("nan")
    bad.steps["reward"][1] = float("nan")
    metrics = agent.learn(bad)
    assert metrics[SKIPPED] >= 1
    after = agent.state_dict()
    assert all(torch.equal(before["network"][k], v) for k, v in after["network"].items())
    assert all(v.isfinite().all() for v in after["network"].values() if v.is_floating_point())
    state = after["optimizer"]["state"]
    old = before["optimizer"]["state"]
    assert all(torch.equal(old[i][key], v) for i in state for key, v in state[i].items())
    metrics = agent.learn(batch)
    assert metrics[SKIPPED] == 0 and math.isfinite(metrics["loss"])


@pytest.mark.parametrize(("name", "kind"), AGENT_KINDS)
def test_agent_names_its_optimizers_and_torso_dtype(name, kind):
    # A replicated learner averages the gradients of the optimizers the agent names: between
    # them they must step every parameter of its network.
    agent = make_agent(name, SPECS[kind], resolve([{"agent": name}]).agent, "cpu")
    stepped = {
        id(p)
        for optimizer in agent.optimizers()
        for group in optimizer.param_groups
        for p in group["params"]
    }
    assert stepped == {id(p) for p in agent.network.parameters()}
    assert agent.torso_dtype in (None, torch.float32, torch.bfloat16)
    network_dtype = getattr(agent.network, "torso_dtype", None)
    assert agent.torso_dtype == network_dtype


@pytest.mark.parametrize(("name", "kind"), AGENT_KINDS)
def test_acting_outputs_are_deterministic_rows_per_env(name, kind):
    # A broadcast's quantization error compares two networks on them, so sampling and
    # exploration must stay out, even for an agent made to explore (num_envs).
    torch.manual_seed(0)
    spec = SPECS[kind]
    agent = make_agent(name, spec, resolve([{"agent": name}]).agent, "cpu", 4)
    net, state = agent.acting_network(), agent.initial_state(4)
    prev = torch.zeros((4, *spec.action_shape), dtype=getattr(torch, spec.action_dtype))
    done = torch.ones(4, dtype=torch.bool)
    step = StepInput(torch.randn(4, 5), prev, torch.randn(4), done, torch.arange(4))
    outputs, next_state = agent.acting_outputs(net, step, state)
    assert outputs.is_floating_point() and outputs.shape[0] == 4
    assert torch.isfinite(outputs).all()
    assert torch.equal(outputs, agent.acting_outputs(net, step, state)[0])
    assert len(next_state) == len(agent.act(net, step, state).state)


def test_time_limit_cuts_bootstrap_from_the_last_state():
    from seedbed.agents.vtrace.learning import transition_targets

    config = resolve([{"discount": 0.9, "bootstrap_time_limits": True}]).agent
    steps = {
        "reward": torch.tensor([[0.0], [1.0], [2.0], [3.0]]),
        "done": torch.tensor([[True], [False], [True], [True]]),
        "truncated": torch.tensor([[False], [False], [True], [False]]),
    }
    values = torch.tensor([[10.0], [20.0], [30.0], [40.0]], requires_grad=True)
    rewards, discounts = transition_targets(steps, values, config)
    # step 2 ends by a time limit: reward 2 plus 0.9 * V(x_1); step 3 ends the task: no bootstrap.
    assert rewards[:, 0].tolist() == pytest.approx([1.0, 2.0 + 0.9 * 20.0, 3.0])
    assert discounts[:, 0].tolist() == pytest.approx([0.9, 0.0, 0.0])
    assert not rewards.requires_grad
    config.bootstrap_time_limits = False
    rewards, _ = transition_targets(steps, values, config)
    assert rewards[:, 0].tolist() == [1.0, 2.0, 3.0]
