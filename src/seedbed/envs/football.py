"""Google Research Football scenarios (``football:SCENARIO``) as Gymnasium environments.

``football:academy_empty_goal_close``, ``football:11_vs_11_easy_stochastic``… name any scenario
that ships with gfootball (the ``football`` extra, built from source by ``make football``).
How the agent sees and is rewarded is the run's ``football`` section (``FootballSettings``: in
YAML ``football: {representation: simple115v2}``, or the ``--representation``, ``--rewards``
and ``--stacked`` flags), which travels to every actor, local or remote, and into the run's
``config.yaml``:

- ``representation``: ``smm`` (default; the "extracted" Super Mini Map of SEED RL: 4 planes of
  72x96 holding the left team, the right team, the ball and the active player as 0/255),
  ``pixels`` (the rendered game, RGB, downscaled to 72x96), ``pixels_gray``, ``simple115v2`` or
  ``simple115`` (115 floats: positions, directions, ball, game mode);
- ``rewards``: ``scoring`` (default; +1 per goal scored, -1 per goal conceded) or
  ``scoring,checkpoints`` (plus 0.1 for each of ten zones the ball is first carried into);
- ``stacked``: the last 4 observations, as SEED RL stacks them (default: the image
  representations are stacked, the vectors never).

The same options may also follow the scenario in the id as ``:KEY=VALUE`` parts, which win over
the section (ids written so before the section existed keep their meaning)::

    football:11_vs_11_easy_stochastic:representation=simple115v2:rewards=scoring,checkpoints

Image observations are uint8 and channels first, ``[planes x frames, 72, 96]`` (SMM stacked:
``[16, 72, 96]``), the layout seedbed's torsos take; the vectors are float32 ``[115]``. Actions
are gfootball's default set of 19 (idle, 8 directions, passes, shot, sprint, ...). The agent
controls one player, the one nearest the ball. An episode ends when the scenario says so (a
goal, the ball lost or out of play in the academy scenarios, the final whistle in full games);
the game clock is part of the task, so every end is reported as ``terminated``.

gfootball is imported on first use, so other envs never pay for it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import difflib
import functools
import importlib.util
import io
import warnings
from pathlib import Path
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from seedbed.config import setting
from seedbed.envs.base import EnvFamily
from seedbed.errors import ConfigError

PREFIX = "football:"
INSTALL = "run `make football` (builds gfootball 2.10.2 from source; Debian/Ubuntu)"

# gfootball 2.10.2's scenarios, for close-match errors where gfootball is not installed.
KNOWN_SCENARIOS = (
    "11_vs_11_competition",
    "11_vs_11_easy_stochastic",
    "11_vs_11_hard_stochastic",
    "11_vs_11_kaggle",
    "11_vs_11_stochastic",
    "1_vs_1_easy",
    "5_vs_5",
    "academy_3_vs_1_with_keeper",
    "academy_corner",
    "academy_counterattack_easy",
    "academy_counterattack_hard",
    "academy_empty_goal",
    "academy_empty_goal_close",
    "academy_pass_and_shoot_with_keeper",
    "academy_run_pass_and_shoot_with_keeper",
    "academy_run_to_score",
    "academy_run_to_score_with_keeper",
    "academy_single_goal_versus_lazy",
    "test_example_multiagent",
)
# Our names of the representations, and gfootball's.
REPRESENTATIONS = {
    "smm": "extracted",
    "extracted": "extracted",
    "pixels": "pixels",
    "pixels_gray": "pixels_gray",
    "simple115v2": "simple115v2",
    "simple115": "simple115",
}
IMAGES = ("extracted", "pixels", "pixels_gray")
REWARDS = ("scoring", "scoring,checkpoints")
SMM_SIZE = (96, 72)  # (width, height), gfootball's and SEED RL's default SMM and pixels size
NUM_ACTIONS = 19  # gfootball's default action set


@dataclasses.dataclass
class FootballSettings:
    """How the agent sees and is rewarded in a scenario: the run's ``football`` section
    (``--representation``, ``--rewards`` and ``--stacked`` set the same fields)."""

    representation: Literal["smm", "pixels", "pixels_gray", "simple115v2", "simple115"] = setting(
        "smm", "Football observations: the Super Mini Map, the rendered game, or 115 floats"
    )
    rewards: Literal["scoring", "scoring,checkpoints"] = setting(
        "scoring", "Football rewards: goals, or goals plus 0.1 per checkpoint zone reached"
    )
    stacked: bool | None = setting(
        None, "Football: stack the last 4 observations (none: images yes, vectors no)"
    )

    def validate(self) -> None:
        """Raise ConfigError on a value that cannot work."""
        _options(self, "the football settings")


@dataclasses.dataclass(frozen=True)
class Scenario:
    """A scenario with its options resolved: what gfootball is asked to make."""

    name: str
    representation: str = "extracted"  # gfootball's name: extracted, pixels, simple115v2...
    rewards: str = "scoring"
    stacked: bool = True

    def protocol(self) -> str:
        """One line describing the setup, for the run's summary."""
        name = {"extracted": "SMM"}.get(self.representation, self.representation)
        stack = ", 4 stacked" if self.stacked else ""
        return (
            f"Google Research Football {self.name}: {name} observations{stack}, rewards "
            f"{self.rewards}, {NUM_ACTIONS} actions (default set), one controlled player"
        )


