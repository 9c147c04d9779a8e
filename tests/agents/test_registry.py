"""The agent registry: seedbed's agents by name, and a user's added with ``register`` (the
example plug-in's, examples/plugin, is one); each refusal is one line."""

from __future__ import annotations

import sys

import pytest

from seedbed.agents import AGENTS, register, unregister
from seedbed.errors import ConfigError
from tests.conftest import toyplug_registered


def test_a_registered_agent_is_named_with_its_package():
    with toyplug_registered():
        assert AGENTS["toyppo"] == "seedbed_toyplug.toyppo"
        assert list(AGENTS)[:5] == ["vtrace", "ppo", "dqn", "r2d2", "d4pg"]  # seedbed's first
    assert "toyppo" not in AGENTS


def test_an_agent_is_refused_a_taken_name_or_a_package_without_config():
    with toyplug_registered():
        with pytest.raises(ConfigError, match="an agent named 'ppo' is registered already"):
            register("ppo", "my_rl.ppo")
        register("toyppo", "seedbed_toyplug.toyppo")  # the same again: nothing
        for name, says in [
            ("batch", "agent name 'batch' is a run setting's name"),
            ("toyplug", "agent name 'toyplug' is an environment family's name"),
            ("my-agent", "must be a Python identifier"),
        ]:
            with pytest.raises(ConfigError, match=says):
                register(name, "seedbed.agents.ppo")
    with pytest.raises(ConfigError, match=r"cannot import no_such_pkg.config \(No module"):
        register("mine", "no_such_pkg")
    with pytest.raises(ConfigError, match="seedbed.config defines no CONFIG_CLASS"):
        register("mine", "seedbed")  # a package whose config module is not one
    with pytest.raises(ConfigError, match="one of seedbed's own"):
        unregister("vtrace")
    assert "mine" not in AGENTS


def test_an_agent_whose_settings_shadow_run_settings_is_refused(tmp_path, monkeypatch):
    package = tmp_path / "shadowing"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "config.py").write_text(
        "import dataclasses\n\n@dataclasses.dataclass\nclass C:\n    batch: int = 3\n\n"
        "CONFIG_CLASS = C\n"
    )
    monkeypatch.syspath_prepend(str(tmp_path))
    try:
        with pytest.raises(ConfigError, match="agent 'shadowing': settings batch are run setting"):
            register("shadowing", "shadowing")
    finally:
        for name in ("shadowing.config", "shadowing"):
            sys.modules.pop(name, None)
    assert "shadowing" not in AGENTS
