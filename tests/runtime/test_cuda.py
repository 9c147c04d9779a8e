"""The learner on a CUDA device: the same results as on the CPU, and whole runs complete.

Skipped where no CUDA device is present (CI has none); ``bench/gpu.sh`` runs them on one.
"""

from __future__ import annotations

import importlib.util

import pytest
import torch

from seedbed.agents import config_class, make_agent
from seedbed.resolve import resolve
from seedbed.runtime.train import train
from tests.agents.test_agents import AGENT_KINDS, SPECS, collect
from tests.conftest import tiny_settings

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device"),
]


@pytest.mark.parametrize(("name", "kind"), AGENT_KINDS)
def test_learning_step_on_cuda_matches_cpu(name, kind):
    torch.manual_seed(0)
    spec = SPECS[kind]
    recurrent = (
        {"lstm": True, "torso_dtype": "float32"} if hasattr(config_class(name), "lstm") else {}
    )
    config = resolve([{"agent": name, **recurrent}]).agent
    cpu = make_agent(name, spec, config, "cpu")
    cuda = make_agent(name, spec, config, "cuda")
    cuda.load_state_dict(cpu.state_dict())
    batch = collect(cpu, spec)
    for _ in range(3):
        want, got = cpu.learn(batch), cuda.learn(batch.to(torch.device("cuda")))
        assert got["loss"] == pytest.approx(want["loss"], rel=1e-3, abs=1e-5)
    for a, b in zip(cpu.network.parameters(), cuda.network.parameters(), strict=True):
        torch.testing.assert_close(b.cpu(), a, rtol=1e-3, atol=1e-4)


def test_cartpole_run_on_cuda(tmp_path, no_leaks):
    summary = train(resolve([tiny_settings(tmp_path / "run", device="cuda")]))
    assert summary["device"].startswith("cuda") and summary["frames"] >= 3000


def test_atari_run_on_cuda_with_auto_dtype(tmp_path, no_leaks):
    settings = tiny_settings(
        tmp_path / "run",
        env="atari:Pong",
        env_backend="envpool" if importlib.util.find_spec("envpool") else "gymnasium",
        device="cuda",
        torso_dtype="auto",
        envs_per_actor=4,
        batch=4,
        total_frames=8000,
    )
    summary = train(resolve([settings]))
    assert summary["device"].startswith("cuda") and summary["frames"] >= 8000
    assert summary["torso_dtype"] == "bfloat16"  # every CUDA device since Ampere runs it