def _installed_scenarios() -> tuple[str, ...] | None:
    """The scenario modules of the installed gfootball, read from its files without importing
    it (its import loads the C++ engine); None where gfootball is not installed."""
    spec = importlib.util.find_spec("gfootball")
    if spec is None or not spec.submodule_search_locations:
        return None
    folder = Path(next(iter(spec.submodule_search_locations))) / "scenarios"
    return tuple(sorted(p.stem for p in folder.glob("*.py") if p.stem != "__init__"))


@functools.cache
def scenarios() -> tuple[str, ...]:
    """Every scenario name: the installed gfootball's, else those of gfootball 2.10.2."""
    return _installed_scenarios() or KNOWN_SCENARIOS


def has_gfootball() -> bool:
    """Whether gfootball is installed (without importing it)."""
    return importlib.util.find_spec("gfootball") is not None


def parse(env_id: str, settings: FootballSettings | None = None) -> Scenario:
    """The scenario of a ``football:SCENARIO[:KEY=VALUE]...`` id with its options (the id's
    own, else ``settings``), or a one-line error."""
    scenario, *options = env_id[len(PREFIX) :].split(":")
    if scenario not in scenarios():
        close = difflib.get_close_matches(scenario, scenarios(), n=3, cutoff=0.6)
        hint = (
            f"; did you mean {', '.join(PREFIX + c for c in close)}?"
            if close
            else "; e.g. football:academy_empty_goal_close, football:11_vs_11_easy_stochastic"
        )
        raise ConfigError(f"unknown Football scenario '{scenario}'{hint}")
    values: dict[str, Any] = dataclasses.asdict(settings or FootballSettings())
    for option in options:
        key, sep, value = option.partition("=")
        if not sep or key not in values:
            raise ConfigError(
                f"{env_id}: option '{option}' is not KEY=VALUE with KEY representation, "
                "rewards or stacked, e.g. football:academy_empty_goal_close:rewards=scoring"
            )
        values[key] = value
    if isinstance(values["stacked"], str):
        if values["stacked"].lower() not in ("true", "false"):
            raise ConfigError(f"{env_id}: stacked must be true or false, got '{values['stacked']}'")
        values["stacked"] = values["stacked"].lower() == "true"
    return Scenario(scenario, *_options(FootballSettings(**values), env_id))


def _options(settings: FootballSettings, where: str) -> tuple[str, str, bool]:
    """``settings`` checked, in gfootball's names (representation, rewards, stacked), or a
    one-line error naming ``where`` they came from."""
    if settings.representation not in REPRESENTATIONS:
        raise ConfigError(
            f"{where}: representation '{settings.representation}' is not one of "
            f"{', '.join(REPRESENTATIONS)}"
        )
    if settings.rewards not in REWARDS:
        raise ConfigError(
            f"{where}: rewards '{settings.rewards}' is not one of {' or '.join(REWARDS)}"
        )
    representation = REPRESENTATIONS[settings.representation]
    stacked = representation in IMAGES if settings.stacked is None else settings.stacked
    if stacked and representation not in IMAGES:
        raise ConfigError(
            f"{where}: gfootball stacks only the smm and pixels representations; leave "
            f"stacked unset (none) or false for {settings.representation}"
        )
    return representation, settings.rewards, stacked


def check_installed() -> None:
    """A one-line error saying how to install gfootball, where it is missing."""
    if not has_gfootball():
        raise ConfigError(f"football: environments need gfootball: {INSTALL}")


