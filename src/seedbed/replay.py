"""Where unrolls wait for the learner: a bounded FIFO queue (on-policy agents)."""

from __future__ import annotations

import collections
import threading

import torch

from seedbed.agents.base import Unrolls


def concat_unrolls(parts: list[Unrolls]) -> Unrolls:
    """Join batches of unrolls along the batch dimension."""
    if len(parts) == 1:
        return parts[0]
    return Unrolls(
        {key: torch.cat([p.steps[key] for p in parts], dim=1) for key in parts[0].steps},
        tuple(torch.cat(s, dim=0) for s in zip(*(p.initial_state for p in parts), strict=True)),
        torch.cat([p.policy_version for p in parts]),
    )


def split_unrolls(unrolls: Unrolls, n: int) -> tuple[Unrolls, Unrolls]:
    """The first ``n`` unrolls of a batch, and the rest."""
    head = Unrolls(
        {k: v[:, :n] for k, v in unrolls.steps.items()},
        tuple(s[:n] for s in unrolls.initial_state),
        unrolls.policy_version[:n],
    )
    tail = Unrolls(
        {k: v[:, n:] for k, v in unrolls.steps.items()},
        tuple(s[n:] for s in unrolls.initial_state),
        unrolls.policy_version[n:],
    )
    return head, tail


class UnrollQueue:
    """A FIFO of unrolls bounded by a count; producers wait while it is full (backpressure)."""

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._parts: collections.deque[Unrolls] = collections.deque()
        self._size = 0
        self._cond = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        return self._size

    def put(self, unrolls: Unrolls, timeout: float | None = None) -> bool:
        """Add a batch of unrolls; False if it timed out while full or the queue closed."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._closed or self._size < self.capacity, timeout):
                return False
            if self._closed:
                return False
            self._parts.append(unrolls)
            self._size += unrolls.batch_size
            self._cond.notify_all()
            return True

    def get(self, batch_size: int, timeout: float | None = None) -> Unrolls | None:
        """Take exactly ``batch_size`` unrolls in arrival order, or None on timeout or close."""
        with self._cond:
            if not self._cond.wait_for(lambda: self._closed or self._size >= batch_size, timeout):
                return None
            if self._size < batch_size:
                return None
            taken, count = [], 0
            while count < batch_size:
                part = self._parts.popleft()
                if count + part.batch_size > batch_size:
                    part, rest = split_unrolls(part, batch_size - count)
                    self._parts.appendleft(rest)
                taken.append(part)
                count += part.batch_size
            self._size -= batch_size
            self._cond.notify_all()
        return concat_unrolls(taken)

    def close(self) -> None:
        """Wake every waiter; later puts and gets return at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()
