"""Frame stacks rebuilt from frames stored once: the learner's side of ``--frame-stack-on learner``.

When the learner stacks frames (``EnvSpec.learner_stack`` k > 1), actors send only each step's
newest frame, and unrolls and replay keep it once: a stored unroll is its T+1 newest frames plus
a *context*, the k - 1 older frames of the stack at its first step. ``stack_frames`` turns that
back into the k-frame stacks the network reads; ``stack_context`` gives the context at any step,
which the ``UnrollBuilder`` needs to open the next unroll and replay to start an item mid-row.

A stack follows the actor-side wrappers exactly (Gymnasium's ``FrameStackObservation`` with its
default "reset" padding, and EnvPool's ``stack_num``): at an episode's first observation every
slot holds that frame; each later step drops the oldest frame and appends the newest. So the
stack at step t is frames t-k+1 .. t, each clamped to the episode's first frame, and frames from
before an episode start inside the unroll are never used. The acting side keeps the same stacks
as a ring per env (``inference.acting.FrameStacks``); tests check both against the wrappers.

Shapes: ``frames`` [S, B, c, ...] (c channels per frame, 1 for Atari's grayscale), ``starts``
[S, B] bool (the unroll's ``done``: obs starts an episode), ``context`` [B, (k-1) * c, ...].
"""

from __future__ import annotations

import dataclasses

import torch

from seedbed.types import Unrolls


def stack_sources(starts: torch.Tensor, depth: int) -> torch.Tensor:
    """For each step and stack slot (oldest first), where its frame is in the sequence of the
    context's ``depth - 1`` frames followed by the unroll's frames: [S, B, depth] int64.

    Slot j of step t wants frame t - (depth-1-j), sequence index t + j, but never earlier than
    the first frame of the episode in progress when that episode started inside the unroll.
    """
    steps = torch.arange(starts.shape[0], device=starts.device)[:, None]
    last_start = torch.where(starts, steps, -1).cummax(dim=0).values  # [S, B], -1: none yet
    # Sequence index of that episode's first frame; 0 when it began before step 0, whose
    # stack the context already holds with its own boundaries.
    first = torch.where(last_start >= 0, last_start + depth - 1, 0)
    wanted = steps[..., None] + torch.arange(depth, device=starts.device)
    return torch.maximum(wanted, first[..., None])


def _depth(context: torch.Tensor, frames: torch.Tensor) -> int:
    return context.shape[1] // frames.shape[2] + 1


def _sequence(context: torch.Tensor, frames: torch.Tensor) -> torch.Tensor:
    """The context's older frames, then ``frames``: [depth - 1 + S, B, c, ...]."""
    batch, channels = frames.shape[1], frames.shape[2]
    older = context.reshape(batch, -1, channels, *frames.shape[3:]).transpose(0, 1)
    return torch.cat((older, frames))


def stack_frames(context: torch.Tensor, frames: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
    """The stacks of every step, [S, B, k * c, ...], from frames stored once.

    Args:
        context: [B, (k-1) * c, ...], the older frames of step 0's stack, oldest first.
        frames: [S, B, c, ...], each step's newest frame.
        starts: [S, B] bool, where a step's frame starts an episode.
    """
    sources = stack_sources(starts, _depth(context, frames))
    batch = torch.arange(frames.shape[1], device=frames.device)[None, :, None]
    return _sequence(context, frames)[sources, batch].flatten(2, 3)


def stack_context(
    context: torch.Tensor, frames: torch.Tensor, starts: torch.Tensor, at: int | torch.Tensor
) -> torch.Tensor:
    """The context of step ``at`` (an int, or [B] int64, one per unroll): the older k - 1 frames
    of the stack at that step, [B, (k-1) * c, ...], as an unroll starting there stores it. The
    arguments are ``stack_frames``'s; steps after ``at`` do not matter."""
    depth = _depth(context, frames)
    if isinstance(at, int) and at >= depth - 1:
        # Only the k frames up to ``at`` can be in its stack (never the context): read those,
        # so that cutting a long unroll costs k frames, not the unroll.
        window = slice(at - depth + 1, at + 1)
        frames, starts, at = frames[window], starts[window], depth - 1
    batch = torch.arange(frames.shape[1], device=frames.device)
    at = torch.as_tensor(at, device=frames.device).expand(frames.shape[1])
    sources = stack_sources(starts, depth)[at, batch, :-1]  # [B, k-1]
    return _sequence(context, frames)[sources, batch[:, None]].flatten(1, 2)


def restack(unrolls: Unrolls) -> Unrolls:
    """``unrolls`` with whole stacks as ``obs`` (``Unrolls.obs_context`` consumed), as the agent
    learns from them; unrolls whose obs are stacks already are returned as they are."""
    if unrolls.obs_context is None:
        return unrolls
    steps = unrolls.steps
    obs = stack_frames(unrolls.obs_context, steps["obs"], steps["done"])
    return dataclasses.replace(unrolls, steps={**steps, "obs": obs}, obs_context=None)
