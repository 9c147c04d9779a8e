"""DeepMind Lab levels (``dmlab:LEVEL``) as Gymnasium environments, for machines that have it.

``dmlab:explore_goal_locations_small``, ``dmlab:rooms_watermaze``… name a DMLab-30 level (run
from ``contributed/dmlab30/``), ``dmlab:nav_maze_static_01``… one of Lab's classic levels, and an
id with a slash (``dmlab:contributed/dmlab30/lasertag_one_opponent_small``, or a level script of
your own) is passed to Lab as it is. The setup is IMPALA's and SEED RL's:

- observations: ``RGB_INTERLEAVED`` frames of 96x72, as uint8 ``[3, 72, 96]`` (channels first,
  the layout seedbed's torsos convolve);
- actions: IMPALA's 9 discrete actions (forward, backward, strafe left/right, look left/right,
  look left/right while moving forward, fire), each a vector of Lab's 7 integer action channels;
- every action is repeated for 4 Lab frames, whose rewards are summed;
- episodes end when the level ends them (its time limit is part of the task: ``terminated``).

deepmind_lab is not on PyPI and cannot be installed on seedbed's usual machines: it is built from
source with Bazel (https://github.com/google-deepmind/lab), and the packaging of recent forks
needs Python 3.13 and a container build. Where ``import deepmind_lab`` works, these ids work.
"""

from __future__ import annotations

import difflib
from typing import Any

import gymnasium as gym
import numpy as np

from seedbed.envs.base import EnvFamily
from seedbed.errors import ConfigError

PREFIX = "dmlab:"
WIDTH, HEIGHT = 96, 72
ACTION_REPEATS = 4

# Lab's action spec: 7 integer channels, in this order.
ACTION_CHANNELS = (
    "LOOK_LEFT_RIGHT_PIXELS_PER_FRAME",
    "LOOK_DOWN_UP_PIXELS_PER_FRAME",
    "STRAFE_LEFT_RIGHT",
    "MOVE_BACK_FORWARD",
    "FIRE",
    "JUMP",
    "CROUCH",
)
# IMPALA's action set (Espeholt et al. 2018, table D.2), as SEED RL uses it.
ACTION_SET = (
    (0, 0, 0, 1, 0, 0, 0),  # forward
    (0, 0, 0, -1, 0, 0, 0),  # backward
    (0, 0, -1, 0, 0, 0, 0),  # strafe left
    (0, 0, 1, 0, 0, 0, 0),  # strafe right
    (-20, 0, 0, 0, 0, 0, 0),  # look left
    (20, 0, 0, 0, 0, 0, 0),  # look right
    (-20, 0, 0, 1, 0, 0, 0),  # look left + forward
    (20, 0, 0, 1, 0, 0, 0),  # look right + forward
    (0, 0, 0, 0, 1, 0, 0),  # fire
)
_ACTIONS = np.array(ACTION_SET, np.intc)  # Lab takes a C int array

DMLAB_30 = (
    "rooms_collect_good_objects_train",
    "rooms_collect_good_objects_test",
    "rooms_exploit_deferred_effects_train",
    "rooms_exploit_deferred_effects_test",
    "rooms_select_nonmatching_object",
    "rooms_watermaze",
    "rooms_keys_doors_puzzle",
    "language_select_described_object",
    "language_select_located_object",
    "language_execute_random_task",
    "language_answer_quantitative_question",
    "lasertag_one_opponent_small",
    "lasertag_three_opponents_small",
    "lasertag_one_opponent_large",
    "lasertag_three_opponents_large",
    "natlab_fixed_large_map",
    "natlab_varying_map_regrowth",
    "natlab_varying_map_randomized",
    "skymaze_irreversible_path_hard",
    "skymaze_irreversible_path_varied",
    "psychlab_arbitrary_visuomotor_mapping",
    "psychlab_continuous_recognition",
    "psychlab_sequential_comparison",
    "psychlab_visual_search",
    "explore_object_locations_small",
    "explore_object_locations_large",
    "explore_obstructed_goals_small",
    "explore_obstructed_goals_large",
    "explore_goal_locations_small",
    "explore_goal_locations_large",
    "explore_object_rewards_few",
    "explore_object_rewards_many",
)
CLASSIC_LEVELS = (
    "lt_chasm",
    "lt_hallway_slope",
    "lt_horseshoe_color",
    "lt_space_bounce_hard",
    "nav_maze_random_goal_01",
    "nav_maze_random_goal_02",
    "nav_maze_random_goal_03",
    "nav_maze_static_01",
    "nav_maze_static_02",
    "nav_maze_static_03",
    "seekavoid_arena_01",
    "stairway_to_melon",
)


