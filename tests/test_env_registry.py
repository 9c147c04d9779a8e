"""The env family registry: which family an id belongs to, its settings as flags and as a config
section, ALE ids, the settings remote actors receive, and a family registered from outside the
package (here, this test module), as a user's would be."""

from __future__ import annotations

import dataclasses
from typing import Any

import gymnasium as gym
import numpy as np
import pytest
import yaml

from seedbed.cli import _settings_layers, build_parser
from seedbed.config import load_yaml, setting, to_dict
from seedbed.envs import (
    NOOP_ENV_ID,
    EnvFamily,
    check_env_id,
    family_for,
    make_env,
    make_settings,
    make_spec,
    make_vector_env,
    register,
    unregister,
)
from seedbed.envs.atari import AtariSettings
from seedbed.errors import ConfigError
from seedbed.resolve import resolve
from seedbed.transport.remote import Assignment


@pytest.mark.parametrize(
    ("env_id", "family"),
    [
        ("atari:Pong", "atari"),
        ("ALE/Pong-v5", "atari"),
        ("dmc:cartpole-swingup", "dmc"),
        ("football:academy_empty_goal_close", "football"),
        ("dmlab:rooms_watermaze", "dmlab"),
        (NOOP_ENV_ID, "noop"),
        ("CartPole-v1", "gym"),
        ("corridor:Corridor-v0", "gym"),  # a user's module:EnvId
    ],
)
def test_each_id_belongs_to_one_family(env_id, family):
    assert family_for(env_id).name == family


def test_families_give_the_defaults_rows_agents_know():
    rows = {
        "atari:Pong": "atari",
        "dmc:walker-walk": "dmc",
        "football:academy_empty_goal_close": "football",
        "dmlab:rooms_watermaze": "dmlab",
        "HalfCheetah-v5": "mujoco",
        "CartPole-v1": "classic",
        "Pendulum-v1": "continuous",  # continuous actions, not MuJoCo's
        NOOP_ENV_ID: "classic",
    }
    assert {env_id: family_for(env_id).preset(env_id) for env_id in rows} == rows


def test_a_users_env_takes_the_row_of_its_action_space_and_one_not_made_the_classic_row():
    """The row of a plain Gymnasium id comes from one env made: a user's Box-action env gets the
    continuous defaults; an id that cannot be made gets the classic row, and check says why."""
    gym.register(
        "SeedbedTestBoxActions-v0", entry_point="gymnasium.envs.classic_control:PendulumEnv"
    )
    try:
        assert (
            family_for("SeedbedTestBoxActions-v0").preset("SeedbedTestBoxActions-v0")
            == "continuous"
        )
    finally:
        del gym.registry["SeedbedTestBoxActions-v0"]
    assert family_for("NoSuchEnv-v0").preset("NoSuchEnv-v0") == "classic"
    with pytest.raises(ConfigError, match="unknown environment 'NoSuchEnv-v0'"):
        check_env_id("NoSuchEnv-v0")


def test_the_noop_env_is_made_through_its_family():
    envs = make_vector_env(NOOP_ENV_ID, 3, seed=0)
    obs, _ = envs.reset(seed=0)
    assert obs.shape == (3, 4) and make_spec(NOOP_ENV_ID).num_actions == 2
    envs.close()


