"""Atari 2600 games through the Arcade Learning Environment, with the standard preprocessing.

``atari:GAME`` ids (``atari:Pong``, ``atari:Breakout``…) name any game whose ROM ships with
ale-py. Two backends give the same observations: Gymnasium's ``AtariPreprocessing`` and
``FrameStackObservation`` wrappers around ALE (always available), and EnvPool's C++ Atari (the
``envpool`` extra), which steps its environments without the Python interpreter.

Both follow the settings of :class:`AtariSettings`; the defaults are the sticky-action protocol
of Machado et al. (2018): repeat the previous action with probability 0.25 on every emulator
frame, no no-op starts (sticky actions already make starts random), life loss is not terminal,
episodes end by game over or after 108,000 emulator frames (30 minutes of play). Actions are
the game's minimal set, as in ALE's v5 environments and SEED RL (``--full-action-space``: 18).

Frames are stacked by the actors' envs (``--frame-stack-on actor``, the default) or by the
learner (``learner``): actors then send one 84x84 frame per step instead of four, central
inference keeps each env's stack, and unrolls and replay store each frame once. The env spec
still describes what the network sees (``EnvSpec.learner_stack`` says who stacks), and a single
env (``make_env``: evaluation, video, the spec) always stacks its own frames.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import re
from typing import Any, Literal

import gymnasium as gym
import numpy as np

from seedbed.config import flag, setting
from seedbed.envs.base import EnvFamily
from seedbed.errors import ConfigError

PREFIX = "atari:"
# ALE's own Gymnasium ids name the same games: ALE/Pong-v5 is atari:Pong here.
_ALE_ID = re.compile(r"ALE/(?P<game>.+)-v\d+")


@dataclasses.dataclass(frozen=True)
class AtariSettings:
    """The preprocessing of an Atari environment: the run's ``atari`` section (``--frame-skip``
    and the other flags set the same fields). Defaults: Machado et al. (2018) sticky actions."""

    env_backend: Literal["gymnasium", "envpool"] = setting(
        "gymnasium", "Atari backend: Gymnasium's ALE wrappers, or EnvPool (faster, C++)"
    )
    frame_skip: int = setting(4, "emulator frames per agent step (max of the last two is seen)")
    sticky_actions: float = setting(
        0.25, "probability that the emulator repeats the previous action on each frame"
    )
    full_action_space: bool = setting(False, "all 18 actions instead of the game's minimal set")
    noop_max: int = setting(0, "start episodes with up to this many no-ops (0: none)")
    frame_stack: int = setting(4, "frames stacked into one observation")
    frame_stack_on: Literal["actor", "learner"] = setting(
        "actor",
        "who stacks the frames: the actors' envs, or the learner (actors send 1 frame, not "
        "--frame-stack; needs central inference)",
    )
    screen_size: int = setting(84, "observations are screen-size x screen-size grayscale")
    max_episode_frames: int = setting(108_000, "cut episodes after this many emulator frames")
    terminal_on_life_loss: bool = setting(False, "end the episode when a life is lost")

    def validate(self) -> None:
        """Raise ConfigError on a value that cannot work."""
        for name in ("frame_skip", "frame_stack", "screen_size", "max_episode_frames"):
            if getattr(self, name) <= 0:
                raise ConfigError(f"--{flag(name)} must be positive, got {getattr(self, name)}")
        if self.noop_max < 0:
            raise ConfigError(f"--noop-max must be >= 0, got {self.noop_max}")
        if not 0.0 <= self.sticky_actions <= 1.0:
            raise ConfigError(f"--sticky-actions must lie in [0, 1], got {self.sticky_actions}")

    def check_run(self, train: Any) -> None:
        """Raise ConfigError where the run's settings (``TrainConfig``) cannot work with these."""
        if self.frame_stack_on == "learner" and train.inference == "local":
            raise ConfigError(
                "--frame-stack-on learner needs central inference: local actors act themselves "
                "and need the stack; use --frame-stack-on actor with --inference local"
            )

    @property
    def learner_stack(self) -> int:
        """Frames the learner stacks (``EnvSpec.learner_stack``): 1 when the actors do."""
        return self.frame_stack if self.frame_stack_on == "learner" else 1

    def actor_side(self) -> AtariSettings:
        """These settings as an actor's envs apply them: one frame per step where the learner
        stacks them."""
        if self.frame_stack_on == "actor":
            return self
        return dataclasses.replace(self, frame_stack=1)

    def protocol(self) -> str:
        """One line naming the evaluation protocol, for the run's summary."""
        starts = f"up to {self.noop_max} no-op starts" if self.noop_max else "no no-op starts"
        actions = "full 18-action set" if self.full_action_space else "minimal action set"
        life = "life loss terminal" if self.terminal_on_life_loss else "life loss not terminal"
        name = (
            "Machado et al. (2018) sticky actions"
            if self.sticky_actions == 0.25 and not self.noop_max and not self.terminal_on_life_loss
            else "custom"
        )
        return (
            f"{name}: repeat probability {self.sticky_actions}, {starts}, {actions}, {life}, "
            f"frame skip {self.frame_skip} (max of last 2 frames), {self.screen_size}x"
            f"{self.screen_size} grayscale, {self.frame_stack} stacked, episodes capped at "
            f"{self.max_episode_frames} frames, raw scores (rewards clipped by the learner only)"
        )