def level_path(env_id: str) -> str:
    """The level script Lab loads for a ``dmlab:LEVEL`` id, or a one-line error."""
    level = env_id[len(PREFIX) :]
    if level in DMLAB_30:
        return f"contributed/dmlab30/{level}"
    if level in CLASSIC_LEVELS or "/" in level:
        return level
    close = difflib.get_close_matches(level, DMLAB_30 + CLASSIC_LEVELS, n=3, cutoff=0.6)
    hint = (
        f"; did you mean {', '.join(PREFIX + c for c in close)}?"
        if close
        else "; name a DMLab-30 level (dmlab:rooms_watermaze) or give a level path with a /"
    )
    raise ConfigError(f"unknown DeepMind Lab level '{level}'{hint}")


def lab_action(action: Any) -> np.ndarray:
    """Lab's 7-channel int action for discrete action ``action`` (0-8) of IMPALA's set."""
    index = int(action)
    if not 0 <= index < len(ACTION_SET):
        raise ValueError(f"DeepMind Lab action {index} is outside 0..{len(ACTION_SET) - 1}")
    return _ACTIONS[index]


def observation(rgb_interleaved: np.ndarray) -> np.ndarray:
    """Lab's ``RGB_INTERLEAVED`` frame [height, width, 3] as uint8 [3, height, width]."""
    frame = np.asarray(rgb_interleaved)
    if frame.ndim != 3 or frame.shape[-1] != 3:
        raise ValueError(f"expected an RGB_INTERLEAVED frame [h, w, 3], got {frame.shape}")
    return np.ascontiguousarray(np.moveaxis(frame.astype(np.uint8, copy=False), -1, 0))


def _make_lab(level: str) -> Any:
    try:
        import deepmind_lab
    except ImportError:
        raise ConfigError(
            "dmlab: environments need deepmind_lab, which cannot be installed here: build it "
            "from https://github.com/google-deepmind/lab with Bazel on a machine that can, then "
            "pip install the wheel it makes"
        ) from None
    config = {"width": str(WIDTH), "height": str(HEIGHT), "logLevel": "WARN"}
    return deepmind_lab.Lab(level, ["RGB_INTERLEAVED"], config=config)


class DMLabEnv(gym.Env):
    """One Lab level behind the Gymnasium API (see the module docstring).

    ``lab`` is a ready ``deepmind_lab.Lab`` (or any object with its ``reset``, ``step``,
    ``observations``, ``is_running`` and ``close``); by default one is made for ``level``.
    """

    metadata = {"render_modes": ["rgb_array"], "render_fps": 15}  # 60 Lab frames/s, 4 per step

    def __init__(self, level: str, render_mode: str | None = None, lab: Any = None) -> None:
        self._lab = lab if lab is not None else _make_lab(level)
        self.render_mode = render_mode
        self.observation_space = gym.spaces.Box(0, 255, (3, HEIGHT, WIDTH), np.uint8)
        self.action_space = gym.spaces.Discrete(len(ACTION_SET))
        self._rng = np.random.default_rng()
        self._last = np.zeros(self.observation_space.shape, np.uint8)

    def _observe(self) -> np.ndarray:
        self._last = observation(self._lab.observations()["RGB_INTERLEAVED"])
        return self._last

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        # Lab seeds each episode's level generation: one seed per episode from our generator.
        self._lab.reset(seed=int(self._rng.integers(2**31 - 1)))
        return self._observe(), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        reward = float(self._lab.step(lab_action(action), num_steps=ACTION_REPEATS))
        if not self._lab.is_running():
            # An ended episode has no observation: the last one stands in (autoreset
            # replaces it with the next episode's first).
            return self._last, reward, True, False, {}
        return self._observe(), reward, False, False, {}

    def render(self) -> np.ndarray:
        """The newest frame, [height, width, 3]."""
        return np.ascontiguousarray(np.moveaxis(self._last, 0, -1))

    def close(self) -> None:
        self._lab.close()


def protocol() -> str:
    """One line describing the setup, for the run's summary."""
    return (
        f"DeepMind Lab, IMPALA's setup: {WIDTH}x{HEIGHT} RGB, {len(ACTION_SET)} actions, "
        f"each repeated for {ACTION_REPEATS} frames (rewards summed)"
    )


def make_env(env_id: str, render_mode: str | None = None) -> gym.Env:
    """The level of a ``dmlab:`` id as a Gymnasium env."""
    return DMLabEnv(level_path(env_id), render_mode)


class DMLabFamily(EnvFamily):
    """``dmlab:LEVEL`` ids, in IMPALA's fixed setup (no settings)."""

    name = "dmlab"
    prefix = PREFIX

    def check(self, env_id: str) -> None:
        level_path(env_id)

    def make(self, env_id: str, settings: Any, render_mode: str | None = None) -> gym.Env:
        return make_env(env_id, render_mode)

    def spec_extra(self, env_id: str, settings: Any) -> dict[str, Any]:
        return {"frame_skip": ACTION_REPEATS, "protocol": protocol()}


FAMILY = DMLabFamily()
