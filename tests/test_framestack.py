"""Frame stacks rebuilt from frames stored once, against stacks built as the actor-side wrappers
build them (a loop over one deque per env), at episode starts inside unrolls and across their
contexts; and through the unroll builder and prioritized replay, as the learner gets them."""

from __future__ import annotations

import collections

import numpy as np
import pytest
import torch

from seedbed.framestack import restack, stack_context, stack_frames
from seedbed.inference.acting import FrameStacks
from seedbed.inference.unrolls import UnrollBuilder
from seedbed.replay import PrioritizedReplay, UnrollQueue
from seedbed.resolve import resolve
from seedbed.types import Unrolls

K = 4  # frames per stack
FRAME = (1, 2, 3)  # one frame: 1 channel of 2x3


def wrapper_stacks(frames: torch.Tensor, starts: torch.Tensor, first: torch.Tensor | None = None):
    """Stacks [S, B, K * c, ...] as Gymnasium's FrameStackObservation (reset padding) builds
    them, one env and one step at a time; ``first`` [B, K-1, c, ...] fills the deques before
    step 0 (the stack there, less its newest frame)."""
    steps, batch = starts.shape
    out = torch.empty((steps, batch, K * frames.shape[2], *frames.shape[3:]), dtype=frames.dtype)
    for b in range(batch):
        stack = collections.deque(maxlen=K)
        if first is not None:
            stack.extend(first[b])
        for t in range(steps):
            if starts[t, b]:
                stack.extend([frames[t, b]] * K)  # reset: the first frame repeated
            else:
                stack.append(frames[t, b])
            out[t, b] = torch.cat(list(stack))
    return out


def random_frames(steps: int, batch: int, seed: int = 0) -> torch.Tensor:
    gen = torch.Generator().manual_seed(seed)
    return torch.randint(0, 256, (steps, batch, *FRAME), dtype=torch.uint8, generator=gen)


def test_stacks_respect_episode_starts_inside_an_unroll_and_across_the_context():
    steps, batch = 9, 5
    frames = random_frames(steps, batch)
    context = random_frames(K - 1, batch, seed=1).transpose(0, 1)  # [B, K-1, c, ...]
    starts = torch.zeros(steps, batch, dtype=torch.bool)
    starts[0, 1] = True  # an episode starts at step 0: the context is not read
    starts[2, 2] = True  # mid-unroll, with context frames still in the stack before it
    starts[[3, 4], 3] = True  # two starts in a row: a one-step episode
    starts[[1, steps - 1], 4] = True  # early and at the last step
    # env 0 has no start: its first K-1 stacks reach into the context
    expected = wrapper_stacks(frames, starts, first=context)
    got = stack_frames(context.flatten(1, 2), frames, starts)
    assert got.shape == (steps, batch, K, *FRAME[1:])
    assert torch.equal(got, expected)
    assert torch.equal(got[1, 0, :2], context[0, 1:, 0])  # step 1 still holds 2 context frames
    assert (got[2, 2] == frames[2, 2]).all()  # a start: its frame K times
    # The context a new unroll gets at any step is that step's stack less its newest frame.
    for at in (0, 2, 5, steps - 1):
        assert torch.equal(
            stack_context(context.flatten(1, 2), frames, starts, at), got[at, :, :-1]
        )
    at = torch.tensor([0, 8, 2, 4, 1])  # one step per unroll (replay items)
    assert torch.equal(
        stack_context(context.flatten(1, 2), frames, starts, at), got[at, torch.arange(batch), :-1]
    )


def test_stacks_of_several_channels_keep_each_frames_channels_together():
    frames = torch.arange(3 * 2, dtype=torch.float32).view(3, 1, 2, 1)  # [S, B, c=2, 1]
    context = torch.full((1, (K - 1) * 2, 1), -1.0)
    starts = torch.tensor([[False], [False], [True]])
    got = stack_frames(context, frames, starts)[..., 0]
    assert got[1, 0].tolist() == [-1, -1, -1, -1, 0, 1, 2, 3]
    assert got[2, 0].tolist() == [4, 5] * K


def test_restack_leaves_whole_stacks_alone_and_rebuilds_frames_stored_once():
    frames = random_frames(4, 2)
    starts = torch.tensor([[True, False], [False, False], [False, True], [False, False]])
    steps = {"obs": frames, "done": starts, "action": torch.zeros(4, 2, dtype=torch.int64)}
    stacked = Unrolls({**steps, "obs": torch.zeros(4, 2, K, 2, 3)}, (), torch.zeros(2))
    assert restack(stacked) is stacked
    context = torch.zeros(2, K - 1, 2, 3, dtype=torch.uint8)
    batch = restack(Unrolls(steps, (), torch.zeros(2), obs_context=context))
    assert batch.obs_context is None and batch.steps["action"] is steps["action"]
    assert torch.equal(batch.steps["obs"], wrapper_stacks(frames, starts, context[:, :, None]))


