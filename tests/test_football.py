"""Google Research Football: ids, observations, the Gymnasium API and a short training run.

Most tests need gfootball (``make football`` builds it); they skip with that reason where it is
missing, and conftest.py says so at the end of the run. The id checks run everywhere.
"""

from __future__ import annotations

import json
import subprocess
import sys

import numpy as np
import pytest

from seedbed.cli import _settings_layers, build_parser
from seedbed.config import to_dict
from seedbed.envs import (
    check_env_id,
    football,
    make_env,
    make_settings,
    make_spec,
    make_vector_env,
)
from seedbed.errors import ConfigError
from seedbed.resolve import resolve
from seedbed.transport.remote import Assignment

needs_gfootball = pytest.mark.skipif(
    not football.has_gfootball(), reason="gfootball is not installed: run `make football`"
)
SCENARIO = "football:academy_empty_goal_close"


@pytest.mark.parametrize(
    ("env_id", "message"),
    [
        ("football:academy_empty_goal_closee", "did you mean football:academy_empty_goal_close"),
        ("football:11_vs_11_easy", "football:11_vs_11_easy_stochastic?"),
        ("football:basketball", "e.g. football:academy_empty_goal_close"),
    ],
)
def test_unknown_scenario_is_one_line_with_close_matches(env_id, message):
    with pytest.raises(ConfigError, match="unknown Football scenario") as error:
        check_env_id(env_id)
    assert message in str(error.value) and "\n" not in str(error.value)


def test_options_follow_the_scenario_in_the_id():
    assert football.parse(SCENARIO) == football.Scenario(
        "academy_empty_goal_close", "extracted", "scoring", True
    )
    vector = football.parse(
        "football:11_vs_11_easy_stochastic:representation=simple115v2:rewards=scoring,checkpoints"
    )
    assert (vector.representation, vector.rewards, vector.stacked) == (
        "simple115v2",
        "scoring,checkpoints",
        False,
    )
    assert not football.parse(SCENARIO + ":stacked=false").stacked
    for bad, message in [
        (":representation=raw", "representation 'raw' is not one of"),
        (":rewards=checkpoints", "rewards 'checkpoints' is not one of"),
        (":stacked=2", "stacked must be true or false"),
        (":representation=simple115v2:stacked=true", "stacks only the smm and pixels"),
        (":frames=4", "is not KEY=VALUE with KEY representation"),
    ]:
        with pytest.raises(ConfigError, match=message):
            check_env_id(SCENARIO + bad)


def test_options_are_the_football_section_and_id_options_win():
    from_section = resolve([{"env": SCENARIO, "football": {"representation": "simple115v2"}}])
    flags = build_parser().parse_args(
        [
            "train",
            "--env",
            SCENARIO,
            "--representation",
            "simple115v2",
            "--rewards",
            "scoring,checkpoints",
        ]
    )
    from_flags = resolve(_settings_layers(flags))
    assert from_section.env_settings == football.FootballSettings(representation="simple115v2")
    assert from_flags.env_settings.rewards == "scoring,checkpoints"
    vector = football.parse(SCENARIO, from_flags.env_settings)
    assert (vector.representation, vector.rewards, vector.stacked) == (
        "simple115v2",
        "scoring,checkpoints",
        False,  # vectors are never stacked unless asked
    )
    # An option in the id wins over the section; the id keeps its meaning wherever it goes.
    assert football.parse(SCENARIO + ":representation=smm", from_flags.env_settings).stacked
    with pytest.raises(ConfigError, match="stacks only the smm and pixels") as error:
        resolve([{"env": SCENARIO, "football": {"representation": "simple115", "stacked": True}}])
    assert "\n" not in str(error.value)
    with pytest.raises(ConfigError, match="--rewards: invalid value 'goals'"):
        resolve([{"env": SCENARIO, "rewards": "goals"}])


def test_remote_actors_receive_the_football_section():
    settings = football.FootballSettings(representation="pixels", stacked=None)
    job = Assignment(SCENARIO, 2, 0, to_dict(settings), 0, "|u1", (12, 72, 96))
    received = Assignment.from_message(job.to_message().assignment)
    assert make_settings(received.env_id, received.settings) == settings