def _create(settings: Scenario, seed: int) -> Any:
    """gfootball's own (old gym API) environment for ``settings``."""
    check_installed()
    from absl import logging as absl_logging

    absl_logging.set_verbosity(absl_logging.WARNING)  # gfootball logs every episode at INFO
    # gym 0.25 prints a notice on import and warns about its old step API, in every actor: the
    # wrapper below is the Gymnasium env, so neither applies.
    with contextlib.redirect_stderr(io.StringIO()), warnings.catch_warnings():
        import gfootball.env

        warnings.simplefilter("ignore", DeprecationWarning)  # after gym's import sets its own
        options: dict[str, Any] = {"game_engine_random_seed": seed}
        pixels = settings.representation.startswith("pixels")
        if pixels:
            # The frame is downscaled to 96x72 anyway; rendering 320x180 rather than gfootball's
            # 1280x720 makes software (no GPU) rendering an order of magnitude faster.
            options.update(render_resolution_x=320, render_resolution_y=180)
        return gfootball.env.create_environment(
            env_name=settings.name,
            stacked=settings.stacked,
            representation=settings.representation,
            rewards=settings.rewards,
            render=pixels,  # only the pixel representations need the game rendered
            channel_dimensions=SMM_SIZE,
            other_config_options=options,
        )


class FootballEnv(gym.Env):
    """One gfootball scenario behind the Gymnasium API (see the module docstring)."""

    metadata = {"render_modes": ["rgb_array"], "render_fps": 10}  # the engine's 10 steps/s

    def __init__(self, settings: Scenario, render_mode: str | None = None) -> None:
        self.settings = settings
        self.render_mode = render_mode
        self._rng = np.random.default_rng()  # engine seeds, one per episode; reset(seed) fixes it
        self._env = _create(settings, self._engine_seed())
        shape = self._env.observation_space.shape
        if settings.representation in IMAGES:
            height, width, channels = shape
            self.observation_space = gym.spaces.Box(0, 255, (channels, height, width), np.uint8)
        else:
            self.observation_space = gym.spaces.Box(-np.inf, np.inf, shape, np.float32)
        self.action_space = gym.spaces.Discrete(int(self._env.action_space.n))

    def _engine_seed(self) -> int:
        return int(self._rng.integers(2**31 - 1))

    def _observation(self, obs: Any) -> np.ndarray:
        if self.settings.representation in IMAGES:
            # gfootball gives [height, width, planes]; the torsos convolve [planes, h, w].
            return np.ascontiguousarray(np.moveaxis(np.asarray(obs, np.uint8), -1, 0))
        return np.asarray(obs, np.float32)

    def reset(
        self, *, seed: int | None = None, options: dict | None = None
    ) -> tuple[np.ndarray, dict]:
        super().reset(seed=seed)
        if seed is not None:
            self._rng = np.random.default_rng(seed)
        # The engine draws each episode from the seed in its config; a fresh one per episode
        # keeps episodes apart, and one drawn from our generator makes them reproducible.
        self._env.unwrapped._config["game_engine_random_seed"] = self._engine_seed()
        return self._observation(self._env.reset()), {}

    def step(self, action: Any) -> tuple[np.ndarray, float, bool, bool, dict]:
        obs, reward, done, info = self._env.step(int(action))
        return self._observation(obs), float(reward), bool(done), False, {}

    def render(self) -> np.ndarray:
        """The game as an RGB frame: the rendered game for the pixel representations, else the
        current Super Mini Map in colour, 4x enlarged (the others do not render the game, which
        would need an OpenGL context)."""
        obs = self._env.unwrapped.observation()[0]
        if "frame" in obs:
            return np.asarray(obs["frame"], np.uint8)
        from gfootball.env import observation_preprocessing

        smm = observation_preprocessing.generate_smm([obs], SMM_SIZE)[0]  # [h, w, 4]
        frame = np.zeros((*smm.shape[:2], 3), np.uint8)
        frame[..., 0] = np.maximum(smm[..., 0], smm[..., 3])  # left team red, active white
        frame[..., 1] = np.maximum(smm[..., 2], smm[..., 3])  # ball green
        frame[..., 2] = np.maximum(smm[..., 1], smm[..., 3])  # right team blue
        return frame.repeat(4, axis=0).repeat(4, axis=1)

    def close(self) -> None:
        self._env.close()


def make_env(
    env_id: str, settings: FootballSettings | None = None, render_mode: str | None = None
) -> gym.Env:
    """The scenario of a ``football:`` id as a Gymnasium env, with the run's ``settings``."""
    return FootballEnv(parse(env_id, settings), render_mode)


class FootballFamily(EnvFamily):
    """``football:SCENARIO`` ids, with ``FootballSettings`` (and ``:KEY=VALUE`` id options)."""

    name = "football"
    prefix = PREFIX
    settings_class = FootballSettings

    def check(self, env_id: str) -> None:
        parse(env_id)

    def make(self, env_id: str, settings: Any, render_mode: str | None = None) -> gym.Env:
        return make_env(env_id, settings, render_mode)

    def spec_extra(self, env_id: str, settings: Any) -> dict[str, Any]:
        return {"protocol": parse(env_id, settings).protocol()}


FAMILY = FootballFamily()
