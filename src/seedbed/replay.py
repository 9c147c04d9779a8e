"""Where unrolls wait for the learner: a FIFO for on-policy agents, prioritized replay for others.

Both are a ``seedbed.types.Buffer``, whose docstring shows the order the runtime calls them in:
the inference thread puts, the learner thread gets and hands each batch back after learning.

``UnrollQueue`` is a bounded FIFO: each unroll is learned from once, in arrival order, and the
actors wait while it is full. ``PrioritizedReplay`` keeps unrolls in a ring of rows, splits each
row into fixed-length windows ("items"), draws items in proportion to priority ** alpha through a
``SumTree``, and keeps sampling and inserting near a fixed ratio by making one side wait.

Unrolls whose frames are stored once (``Unrolls.obs_context``: the learner stacks frames) stay
so in both: a row keeps its frames and its context, and an item that starts mid-row gets the
context of its first step (``framestack.stack_context``); the learner loop rebuilds the stacks.
"""

from __future__ import annotations

import collections
import threading

import numpy as np
import torch

from seedbed.framestack import stack_context
from seedbed.types import ReplayInfo, Unrolls


def _cat_contexts(parts: list[Unrolls]) -> torch.Tensor | None:
    if parts[0].obs_context is None:
        return None
    return torch.cat([p.obs_context for p in parts])


def concat_unrolls(parts: list[Unrolls]) -> Unrolls:
    """Join batches of unrolls along the batch dimension."""
    if len(parts) == 1:
        return parts[0]
    return Unrolls(
        {key: torch.cat([p.steps[key] for p in parts], dim=1) for key in parts[0].steps},
        tuple(torch.cat(s, dim=0) for s in zip(*(p.initial_state for p in parts), strict=True)),
        torch.cat([p.policy_version for p in parts]),
        obs_context=_cat_contexts(parts),
    )


def split_unrolls(unrolls: Unrolls, n: int) -> tuple[Unrolls, Unrolls]:
    """The first ``n`` unrolls of a batch, and the rest."""
    context = unrolls.obs_context
    head = Unrolls(
        {k: v[:, :n] for k, v in unrolls.steps.items()},
        tuple(s[:n] for s in unrolls.initial_state),
        unrolls.policy_version[:n],
        obs_context=None if context is None else context[:n],
    )
    tail = Unrolls(
        {k: v[:, n:] for k, v in unrolls.steps.items()},
        tuple(s[n:] for s in unrolls.initial_state),
        unrolls.policy_version[n:],
        obs_context=None if context is None else context[n:],
    )
    return head, tail


