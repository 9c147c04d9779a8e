"""Unroll assembly on hand-built sequences: overlap, episode ends, resets, interleaved envs."""

from __future__ import annotations

import pytest
import torch

from seedbed.inference.unrolls import UnrollBuilder


def step(values: list[float], done: list[bool] | None = None) -> dict[str, torch.Tensor]:
    v = torch.tensor(values)
    d = torch.tensor(done if done is not None else [False] * len(values))
    return {"obs": v[:, None].repeat(1, 2), "action": v.long(), "done": d}


def state(values: list[float]) -> tuple[torch.Tensor]:
    return (torch.tensor(values)[:, None].repeat(1, 3),)


def test_consecutive_unrolls_share_one_step():
    b = UnrollBuilder(num_envs=1, unroll_length=3)
    ids = torch.tensor([0])
    out = [b.append(ids, step([t]), state([100 + t]), version=t) for t in range(10)]
    full = [(t, u) for t, u in enumerate(out) if u is not None]
    assert [t for t, _ in full] == [3, 6, 9]
    for k, (_, u) in enumerate(full):
        first = 3 * k
        assert u.steps["action"][:, 0].tolist() == [first, first + 1, first + 2, first + 3]
        assert u.steps["obs"].shape == (4, 1, 2)
        assert u.initial_state[0][0].tolist() == [100.0 + first] * 3  # state before step 0
        assert u.policy_version.tolist() == [first]


@pytest.mark.parametrize("overlap", [2, 4])
def test_consecutive_unrolls_share_overlap_steps_with_their_state(overlap):
    # Replay agents' sequences: unrolls of 5 + 1 steps, a new one every 6 - overlap steps.
    b = UnrollBuilder(num_envs=1, unroll_length=5, overlap=overlap)
    ids = torch.tensor([0])
    out = [b.append(ids, step([t]), state([100 + t]), version=t) for t in range(20)]
    full = [u for u in out if u is not None]
    stride = 6 - overlap
    assert len(full) == 1 + (20 - 6) // stride
    for k, u in enumerate(full):
        first = stride * k
        assert u.steps["action"][:, 0].tolist() == list(range(first, first + 6))
        assert u.initial_state[0][0].tolist() == [100.0 + first] * 3  # state before step 0
        assert u.policy_version.tolist() == [first]


def test_overlap_must_leave_new_steps():
    with pytest.raises(ValueError, match="overlap"):
        UnrollBuilder(num_envs=1, unroll_length=3, overlap=4)


def test_episode_ends_stay_in_place():
    b = UnrollBuilder(num_envs=1, unroll_length=4)
    ids = torch.tensor([0])
    dones = [True, False, False, True, False]
    for t, d in enumerate(dones):
        u = b.append(ids, step([t], [d]), state([0]), version=0)
    assert u.steps["done"][:, 0].tolist() == dones


def test_interleaved_envs_and_subsets():
    b = UnrollBuilder(num_envs=3, unroll_length=2)
    emitted = []
    # env 0 steps every call, env 1 every other call, env 2 only once.
    for t in range(6):
        ids = [0] + ([1] if t % 2 == 0 else []) + ([2] if t == 0 else [])
        u = b.append(torch.tensor(ids), step([10 * i + t for i in ids]), state([0] * len(ids)), 0)
        if u is not None:
            emitted.append((t, u))
    by_time = {t: u for t, u in emitted}
    assert by_time[2].steps["action"][:, 0].tolist() == [0, 1, 2]
    assert by_time[4].steps["action"][:, 0].tolist() == [2, 3, 4]
    assert by_time[4].steps["action"][:, 1].tolist() == [10, 12, 14]
    assert sum(u.batch_size for _, u in emitted) == 3


def test_reset_drops_partial_unroll():
    b = UnrollBuilder(num_envs=2, unroll_length=2)
    ids = torch.tensor([0, 1])
    b.append(ids, step([1, 1]), state([1, 1]), 0)
    b.append(ids, step([2, 2]), state([2, 2]), 0)
    b.reset(torch.tensor([1]))
    u = b.append(ids, step([3, 3]), state([3, 3]), 0)
    assert u.batch_size == 1 and u.steps["action"][:, 0].tolist() == [1, 2, 3]
    b.append(ids, step([4, 4]), state([4, 4]), 0)
    u = b.append(torch.tensor([1]), step([5]), state([5]), 7)
    assert u.steps["action"][:, 0].tolist() == [3, 4, 5]  # env 1 restarted at step 3
    assert u.initial_state[0][0, 0].item() == 3.0
    assert u.policy_version.tolist() == [0]