def is_atari(env_id: str) -> bool:
    """Whether ``env_id`` names an Atari game: ``atari:GAME`` or ALE's ``ALE/GAME-v5``."""
    return env_id.startswith((PREFIX, "ALE/"))


@functools.cache
def games() -> tuple[str, ...]:
    """Names of the games whose ROMs ship with ale-py, as ALE's Gymnasium ids spell them."""
    import ale_py

    ale_py.ALEInterface.setLoggerMode(ale_py.LoggerMode.Error)  # no banner from every env
    gym.register_envs(ale_py)
    names = (e[4:-3] for e in gym.registry if e.startswith("ALE/") and e.endswith("-v5"))
    return tuple(sorted(n for n in names if not n.endswith("-ram")))


def game_name(env_id: str) -> str:
    """The game of an ``atari:GAME`` or ``ALE/GAME-v5`` id, spelled as ALE does, or a one-line
    error with close matches."""
    if env_id.startswith(PREFIX):
        asked = env_id[len(PREFIX) :]
    else:
        ale = _ALE_ID.fullmatch(env_id)
        if ale is None:
            raise ConfigError(f"{env_id}: ALE ids are ALE/GAME-v5, e.g. ALE/Pong-v5 (atari:Pong)")
        asked = ale["game"]
    by_lower = {g.lower(): g for g in games()}
    if asked.lower() in by_lower:
        return by_lower[asked.lower()]
    close = difflib.get_close_matches(asked.lower(), list(by_lower), n=3, cutoff=0.6)
    hint = (
        f"; did you mean {', '.join(PREFIX + by_lower[c] for c in close)}?"
        if close
        else "; games are named as in ALE, e.g. atari:Pong, atari:Breakout"
    )
    raise ConfigError(f"unknown Atari game '{asked}'{hint}")


def make_env(env_id: str, settings: AtariSettings, render_mode: str | None = None) -> gym.Env:
    """One preprocessed game on the Gymnasium backend (evaluation and video use this)."""
    from gymnasium.wrappers import AtariPreprocessing, FrameStackObservation

    env = gym.make(
        f"ALE/{game_name(env_id)}-v5",
        frameskip=1,  # AtariPreprocessing skips frames itself, to max-pool the last two
        repeat_action_probability=settings.sticky_actions,
        full_action_space=settings.full_action_space,
        max_num_frames_per_episode=settings.max_episode_frames,
        render_mode=render_mode,
    )
    env = AtariPreprocessing(
        env,
        noop_max=settings.noop_max,
        frame_skip=settings.frame_skip,
        screen_size=settings.screen_size,
        terminal_on_life_loss=settings.terminal_on_life_loss,
        grayscale_obs=True,
        scale_obs=False,  # uint8 frames; the network scales them once, on its device
    )
    return FrameStackObservation(env, settings.frame_stack)


def envpool_id(env_id: str) -> str:
    """EnvPool's id for ``env_id``, or a one-line error saying what to do instead."""
    try:
        import envpool
    except ImportError:
        raise ConfigError(
            "--env-backend envpool needs EnvPool: pip install 'seedbed[envpool]'"
        ) from None
    name = f"{game_name(env_id)}-v5"
    if name not in envpool.list_all_envs():
        raise ConfigError(f"EnvPool has no {name}; use --env-backend gymnasium for it")
    return name


