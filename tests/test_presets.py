"""Defaults as data: every preset file resolves, one order of precedence (built-in, preset,
--config, flags), and what --print-config and --help show is what a run records."""

from __future__ import annotations

import re
import subprocess
import sys
from pathlib import Path

import pytest
import yaml

from seedbed.agents import AGENTS
from seedbed.config import RunConfig
from seedbed.errors import ConfigError
from seedbed.presets import FOLDER, load_preset
from seedbed.resolve import resolve, resolve_with_sources

ROW_ENVS = {
    "classic": "CartPole-v1",
    "continuous": "Pendulum-v1",
    "mujoco": "HalfCheetah-v5",
    "atari": "atari:Pong",
    "dmc": "dmc:cartpole-swingup",
    "football": "football:academy_empty_goal_close",
    "dmlab": "dmlab:rooms_watermaze",
}


def seedbed_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seedbed", *args], capture_output=True, text=True, timeout=120
    )


def flat(config: RunConfig) -> dict:
    """Every setting by its flat name (names are unique across the run, agent and family)."""
    out = {}
    for key, value in config.to_dict().items():
        out.update(value if isinstance(value, dict) else {key: value})
    return out


def preset_files() -> list[Path]:
    return sorted(FOLDER.glob("*.yaml")) + sorted(FOLDER.glob("*/*.yaml"))


def test_every_row_has_an_env_here_and_every_agent_file_a_registered_agent():
    rows = {path.stem for path in FOLDER.glob("*.yaml")}
    assert rows == set(ROW_ENVS)
    assert {path.stem for path in FOLDER.glob("*/*.yaml")} <= set(AGENTS)
    assert {path.parent.name for path in FOLDER.glob("*/*.yaml")} <= rows


@pytest.mark.parametrize("row", sorted(set(ROW_ENVS) - {"football", "dmlab"}))
def test_each_rows_default_agent_acts_in_its_envs(row):
    """``seedbed train --env ID`` alone must run: the row's agent takes its env's actions
    (Football and DeepMind Lab, optional installs, have discrete actions, as V-trace and PPO)."""
    from seedbed.agents import check_actions
    from seedbed.envs import make_spec

    config = resolve([{"env": ROW_ENVS[row]}])
    check_actions(config.train.agent, make_spec(ROW_ENVS[row]))


def shown_defaults(help_text: str) -> dict[str, str]:
    """Each option's default as ``--help`` shows it, by flag."""
    shown = {}
    for block in re.split(r"\n(?=  -)", help_text):
        match = re.match(r"\s+--([\w-]+).*?\(default:\s*([^)]*)\)", block, re.S)
        if match:
            shown[match.group(1)] = " ".join(match.group(2).split())
    return shown


def resolved_with(row: str, key: str) -> tuple[dict, dict]:
    """The settings, and their sources, of a run of ``row`` with an agent whose own preset does
    not set ``key`` (the row's own agent for ``agent``)."""
    for agent in [None] if key == "agent" else list(AGENTS):
        own = FOLDER / row / f"{agent}.yaml"
        if agent is None or not own.is_file() or key not in load_preset(own):
            layer = {"env": ROW_ENVS[row]} | ({"agent": agent} if agent else {})
            config, sources = resolve_with_sources([("flag", layer)])
            return flat(config), {k.rpartition(".")[2]: v for k, v in sources.items()}
    raise AssertionError(f"every agent overrides {row}.yaml's {key}")


@pytest.mark.parametrize("path", preset_files(), ids=lambda p: str(p.relative_to(FOLDER)))
def test_each_preset_file_is_what_its_runs_use(path):
    row_file = path.parent == FOLDER
    row = path.stem if row_file else path.parent.name
    for key, value in load_preset(path).items():
        if row_file:
            values, where = resolved_with(row, key)
        else:
            config, sources = resolve_with_sources(
                [("flag", {"env": ROW_ENVS[row], "agent": path.stem})]
            )
            values, where = flat(config), {k.rpartition(".")[2]: v for k, v in sources.items()}
        assert values[key] == value, key
        assert where[key] == f"preset {path.relative_to(FOLDER)}", key


