"""The learner's loop: take a batch, learn, publish the new parameters; every ``--log-every-s`` a
metrics row and the stop rules, every ``--checkpoint-every-s`` a checkpoint.

With ``--learner-replicas`` the replicas meet only after a learner step, where replica 0's clock
and stop request decide for every replica whether to log, checkpoint or stop; a row's counters
are merged over all replicas (``replica_stats``), so all reach the same stop decision, and replica
0 alone writes rows and checkpoints.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from seedbed.framestack import restack
from seedbed.inference.server import InferenceStats
from seedbed.replicate import ReplicaContext
from seedbed.runtime.lr_schedule import LearningRates
from seedbed.runtime.progress import Progress
from seedbed.runtime.replica_stats import merge_stats
from seedbed.runtime.rundir import RunFiles
from seedbed.runtime.services import Services
from seedbed.runtime.stopping import StopRules
from seedbed.telemetry import Stopwatch
from seedbed.types import Unrolls


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
        layout = services.layout
        self.learning_rates = LearningRates(
            self.agent.optimizers(), layout.lr_schedule, layout.total_frames, layout.lr_hold_frames
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
        watch = self.stopwatch
        while True:
            batch = queue.get(cfg.batch, timeout=0.05)
            watch.lap("waiting_for_batch")
            if batch is not None:
                self._learn(batch)
            if supervisor.error is not None:
                raise supervisor.error
            if replicated and batch is None:
                continue  # replicas meet only after a step, so all make the same collectives
            now = time.perf_counter()
            # Replica 0's clock and stop request decide for every replica.
            flags = (now >= next_log, now >= next_ckpt, self.stopping.requested.is_set())
            log_now, checkpoint_now, stop_now = self.replica.broadcast(
                torch.tensor(flags, dtype=torch.int32)
            ).tolist()
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

    def _learn(self, batch: Unrolls) -> None:
        """One learner step on ``batch``, then the new parameters to inference."""
        watch, progress = self.stopwatch, self.progress
        # Frames stored once (--frame-stack-on learner) become stacks here, on the learner's
        # device, so no agent knows where the stacks were built.
        batch = restack(batch.to(self.replica.device))
        # Frames as of the last row, the same on every replica (merged), so rates stay equal.
        lr_fraction = self.learning_rates.update(progress.frames)
        metrics = self.agent.learn(batch)
        self.services.buffer.learned(batch)
        watch.lap("learning")
        progress.learner_steps += 1
        self.services.publisher.publish(progress.learner_steps, batch)
        watch.lap("publishing")
        policy_lag = (progress.learner_steps - 1 - batch.policy_version).float().mean()
        self.metrics.add({**metrics, "lr_fraction": lr_fraction}, policy_lag)

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
        self._count = 0
        self._last_wall = wall_s

    def add(self, metrics: dict[str, float], policy_lag: torch.Tensor) -> None:
        for key, value in {**metrics, "policy_lag": float(policy_lag)}.items():
            self._sums[key] = self._sums.get(key, 0.0) + value
        self._count += 1

    def take(self) -> dict[str, float | None]:
        row = {
            k: (self._sums[k] / self._count if self._count and k in self._sums else None)
            for k in self._keys
        }
        self._sums, self._count = {}, 0
        return row

    def fps(self, frames: int, wall_s: float) -> float | None:
        last, self._last_wall = self._last_wall, wall_s
        if wall_s <= last:
            return None
        return round(frames / (wall_s - last), 1)
