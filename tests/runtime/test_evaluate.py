"""``seedbed eval`` on a saved policy: recurrent agents carry their state through an episode, in
discrete and continuous action spaces, and a seed gives the same episodes again."""

from __future__ import annotations

import math

import pytest
import torch

from seedbed.agents import make_agent
from seedbed.envs import make_spec
from seedbed.resolve import resolve
from seedbed.runtime.checkpoint import save_checkpoint
from seedbed.runtime.evaluate import evaluate


@pytest.mark.parametrize(("env", "agent"), [("CartPole-v1", "vtrace"), ("Pendulum-v1", "ppo")])
def test_a_recurrent_policy_evaluates_the_same_on_a_seed(env, agent, tmp_path):
    torch.manual_seed(0)
    config = resolve([{"env": env, "agent": agent, "lstm": True, "lstm_size": 8}])
    spec = make_spec(env, config.env_settings)
    made = make_agent(agent, spec, config.agent, torch.device("cpu"))
    payload = {"agent": made.state_dict(), "config": config.to_dict()}
    path = save_checkpoint(tmp_path / "checkpoints", 0, payload, keep=1)
    first = evaluate(path, episodes=2, seed=3)
    assert first["env"] == env and len(first["returns"]) == 2
    assert all(math.isfinite(r) for r in first["returns"])
    assert evaluate(tmp_path, episodes=2, seed=3)["returns"] == first["returns"]
