"""The DeepMind Lab adapter on synthetic inputs: deepmind_lab itself cannot be installed here."""

from __future__ import annotations

import importlib.util

import numpy as np
import pytest

from seedbed.envs import check_env_id, dmlab, make_env
from seedbed.errors import ConfigError


class FakeLab:
    """The part of ``deepmind_lab.Lab`` the adapter uses: episodes of ``length`` steps whose
    frames encode the step count, rewards of 1 per Lab frame, and a record of the actions."""

    def __init__(self, length: int = 3) -> None:
        self.length = length
        self.actions: list[tuple[np.ndarray, int]] = []
        self.seeds: list[int] = []
        self._t = 0
        self.closed = False

    def reset(self, seed: int) -> None:
        self.seeds.append(seed)
        self._t = 0

    def observations(self) -> dict[str, np.ndarray]:
        assert self.is_running(), "Lab has no observation once the episode ended"
        frame = np.zeros((dmlab.HEIGHT, dmlab.WIDTH, 3), np.uint8)
        frame[..., 0] = self._t  # red: the step
        frame[..., 1] = np.arange(dmlab.WIDTH, dtype=np.uint8)  # green: the column
        frame[..., 2] = 200
        return {"RGB_INTERLEAVED": frame}

    def step(self, action: np.ndarray, num_steps: int = 1) -> float:
        assert action.dtype == np.intc and action.shape == (7,)
        self.actions.append((action.copy(), num_steps))
        self._t += 1
        return float(num_steps)

    def is_running(self) -> bool:
        return self._t < self.length

    def close(self) -> None:
        self.closed = True


def test_actions_map_to_impalas_set_of_lab_action_vectors():
    channel = dict(zip(dmlab.ACTION_CHANNELS, range(7), strict=True))
    forward, look, strafe, fire = (
        channel["MOVE_BACK_FORWARD"],
        channel["LOOK_LEFT_RIGHT_PIXELS_PER_FRAME"],
        channel["STRAFE_LEFT_RIGHT"],
        channel["FIRE"],
    )
    vectors = [dmlab.lab_action(a) for a in range(9)]
    assert all(v.dtype == np.intc and v.shape == (7,) for v in vectors)
    assert vectors[0][forward] == 1 and vectors[1][forward] == -1
    assert (vectors[2][strafe], vectors[3][strafe]) == (-1, 1)
    assert (vectors[4][look], vectors[5][look]) == (-20, 20)
    assert tuple(vectors[6][[look, forward]]) == (-20, 1)
    assert tuple(vectors[7][[look, forward]]) == (20, 1)
    assert vectors[8][fire] == 1 and vectors[8].sum() == 1
    assert len({tuple(v) for v in vectors}) == 9  # nine different actions
    assert dmlab.lab_action(np.int64(3)).tolist() == [0, 0, 1, 0, 0, 0, 0]  # numpy ints work
    with pytest.raises(ValueError, match="outside 0..8"):
        dmlab.lab_action(9)


def test_observations_become_channels_first_uint8():
    rgb = np.random.default_rng(0).integers(0, 256, (72, 96, 3), dtype=np.uint8)
    obs = dmlab.observation(rgb)
    assert obs.shape == (3, 72, 96) and obs.dtype == np.uint8 and obs.flags.c_contiguous
    for c in range(3):
        assert np.array_equal(obs[c], rgb[..., c])
    with pytest.raises(ValueError, match=r"\[h, w, 3\]"):
        dmlab.observation(np.zeros((72, 96), np.uint8))


def test_env_follows_the_gymnasium_api_over_a_fake_lab():
    lab = FakeLab(length=3)
    env = dmlab.DMLabEnv("contributed/dmlab30/rooms_watermaze", lab=lab)
    obs, info = env.reset(seed=5)
    assert env.observation_space.contains(obs) and info == {}
    assert obs[0].max() == 0 and np.array_equal(obs[1, 0], np.arange(96))  # step 0, columns
    steps = [env.step(a) for a in (0, 4, 8)]
    rewards = [s[1] for s in steps]
    assert rewards == [4.0, 4.0, 4.0]  # 4 Lab frames per action, rewards summed
    assert [s[2] for s in steps] == [False, False, True] and not any(s[3] for s in steps)
    assert steps[1][0][0].max() == 2  # the frame after two steps
    assert np.array_equal(steps[2][0], steps[1][0])  # episode over: the last frame stands in
    assert [a.tolist() for a, _ in lab.actions] == [list(dmlab.ACTION_SET[a]) for a in (0, 4, 8)]
    assert {n for _, n in lab.actions} == {dmlab.ACTION_REPEATS}
    assert env.render().shape == (72, 96, 3)
    env.reset(seed=5)
    env.reset()
    assert lab.seeds[0] != lab.seeds[2]  # a fresh level seed per episode...
    env.reset(seed=5)
    assert lab.seeds[3] == lab.seeds[0]  # ...reproducible from the reset seed
    env.close()
    assert lab.closed


def test_level_names_resolve_with_close_matches():
    assert dmlab.level_path("dmlab:rooms_watermaze") == "contributed/dmlab30/rooms_watermaze"
    assert dmlab.level_path("dmlab:nav_maze_static_01") == "nav_maze_static_01"
    assert dmlab.level_path("dmlab:my/own_level") == "my/own_level"
    with pytest.raises(ConfigError, match=r"unknown DeepMind Lab level .*dmlab:rooms_watermaze"):
        check_env_id("dmlab:rooms_watermaz")


@pytest.mark.skipif(
    importlib.util.find_spec("deepmind_lab") is not None, reason="deepmind_lab is installed"
)
def test_missing_deepmind_lab_says_how_to_get_it():
    with pytest.raises(ConfigError, match="need deepmind_lab.*github.com/google-deepmind/lab"):
        make_env("dmlab:rooms_watermaze")
