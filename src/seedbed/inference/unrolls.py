"""Per-environment unrolls of T+1 steps, built for many environments at once.

Every field has one buffer ``[T+1, num_envs, ...]``, made at the first step, and each
environment a write position. Appending a step for a set of environments is one indexed write
per field; the environments whose unroll filled are cut out together as one batch, and their
last ``overlap`` steps are copied to the front so consecutive unrolls share them. With one shared
step (V-trace) the last step bootstraps the first unroll and starts the second; replay agents
share more (R2D2's sequences overlap by their burn-in and more, DQN's by its n-step window).

The buffers are time-major and written through numpy: in the common case (an actor's envs, rows
``[a*E, (a+1)*E)``, all at the same position, as central inference serves them) a step writes one
contiguous block per field, with no allocation and no torch call (a torch call lets the learner's
thread take the interpreter lock, and the inference thread then waits to get it back). A cut
copies each field once, into the batch-major layout unrolls have always had.

With ``frame_stack`` k > 1 each step's ``obs`` is one frame, and each env also keeps the context
of its open unroll (the k - 1 older frames of the stack at its first step), which the cut unroll
carries as ``Unrolls.obs_context``; the next unroll's context is the stack at the step it starts
from, found by ``framestack.stack_context``. An env's first step, and its first after ``reset``,
must start an episode (central inference makes sure): its context is then never read.
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch

from seedbed.framestack import stack_context
from seedbed.types import State, Unrolls

Rows = slice | np.ndarray  # envs as a slice of consecutive ids, or an int64 array of ids


def env_rows(env_ids: Any) -> tuple[np.ndarray, Rows]:
    """``env_ids`` ([k] int64, numpy or a CPU tensor) as an array, and as the cheapest index
    of the same rows in the same order: a slice where they are consecutive and ascending (an
    actor's envs), else the array."""
    ids = env_ids.numpy() if isinstance(env_ids, torch.Tensor) else np.asarray(env_ids, np.int64)
    n = len(ids)
    # Ids are distinct, so ascending ids that span n are consecutive.
    if n and ids[-1] - ids[0] == n - 1 and (n < 3 or (ids[1:] > ids[:-1]).all()):
        first = int(ids[0])
        return ids, slice(first, first + n)
    return ids, ids


def as_array(value: Any) -> np.ndarray:
    """A step field as a numpy array (a CPU view of a tensor, copied off another device)."""
    if isinstance(value, torch.Tensor):
        if value.requires_grad or value.device.type != "cpu":
            value = value.detach().cpu()
        return value.numpy()
    return np.asarray(value)


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
        self._buffers: dict[str, np.ndarray] = {}  # field -> [length, num_envs, ...]
        # The recurrent state and parameter version before each stored step: an unroll that
        # starts at a shared step needs them.
        self._states: State = ()  # each [length, num_envs, ...]
        self._versions = np.zeros((self.length, num_envs), np.int64)
        self._pos = np.zeros(num_envs, np.int64)
        self._allocating = threading.Lock()  # threads appending for other envs may race to it

    def reset(self, env_ids: Any) -> None:
        """Drop the partial unrolls of ``env_ids`` (their actor restarted)."""
        self._pos[env_rows(env_ids)[1]] = 0

    def _allocate(self, step: dict[str, np.ndarray], state: State) -> None:
        with self._allocating:
            if self._buffers:
                return  # another thread's first step came first
            self._states = tuple(
                torch.zeros((self.length, self.num_envs, *s.shape[1:]), dtype=s.dtype)
                for s in state
            )
            if self.frame_stack > 1:
                frame = step["obs"].shape[1:]
                shape = (self.num_envs, (self.frame_stack - 1) * frame[0], *frame[1:])
                self._contexts = torch.from_numpy(np.zeros(shape, dtype=step["obs"].dtype))
            # Last, and whole: a thread that sees buffers sees everything made with them.
            self._buffers = {
                key: np.zeros((self.length, self.num_envs, *value.shape[1:]), dtype=value.dtype)
                for key, value in step.items()
            }

    def append(
        self,
        env_ids: Any,
        step: dict[str, Any],
        state: State,
        version: int | np.ndarray | torch.Tensor,
    ) -> Unrolls | None:
        """Add one step for each of ``env_ids``; return the unrolls this completed, if any.

        Args:
            env_ids: [k] int64 environment ids, each at most once (numpy or a CPU tensor).
            step: fields of this step, each [k, ...] (numpy, or tensors); copied here.
            state: the recurrent state the step was acted from (before it), each [k, ...].
            version: the parameter version that acted: one for all, or [k] (local actors).
        """
        ids, rows = env_rows(env_ids)
        step = {key: as_array(value) for key, value in step.items()}
        if not self._buffers:
            self._allocate(step, state)
        pos = self._pos[rows]
        at_pos: Any = int(pos[0]) if len(pos) else 0
        at = (at_pos, rows)
        if not (pos == at_pos).all():
            at_pos = pos.copy()  # envs at different positions: one (position, env) pair each
            at = (at_pos, ids)
        for key, value in step.items():
            self._buffers[key][at] = value
        if state:
            t_at = (torch.from_numpy(np.asarray(at_pos)), torch.from_numpy(ids))
            for table, rows_state in zip(self._states, state, strict=True):
                table[t_at] = rows_state.cpu()
        self._versions[at] = as_array(version)
        self._pos[rows] = pos + 1
        if isinstance(at_pos, int):
            if at_pos + 1 < self.length:
                return None
            return self._cut(rows, ids)
        full = at_pos + 1 == self.length
        if not full.any():
            return None
        full_ids = ids[full]
        return self._cut(full_ids, full_ids)

    def _cut(self, rows: Rows, ids: np.ndarray) -> Unrolls:
        """The full unrolls of ``rows`` (ids ``ids``) as a batch; their last ``overlap`` steps
        open their next unrolls, with the state, version and stack context from before."""
        t_ids = torch.from_numpy(ids)
        unrolls = Unrolls(
            {key: _batch_major(buf, rows).transpose(0, 1) for key, buf in self._buffers.items()},
            tuple(table[0, t_ids] for table in self._states),
            torch.from_numpy(self._versions[0, rows].copy()),
            obs_context=None if self._contexts is None else self._contexts[t_ids],
        )
        first_shared = self.length - self.overlap
        if unrolls.obs_context is not None:
            steps = unrolls.steps
            self._contexts[t_ids] = stack_context(
                unrolls.obs_context, steps["obs"], steps["done"], first_shared
            )
        shared = slice(first_shared, self.length)
        for buf in (*self._buffers.values(), self._versions):
            buf[: self.overlap, rows] = buf[shared, rows]
        for table in self._states:
            table[: self.overlap, t_ids] = table[shared, t_ids]
        self._pos[rows] = self.overlap
        return unrolls


def _batch_major(buf: np.ndarray, rows: Rows) -> torch.Tensor:
    """A copy of ``buf[:, rows]`` laid out batch-major, ``[k, T+1, ...]``: the layout unrolls
    have always had (time-major views of it), which the learner's arithmetic follows."""
    part = buf.swapaxes(0, 1)[rows]
    # A slice is a view, and one that may look contiguous already (k = 1): copy it.
    return torch.from_numpy(part.copy() if isinstance(rows, slice) else np.ascontiguousarray(part))
