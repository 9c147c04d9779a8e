"""Per-environment unrolls of T+1 steps, built for many environments at once.

Each environment has a row in preallocated buffers ``[num_envs, T+1, ...]`` and a write position.
Appending a step for a set of environments is one indexed write per field; the environments whose
unroll filled are cut out together as one batch, and their last ``overlap`` steps are copied to
the front so consecutive unrolls share them. With one shared step (V-trace) the last step
bootstraps the first unroll and starts the second; replay agents share more (R2D2's sequences
overlap by their burn-in and more, DQN's by its n-step window).

With ``frame_stack`` k > 1 each step's ``obs`` is one frame, and each env also keeps the context
of its open unroll (the k - 1 older frames of the stack at its first step), which the cut unroll
carries as ``Unrolls.obs_context``; the next unroll's context is the stack at the step it starts
from, found by ``framestack.stack_context``. An env's first step, and its first after ``reset``,
must start an episode (central inference makes sure): its context is then never read.
"""

from __future__ import annotations

import torch

from seedbed.framestack import stack_context
from seedbed.types import State, Unrolls


class UnrollBuilder:
    """Assembles unrolls from steps that arrive for arbitrary subsets of environments."""

    def __init__(
        self, num_envs: int, unroll_length: int, overlap: int = 1, frame_stack: int = 1
    ) -> None:
        if not 1 <= overlap <= unroll_length:
            raise ValueError(f"overlap must lie in [1, {unroll_length}], got {overlap}")
        self.num_envs = num_envs
        self.length = unroll_length + 1  # steps stored per unroll
        self.overlap = overlap
        self.frame_stack = frame_stack
        self._contexts: torch.Tensor | None = None  # [num_envs, (k-1) * c, ...] with stacking
        self._buffers: dict[str, torch.Tensor] = {}
        # The recurrent state and parameter version before each stored step: an unroll that
        # starts at a shared step needs them.
        self._states: State = ()
        self._versions = torch.zeros(num_envs, self.length, dtype=torch.int64)
        self._pos = torch.zeros(num_envs, dtype=torch.int64)

    def reset(self, env_ids: torch.Tensor) -> None:
        """Drop the partial unrolls of ``env_ids`` (their actor restarted)."""
        self._pos[env_ids] = 0

    def _allocate(self, step: dict[str, torch.Tensor], state: State) -> None:
        for key, value in step.items():
            shape = (self.num_envs, self.length, *value.shape[1:])
            self._buffers[key] = torch.zeros(shape, dtype=value.dtype)
        self._states = tuple(
            torch.zeros((self.num_envs, self.length, *s.shape[1:]), dtype=s.dtype) for s in state
        )
        if self.frame_stack > 1:
            frame = step["obs"].shape[1:]
            shape = (self.num_envs, (self.frame_stack - 1) * frame[0], *frame[1:])
            self._contexts = torch.zeros(shape, dtype=step["obs"].dtype)

    def append(
        self,
        env_ids: torch.Tensor,
        step: dict[str, torch.Tensor],
        state: State,
        version: int | torch.Tensor,
    ) -> Unrolls | None:
        """Add one step for each of ``env_ids``; return the unrolls this completed, if any.

        Args:
            env_ids: [k] int64 environment ids, each at most once.
            step: fields of this step, each [k, ...] on the CPU.
            state: the recurrent state the step was acted from (before it), each [k, ...].
            version: the parameter version that acted: one for all, or [k] (local actors).
        """
        if not self._buffers:
            self._allocate(step, state)
        pos = self._pos[env_ids]
        for key, value in step.items():
            self._buffers[key][env_ids, pos] = value
        for table, rows in zip(self._states, state, strict=True):
            table[env_ids, pos] = rows
        self._versions[env_ids, pos] = version
        pos += 1
        self._pos[env_ids] = pos
        full = pos == self.length
        if not full.any():
            return None
        done_ids = env_ids[full]
        unrolls = Unrolls(
            {key: buf[done_ids].transpose(0, 1) for key, buf in self._buffers.items()},
            tuple(table[done_ids, 0] for table in self._states),
            self._versions[done_ids, 0],
            obs_context=None if self._contexts is None else self._contexts[done_ids],
        )
        # The last steps open the next unroll, with the state, version and stack from before.
        first_shared = self.length - self.overlap
        if unrolls.obs_context is not None:
            steps = unrolls.steps
            self._contexts[done_ids] = stack_context(
                unrolls.obs_context, steps["obs"], steps["done"], first_shared
            )
        shared = slice(first_shared, self.length)
        for buf in (*self._buffers.values(), *self._states, self._versions):
            buf[done_ids, : self.overlap] = buf[done_ids, shared]
        self._pos[done_ids] = self.overlap
        return unrolls
