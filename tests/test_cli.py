"""The command line as a user runs it: subprocesses, exit codes, one-line errors."""

from __future__ import annotations

import dataclasses
import json
import re
import subprocess
import sys

import pytest
import torch

from seedbed.cli import _preparse, build_parser
from seedbed.config import TRAIN_GROUPS, TrainConfig
from tests.conftest import alive, interruptible, leaked_shm, shm_blocks, tiny_settings, workers


def seedbed(*args: str, cwd=None) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seedbed", *args],
        capture_output=True,
        text=True,
        timeout=240,
        cwd=cwd,
    )


def flags(settings: dict) -> list[str]:
    out = []
    for key, value in settings.items():
        name = "--" + key.replace("_", "-")
        if isinstance(value, bool):
            out.append(name if value else "--no-" + name[2:])
        else:
            out += [name, "none" if value is None else str(value)]
    return out


def test_help_lists_every_setting_with_its_default():
    out = " ".join(seedbed("train", "--help").stdout.split())  # undo line wrapping
    for flag in (
        "--env",
        "--agent",
        "--actors",
        "--envs-per-actor",
        "--unroll",
        "--batch",
        "--inference-batch",
        "--inference-timeout-ms",
        "--lr",
        "--total-frames",
        "--target-return",
        "--seed",
        "--device",
        "--run-dir",
        "--resume",
        "--lstm",
        "--config",
        "--discount",
        "--entropy-cost",
    ):
        assert flag in out
    assert "(default: CartPole-v1)" in out and "(default: 475.0)" in out


def help_groups(*args: str) -> list[str]:
    """The group titles ``seedbed train ARGS --help`` shows, in order."""
    parser = build_parser(_preparse(["train", *args, "--help"]))
    train = parser._subparsers._group_actions[0].choices["train"]
    return re.findall(r"^(\S.*):$", train.format_help(), re.M)


def test_help_for_an_atari_env_shows_what_concerns_its_run_first():
    titles = help_groups("--env", "atari:Pong")
    assert titles[:8] == [
        "options",
        "run",
        "actors and inference",
        "learner",
        "ppo agent settings",  # Atari's preset agent
        "atari settings (atari:... ids; YAML: atari: ...)",
        "remote actors",
        "logging",
    ]
    assert help_groups("--env", "atari:Pong", "--agent", "r2d2")[4] == "r2d2 agent settings"


def test_every_run_setting_is_in_one_help_group():
    grouped = [name for names in TRAIN_GROUPS.values() for name in names]
    assert sorted(grouped) == sorted(f.name for f in dataclasses.fields(TrainConfig)), (
        "put each TrainConfig setting in one group of seedbed.config.TRAIN_GROUPS"
    )


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--env", "CartPol-v1"], "unknown environment 'CartPol-v1'; did you mean CartPole-v1"),
        (["--env", "atari:Pongg"], "unknown Atari game 'Pongg'; did you mean atari:Pong"),
        (["--env", "atari:Pong", "--sticky-actions", "2"], "--sticky-actions must lie in [0, 1]"),
        (
            ["--env", "atari:Pong", "--frame-stack-on", "learner", "--inference", "local"],
            "--frame-stack-on learner needs central inference",
        ),
        (["--env", "atari:Pong", "--frame-stack-on", "gpu"], "invalid value 'gpu'"),
        (["--torso", "impala"], "--torso impala needs image observations"),
        (["--actors", "0"], "--actors must be positive"),
        (["--batch", "-1"], "--batch must be positive"),
        (["--listen", "5000"], "--listen '5000': expected HOST:PORT"),
        (
            ["--listen", "127.0.0.1:0", "--tls-cert", "c.pem"],
            "--tls-cert and --tls-key go together",
        ),
        (["--listen", "127.0.0.1:0", "--token-file", "/nonexistent"], "--token-file /nonexistent:"),
        pytest.param(
            ["--device", "cuda"],
            "no CUDA device is available; use --device cpu",
            marks=pytest.mark.skipif(torch.cuda.is_available(), reason="a GPU is present"),
        ),
    ],
)
def test_bad_input_exits_nonzero_with_one_line(tmp_path, args, message):
    result = seedbed("train", "--run-dir", str(tmp_path / "r"), "--no-progress", *args)
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and message in lines[0], result.stderr


