"""Atari preprocessing on real ALE games, through both backends."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from seedbed.envs import check_env_id, make_env, make_spec, make_vector_env
from seedbed.envs.atari import AtariSettings
from seedbed.errors import ConfigError

HAS_ENVPOOL = importlib.util.find_spec("envpool") is not None
BACKENDS = (
    "gymnasium",
    pytest.param(
        "envpool",
        marks=pytest.mark.skipif(not HAS_ENVPOOL, reason="EnvPool has no wheel for this platform"),
    ),
)
UP, DOWN = 2, 3  # Pong's minimal action set: NOOP, FIRE, RIGHT(up), LEFT(down), ...


def play(settings: AtariSettings, actions: np.ndarray, num_envs: int = 2, seed: int = 7):
    """Observations of every step when ``actions`` [steps, num_envs] are played."""
    envs = make_vector_env("atari:Pong", num_envs, seed, settings)
    try:
        obs, _ = envs.reset(seed=seed)
        frames = [obs.copy()]
        for a in actions:
            obs, *_ = envs.step(a)
            frames.append(obs.copy())
        return np.stack(frames)
    finally:
        envs.close()


@pytest.mark.parametrize("backend", BACKENDS)
def test_observations_are_stacked_uint8_frames(backend):
    settings = AtariSettings(env_backend=backend)
    spec = make_spec("atari:Pong", settings)
    assert spec.obs_shape == (4, 84, 84) and spec.obs_dtype == "uint8"
    assert spec.num_actions == 6 and spec.frame_skip == 4
    frames = play(settings, np.full((8, 2), UP))
    assert frames.shape == (9, 2, 4, 84, 84) and frames.dtype == np.uint8
    # The stack shifts by one frame per step: the newest frame becomes the next step's third.
    assert np.array_equal(frames[5][:, 3], frames[6][:, 2])
    full = make_spec("atari:Pong", AtariSettings(env_backend=backend, full_action_space=True))
    assert full.num_actions == 18


@pytest.mark.parametrize("backend", BACKENDS)
def test_sticky_actions_repeat_the_previous_action(backend):
    moves = np.where(np.arange(40)[:, None] % 6 < 3, UP, DOWN).repeat(2, axis=1)
    noops = np.zeros_like(moves)
    always_sticky = play(AtariSettings(env_backend=backend, sticky_actions=1.0), moves)
    never_sticky = play(AtariSettings(env_backend=backend, sticky_actions=0.0), moves)
    idle = play(AtariSettings(env_backend=backend, sticky_actions=0.0), noops)
    # Probability 1 repeats the first action (NOOP at reset) forever: the moves never land.
    assert np.array_equal(always_sticky, idle)
    assert not np.array_equal(never_sticky, idle)


def test_noop_starts_begin_episodes_at_random_frames():
    def start_frames(noop_max: int) -> list[int]:
        env = make_env("atari:Pong", AtariSettings(sticky_actions=0.0, noop_max=noop_max))
        try:
            return [env.reset(seed=s)[1]["episode_frame_number"] for s in range(12)]
        finally:
            env.close()

    assert set(start_frames(0)) == {0}
    with_noops = start_frames(30)
    assert all(1 <= f <= 30 for f in with_noops) and len(set(with_noops)) >= 4


@pytest.mark.parametrize("backend", BACKENDS)
def test_episodes_are_capped_and_reset_on_the_same_step(backend):
    settings = AtariSettings(env_backend=backend, max_episode_frames=400)  # 100 agent steps
    envs = make_vector_env("atari:Pong", 2, 0, settings)
    try:
        first, _ = envs.reset(seed=0)
        ends = []
        for t in range(1, 251):
            obs, reward, terminated, truncated, _ = envs.step(np.full(2, UP))
            if truncated.any() or terminated.any():
                ends.append((t, truncated.tolist(), terminated.tolist()))
                # The returned observation already starts the next episode: one frame, stacked.
                assert all(np.array_equal(obs[:, 0], obs[:, k]) for k in (1, 2, 3))
    finally:
        envs.close()
    assert ends == [(100, [True, True], [False, False]), (200, [True, True], [False, False])]


@pytest.mark.skipif(not HAS_ENVPOOL, reason="EnvPool has no wheel for this platform")
def test_backends_agree_on_scores_of_a_fixed_policy():
    """Random play, the same on both: similar raw Pong scores and episode lengths."""
    results = {}
    for backend in ("gymnasium", "envpool"):
        envs = make_vector_env("atari:Pong", 4, 3, AtariSettings(env_backend=backend))
        rng = np.random.default_rng(0)
        returns, lengths = [], []
        total, steps = np.zeros(4), np.zeros(4)
        envs.reset(seed=3)
        while len(returns) < 8:
            _, reward, terminated, truncated, _ = envs.step(rng.integers(0, 6, 4))
            total, steps = total + reward, steps + 1
            for i in np.flatnonzero(terminated | truncated):
                returns.append(total[i])
                lengths.append(steps[i])
                total[i] = steps[i] = 0
        envs.close()
        results[backend] = (np.mean(returns), np.mean(lengths))
    (gym_return, gym_length), (pool_return, pool_length) = results.values()
    assert -21 <= gym_return <= -18 and -21 <= pool_return <= -18  # raw scores, not clipped
    assert abs(gym_return - pool_return) <= 1.0
    assert abs(gym_length - pool_length) <= 0.15 * gym_length


def test_unknown_game_names_close_matches():
    with pytest.raises(ConfigError, match=r"unknown Atari game 'Pongg'.*atari:Pong"):
        check_env_id("atari:Pongg")
    check_env_id("atari:pong")  # case does not matter
    assert make_spec("atari:breakout").num_actions == 4


def test_stacking_on_the_learner_makes_actor_envs_send_one_frame():
    learner = AtariSettings(frame_stack_on="learner")
    assert learner.learner_stack == 4 and learner.actor_side().frame_stack == 1
    assert AtariSettings().learner_stack == 1 and AtariSettings().actor_side() == AtariSettings()
    one = AtariSettings(frame_stack_on="learner", frame_stack=1)
    assert one.learner_stack == 1  # nothing to stack: the same as on the actors
    envs = make_vector_env("atari:Pong", 2, 0, learner)
    try:
        assert envs.reset(seed=0)[0].shape == (2, 1, 84, 84)
    finally:
        envs.close()
    env = make_env("atari:Pong", learner)  # one env (evaluation, video) stacks its own frames
    try:
        assert env.reset(seed=0)[0].shape == (4, 84, 84)
    finally:
        env.close()


def test_stacking_on_the_learner_needs_central_inference():
    from seedbed.resolve import resolve

    layers = [{"env": "atari:Pong", "frame_stack_on": "learner"}]
    assert resolve(layers).env_settings.learner_stack == 4
    with pytest.raises(ConfigError, match="use --frame-stack-on actor with --inference local"):
        resolve([*layers, {"inference": "local"}])