def test_one_order_of_precedence_built_in_preset_config_flags(tmp_path):
    config_file = tmp_path / "mine.yaml"
    config_file.write_text("lr: 0.001\nunroll: 32\n")
    out = seedbed_cli(
        "train", "--env", "atari:Pong", "--config", str(config_file), "--unroll", "8",
        "--print-config",
    )  # fmt: skip
    assert out.returncode == 0, out.stderr
    lines = dict(re.findall(r"^\s*(\w+): (.*)$", out.stdout, re.M))
    assert lines["agent"] == "ppo  # preset atari.yaml"
    assert lines["batch"] == "16  # preset atari/ppo.yaml"
    assert lines["lr"] == f"0.001  # --config {config_file}"
    assert lines["unroll"] == "8  # flag"
    assert lines["inference_batch"] == "256  # built-in"


@pytest.mark.parametrize(
    "layer", [{"env": "atari:Pong"}, {"env": "Pendulum-v1"}, {"env": "CartPole-v1", "agent": "dqn"}]
)
def test_the_printed_config_is_a_config_file_of_the_same_run(tmp_path, layer):
    args = [f"--{k}={v}" for k, v in layer.items()]
    out = seedbed_cli("train", *args, "--print-config")
    assert out.returncode == 0, out.stderr
    path = tmp_path / "printed.yaml"
    path.write_text(out.stdout)
    assert resolve([yaml.safe_load(out.stdout)]) == resolve([layer])


def test_help_shows_the_defaults_of_the_env_and_agent_typed():
    def default_of(flag: str, *args: str) -> str:
        return shown_defaults(seedbed_cli("train", *args, "--help").stdout)[flag]

    assert default_of("lr", "--env", "atari:Pong") == "0.00025"
    assert default_of("unroll", "--env", "atari:Pong") == "64"
    assert default_of("lr") == "0.002"  # CartPole-v1's PPO
    assert default_of("lr", "--agent", "vtrace") == "0.0014"
    assert "(default: ppo on CartPole-v1" in seedbed_cli("--help").stdout


@pytest.mark.slow
def test_print_config_and_help_match_what_a_run_records(tmp_path):
    run = tmp_path / "run"
    flags = ["--env", "Acrobot-v1", "--total-frames", "2000", "--no-progress", "--no-energy"]
    printed = seedbed_cli("train", *flags, "--print-config")
    trained = seedbed_cli("train", *flags, "--run-dir", str(run))
    assert trained.returncode == 0, trained.stderr[-2000:]
    recorded = yaml.safe_load((run / "config.yaml").read_text())
    expected = yaml.safe_load(printed.stdout) | {"run_dir": str(run)}
    assert recorded == expected
    shown = shown_defaults(seedbed_cli("train", "--env", "Acrobot-v1", "--help").stdout)
    for name, value in {**recorded, **recorded["ppo"]}.items():
        if isinstance(value, dict) or name in (
            "run_dir",
            "env",
            "total_frames",
            "progress",
            "energy",
        ):
            continue  # sections, and the settings this run gave as flags
        text = ",".join(map(str, value)) if isinstance(value, list) else str(value)
        assert shown.get(name.replace("_", "-"), "") == text, name  # "": none shown


def test_a_preset_extends_another_and_its_own_settings_win(tmp_path):
    own = tmp_path / "ppo.yaml"
    own.write_text("extends: mujoco/ppo\nlr: 0.001\n")
    assert load_preset(own) == load_preset(FOLDER / "mujoco" / "ppo.yaml") | {"lr": 0.001}


@pytest.mark.parametrize(
    "extends, says",
    [("nowhere/ppo", "names no preset"), ("../config", "names no preset"), ("dmc/ppo", "extends")],
)
def test_a_preset_that_extends_nothing_or_a_chain_is_refused_in_one_line(tmp_path, extends, says):
    own = tmp_path / "ppo.yaml"
    own.write_text(f"extends: {extends}\n")
    with pytest.raises(ConfigError, match=says) as raised:
        load_preset(own)
    assert "\n" not in str(raised.value)
