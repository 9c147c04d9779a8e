"""Plug-ins: a user's package, outside seedbed, that adds an env family, an agent, a transport and
a logger sink, named by ``--plugins`` and imported by every process of the run: the command
line, the Python API, local, remote and Ray actors. The package is the example in examples/plugin
(``seedbed_toyplug``); each registry's own tests sit beside its package's."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

import seedbed
import seedbed.agents
from seedbed.cli import build_parser
from seedbed.errors import ConfigError
from seedbed.resolve import resolve
from seedbed.transport.remote import Assignment
from tests.conftest import assert_imports_without, finish, tiny_settings
from tests.runtime.test_remote_training import actor, learner

PLUG = ("--plugins", "seedbed_toyplug")
# One of each kind the plug-in registers.
ITS_OWN = (
    *("--env", "toyplug:CartPole-v1", "--agent", "toyppo"),
    *("--transport", "toyshm", "--loggers", "jsonl"),
)


def seedbed_cli(*args: str) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "seedbed", *args], capture_output=True, text=True, timeout=240
    )


def jsonl_rows(run: Path) -> list[dict]:
    return [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]


def test_the_cli_trains_with_a_plugins_family_agent_transport_and_sink(tmp_path, plugin_on_path):
    run = tmp_path / "run"
    done = seedbed_cli(
        *("train", *PLUG, *ITS_OWN, "--target-return", "100", "--total-frames", "1000000"),
        *("--run-dir", str(run), "--no-progress", "--log-every-s", "0.5", "--no-energy"),
    )
    assert done.returncode == 0, done.stderr[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return" and summary["target_reached_frames"]
    assert summary["agent"] == "toyppo" and summary["env"] == "toyplug:CartPole-v1"
    rows = jsonl_rows(run)
    assert rows and all(row["frames"] > 0 for row in rows)
    assert rows[-1]["frames"] == summary["frames"]  # the final row, as metrics.csv has it
    saved = (run / "config.yaml").read_text()  # a resume or seedbed eval imports them again
    assert "seedbed_toyplug" in saved and "toyplug:" in saved


def test_an_unknown_plugin_is_one_line_that_says_where_to_put_it():
    done = seedbed_cli("train", "--plugins", "no_such_plugin", "--agent", "toyppo")
    assert done.returncode == 2 and done.stdout == ""
    assert done.stderr.count("\n") == 1, done.stderr
    assert done.stderr.startswith("seedbed: error: cannot import plug-in 'no_such_plugin'")
    assert "PYTHONPATH" in done.stderr
    with pytest.raises(ConfigError, match="cannot import plug-in 'no_such_plugin'.*PYTHONPATH"):
        seedbed.train(plugins=["no_such_plugin"])
    with pytest.raises(ConfigError, match="'a..b' is not a module name"):
        resolve([{"plugins": "a..b"}])


def test_an_actor_that_imports_the_plugin_still_does_without_torch(plugin_on_path):
    assert_imports_without(("seedbed.actor", "seedbed_toyplug"), ("torch",))


def test_the_help_of_a_plugin_run_lists_its_settings(plugin_on_path):
    assert "--reward-scale" not in seedbed_cli("train", "--help").stdout
    assert "--reward-scale" in seedbed_cli("train", *PLUG, "--help").stdout


def test_plugins_in_a_config_file_are_imported_before_its_flags_are_read(tmp_path, plugin_on_path):
    from seedbed.cli import _preparse, _settings_layers

    path = tmp_path / "run.yaml"
    path.write_text("plugins: [seedbed_toyplug]\nenv: toyplug:CartPole-v1\n")
    _preparse(["train", "--config", str(path)])
    args = build_parser().parse_args(["train", "--config", str(path), "--reward-scale", "2"])
    config = resolve(_settings_layers(args))
    assert config.family == "toyplug" and config.env_settings.reward_scale == 2.0
    assert config.train.agent == "toyppo"  # the family's default agent, the plug-in's own


def test_the_python_api_imports_the_plugins_it_is_given(plugin_on_path):
    assert "toyppo" not in seedbed.agents.AGENTS
    # The settings the learner would run with; seedbed.train resolves them the same way.
    config = resolve([{"plugins": ["seedbed_toyplug"], "env": "toyplug:CartPole-v1"}])
    assert config.train.plugins == ("seedbed_toyplug",) and "toyppo" in seedbed.agents.AGENTS
    assert type(config.agent).__name__ == "ToyPPOConfig"


def test_a_python_api_run_feeds_a_plugins_sink(tmp_path, plugin_on_path, no_leaks):
    settings = tiny_settings(
        tmp_path / "run", env="toyplug:CartPole-v1", transport="toyshm", energy=False
    )
    summary = seedbed.train(plugins=["seedbed_toyplug"], loggers=["jsonl"], **settings)
    assert summary["stop_reason"] == "total_frames"
    assert jsonl_rows(tmp_path / "run")[-1]["frames"] == summary["frames"]


def test_remote_actors_are_told_the_plugins():
    def sent(job: Assignment) -> Assignment:
        return Assignment.from_message(job.to_message().assignment)

    job = Assignment("toyplug:CartPole-v1", 2, 0, {}, 0, "<f4", (4,), plugins=("a", "b.c"))
    assert sent(job).plugins == ("a", "b.c")
    assert sent(Assignment("CartPole-v1", 2, 0, None, 0, "<f4", (4,))).plugins == ()


@pytest.mark.slow
def test_a_remote_actor_imports_the_plugins_it_is_assigned(tmp_path, no_leaks, plugin_on_path):
    run = tmp_path / "run"
    lr, address = learner(run, *PLUG, *ITS_OWN, "--target-return", "100", "--no-energy")
    actors = [actor(run, address) for _ in range(2)]
    code, _, err = finish(lr)
    assert code == 0, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return" and jsonl_rows(run)
    for one in actors:
        assert finish(one, 30)[0] == 0


@pytest.mark.slow
@pytest.mark.xdist_group("ray")  # beside the other Ray tests (test_launch.py)
def test_ray_actors_import_the_plugins(tmp_path, plugin_on_path):
    pytest.importorskip("ray", reason="Ray is the 'ray' extra (in dev)")
    from tests.runtime.test_launch import launch  # Ray's own tests: skipped without Ray

    run = tmp_path / "run"
    code, _, err = finish(launch(run, *PLUG, *ITS_OWN, "--target-return", "100", "--no-energy"))
    assert code == 0, err[-3000:]
    summary = json.loads((run / "summary.json").read_text())
    assert summary["stop_reason"] == "target_return" and jsonl_rows(run)


def test_a_list_setting_takes_commas_or_a_list():
    assert resolve([{"loggers": "csv, tensorboard"}]).train.loggers == ("csv", "tensorboard")
    assert resolve([{"plugins": []}]).train.plugins == ()
    args = build_parser().parse_args(["train", "--loggers", "wandb,csv"])
    assert args.loggers == "wandb,csv"