def test_the_noop_vector_env_steps_as_single_noop_envs_in_a_sync_vector_env():
    """The numpy-stepped copies against Gymnasium's own vector env of single NoopEnvs, with the
    same-step autoreset every actor's vector env has, across two episode ends."""
    fast = make_vector_env(NOOP_ENV_ID, 3, seed=0)
    plain = gym.vector.SyncVectorEnv(
        [lambda: gym.make(NOOP_ENV_ID) for _ in range(3)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )
    assert fast.metadata["autoreset_mode"] == plain.metadata["autoreset_mode"]
    assert fast.single_observation_space == plain.single_observation_space
    assert fast.single_action_space == plain.single_action_space
    np.testing.assert_array_equal(fast.reset(seed=0)[0], plain.reset(seed=0)[0])
    ends = 0
    for t in range(250):
        actions = np.array([t % 2, 1, 0])
        got, want = fast.step(actions)[:4], plain.step(actions)[:4]
        for field, expected in zip(got, want, strict=True):
            np.testing.assert_array_equal(field, expected)
        ends += int(want[2].all())
    assert ends == 2  # steps 100 and 200 ended every episode
    fast.close()
    plain.close()


def test_ale_ids_are_atari_ids():
    pytest.importorskip("ale_py", reason="ale-py is not installed")
    config = resolve([{"env": "ALE/Pong-v5"}])
    assert config.train.env == "atari:Pong" and config.family == "atari"
    assert config.train.agent == "ppo" and config.train.total_frames == 20_000_000  # Atari PPO's
    check_env_id("ALE/Breakout-v5")
    with pytest.raises(ConfigError, match=r"unknown Atari game 'Pongg'; did you mean atari:Pong"):
        check_env_id("ALE/Pongg-v5")
    with pytest.raises(ConfigError, match="ALE ids are ALE/GAME-v5") as error:
        resolve([{"env": "ALE/Pong"}])
    assert "\n" not in str(error.value)


def test_nested_atari_settings_equal_the_flags(tmp_path):
    path = tmp_path / "atari.yaml"
    path.write_text("env: atari:Pong\natari:\n  sticky_actions: 0.0\n  noop-max: 30\n")
    from_file = resolve([load_yaml(path)])
    args = build_parser().parse_args(
        ["train", "--env", "atari:Pong", "--sticky-actions", "0", "--noop-max", "30"]
    )
    from_flags = resolve(_settings_layers(args))
    assert from_file.env_settings == from_flags.env_settings
    assert from_file.env_settings == AtariSettings(sticky_actions=0.0, noop_max=30)
    # Flags win over the file's section, as they do over its flat keys.
    args = build_parser().parse_args(["train", "--config", str(path), "--noop-max", "5"])
    assert resolve(_settings_layers(args)).env_settings.noop_max == 5


def test_the_saved_config_nests_the_family_settings_and_round_trips(tmp_path):
    config = resolve([{"env": "atari:Pong", "frame_skip": 2, "env_backend": "gymnasium"}])
    saved = config.to_dict()
    assert saved["atari"]["frame_skip"] == 2 and "frame_skip" not in saved
    path = tmp_path / "config.yaml"
    path.write_text(yaml.safe_dump(saved))
    assert resolve([load_yaml(path)]) == config
    # config.yaml of runs from before the sections held the Atari settings flat.
    flat = {k: v for k, v in saved.items() if k != "atari"} | to_dict(config.env_settings)
    assert resolve([flat]) == config


def test_other_families_settings_are_kept_unused_and_typos_are_one_line():
    cartpole = resolve([{"sticky_actions": 0.0, "atari": {"frame_skip": 2}}])
    assert cartpole.family == "gym" and "atari" not in cartpole.to_dict()
    with pytest.raises(ConfigError, match="unknown setting 'sticky_action'; did you mean"):
        resolve([{"env": "atari:Pong", "atari": {"sticky_action": 0.0}}])
    with pytest.raises(ConfigError, match=r"--sticky-actions must lie in \[0, 1\]"):
        resolve([{"env": "atari:Pong", "atari": {"sticky_actions": 2}}])


def test_remote_actors_receive_the_family_settings_as_plain_values():
    settings = AtariSettings(sticky_actions=0.0, frame_skip=2)
    job = Assignment("atari:Pong", 2, 0, to_dict(settings), 0, "|u1", (4, 84, 84))
    received = Assignment.from_message(job.to_message().assignment)
    assert make_settings(received.env_id, received.settings) == settings
    assert make_settings("CartPole-v1", {}) == make_settings("CartPole-v1", None)


# A toy family, registered from here: no seedbed file names it.


@dataclasses.dataclass(frozen=True)
class ToySettings:
    """The toy family's settings."""

    toy_width: int = setting(3, "observation width")


class ToyEnv(gym.Env):
    """Observations of ``width`` zeros, 2 actions, episodes of 5 steps."""

    def __init__(self, width: int) -> None:
        self.observation_space = gym.spaces.Box(-1.0, 1.0, (width,), np.float32)
        self.action_space = gym.spaces.Discrete(2)
        self._t = 0

    def reset(self, *, seed: int | None = None, options: dict | None = None) -> tuple:
        super().reset(seed=seed)
        self._t = 0
        return np.zeros(self.observation_space.shape, np.float32), {}

    def step(self, action: Any) -> tuple:
        self._t += 1
        return np.zeros(self.observation_space.shape, np.float32), 1.0, self._t >= 5, False, {}


class ToyFamily(EnvFamily):
    name = "toy"
    prefix = "toy:"
    settings_class = ToySettings

    def check(self, env_id: str) -> None:
        if env_id != "toy:box":
            raise ConfigError(f"unknown toy '{env_id}'; did you mean toy:box?")

    def make(self, env_id: str, settings: Any, render_mode: str | None = None) -> gym.Env:
        return ToyEnv(settings.toy_width)

    def spec_extra(self, env_id: str, settings: Any) -> dict[str, Any]:
        return {"protocol": f"toy of width {settings.toy_width}"}


@pytest.fixture
def toy_family(tmp_path):
    """The toy family, with presets of its own: toy.yaml, and toy/vtrace.yaml for one agent."""
    family = ToyFamily()
    family.presets = tmp_path
    (tmp_path / "toy.yaml").write_text("total_frames: 1234\ntarget_return: null\nagent: vtrace\n")
    (tmp_path / "toy").mkdir()
    (tmp_path / "toy" / "vtrace.yaml").write_text("lr: 0.003\ntoy_width: 4\n")
    register(family)
    yield
    unregister("toy")


def test_a_family_registered_from_outside_is_made_and_described(toy_family):
    spec = make_spec("toy:box", ToySettings(toy_width=5))
    assert spec.obs_shape == (5,) and spec.num_actions == 2 and spec.protocol == "toy of width 5"
    assert make_env("toy:box").observation_space.shape == (3,)  # the family's defaults
    envs = make_vector_env("toy:box", 2, seed=0, settings=ToySettings(toy_width=4))
    assert envs.reset(seed=0)[0].shape == (2, 4)
    with pytest.raises(ConfigError, match="did you mean toy:box"):
        check_env_id("toy:bx")
    with pytest.raises(TypeError, match="toy envs take ToySettings, not AtariSettings"):
        make_env("toy:box", AtariSettings())


def test_a_registered_family_has_its_defaults_section_and_flags(toy_family):
    assert family_for("toy:box").preset("toy:box") == "toy"
    config = resolve([{"env": "toy:box"}])
    assert config.train.total_frames == 1234 and config.train.agent == "vtrace"
    assert config.agent.lr == 0.003  # the family's own preset for the agent
    assert config.env_settings == ToySettings(4) and config.to_dict()["toy"] == {"toy_width": 4}
    assert resolve([{"env": "toy:box", "agent": "ppo"}]).env_settings == ToySettings()
    nested = resolve([{"env": "toy:box", "toy": {"toy_width": 7}, "total_frames": 99}])
    assert nested.env_settings == resolve([{"env": "toy:box", "toy_width": "7"}]).env_settings
    assert nested.train.total_frames == 99  # the user's layers win over the family's defaults
    args = build_parser().parse_args(["train", "--env", "toy:box", "--toy-width", "6"])
    assert resolve(_settings_layers(args)).env_settings.toy_width == 6


def test_a_family_whose_names_clash_is_refused(toy_family):
    with pytest.raises(ConfigError, match="named 'toy' is registered already"):
        register(ToyFamily())
    register(family_for("toy:box"))  # the same family again (a module imported twice): nothing

    class Clashing(ToyFamily):
        name, prefix, settings_class = "clash", "clash:", AtariSettings

    with pytest.raises(ConfigError, match="settings .*sticky_actions.* exist already"):
        register(Clashing())
