"""bench/learner.py: ``--set NAME=VALUE`` reaches the timed learner's settings, and bad input
is refused in one line."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from learner import setting_value, settings  # noqa: E402

from seedbed.errors import ConfigError  # noqa: E402


def test_set_takes_a_flag_or_a_setting_name():
    assert setting_value("epochs=3") == ("epochs", "3")
    assert setting_value("--clip-ratio=0.2") == ("clip_ratio", "0.2")
    for bad in ("epochs", "=3", "epochs="):
        with pytest.raises(argparse.ArgumentTypeError, match="expected NAME=VALUE"):
            setting_value(bad)


def test_set_values_override_the_agents_defaults_for_the_env():
    default = settings("atari:Pong", "ppo", {})
    assert (default.agent.epochs, default.agent.minibatches) == (4, 4)
    given = dict([setting_value("epochs=3"), setting_value("minibatches=2")])
    config = settings("atari:Pong", "ppo", given)
    assert (config.agent.epochs, config.agent.minibatches) == (3, 2)
    assert config.agent.torso == default.agent.torso  # the rest stays the env's defaults


def test_an_unknown_setting_is_one_clear_error():
    with pytest.raises(ConfigError, match="unknown setting 'epoch'.*epochs"):
        settings("atari:Pong", "ppo", dict([setting_value("epoch=3")]))
