"""summary.json: what a finished training run reports, as one flat dict of plain values.

``run_summary`` reads the run's settings, its counters (``Progress``), the parts it ran
(``Services``) and where each part's time went (``time_shares``). It is written by replica 0
alone, after the final checkpoint, whose path it names.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any, Protocol

import torch

from seedbed.config import RunConfig
from seedbed.replicate import ReplicaContext
from seedbed.runtime.learner_loop import LearnerLoop
from seedbed.runtime.progress import Progress
from seedbed.runtime.services import Services
from seedbed.types import EnvSpec


class FinishedRun(Protocol):
    """What the summary reads of a ``TrainingRun`` (which imports this module, so it is described
    here rather than imported)."""

    config: RunConfig
    spec: EnvSpec
    agent: Any  # a ``seedbed.agents.base.Agent``: its ``torso_dtype``
    device: torch.device
    replica: ReplicaContext
    progress: Progress
    services: Services
    learner: LearnerLoop
    started_at: float  # unix time this session's wall clock began
    energy: dict[str, Any] | None  # this session's; None with --energy off
    run_dir: Path


def run_summary(
    run: FinishedRun, reason: str, wall_s: float, in_sync: bool | None, checkpoint: Path | None
) -> dict[str, Any]:
    """The summary of ``run``, stopped for ``reason`` after ``wall_s`` seconds over all its
    sessions; ``in_sync`` says whether its replicas ended alike, ``checkpoint`` is its last
    (None where it has none)."""
    cfg, progress, services = run.config.train, run.progress, run.services
    target_reached = progress.target_reached or {}
    dtype = run.agent.torso_dtype
    return {
        "env": cfg.env,
        "agent": cfg.agent,
        "stop_reason": reason,
        "frames": progress.frames,
        "frames_counted_as": frames_counted_as(run.spec),
        "env_protocol": run.spec.protocol,
        "wall_s": round(wall_s, 3),
        "session_started_at": run.started_at,  # unix time this session's wall clock began
        "mean_fps": round(progress.frames / wall_s, 1) if wall_s > 0 else None,
        "mean_return_100": progress.window.mean_return(),
        "episodes": progress.window.count,
        "learner_steps": progress.learner_steps,
        "actor_restarts": progress.actor_restarts,
        "skipped_steps": progress.skipped_steps,  # optimizer steps not taken: NaN or inf
        "learner_replicas": run.replica.num_replicas,
        "replicas_in_sync": in_sync,
        "remote_actors": remote_summary(services),
        "refused_from_actors": refused_summary(services),
        # Replay's items stored, inserted and sampled (not checkpointed); None for the FIFO.
        "replay": services.buffer.stats(),
        "target_return": cfg.target_return,
        "target_episodes": cfg.target_episodes,
        "target_reached_frames": target_reached.get("frames"),
        "target_reached_wall_s": target_reached.get("wall_s"),
        # The window at the stop decision: the final one also holds the episodes that
        # ended while the actors were stopping, and may sit a little lower.
        "target_reached_mean_return": target_reached.get("mean_return"),
        "inference": {
            "mode": cfg.inference,
            "precision": cfg.actor_precision if cfg.inference == "local" else cfg.precision,
            **services.publisher.summary(),
        },
        "device": str(run.device),
        "torso_dtype": None if dtype is None else str(dtype).removeprefix("torch."),
        "torch_threads": services.threads_used,  # as each thread had it when the run ended
        "time_shares": time_shares(services, run.learner),
        "energy": run.energy,  # this session's; None with --energy off
        "checkpoint": None if checkpoint is None else str(checkpoint),
        "run_dir": str(run.run_dir),
    }


def frames_counted_as(spec: EnvSpec) -> str:
    """What one frame is in this run's counts."""
    if spec.frame_skip > 1:
        return f"emulator frames (agent steps x frame skip {spec.frame_skip})"
    return "environment steps (agent steps)"


def remote_summary(services: Services) -> dict[str, Any] | None:
    """Where remote actors connected, how many did and how many were refused; with replicas,
    summed over them, with each replica's own (``replicas``) and the redirects the front door
    sent; with gateway processes, how many connections each served; None without
    ``--listen``."""
    gateway, door = services.gateway, services.front_door
    if gateway is None:
        return None
    if door is None or door.replicas is None:
        return {
            "address": gateway.address,
            "connections": gateway.connections,
            "refused": gateway.rejected_total,
            "gateway_processes": getattr(gateway, "count", 0),
            "connections_by_gateway": getattr(gateway, "served", None),
        }
    return {
        "address": gateway.address,  # the front door
        "connections": sum(r["connections"] for r in door.replicas),
        "refused": sum(r["refused"] for r in door.replicas),
        "redirects": door.placement.redirects if door.placement is not None else None,
        "gateway_processes": getattr(gateway, "count", 0),  # per replica: each runs as many
        "replicas": door.replicas,
    }


def refused_summary(services: Services) -> dict[str, Any] | None:
    """What the inference server refused from actors (``seedbed.transport.checks``): steps, in
    all and per actor slot that had any, episode returns, and actors the gateway sent away for
    it; None if inference never started."""
    server = services.server
    if server is None:
        return None
    per_slot = server.refused_steps.reshape(-1, services.layout.envs_per_actor).sum(axis=1)
    gateway = services.gateway
    return {
        "steps": int(per_slot.sum()),
        "steps_by_actor": {str(slot): int(n) for slot, n in enumerate(per_slot) if n},
        "episode_returns": server.refused_returns,
        "actors_disconnected": gateway.disconnected if gateway is not None else 0,
    }


def time_shares(services: Services, learner: LearnerLoop) -> dict[str, dict[str, float]]:
    """Where each part's time went this session, as fractions of that part's time."""
    times = services.actor_times
    work, wait = times.sum(axis=0) if len(times) else (0.0, 0.0)
    total = work + wait
    actors = (
        {"stepping_envs": round(work / total, 3), "waiting_for_actions": round(wait / total, 3)}
        if total
        else {}
    )
    inference = services.server.time_shares() if services.server else {}
    return {"actors": actors, "inference": inference, **learner.time_shares()}
