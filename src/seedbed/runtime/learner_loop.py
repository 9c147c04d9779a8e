"""The learner's loop: take a batch, learn, publish the new parameters; every ``--log-every-s`` a
metrics row and the stop rules, every ``--checkpoint-every-s`` a checkpoint. The updates run in
the loop's thread, or with ``--learner-process`` in a process of their own (``updates``).

With ``--learner-replicas`` the replicas meet only after a learner step, where replica 0's clock
decides for every replica whether to log or checkpoint, and any replica's stop request stops
them all; a row's counters are merged over all replicas (``replica_stats``), so all reach the
same stop decision, and replica 0 alone writes rows and checkpoints.
"""

from __future__ import annotations

import math
import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from seedbed.agents.base import SKIPPED
from seedbed.errors import SeedbedError
from seedbed.inference.server import InferenceStats
from seedbed.replicate import ReplicaContext
from seedbed.runtime.lr_schedule import LearningRates
from seedbed.runtime.progress import Progress
from seedbed.runtime.replica_stats import merge_stats
from seedbed.runtime.rundir import RunFiles
from seedbed.runtime.services import Services
from seedbed.runtime.stopping import StopRules
from seedbed.runtime.updates import InlineUpdates, LearnerProcess, Update
from seedbed.telemetry import Stopwatch

# Updates in a row whose loss or gradient was not finite (each skipped, the weights kept) after
# which the run stops: one such batch is noise to step over, this many is a diverged run.
MAX_SKIPPED_IN_A_ROW = 20


