"""``seedbed eval`` on a saved policy: recurrent agents carry their state through an episode, in
discrete and continuous action spaces, and a seed gives the same episodes again."""

from __future__ import annotations

import math
import sys

import pytest
import torch

from seedbed.agents import make_agent
from seedbed.envs import make_spec
from seedbed.errors import SeedbedError
from seedbed.resolve import resolve
from seedbed.runtime.checkpoint import save_checkpoint
from seedbed.runtime.evaluate import evaluate


@pytest.mark.parametrize(
    ("env", "agent", "more"),
    [
        ("CartPole-v1", "vtrace", {}),
        ("Pendulum-v1", "ppo", {"minibatches": 4}),  # the preset's 32 are single steps
    ],
)
def test_a_recurrent_policy_evaluates_the_same_on_a_seed(env, agent, more, tmp_path):
    torch.manual_seed(0)
    config = resolve([{"env": env, "agent": agent, "lstm": True, "lstm_size": 8, **more}])
    spec = make_spec(env, config.env_settings)
    made = make_agent(agent, spec, config.agent, torch.device("cpu"))
    payload = {"agent": made.state_dict(), "config": config.to_dict()}
    path = save_checkpoint(tmp_path / "checkpoints", 0, payload, keep=1)
    first = evaluate(path, episodes=2, seed=3)
    assert first["env"] == env and len(first["returns"]) == 2
    assert all(math.isfinite(r) for r in first["returns"])
    assert evaluate(tmp_path, episodes=2, seed=3)["returns"] == first["returns"]


def test_eval_imports_only_the_modules_its_user_names(tmp_path, monkeypatch):
    """A checkpoint names modules to import (plug-ins, an env id's ``module:``): eval refuses
    it in one line without importing them, unless they are named with --plugins."""
    for module in ("evalplug", "evalenv"):
        (tmp_path / f"{module}.py").write_text(
            f"import pathlib\npathlib.Path({str(tmp_path)!r}, '{module}.ran').touch()\n"
        )
        monkeypatch.delitem(sys.modules, module, raising=False)
    monkeypatch.syspath_prepend(str(tmp_path))
    config = resolve([{"env": "CartPole-v1", "agent": "vtrace"}])
    made = make_agent("vtrace", make_spec("CartPole-v1"), config.agent, torch.device("cpu"))
    saved = {**config.to_dict(), "plugins": ["evalplug"]}
    path = save_checkpoint(tmp_path / "a", 0, {"agent": made.state_dict(), "config": saved}, 1)
    with pytest.raises(SeedbedError, match="imports evalplug.*pass --plugins evalplug$"):
        evaluate(path, episodes=1)
    saved = {**config.to_dict(), "env": "evalenv:CartPole-v1"}
    other = save_checkpoint(tmp_path / "b", 0, {"agent": made.state_dict(), "config": saved}, 1)
    with pytest.raises(SeedbedError, match="imports evalenv.*pass --plugins evalenv$"):
        evaluate(other, episodes=1)
    assert not list(tmp_path.glob("*.ran"))  # nothing ran
    assert evaluate(path, episodes=1, plugins=("evalplug",))["episodes"] == 1
    assert [p.name for p in tmp_path.glob("*.ran")] == ["evalplug.ran"]
