"""Per-environment unrolls of T+1 steps, built for many environments at once.

Each environment has a row in preallocated buffers ``[num_envs, T+1, ...]`` and a write position.
Appending a step for a set of environments is one indexed write per field; the environments whose
unroll filled are cut out together as one batch, and their last step is copied to position 0 so
consecutive unrolls share it (it bootstraps the first, and starts the second).
"""

from __future__ import annotations

import torch

from seedbed.agents.base import State, Unrolls


class UnrollBuilder:
    """Assembles unrolls from steps that arrive for arbitrary subsets of environments."""

    def __init__(self, num_envs: int, unroll_length: int) -> None:
        self.num_envs = num_envs
        self.length = unroll_length + 1  # steps stored per unroll
        self._buffers: dict[str, torch.Tensor] = {}
        self._start_state: State | None = None
        self._start_version = torch.zeros(num_envs, dtype=torch.int64)
        self._pos = torch.zeros(num_envs, dtype=torch.int64)

    def reset(self, env_ids: torch.Tensor) -> None:
        """Drop the partial unrolls of ``env_ids`` (their actor restarted)."""
        self._pos[env_ids] = 0

    def _allocate(self, step: dict[str, torch.Tensor], state: State) -> None:
        for key, value in step.items():
            shape = (self.num_envs, self.length, *value.shape[1:])
            self._buffers[key] = torch.zeros(shape, dtype=value.dtype)
        self._start_state = tuple(
            torch.zeros((self.num_envs, *s.shape[1:]), dtype=s.dtype) for s in state
        )

    def append(
        self, env_ids: torch.Tensor, step: dict[str, torch.Tensor], state: State, version: int
    ) -> Unrolls | None:
        """Add one step for each of ``env_ids``; return the unrolls this completed, if any.

        Args:
            env_ids: [k] int64 environment ids, each at most once.
            step: fields of this step, each [k, ...] on the CPU.
            state: the recurrent state the step was acted from (before it), each [k, ...].
            version: the parameter version that acted.
        """
        if not self._buffers:
            self._allocate(step, state)
        pos = self._pos[env_ids]
        starting = pos == 0
        if starting.any():
            self._mark_start(env_ids[starting], tuple(s[starting] for s in state), version)
        for key, value in step.items():
            self._buffers[key][env_ids, pos] = value
        pos += 1
        self._pos[env_ids] = pos
        full = pos == self.length
        if not full.any():
            return None
        done_ids = env_ids[full]
        unrolls = Unrolls(
            {key: buf[done_ids].transpose(0, 1) for key, buf in self._buffers.items()},
            tuple(s[done_ids] for s in self._start_state),
            self._start_version[done_ids],
        )
        # The last step opens the next unroll; the state before it is its initial state.
        for buf in self._buffers.values():
            buf[done_ids, 0] = buf[done_ids, -1]
        self._mark_start(done_ids, tuple(s[full] for s in state), version)
        self._pos[done_ids] = 1
        return unrolls

    def _mark_start(self, env_ids: torch.Tensor, state: State, version: int) -> None:
        for table, rows in zip(self._start_state, state, strict=True):
            table[env_ids] = rows
        self._start_version[env_ids] = version