class UnrollQueue:
    """A FIFO of unrolls bounded by a count; producers wait while it is full (backpressure).

    In lockstep (``hold_acting``) acting waits as well, while a whole batch is waiting here or
    in the learner's hands: each batch is then acted by the policy that learned the one before.
    """

    def __init__(self, capacity: int) -> None:
        self.capacity = capacity
        self._parts: collections.deque[Unrolls] = collections.deque()
        self._size = 0
        self._learning = 0  # unrolls taken by ``get`` and not yet ``learned``
        self._hold_at: int | None = None
        self._cond = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        return self._size

    def hold_acting(self, batch_size: int) -> None:
        """Lockstep: ``may_act`` waits while ``batch_size`` unrolls are waiting or learned from.

        Acting is never held while fewer are, so the learner always gets a full batch (envs
        whose unrolls end out of step cannot leave it short)."""
        with self._cond:
            self._hold_at = batch_size

    def may_act(self, timeout: float | None = None) -> bool:
        """Whether acting may go on: at once unless held (``hold_acting``); False if it was
        still held after ``timeout`` or the queue closed."""
        with self._cond:
            if self._hold_at is None:
                return not self._closed
            held = self._hold_at
            return (
                self._cond.wait_for(
                    lambda: self._closed or self._size + self._learning < held, timeout
                )
                and not self._closed
            )

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
            self._learning += batch_size
            self._cond.notify_all()
        return concat_unrolls(taken)

    def learned(self, batch: Unrolls) -> None:
        """The learner is done with ``batch`` (and has published what it learned): in
        lockstep, acting may go on. A FIFO has no priorities to record."""
        with self._cond:
            self._learning = max(0, self._learning - batch.batch_size)
            self._cond.notify_all()

    def stats(self) -> None:
        """None: a FIFO's unrolls are each learned from once, so there is nothing to report."""

    def close(self) -> None:
        """Wake every waiter; later puts and gets return at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()


class SumTree:
    """Sums of non-negative leaf values, so that leaves can be drawn in proportion to their value.

    Array layout: node 1 is the root, node i has children 2i and 2i + 1, and the leaves are nodes
    ``capacity .. 2 * capacity - 1``, with ``capacity`` the size rounded up to a power of two
    (the padding leaves stay 0). Parents are always recomputed as left + right, never adjusted by
    a difference, so the sums cannot drift however many updates there are.
    """

    def __init__(self, size: int) -> None:
        if size < 1:
            raise ValueError(f"a sum tree needs at least one leaf, got size={size}")
        self.size = size
        self._capacity = 1 << (size - 1).bit_length()
        self._depth = self._capacity.bit_length() - 1
        self._nodes = np.zeros(2 * self._capacity, dtype=np.float64)

    @property
    def total(self) -> float:
        """The sum of all leaves."""
        return float(self._nodes[1])

    def get(self, indices: np.ndarray) -> np.ndarray:
        """The values of the leaves at ``indices`` (a copy)."""
        return self._nodes[np.asarray(indices, dtype=np.int64) + self._capacity]

    __getitem__ = get

    def update(self, indices: np.ndarray, values: np.ndarray) -> None:
        """Set leaves (for a repeated index the last value wins), then their ancestors."""
        indices = np.asarray(indices, dtype=np.int64).ravel()
        values = np.asarray(values, dtype=np.float64).ravel()
        if indices.shape != values.shape:
            raise ValueError(f"{indices.size} indices but {values.size} values")
        if indices.size == 0:
            return
        if indices.min() < 0 or indices.max() >= self.size:
            raise IndexError(f"leaf index out of range [0, {self.size})")
        if not np.all(np.isfinite(values) & (values >= 0)):
            raise ValueError("sum tree values must be finite and >= 0")
        # np.unique over the reversed order finds each index's last occurrence.
        last = indices.size - 1 - np.unique(indices[::-1], return_index=True)[1]
        nodes = indices[last] + self._capacity
        self._nodes[nodes] = values[last]
        nodes = np.unique(nodes // 2)
        while nodes[0] >= 1:  # one level per pass, up to the root (whose parent is 0)
            self._nodes[nodes] = self._nodes[2 * nodes] + self._nodes[2 * nodes + 1]
            nodes = np.unique(nodes // 2)

    def sample(self, n: int, rng: np.random.Generator) -> np.ndarray:
        """Draw ``n`` leaf indices with probability value / total, one per stratum of the total.

        Stratified draws (u_i in the i-th of n equal slices of [0, total)) cover the leaves more
        evenly than independent ones, with the same marginal probabilities.
        """
        total = self.total
        if total <= 0:
            raise ValueError("cannot sample from a sum tree whose total is 0")
        u = (np.arange(n) + rng.random(n)) * (total / n)
        u = np.minimum(u, np.nextafter(total, 0.0))
        nodes = np.ones(n, dtype=np.int64)
        for _ in range(self._depth):
            left = self._nodes[2 * nodes]
            right = self._nodes[2 * nodes + 1]
            # Rounding can push u past the left sum with nothing to the right; every node on the
            # path is > 0 and equals left + right, so one of its children always is > 0.
            go_right = ((u >= left) & (right > 0)) | (left <= 0)
            u = np.where(go_right, u - left, u)
            nodes = 2 * nodes + go_right
        return nodes - self._capacity


class PrioritizedReplay:
    """Off-policy replay of fixed-length windows, drawn by priority, at a bounded sample rate.

    Each unroll put becomes one row of a ring of ``capacity // positions`` rows (the oldest is
    overwritten first). Row r holds the items ``r * positions + p`` for ``p < positions``; item
    (r, p) is the ``window`` steps ``p .. p + window - 1`` of that row. A new item gets the largest
    priority seen so far, so it is drawn soon; priorities the learner sends back (``learned``) are
    dropped for items whose row was overwritten since they were drawn.

    The rate limiter, like Reverb's SampleToInsertRatio, counts items: with ``inserted`` and
    ``sampled`` totals, ``owed = samples_per_insert * (inserted - min_fill) - sampled``. ``get``
    waits until ``min_fill`` items are stored and ``owed >= batch_size``; ``put`` waits while
    ``owed > slack`` (never before ``min_fill`` items are stored). Use ``slack >= batch_size``:
    then whenever one side waits the other may go, so the two threads cannot both wait forever.
    ``samples_per_insert=None`` turns the limiter off.

    Args:
        capacity: items to keep; rounded down to a whole number of rows.
        positions: items per row (window start offsets 0 .. positions - 1).
        window: steps per item.
        alpha: priority exponent; 0 draws uniformly.
        beta: importance-sampling exponent; 1 corrects the non-uniform draws fully.
        min_fill: items stored before the first ``get``.
        samples_per_insert: items sampled per item inserted, or None for no limit.
        slack: how far sampling may fall behind before ``put`` waits, in items.
        seed: of the sampling generator.
    """

    def __init__(
        self,
        capacity: int,
        positions: int,
        window: int,
        *,
        alpha: float,
        beta: float,
        min_fill: int,
        samples_per_insert: float | None,
        slack: int,
        seed: int = 0,
    ) -> None:
        if positions < 1 or window < 1:
            raise ValueError(f"positions ({positions}) and window ({window}) must be >= 1")
        if capacity < positions:
            raise ValueError(f"capacity ({capacity}) must hold one row of {positions} items")
        rows = max(1, capacity // positions)
        if not 0 <= min_fill <= rows * positions:
            raise ValueError(f"min_fill ({min_fill}) must be in [0, {rows * positions}] items")
        if alpha < 0 or beta < 0:
            raise ValueError(f"alpha ({alpha}) and beta ({beta}) must be >= 0")
        if samples_per_insert is not None and samples_per_insert <= 0:
            raise ValueError(f"samples_per_insert ({samples_per_insert}) must be > 0 or None")
        if slack < 0:
            raise ValueError(f"slack ({slack}) must be >= 0")
        self._rows = rows
        self._positions = positions
        self._window = window
        self._alpha = alpha
        self._beta = beta
        self._min_fill = min_fill
        self._ratio = samples_per_insert
        self._slack = slack
        self._rng = np.random.default_rng(seed)
        self._tree = SumTree(rows * positions)
        self._max_priority = 1.0
        self._generation = np.zeros(rows, dtype=np.int64)
        self._steps: dict[str, torch.Tensor] | None = None  # [rows, S, ...], on the first put
        self._states: tuple[torch.Tensor, ...] = ()  # [rows, ...]
        self._contexts: torch.Tensor | None = None  # [rows, ...]: Unrolls.obs_context, if any
        self._versions = torch.zeros(rows, dtype=torch.int64)
        self._next = 0  # the row the next unroll overwrites
        self._filled = 0  # rows written so far, up to rows
        self._inserted = 0
        self._sampled = 0
        self._cond = threading.Condition()
        self._closed = False

    def __len__(self) -> int:
        return self._filled * self._positions

    def stats(self) -> dict[str, int]:
        """Items stored, inserted and sampled so far, and the bytes of the ring's storage (for
        logging; the ring is allocated whole at the first put)."""
        with self._cond:
            return {
                "items": len(self),
                "inserted": self._inserted,
                "sampled": self._sampled,
                "bytes": self.nbytes,
            }

    @property
    def nbytes(self) -> int:
        """Bytes of the ring's storage: steps, recurrent states, obs contexts and versions."""
        if self._steps is None:
            return 0
        buffers = [*self._steps.values(), *self._states, self._versions]
        if self._contexts is not None:
            buffers.append(self._contexts)
        return sum(b.numel() * b.element_size() for b in buffers)

    def put(self, unrolls: Unrolls, timeout: float | None = None) -> bool:
        """Store a batch of unrolls as rows; False if the rate limiter timed out or closed."""
        steps = {k: v.detach().cpu() for k, v in unrolls.steps.items()}
        states = tuple(s.detach().cpu() for s in unrolls.initial_state)
        context = None if unrolls.obs_context is None else unrolls.obs_context.detach().cpu()
        versions = unrolls.policy_version.detach().to("cpu", torch.int64)
        with self._cond:
            self._check_layout(steps, states, context)
            if not self._cond.wait_for(lambda: self._closed or not self._put_waits(), timeout):
                return False
            if self._closed:
                return False
            if self._steps is None:
                self._allocate(steps, states, context)
            self._write(steps, states, context, versions, unrolls.batch_size)
            self._cond.notify_all()
            return True

    def get(self, batch_size: int, timeout: float | None = None) -> Unrolls | None:
        """Draw ``batch_size`` items by priority, time-major; None on timeout or close."""

        def ready() -> bool:
            return self._closed or self._get_allowed(batch_size)

        with self._cond:
            if not self._cond.wait_for(ready, timeout) or self._closed:
                return None
            batch = self._gather(self._tree.sample(batch_size, self._rng))
            self._sampled += batch_size
            self._cond.notify_all()
        return batch

    def learned(self, batch: Unrolls) -> None:
        """Store the priorities the learner set on a batch from ``get``, unless overwritten since.

        Priorities may be on any device; they become ``p + 1e-6`` so no item is left undrawable.
        Items whose priority is NaN or infinite keep the one they had.
        """
        info = batch.replay
        if info is None or info.priorities is None:
            return
        priorities = info.priorities.detach().to("cpu", torch.float64).numpy().ravel()
        items = info.indices.detach().to("cpu", torch.int64).numpy().ravel()
        generations = info.generations.detach().to("cpu", torch.int64).numpy().ravel()
        if not priorities.shape == items.shape == generations.shape:
            raise ValueError(f"{priorities.size} priorities for {items.size} items")
        if np.any(priorities < 0):
            raise ValueError("priorities must be >= 0")
        with self._cond:
            # An item whose priority is not finite keeps the one it has: a learner fed a
            # non-finite value skips the step, and this must not end the run.
            fresh = np.isfinite(priorities)
            fresh &= self._generation[items // self._positions] == generations
            priorities = priorities[fresh] + 1e-6
            if priorities.size:
                self._max_priority = max(self._max_priority, float(priorities.max()))
            self._tree.update(items[fresh], priorities**self._alpha)

    def close(self) -> None:
        """Wake every waiter; later puts and gets return at once."""
        with self._cond:
            self._closed = True
            self._cond.notify_all()

    def _owed(self) -> float:
        return self._ratio * (self._inserted - self._min_fill) - self._sampled

    def _get_allowed(self, batch_size: int) -> bool:
        if len(self) < max(self._min_fill, 1):
            return False
        return self._ratio is None or self._owed() >= batch_size

    def _put_waits(self) -> bool:
        return (
            self._ratio is not None and len(self) >= self._min_fill and self._owed() > self._slack
        )

    def _allocate(
        self,
        steps: dict[str, torch.Tensor],
        states: tuple[torch.Tensor, ...],
        context: torch.Tensor | None,
    ) -> None:
        """The ring's storage, shaped by the first put."""
        self._steps = {
            k: torch.empty((self._rows, v.shape[0], *v.shape[2:]), dtype=v.dtype)
            for k, v in steps.items()
        }
        self._states = tuple(torch.empty((self._rows, *s.shape[1:]), dtype=s.dtype) for s in states)
        if context is not None:
            self._contexts = torch.empty((self._rows, *context.shape[1:]), dtype=context.dtype)

    def _check_layout(
        self,
        steps: dict[str, torch.Tensor],
        states: tuple[torch.Tensor, ...],
        context: torch.Tensor | None,
    ) -> None:
        length = steps["action"].shape[0]
        if self._positions - 1 + self._window > length:
            raise ValueError(
                f"items need positions - 1 + window <= unroll steps, got {self._positions} - 1 + "
                f"{self._window} > {length}"
            )
        if states and self._positions != 1:
            raise ValueError(
                "a recurrent initial state is known only at an unroll's first step: use "
                f"positions=1 (got {self._positions})"
            )
        if self._steps is not None:
            expected = {k: tuple(v.shape[1:]) for k, v in self._steps.items()}
            got = {k: (v.shape[0], *v.shape[2:]) for k, v in steps.items()}
            contexts_differ = (context is None) != (self._contexts is None)
            if got != expected or len(states) != len(self._states) or contexts_differ:
                raise ValueError(f"unroll layout changed: {got} after {expected}")

    def _write(
        self,
        steps: dict[str, torch.Tensor],
        states: tuple[torch.Tensor, ...],
        context: torch.Tensor | None,
        versions: torch.Tensor,
        count: int,
    ) -> None:
        rows = (self._next + np.arange(count)) % self._rows
        np.add.at(self._generation, rows, 1)
        skip = max(0, count - self._rows)  # a put larger than the ring keeps its newest unrolls
        kept = torch.from_numpy(rows[skip:])
        for key, buf in self._steps.items():
            buf[kept] = steps[key][:, skip:].transpose(0, 1)
        for buf, state in zip(self._states, states, strict=True):
            buf[kept] = state[skip:]
        if context is not None:
            self._contexts[kept] = context[skip:]
        self._versions[kept] = versions[skip:]
        items = (rows[skip:, None] * self._positions + np.arange(self._positions)).ravel()
        self._tree.update(items, np.full(items.size, self._max_priority**self._alpha))
        self._next = (self._next + count) % self._rows
        self._filled = min(self._filled + count, self._rows)
        self._inserted += count * self._positions

    def _gather(self, items: np.ndarray) -> Unrolls:
        rows_np = items // self._positions
        rows = torch.from_numpy(rows_np)
        starts = torch.from_numpy(items % self._positions)
        # Advanced indexing with [window, B] index grids copies straight into time-major order.
        steps_at = starts[None, :] + torch.arange(self._window)[:, None]
        steps = {k: buf[rows[None, :], steps_at] for k, buf in self._steps.items()}
        probabilities = self._tree.get(items) / self._tree.total
        weights = (len(self) * probabilities) ** -self._beta
        replay = ReplayInfo(
            torch.from_numpy(items),
            torch.from_numpy((weights / weights.max()).astype(np.float32)),
            torch.from_numpy(self._generation[rows_np]),
        )
        states = tuple(s[rows] for s in self._states)
        context = self._context_at(rows, starts)
        return Unrolls(steps, states, self._versions[rows], replay, context)

    def _context_at(self, rows: torch.Tensor, starts: torch.Tensor) -> torch.Tensor | None:
        """The obs context of items starting at step ``starts`` of ``rows``: the row's own at
        step 0, else the stack at the item's first step, from the row's frames before it."""
        if self._contexts is None:
            return None
        context = self._contexts[rows]
        if self._positions == 1:
            return context
        span = int(starts.max()) + 1  # the steps that can reach into the items' first stacks
        frames = self._steps["obs"][rows, :span].transpose(0, 1)
        episode_starts = self._steps["done"][rows, :span].transpose(0, 1)
        return stack_context(context, frames, episode_starts, starts)
