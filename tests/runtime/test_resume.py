"""What ``--resume`` resumes: a checkpoint made with the run's own settings, and those settings
even where ``config.yaml`` is gone."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
import yaml

from seedbed.agents import make_agent
from seedbed.config import RunConfig
from seedbed.envs import make_spec
from seedbed.errors import SeedbedError
from seedbed.resolve import resolve
from seedbed.runtime.checkpoint import list_checkpoints, save_checkpoint
from seedbed.runtime.progress import Progress, check_settings, checkpoint_payload
from seedbed.runtime.rundir import RunFiles
from tests.conftest import tiny_settings
from tests.runtime.test_faults import assert_one_line_error
from tests.test_cli import seedbed

FRAMES = 1000  # where the made checkpoint stands


def make_run(run: Path, **overrides) -> RunConfig:
    """A run directory as a run of ``overrides``' settings leaves it, made by the run's own
    code without training: its config.yaml, and one checkpoint of a fresh agent."""
    config = resolve([tiny_settings(run, energy=False, **overrides)])
    spec = make_spec(config.train.env, config.env_settings)
    agent = make_agent(config.train.agent, spec, config.agent, torch.device("cpu"))
    RunFiles(run, lambda: 0).prepare(config)
    payload = checkpoint_payload(agent.state_dict(), Progress(frames=FRAMES), 1.0, config)
    save_checkpoint(run / "checkpoints", FRAMES, payload, keep=2)
    return config


def test_a_checkpoint_of_another_env_of_the_same_shapes_is_refused_in_one_line(tmp_path):
    run = tmp_path / "r"
    make_run(run, lr=0.001)  # CartPole-v1
    saved = (run / "config.yaml").read_text()
    done = seedbed("train", "--resume", "--run-dir", str(run), "--env", "CartPole-v0")
    assert done.returncode == 2, done.stderr[-3000:]
    line = "--env CartPole-v1, this run has CartPole-v0"
    assert_one_line_error(done.stderr, line, "--resume-mismatch accept")
    assert (run / "config.yaml").read_text() == saved  # the run's settings are not replaced
    # Another agent setting, the same network: refused, naming it.
    with pytest.raises(SeedbedError, match="--lr 0.001, this run has 0.5"):
        RunFiles(run, lambda: 0).prepare(resolve([tiny_settings(run, resume=True, lr=0.5)]))
    accepted = resolve([tiny_settings(run, resume=True, lr=0.5, resume_mismatch="accept")])
    path, _ = RunFiles(run, lambda: 0).prepare(accepted)
    assert path == list_checkpoints(run / "checkpoints")[-1]
    # Saved for the next resume: the new rate, and no standing acceptance of a mismatch.
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["ppo"]["lr"] == 0.5 and saved["resume_mismatch"] == "refuse"


def test_a_run_without_config_yaml_resumes_on_its_checkpoints_settings(tmp_path):
    run = tmp_path / "r"
    made = make_run(run, lr=0.0123, envs_per_actor=3)
    (run / "config.yaml").unlink()
    done = seedbed("train", "--resume", "--run-dir", str(run), "--total-frames", "2000")
    assert done.returncode == 0, done.stderr[-3000:]
    assert "has no config.yaml: resuming with the settings saved in ckpt-" in done.stderr
    saved = yaml.safe_load((run / "config.yaml").read_text())
    assert saved["ppo"]["lr"] == 0.0123 and saved["envs_per_actor"] == 3
    assert saved["env"] == made.train.env and saved["total_frames"] == 2000
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "total_frames" and summary["frames"] >= 2000


def test_a_setting_the_checkpoint_does_not_record_is_not_compared(tmp_path):
    """A setting a newer seedbed added is missing from an older checkpoint: not a mismatch.
    One that both record and that differs is, named as its flag."""
    config = resolve([tiny_settings(tmp_path, lr=0.001)])
    saved = config.to_dict()
    del saved["ppo"]["entropy_cost"]
    check_settings(tmp_path / "ckpt.pt", saved, config)
    saved["ppo"]["hidden_sizes"] = [7]
    with pytest.raises(SeedbedError, match="made with --hidden-sizes 7, this run has"):
        check_settings(tmp_path / "ckpt.pt", saved, config)
    with pytest.raises(SeedbedError, match="holds no settings.*--resume-mismatch accept"):
        check_settings(tmp_path / "ckpt.pt", None, config)
