"""How far a training run has come (``Progress``), and the checkpoint that keeps it with the agent.

The learner loop moves the counters on, the stop rules and the summary read them, and a
checkpoint saves them with the agent's state, the torch RNG and the resolved config; a resumed
run's counters go on from its checkpoint's.
"""

from __future__ import annotations

import dataclasses
import logging
from pathlib import Path
from typing import Any

import torch

from seedbed.config import RunConfig, flag
from seedbed.errors import SeedbedError
from seedbed.telemetry import EpisodeWindow

# The run's messages keep the name they always had in the console ("INFO seedbed.runtime.train:").
log = logging.getLogger("seedbed.runtime.train")


@dataclasses.dataclass(eq=False)
class Progress:
    """A run's counters, over every replica and every session of the run."""

    frames: int = 0  # as the inference servers count them (emulator frames for Atari)
    learner_steps: int = 0
    wall_offset: float = 0.0  # the wall time of the sessions before this one (resumed runs)
    window: EpisodeWindow = dataclasses.field(default_factory=lambda: EpisodeWindow(100))
    # The frames, wall time and mean return when the target return was first reached.
    target_reached: dict[str, float] | None = None
    actor_restarts: int = 0  # this session's, over all replicas; not checkpointed
    # Optimizer steps skipped as not finite (NaN or inf), this session's; not checkpointed.
    skipped_steps: int = 0


def checkpoint_payload(
    agent_state: dict[str, Any], progress: Progress, wall_s: float, config: RunConfig
) -> dict[str, Any]:
    """What a checkpoint holds: the agent's ``state_dict()``, the counters and the config,
    ``wall_s`` being the run's wall time so far."""
    return {
        "agent": agent_state,
        "frames": progress.frames,
        "learner_steps": progress.learner_steps,
        "wall_s": wall_s,
        "episodes": progress.window.state_dict(),
        "target_reached": progress.target_reached,
        "torch_rng": torch.get_rng_state(),
        "config": config.to_dict(),
    }


def restore(path: Path, state: dict[str, Any], agent: Any, progress: Progress) -> None:
    """Load checkpoint ``state`` (read from ``path``) into ``agent`` and ``progress``; its
    settings were checked against the run's (``check_settings``) when it was found.

    Raises:
        SeedbedError: One line when the checkpoint does not fit this run's settings.
    """
    try:
        agent.load_state_dict(state["agent"])
        progress.frames = int(state["frames"])
        progress.learner_steps = int(state["learner_steps"])
        progress.wall_offset = float(state["wall_s"])
        progress.window.load_state_dict(state["episodes"])
        progress.target_reached = state.get("target_reached")
        torch.set_rng_state(state["torch_rng"])
    except (KeyError, RuntimeError, ValueError) as e:
        raise SeedbedError(
            f"checkpoint {path} does not fit this run's settings ({str(e).splitlines()[0]})"
        ) from None
    log.info("resumed from %s at %d frames", path, progress.frames)


def check_settings(path: Path, saved: Any, config: RunConfig) -> None:
    """Check that the checkpoint at ``path``, made with the settings ``saved``, was made with
    ``config``'s env, agent, env settings and agent settings: two envs of the same shapes, or
    the same network with another setting, would otherwise resume without a word.

    Raises:
        SeedbedError: One line naming the first setting that differs.
    """
    if not isinstance(saved, dict):
        raise SeedbedError(
            f"checkpoint {path} holds no settings to compare with this run's; pass "
            "--resume-mismatch accept to resume from it on purpose"
        )
    mine = config.to_dict()
    pairs = [(name, saved.get(name), mine[name]) for name in ("env", "agent")]
    for section in dict.fromkeys((config.train.agent, config.family)):
        theirs, ours = saved.get(section) or {}, mine.get(section) or {}
        # A setting one side lacks came or went with a new seedbed: not the user's change.
        pairs += [(key, theirs[key], ours[key]) for key in sorted(theirs) if key in ours]
    for name, theirs, ours in pairs:
        if theirs != ours:
            raise SeedbedError(
                f"checkpoint {path} was made with --{flag(name)} {_shown(theirs)}, this run has "
                f"{_shown(ours)}: resume with the checkpoint's settings, or pass "
                "--resume-mismatch accept to go on with this run's on purpose"
            )


def _shown(value: Any) -> str:
    if value is None:
        return "none"
    if isinstance(value, list):
        return ",".join(map(str, value)) or "(empty)"
    return str(value)