def test_acting_side_rings_match_the_wrapper_for_any_subset_of_envs_per_step():
    envs, steps = 6, 30
    rng = np.random.default_rng(0)
    frames = random_frames(steps, envs, seed=2)
    starts = torch.from_numpy(rng.random((steps, envs)) < 0.15)
    starts[0] = True  # every env's first step starts an episode
    expected = wrapper_stacks(frames, starts)
    table = FrameStacks(K, envs, torch.device("cpu"))
    turn = np.zeros(envs, np.int64)  # each env's own step count: envs step at their own pace
    while (turn < steps).any():
        ready = np.flatnonzero((turn < steps) & (rng.random(envs) < 0.6))
        slots = torch.from_numpy(rng.permutation(ready))
        if not len(slots):
            continue
        t = torch.from_numpy(turn[slots.numpy()])
        got = table.push(slots, frames[t, slots], starts[t, slots])
        assert torch.equal(got, expected[t, slots])
        turn[slots.numpy()] += 1


def stream(envs: int, steps: int, seed: int):
    """Per-step records of ``envs`` envs: a frame, episode starts (every env's first step and
    some random ones), and the step's index and env, to find each item's true stacks."""
    rng = np.random.default_rng(seed)
    frames = random_frames(steps, envs, seed=seed)
    starts = torch.from_numpy(rng.random((steps, envs)) < 0.1)
    starts[0] = True
    return frames, starts


def build_unrolls(frames, starts, unroll: int, overlap: int, restart_at: int | None = None):
    """Unrolls the builder cuts from the stream, each env stepping every step; at
    ``restart_at`` env 0's actor restarts (its partial unroll is dropped, its step starts)."""
    steps, envs = starts.shape
    builder = UnrollBuilder(envs, unroll, overlap, frame_stack=K)
    ids, out = torch.arange(envs), []
    for t in range(steps):
        if t == restart_at:
            builder.reset(ids[:1])
        record = {
            "obs": frames[t],
            "done": starts[t],
            "action": torch.zeros(envs, dtype=torch.int64),
            "t": torch.full((envs,), t),
            "env": ids,
        }
        unrolls = builder.append(ids, record, (), 0)
        if unrolls is not None:
            out.append(unrolls)
    return out


@pytest.mark.parametrize(("unroll", "overlap"), [(5, 1), (6, 3), (4, 4)])
def test_unrolls_cut_with_overlap_carry_the_context_of_their_first_step(unroll, overlap):
    frames, starts = stream(envs=3, steps=40, seed=3)
    starts[17, 0] = True  # env 0's actor restarts there: the server forces done
    expected = wrapper_stacks(frames, starts)
    cut = build_unrolls(frames, starts, unroll, overlap, restart_at=17)
    assert sum(u.batch_size for u in cut) >= 3 * (40 // unroll - 2)
    queue = UnrollQueue(1000)
    for unrolls in cut:
        assert unrolls.steps["obs"].shape[2:] == FRAME  # frames stored once
        queue.put(unrolls)
    batch = restack(queue.get(len(queue)))  # concatenated and restacked as the learner does
    t, env = batch.steps["t"], batch.steps["env"]
    assert torch.equal(batch.steps["obs"], expected[t, env])


@pytest.mark.parametrize(
    ("unroll", "overlap", "positions", "window"),
    [(8, 3, 6, 4), (10, 5, 1, 11)],  # DQN's n-step items (n = 3), R2D2's burn-in sequences
    ids=["dqn", "r2d2"],
)
def test_replay_stores_frames_once_and_sampled_items_restack_exactly(
    unroll, overlap, positions, window
):
    frames, starts = stream(envs=4, steps=60, seed=4)
    expected = wrapper_stacks(frames, starts)
    replay = PrioritizedReplay(
        1000, positions, window, alpha=0.6, beta=0.4, min_fill=1, samples_per_insert=None, slack=0
    )
    for unrolls in build_unrolls(frames, starts, unroll, overlap):
        assert replay.put(unrolls, timeout=1)
    assert replay._steps["obs"].shape[2:] == FRAME  # one frame per stored step
    assert replay._contexts.shape[1:] == ((K - 1) * FRAME[0], *FRAME[1:])
    for _ in range(5):
        batch = replay.get(32, timeout=1)
        assert batch.obs_context is not None
        batch = restack(batch)
        t, env = batch.steps["t"], batch.steps["env"]
        assert batch.steps["obs"].shape == (window, 32, K, *FRAME[1:])
        assert torch.equal(batch.steps["obs"], expected[t, env])
        if positions > 1:
            assert (t[0] % (unroll + 1 - overlap) != 0).any()  # items starting mid-row


def test_a_million_atari_dqn_transitions_with_learner_stacks_fit_in_8_gb():
    """Atari DQN's default layout stores unroll + 1 frames and 3 of context per row of
    unroll - n + 1 items; the rest of a stored step is under 100 bytes (measured by the Atari
    run in tests/runtime/test_train.py)."""
    config = resolve([{"env": "atari:Pong", "agent": "dqn", "frame_stack_on": "learner"}])
    layout = config.agent.layout(config.train.unroll)
    frames_per_item = (layout.unroll + 1 + K - 1) / layout.positions
    assert 1_000_000 * (frames_per_item * 84 * 84 + 100) < 8e9, frames_per_item