def make_envpool(env_id: str, settings: AtariSettings, num_envs: int, seed: int) -> Any:
    """``num_envs`` games in one EnvPool, stepped by one thread (actors are the parallelism)."""
    import envpool

    return envpool.make(
        envpool_id(env_id),
        env_type="gymnasium",
        num_envs=num_envs,
        batch_size=num_envs,
        num_threads=1,
        seed=seed,
        frame_skip=settings.frame_skip,
        repeat_action_probability=settings.sticky_actions,
        full_action_space=settings.full_action_space,
        # EnvPool always starts with 1 to noop_max no-ops and crashes on 0, so "none" becomes
        # one no-op step: the only difference between the backends' episodes.
        noop_max=max(settings.noop_max, 1),
        stack_num=settings.frame_stack,
        img_height=settings.screen_size,
        img_width=settings.screen_size,
        gray_scale=True,
        episodic_life=settings.terminal_on_life_loss,
        reward_clip=False,
        use_fire_reset=False,  # Gymnasium's wrappers do not press FIRE at reset either
        max_episode_steps=settings.max_episode_frames // settings.frame_skip,
    )


class EnvPoolVector:
    """EnvPool behind the vector-env interface actors use, with same-step autoreset.

    EnvPool resets an ended episode on the *next* step, spending that step's action on it. Here
    ended envs are reset at once instead, so the step that ends an episode returns the next
    episode's first observation, as Gymnasium's SAME_STEP autoreset does, and no agent step is
    wasted on a reset.
    """

    def __init__(self, env_id: str, settings: AtariSettings, num_envs: int, seed: int) -> None:
        self._pool = make_envpool(env_id, settings, num_envs, seed)
        self.num_envs = num_envs
        self._ids = np.arange(num_envs)
        self.single_observation_space = self._pool.observation_space
        self.single_action_space = self._pool.action_space

    def reset(self, *, seed: int | None = None) -> tuple[np.ndarray, dict]:
        obs, _ = self._pool.reset()
        return obs, {}

    def step(self, actions: np.ndarray) -> tuple[np.ndarray, ...]:
        obs, reward, terminated, truncated, info = self._pool.step(
            np.asarray(actions, dtype=np.int32)
        )
        order = info["env_id"]
        if not np.array_equal(order, self._ids):  # rows must be in env order for the learner
            perm = np.argsort(order)
            obs, reward = obs[perm], reward[perm]
            terminated, truncated = terminated[perm], truncated[perm]
        ended = np.flatnonzero(terminated | truncated)
        if len(ended):
            first, info = self._pool.reset(ended.astype(np.int32))
            obs[info["env_id"]] = first
        return obs, reward.astype(np.float32), terminated, truncated, {}

    def close(self) -> None:
        self._pool.close()


class AtariFamily(EnvFamily):
    """``atari:GAME`` ids, and ALE's ``ALE/GAME-v5`` ids, which runs record as ``atari:GAME``."""

    name = "atari"
    prefix = PREFIX
    settings_class = AtariSettings

    def owns(self, env_id: str) -> bool:
        return is_atari(env_id)

    def canonical_id(self, env_id: str) -> str:
        # atari:GAME ids stay as typed (case does not matter); ALE's become atari:GAME, so that
        # runs, defaults and the preprocessing are the same whichever spelling the user chose.
        return env_id if env_id.startswith(PREFIX) else PREFIX + game_name(env_id)

    def check(self, env_id: str) -> None:
        game_name(env_id)

    def make(self, env_id: str, settings: Any, render_mode: str | None = None) -> gym.Env:
        return make_env(env_id, settings, render_mode)

    def make_vector(self, env_id: str, num_envs: int, seed: int, settings: Any) -> Any:
        settings = settings.actor_side()  # actors' envs: what actors send
        if settings.env_backend == "envpool":
            return EnvPoolVector(env_id, settings, num_envs, seed)
        return super().make_vector(env_id, num_envs, seed, settings)

    def spec_extra(self, env_id: str, settings: Any) -> dict[str, Any]:
        if settings.env_backend == "envpool":
            envpool_id(env_id)  # fail here, not in every actor
        return {
            "frame_skip": settings.frame_skip,
            "protocol": settings.protocol(),
            "learner_stack": settings.learner_stack,
        }


FAMILY = AtariFamily()
