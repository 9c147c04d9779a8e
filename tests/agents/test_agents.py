"""The standard test every registered agent passes: act, learn a few steps, checkpoint, reload."""

from __future__ import annotations

import math

import pytest
import torch

from seedbed.agents import AGENTS, make_agent
from seedbed.agents.base import StepInput
from seedbed.config import resolve
from seedbed.envs import EnvSpec
from seedbed.inference.unrolls import UnrollBuilder
from seedbed.runtime.checkpoint import load_checkpoint, save_checkpoint

SPEC = EnvSpec("test", (5,), "float32", 3)


def collect(agent, num_envs: int = 4, unroll: int = 6):
    """Unrolls from acting on random observations with random rewards and episode ends."""
    builder = UnrollBuilder(num_envs, unroll)
    net, state = agent.acting_network(), agent.initial_state(num_envs)
    ids = torch.arange(num_envs)
    prev = torch.zeros(num_envs, dtype=torch.int64)
    for t in range(unroll + 1):
        done = torch.rand(num_envs) < 0.2 if t else torch.ones(num_envs, dtype=torch.bool)
        step = StepInput(torch.randn(num_envs, 5), prev, torch.randn(num_envs), done, ids)
        out = agent.act(net, step, state)
        assert out.action.shape == (num_envs,) and out.action.max() < SPEC.num_actions
        record = {
            "obs": step.obs,
            "prev_action": prev,
            "reward": step.reward,
            "done": done,
            "action": out.action,
            **out.extras,
        }
        unrolls = builder.append(ids, record, state, version=0)
        state, prev = out.state, out.action
    assert unrolls is not None and unrolls.batch_size == num_envs
    return unrolls


@pytest.mark.parametrize("name", AGENTS)
@pytest.mark.parametrize("lstm", [False, True])
def test_agent_learns_and_checkpoints(name, lstm, tmp_path):
    torch.manual_seed(0)
    config = resolve([{"agent": name, "lstm": lstm}])
    agent = make_agent(name, SPEC, config.agent, "cpu")
    batch = collect(agent)
    before = [p.clone() for p in agent.network.parameters()]
    for _ in range(20):
        metrics = agent.learn(batch)
        assert all(math.isfinite(v) for v in metrics.values()), metrics
        assert any(k.startswith("loss_") for k in metrics)
    after = list(agent.network.parameters())
    assert any(not torch.equal(a, b) for a, b in zip(before, after, strict=True))
    path = save_checkpoint(tmp_path, 1, {"agent": agent.state_dict()}, keep=1)
    again = make_agent(name, SPEC, config.agent, "cpu")
    again.load_state_dict(load_checkpoint(path)["agent"])
    saved, loaded = agent.state_dict()["network"], again.state_dict()["network"]
    assert all(torch.equal(saved[k], loaded[k]) for k in saved)
    assert agent.learn(batch)["loss"] == pytest.approx(again.learn(batch)["loss"], rel=1e-5)
