"""The data types every layer shares: an environment's spec, the batches that flow between
inference, the buffers and the agents, and the ``Buffer`` interface.

They sit below everything that uses them, so lower layers (replay, inference, the actor) never
import ``agents`` for a type. This module does not import torch: actor processes read
``EnvSpec`` and stay torch-free, so tensor types appear only in annotations.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Protocol

import numpy as np

if TYPE_CHECKING:
    import torch

State = tuple["torch.Tensor", ...]  # recurrent state, each tensor [num_envs, ...]; () when none


@dataclasses.dataclass(frozen=True)
class EnvSpec:
    """What the rest of the system needs to know about an environment.

    Actions travel through one code path whatever their kind: each env's action is an array of
    ``action_shape`` in ``action_dtype``. Discrete actions are int64 scalars (shape ``()``) below
    ``num_actions``; continuous ones are float32 arrays within ``action_low`` and
    ``action_high`` (flattened in C order), and ``num_actions`` is 0.
    """

    env_id: str
    obs_shape: tuple[int, ...]
    obs_dtype: str  # numpy dtype name; observations travel in this dtype
    num_actions: int  # size of the discrete action set; 0 for continuous actions
    frame_skip: int = 1  # emulator frames per agent step: reports count frames, not steps
    protocol: str | None = None  # how the environment is set up, for the run's summary
    action_shape: tuple[int, ...] = ()  # one env's action: () for a discrete action
    action_dtype: str = "int64"  # numpy dtype name: int64 (discrete) or float32 (continuous)
    action_low: tuple[float, ...] = ()  # continuous actions' bounds, flattened; () if discrete
    action_high: tuple[float, ...] = ()
    # Frames the learner stacks into obs_shape's first axis: actors then send one frame
    # (sent_obs_shape) and central inference keeps each env's stack (Atari's --frame-stack-on).
    learner_stack: int = 1

    def __post_init__(self) -> None:
        if self.learner_stack < 1 or (
            self.learner_stack > 1
            and (not self.obs_shape or self.obs_shape[0] % self.learner_stack)
        ):
            raise ValueError(
                f"learner_stack {self.learner_stack} does not divide obs_shape {self.obs_shape}"
            )

    @property
    def sent_obs_shape(self) -> tuple[int, ...]:
        """One env's observation as actors send it: ``obs_shape`` less the stack the learner
        builds (``learner_stack`` frames), so [1, 84, 84] for Atari stacked on the learner."""
        if self.learner_stack == 1:
            return tuple(self.obs_shape)
        return (self.obs_shape[0] // self.learner_stack, *self.obs_shape[1:])

    @property
    def continuous(self) -> bool:
        """Whether actions are real-valued arrays (a Box) rather than one of ``num_actions``."""
        return np.dtype(self.action_dtype).kind == "f"

    @property
    def action_kind(self) -> str:
        """'continuous' or 'discrete', for messages."""
        return "continuous" if self.continuous else "discrete"


@dataclasses.dataclass
class StepInput:
    """One step of a batch of environments, as central inference hands it to ``act``.

    ``done[i]`` says that ``obs[i]`` is the first observation of a new episode: ``reward[i]``
    then is the last reward of the episode that ended, and recurrent state must be reset.
    """

    obs: torch.Tensor  # [N, *obs_shape] in the env's dtype
    # [N, *action_shape], the action taken before obs: [N] int64 for discrete actions,
    # [N, A] float32 for continuous ones (EnvSpec.action_shape and action_dtype)
    prev_action: torch.Tensor
    reward: torch.Tensor  # [N] float32, the reward that arrived with obs
    done: torch.Tensor  # [N] bool
    env_ids: torch.Tensor  # [N] int64, which environments these rows are

    def to(self, device: torch.device) -> StepInput:
        return StepInput(*(getattr(self, f.name).to(device) for f in dataclasses.fields(self)))


@dataclasses.dataclass
class ActOutput:
    """What ``act`` returns: actions, extras recorded in the unroll, and the next state."""

    action: torch.Tensor  # [N, *action_shape] in the env's action dtype, as prev_action
    extras: dict[str, torch.Tensor]  # e.g. {"logits": [N, A]}, stored per step in unrolls
    state: State


@dataclasses.dataclass
class ReplayInfo:
    """Where a batch sampled from prioritized replay came from, and what the learner says back.

    The learner scales each item's loss by ``weights`` (importance sampling) and sets
    ``priorities``; the replay then stores them for ``indices``, unless those items were
    overwritten meanwhile (``generations`` tells).
    """

    indices: torch.Tensor  # [B] int64 item indices in the replay
    weights: torch.Tensor  # [B] float32 importance-sampling weights, largest 1
    generations: torch.Tensor  # [B] int64, how often each item's row had been written
    priorities: torch.Tensor | None = None  # [B] float, set by the agent's learn()


@dataclasses.dataclass
class Unrolls:
    """B unrolls of T+1 steps each, time-major; step t+1 holds what followed step t's action.

    Consecutive unrolls of one environment share a step: the last step of one is the first of the
    next, so every transition is learned from once and the final value can bootstrap.

    Where the learner stacks frames (``EnvSpec.learner_stack`` k > 1), ``obs`` holds each step's
    newest frame only, ``[T+1, B, *sent_obs_shape]``, and ``obs_context`` the k - 1 older frames
    of the stack at step 0, oldest first; ``seedbed.framestack.restack`` rebuilds the stacks
    (respecting episode starts, ``done``) before the agent learns, so each frame is stored once.
    """

    # obs, prev_action, reward, done, truncated, action and the agent's extras: [T+1, B, ...]
    steps: dict[str, torch.Tensor]
    initial_state: State  # recurrent state before step 0, each [B, ...]
    policy_version: torch.Tensor  # [B] int64, learner version that acted each unroll's first step
    replay: ReplayInfo | None = None  # set on batches sampled from prioritized replay
    # [B, (k-1) * frame channels, ...]: the older frames of step 0's stack; None: obs are stacks
    obs_context: torch.Tensor | None = None

    @property
    def batch_size(self) -> int:
        return int(self.steps["action"].shape[1])

    def to(self, device: torch.device) -> Unrolls:
        return Unrolls(
            {k: v.to(device, non_blocking=True) for k, v in self.steps.items()},
            tuple(s.to(device, non_blocking=True) for s in self.initial_state),
            self.policy_version,
            self.replay,
            None if self.obs_context is None else self.obs_context.to(device, non_blocking=True),
        )


class Buffer(Protocol):
    """Where unrolls wait for the learner (``agent.make_buffer``): the inference thread puts,
    the learner thread gets, in this order::

        buffer.put(unrolls, timeout)             # inference thread; False on timeout or close
        batch = buffer.get(batch_size, timeout)  # learner thread; None on timeout or close
        agent.learn(batch)                       # may set batch.replay.priorities
        buffer.learned(batch)                    # learner thread, after each learn
        buffer.stats()                           # for the run's summary
        buffer.close()                           # at shutdown: wakes both threads

    ``put`` blocks while the buffer will not take more: that is the actors' backpressure.
    """

    def put(self, unrolls: Unrolls, timeout: float | None = None) -> bool: ...

    def get(self, batch_size: int, timeout: float | None = None) -> Unrolls | None: ...

    def learned(self, batch: Unrolls) -> None: ...

    def stats(self) -> dict[str, int] | None: ...

    def close(self) -> None: ...