def test_missing_gfootball_says_to_run_make_football(monkeypatch):
    monkeypatch.setattr(football, "has_gfootball", lambda: False)  # as where it is missing
    with pytest.raises(ConfigError, match="need gfootball: run `make football`"):
        make_env(SCENARIO)


@needs_gfootball
def test_installed_scenarios_are_the_known_ones():
    assert set(football.KNOWN_SCENARIOS) <= set(football.scenarios())


@needs_gfootball
@pytest.mark.parametrize(
    ("options", "shape", "dtype"),
    [
        ("", (16, 72, 96), "uint8"),  # SMM: 4 planes x 4 frames, channels first
        (":stacked=false", (4, 72, 96), "uint8"),
        (":representation=simple115v2", (115,), "float32"),
    ],
)
def test_observation_shapes_per_representation(options, shape, dtype):
    spec = make_spec(SCENARIO + options)
    assert spec.obs_shape == shape and spec.obs_dtype == dtype and spec.num_actions == 19
    env = make_env(SCENARIO + options)
    try:
        obs, _ = env.reset(seed=0)
        assert obs.shape == shape and obs.dtype == dtype
        if dtype == "uint8":
            assert set(np.unique(obs)) <= {0, 255} and obs.any()  # SMM planes mark positions
    finally:
        env.close()


@needs_gfootball
def test_pixels_are_the_rendered_game_channels_first():
    # Rendering needs an OpenGL context; run it in a child so a failure to get one stays there.
    code = (
        "from seedbed.envs import make_env; import json\n"
        f"env = make_env('{SCENARIO}:representation=pixels')\n"
        "obs, _ = env.reset(seed=0); env.step(0)\n"
        "print(json.dumps([list(obs.shape), str(obs.dtype), int(obs.std() > 1)]))\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert out.returncode == 0, out.stderr[-2000:]
    assert json.loads(out.stdout.splitlines()[-1]) == [[12, 72, 96], "uint8", 1]


@needs_gfootball
def test_reset_and_step_follow_the_gymnasium_api():
    env = make_env(SCENARIO)
    try:
        obs, info = env.reset(seed=3)
        assert env.observation_space.contains(obs) and isinstance(info, dict)
        again, _ = env.reset(seed=3)
        assert np.array_equal(obs, again)  # reset(seed) reproduces the start
        assert env.render().shape == (288, 384, 3)  # the SMM in colour, for videos
        ended, steps = False, 0
        while not ended:
            obs, reward, terminated, truncated, info = env.step(env.action_space.sample())
            assert env.observation_space.contains(obs)
            assert isinstance(reward, float) and isinstance(terminated, bool)
            assert truncated is False and isinstance(info, dict)
            ended, steps = terminated or truncated, steps + 1
        assert steps <= 400  # the scenario's game duration
        assert reward in (-1.0, 0.0, 1.0)  # scoring: a goal either way, or none
        obs, _ = env.reset()
        assert env.observation_space.contains(obs)
    finally:
        env.close()


@needs_gfootball
def test_vector_env_resets_on_the_step_an_episode_ends():
    envs = make_vector_env(SCENARIO + ":representation=simple115v2", 2, seed=0)
    try:
        obs, _ = envs.reset(seed=0)
        ends = 0
        for _ in range(120):
            obs, reward, terminated, truncated, _ = envs.step(np.full(2, 12))  # 12: shot
            assert obs.shape == (2, 115)
            ends += int((terminated | truncated).sum())
        assert ends >= 2  # shooting from close range ends episodes quickly
    finally:
        envs.close()


@needs_gfootball
def test_short_training_run_completes(tmp_path):
    run_dir = tmp_path / "run"
    args = [
        *("--env", SCENARIO, "--actors", "1", "--envs-per-actor", "2", "--unroll", "8"),
        *("--batch", "2", "--queue-size", "4", "--inference-batch", "2", "--total-frames"),
        *("400", "--run-dir", str(run_dir), "--no-progress", "--no-energy", "--threads", "1"),
    ]
    out = subprocess.run(
        [sys.executable, "-m", "seedbed", "train", *args],
        capture_output=True,
        text=True,
        timeout=280,
    )
    assert out.returncode == 0, out.stderr[-3000:]
    assert (run_dir / "metrics.csv").is_file()
    saved = (run_dir / "config.yaml").read_text()
    assert "torso: football" in saved and SCENARIO in saved