def test_unknown_key_in_config_file(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_text("actors: 2\nlearning_rate: 0.1\n")
    result = seedbed("train", "--config", str(path), "--run-dir", str(tmp_path / "r"))
    assert result.returncode != 0
    lines = result.stderr.strip().splitlines()
    assert len(lines) == 1 and "unknown setting 'learning_rate'" in lines[0], result.stderr


def test_corrupt_checkpoint(tmp_path):
    ckpt = tmp_path / "r" / "checkpoints" / "ckpt-000000001000.pt"
    ckpt.parent.mkdir(parents=True)
    ckpt.write_bytes(b"PK\x03\x04 this is not a checkpoint")
    for args in (["train", "--run-dir", str(tmp_path / "r"), "--resume"], ["eval", str(ckpt)]):
        result = seedbed(*args)
        assert result.returncode != 0
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and "is corrupt" in lines[0], result.stderr


@pytest.mark.parametrize("case", ["under-a-file", "immutable"])
def test_an_unusable_run_directory_is_one_line_before_anything_starts(tmp_path, case):
    import shutil

    if case == "under-a-file":
        (tmp_path / "file").write_text("not a folder")
        run_dir, cause = tmp_path / "file" / "sub", "Not a directory"
    else:
        run_dir, cause = tmp_path / "locked", "Operation not permitted"
        run_dir.mkdir()
        if not shutil.which("chattr") or subprocess.run(["chattr", "+i", str(run_dir)]).returncode:
            pytest.skip("chattr +i is not available here (needs root and a file system with it)")
    try:
        for command in ("train", "launch"):
            args = [command, "--run-dir", str(run_dir), "--no-progress"]
            result = seedbed(*args, *(["--ray"] if command == "launch" else []))
            assert result.returncode == 2, result.stderr
            lines = result.stderr.strip().splitlines()
            assert len(lines) == 1, result.stderr
            assert f"--run-dir {run_dir}" in lines[0] and cause in lines[0], lines[0]
            assert "choose another --run-dir" in lines[0]
    finally:
        subprocess.run(["chattr", "-i", str(run_dir)], capture_output=True)


def test_train_then_eval_with_video(tmp_path, monkeypatch):
    monkeypatch.delenv("XDG_RUNTIME_DIR", raising=False)  # as on a server or in a container
    run = tmp_path / "r"
    result = seedbed("train", *flags(tiny_settings(run)))
    assert result.returncode == 0, result.stderr
    assert f"run directory: {run}" in result.stdout
    assert "learning curve:" in result.stdout
    video = tmp_path / "eval.mp4"
    result = seedbed("eval", str(run), "--episodes", "2", "--video", str(video))
    assert result.returncode == 0, result.stderr
    assert "2 episodes of CartPole-v1: return" in result.stdout
    assert "XDG_RUNTIME_DIR" not in result.stderr  # SDL looked for a desktop it does not need
    assert video.stat().st_size > 1000


def test_train_on_the_noop_env(tmp_path):
    """What the framework benchmark runs: its numpy-stepped envs in real actors, every episode
    100 steps of reward 1, so every return the learner counted is 100."""
    run = tmp_path / "r"
    settings = tiny_settings(run, env="seedbed/Noop-v0", hidden_sizes="8")
    result = seedbed("train", *flags(settings))
    assert result.returncode == 0, result.stderr
    summary = json.loads((run / "summary.json").read_text())
    assert summary["frames"] >= 3000 and summary["episodes"] >= 8  # 8 envs x 100 steps at least
    assert summary["mean_return_100"] == 100.0


@pytest.mark.parametrize(
    ("signum", "replicas"), [("SIGINT", 1), ("SIGTERM", 1), ("SIGINT", 2), ("SIGTERM", 2)]
)
def test_ctrl_c_and_sigterm_stop_cleanly(tmp_path, signum, replicas):
    """Ctrl-C, or a scheduler's SIGTERM: final checkpoint and summary, no orphans, no leaks.

    A terminal's Ctrl-C reaches every process in the foreground group (the learner replicas
    and the actors too), so with replicas the signal goes to the whole group.
    """
    import os
    import signal
    import time

    import psutil

    run = tmp_path / "r"
    shm_before = shm_blocks()
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "seedbed",
            "train",
            *flags(tiny_settings(run, total_frames=50_000_000, learner_replicas=replicas, batch=8)),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        preexec_fn=interruptible,
        start_new_session=replicas > 1,
    )
    deadline = time.time() + 120
    while not (run / "metrics.csv").is_file() and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(1.0)
    children = workers(psutil.Process(proc.pid), recursive=True)
    assert len(children) >= 2
    if replicas > 1:
        os.killpg(proc.pid, getattr(signal, signum))
    else:
        proc.send_signal(getattr(signal, signum))
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "interrupted"
    assert summary["learner_replicas"] == replicas
    time.sleep(0.5)
    assert not alive(children), f"orphan processes: {alive(children)}"
    leaked = leaked_shm(shm_before)
    assert not leaked, f"leaked shared memory: {leaked}"


def test_a_killed_learner_replica_stops_the_run_with_a_clear_error(tmp_path):
    """A replica killed outright: every other process stops, and the error names the replica."""
    import os
    import signal
    import time

    import psutil

    run = tmp_path / "r"
    shm_before = shm_blocks()
    settings = tiny_settings(run, total_frames=50_000_000, learner_replicas=2, batch=8)
    proc = subprocess.Popen(
        [sys.executable, "-m", "seedbed", "train", *flags(settings)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.time() + 120
    while not (run / "metrics.csv").is_file() and time.time() < deadline:
        time.sleep(0.1)
    launcher = psutil.Process(proc.pid)
    replicas = workers(launcher)
    assert len(replicas) == 2
    everyone = launcher.children(recursive=True)
    os.kill(replicas[1].pid, signal.SIGKILL)
    _, err = proc.communicate(timeout=120)
    assert proc.returncode == 2, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("seedbed: error:")]
    assert lines and "replica" in lines[0], err[-3000:]
    time.sleep(0.5)
    assert not alive(everyone), f"orphan processes: {alive(everyone)}"
    leaked = leaked_shm(shm_before)
    assert not leaked, f"leaked shared memory: {leaked}"
