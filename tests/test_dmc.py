"""DM Control tasks (``dmc:DOMAIN-TASK``) and Gymnasium's MuJoCo ids behind the Gymnasium API."""

from __future__ import annotations

import subprocess
import sys

import numpy as np
import pytest

pytest.importorskip("dm_control", reason="the dmc extra is not installed")

from gymnasium.utils.env_checker import check_env  # noqa: E402

from seedbed.envs import (  # noqa: E402
    check_env_id,
    family_for,
    make_env,
    make_spec,
    make_vector_env,
)
from seedbed.errors import ConfigError  # noqa: E402


# Observations are unbounded, as Gymnasium's own MuJoCo envs declare theirs; its checker warns.
@pytest.mark.filterwarnings("ignore:.*Box observation space m.*infinity")
@pytest.mark.parametrize(
    ("env_id", "obs", "actions"),
    [("dmc:cartpole-swingup", 5, 1), ("dmc:walker-walk", 24, 6), ("dmc:ball_in_cup-catch", 8, 2)],
)
def test_tasks_follow_the_gymnasium_api_with_flat_float32_observations(env_id, obs, actions):
    env = make_env(env_id)
    try:
        check_env(env.unwrapped, skip_render_check=True)
        assert env.observation_space.shape == (obs,) and env.observation_space.dtype == np.float32
        space = env.action_space
        assert space.shape == (actions,) and space.dtype == np.float32
        assert (space.low == -1).all() and (space.high == 1).all()
        first, info = env.reset(seed=3)
        assert first.dtype == np.float32 and first.shape == (obs,) and info == {}
        again, _ = env.reset(seed=3)
        np.testing.assert_array_equal(first, again)  # a seed fixes the episode's start
    finally:
        env.close()


def test_observations_keep_the_tasks_key_order():
    from dm_control import suite

    env = make_env("dmc:cartpole-balance")
    reference = suite.load("cartpole", "balance")
    env.unwrapped._env.task.random.seed(7)
    reference.task.random.seed(7)
    ours, _ = env.reset()
    theirs = reference.reset().observation
    assert list(theirs) == ["position", "velocity"]
    np.testing.assert_allclose(ours, np.concatenate([theirs["position"], theirs["velocity"]]))


def test_episodes_end_by_time_limit_as_truncated():
    env = make_env("dmc:cartpole-balance")
    env.reset(seed=0)
    steps, rewards = 0, []
    while True:
        _, reward, terminated, truncated, _ = env.step(np.zeros(1, np.float32))
        steps += 1
        rewards.append(reward)
        if terminated or truncated:
            break
    assert steps == 1000 and truncated and not terminated
    assert all(isinstance(r, float) and 0.0 <= r <= 1.0 for r in rewards)


def test_spec_and_vector_env_carry_float32_action_vectors():
    spec = make_spec("dmc:cartpole-swingup")
    assert spec.continuous and spec.num_actions == 0
    assert (spec.obs_shape, spec.obs_dtype) == ((5,), "float32")
    assert (spec.action_shape, spec.action_dtype) == ((1,), "float32")
    assert (spec.action_low, spec.action_high) == ((-1.0,), (1.0,))
    assert family_for("dmc:cartpole-swingup").preset("dmc:cartpole-swingup") == "dmc"
    envs = make_vector_env("dmc:cartpole-swingup", 3, seed=0)
    try:
        obs, _ = envs.reset(seed=0)
        obs, reward, terminated, truncated, _ = envs.step(np.full((3, 1), 0.5, np.float32))
        assert obs.shape == (3, 5) and reward.shape == (3,) and not (terminated | truncated).any()
    finally:
        envs.close()


def test_gymnasium_mujoco_ids_take_the_gymnasium_path():
    spec = make_spec("InvertedPendulum-v5")
    assert spec.continuous and spec.action_shape == (1,)
    assert (spec.action_low, spec.action_high) == ((-3.0,), (3.0,))
    for env_id, row in (("InvertedPendulum-v5", "mujoco"), ("CartPole-v1", "classic")):
        assert family_for(env_id).preset(env_id) == row


def test_unknown_task_gives_one_line_with_close_matches():
    with pytest.raises(ConfigError, match=r"unknown DM Control task 'cartpole-swingupp'.*") as e:
        check_env_id("dmc:cartpole-swingupp")
    assert "dmc:cartpole-swingup" in str(e.value) and "\n" not in str(e.value)
    with pytest.raises(ConfigError, match="ids are dmc:DOMAIN-TASK"):
        check_env_id("dmc:nothing")


def test_cli_refuses_an_unknown_task_in_one_line(tmp_path):
    result = subprocess.run(
        [sys.executable, "-m", "seedbed", "train", "--env", "dmc:walker-wlak", "--agent", "d4pg"]
        + ["--run-dir", str(tmp_path / "r"), "--no-progress"],
        capture_output=True,
        text=True,
        timeout=120,
    )
    lines = result.stderr.strip().splitlines()
    assert result.returncode == 2 and len(lines) == 1, result.stderr
    assert "unknown DM Control task 'walker-wlak'; did you mean dmc:walker-walk" in lines[0]