class LearnerLoop:
    """One session's learner loop, in the calling thread, over the run's started ``Services``."""

    def __init__(
        self,
        services: Services,
        progress: Progress,
        stopping: StopRules,
        replica: ReplicaContext,
        files: RunFiles,
    ) -> None:
        self.services, self.progress, self.stopping = services, progress, stopping
        self.replica, self.files = replica, files
        self.agent = services.agent
        self.stopwatch = Stopwatch()  # the learner thread's time
        self.metrics = MetricsWindow(progress.wall_offset, self.agent.metric_names)
        self._frames_base = progress.frames  # the servers count this session's frames
        # The frame count of the last metrics row: a resumed run's rows go on after its
        # checkpoint's, which holds that row's counters.
        self._row_frames = progress.frames
        self._row_batches = np.zeros(2, np.int64)  # inference batches and envs since that row
        self.updates: InlineUpdates | LearnerProcess | None = None  # made by ``start``
        self._skipped_in_a_row = 0  # updates with a skipped (non-finite) optimizer step

    def start(self) -> None:
        """Make where the updates run, once the services are made (before they go, so that a
        learner process starts beside the actors); ``close`` stops it."""
        services, progress = self.services, self.progress
        if services.layout.learner_process:
            self.updates = LearnerProcess(
                services.config,
                services.spec,
                self.agent,
                services.buffer,
                services.publisher,
                progress.learner_steps,
                services.threads["learner"],
                self.learned,
            )
            return
        layout = services.layout
        rates = LearningRates(
            self.agent.optimizers(), layout.lr_schedule, layout.total_frames, layout.lr_hold_frames
        )
        self.updates = InlineUpdates(
            self.agent,
            services.buffer,
            services.publisher,
            self.replica.device,
            rates,
            progress.learner_steps,
            self.learned,
            self.stopwatch,
        )

    def run(self, start: float, save: Callable[[float], Any]) -> str:
        """Learn until a stop rule or a stop request; return why (``target_return``,
        ``total_frames``, ``interrupted``). ``start`` is the session's ``perf_counter`` start;
        ``save(elapsed)`` writes a checkpoint (replica 0 alone calls it)."""
        cfg = self.services.layout
        queue, supervisor = self.services.buffer, self.services.supervisor
        replicated = self.replica.num_replicas > 1
        next_log = next_ckpt = time.perf_counter()
        next_log += cfg.log_every_s
        next_ckpt += cfg.checkpoint_every_s
        watch, updates = self.stopwatch, self.updates
        separate = isinstance(updates, LearnerProcess)
        while True:
            batch = None
            if updates.ready():
                batch = queue.get(cfg.batch, timeout=0.05)
                watch.lap("waiting_for_batch")
                if batch is not None:
                    updates.submit(batch, self.progress.frames)  # frames as of the last row
            if separate:  # take the learner process's finished updates
                updates.wait(0.0 if updates.ready() else 0.05)
                watch.lap("waiting_for_learner")
            if supervisor.error is not None:
                raise supervisor.error
            if self.services.error is not None:  # a thread beside the loop died
                raise self.services.error
            if replicated and batch is None:
                continue  # replicas meet only after a step, so all make the same collectives
            now = time.perf_counter()
            # Replica 0's clock decides for every replica, and any replica's stop request: on
            # several machines a signal may reach one replica alone. One collective for both.
            stop = self.stopping.requested.is_set()
            due = (now >= next_log, now >= next_ckpt) if self.replica.is_primary else (0, 0)
            log_now, checkpoint_now, stop_now = self._meet(
                torch.tensor((*due, stop), dtype=torch.int32)
            )
            if stop_now:
                return "interrupted"
            row_frames = self._row_frames
            if log_now or checkpoint_now:  # a checkpoint keeps the counters of its row
                next_log = now + cfg.log_every_s
                reason = self.log_row(now - start)
                if reason:
                    return reason
            # With no new row (no frames came), a due checkpoint waits for the next one.
            if checkpoint_now and self._row_frames > row_frames:
                next_ckpt = now + cfg.checkpoint_every_s
                if self.replica.is_primary:
                    save(now - start)
            watch.lap("logging_and_checkpoints")

    def _meet(self, flags: torch.Tensor) -> list[int]:
        """``flags``' maximum over the replicas, on every replica; with remote actors the same
        meeting tells replica 0 how many each replica serves (``FrontDoor.meet``)."""
        door = self.services.front_door
        if door is not None:
            return door.meet(flags).tolist()
        return self.replica.all_reduce(flags, "max").tolist()

    def close(self) -> None:
        """Stop a learner process: after the run's final checkpoint, which needs its state."""
        if self.updates is not None:
            self.updates.close()

    def learned(self, update: Update) -> None:
        """Count one finished update and keep its metrics for the next row.

        Raises:
            SeedbedError: One line, the ``MAX_SKIPPED_IN_A_ROW``-th update in a row that skipped
                a step as not finite (once: the updates still in flight at the stop do not).
        """
        self.progress.learner_steps += 1
        skipped = int(update.metrics.get(SKIPPED, 0))
        self.progress.skipped_steps += skipped
        self._skipped_in_a_row = self._skipped_in_a_row + 1 if skipped else 0
        self.metrics.add(update.metrics, update.policy_lag)
        if self._skipped_in_a_row == MAX_SKIPPED_IN_A_ROW:
            raise SeedbedError(
                f"the learner's loss or gradient was not finite (NaN or inf) in "
                f"{MAX_SKIPPED_IN_A_ROW} updates in a row, each skipped: the run diverged and "
                "stopped with its weights as they were before; lower --lr, set --max-grad-norm "
                "or --reward-clip, or check the env's observations and rewards, then --resume"
            )

    def agent_state(self) -> dict[str, Any]:
        """The learning agent's state, after every update so far: what a checkpoint keeps."""
        return self.updates.agent_state()

    def time_shares(self) -> dict[str, dict[str, float]]:
        """Where the learner's time went (the learner process's, with ``--learner-process``,
        and then also the loop's that feeds it)."""
        shares = {"learner": self.updates.time_shares()}
        if isinstance(self.updates, LearnerProcess):  # the loop only feeds and publishes
            shares["learner_loop"] = self.stopwatch.shares()
        return shares

    def log_row(self, elapsed: float) -> str | None:
        """Take every replica's counters, log one row (replica 0), and say whether to stop.

        Every replica gets the same merged counters, so all reach the same decision. A row is
        logged only when frames moved on: a resumed run's first seconds, before its actors
        step, would repeat the checkpoint's row.
        """
        progress, publisher = self.progress, self.services.publisher
        stats = self._take_stats()
        self._row_batches += (stats.batches, stats.batch_envs)
        wall_s = progress.wall_offset + elapsed
        if progress.frames > self._row_frames:
            acc, (batches, batch_envs) = self.metrics, self._row_batches
            row = {
                "frames": progress.frames,
                "wall_s": round(wall_s, 3),
                "fps": acc.fps(progress.frames - self._row_frames, wall_s),
                "mean_return": progress.window.mean_return(),
                "episodes": progress.window.count,
                **self.replica.all_reduce(acc.take(), "mean"),
                "learner_steps": progress.learner_steps,
                "inference_batch": batch_envs / batches if batches else None,
                "actor_restarts": progress.actor_restarts,
                "skipped_steps": progress.skipped_steps,
                **(publisher.take() if publisher.measured else {}),
            }
            self._row_frames, self._row_batches = progress.frames, np.zeros(2, np.int64)
            self.files.log(row)
        return self.stopping.check(wall_s)

    def _take_stats(self) -> InferenceStats:
        """The inference counters of every replica since the last call, merged; updates the
        episode window, the frame count and the actor restarts with them."""
        services, progress = self.services, self.progress
        stats = services.server.take_stats()
        merged, restarts = merge_stats(self.replica, stats, services.supervisor.restarts)
        progress.window.add(merged.episode_returns, merged.episode_lengths)
        progress.frames = self._frames_base + merged.frames
        progress.actor_restarts = restarts
        return merged


class MetricsWindow:
    """Learner metrics averaged over one logging interval."""

    def __init__(self, wall_s: float, keys: tuple[str, ...]) -> None:
        # Fixed up front: they are the CSV's columns.
        self._keys = (*keys, "policy_lag", "lr_fraction")
        self._sums: dict[str, float] = {}
        self._counts: dict[str, int] = {}
        self._last_wall = wall_s

    def add(self, metrics: dict[str, float], policy_lag: float) -> None:
        """Add one update's metrics; a value that is not finite (a skipped step's) is left out
        of its mean."""
        for key, value in {**metrics, "policy_lag": float(policy_lag)}.items():
            if math.isfinite(value):
                self._sums[key] = self._sums.get(key, 0.0) + value
                self._counts[key] = self._counts.get(key, 0) + 1

    def take(self) -> dict[str, float | None]:
        row = {k: self._sums[k] / self._counts[k] if k in self._sums else None for k in self._keys}
        self._sums, self._counts = {}, {}
        return row

    def fps(self, frames: int, wall_s: float) -> float | None:
        last, self._last_wall = self._last_wall, wall_s
        if wall_s <= last:
            return None
        return round(frames / (wall_s - last), 1)
