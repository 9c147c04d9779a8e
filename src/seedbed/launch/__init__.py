"""Launch a training run on a Ray cluster: ``seedbed launch --ray [ADDRESS] ...``.

Before any Ray actor starts, the launcher checks that the cluster has the CPUs and GPUs for the
learner and every actor, and refuses if not (Ray would otherwise leave the extra actors waiting
for room, and the run would quietly train with fewer); ``Placement.fit_actors`` starts as many as
fit instead (``placement``). One learner and its remote actors run as ``single`` starts them;
``--learner-replicas N`` runs N replicas across nodes as ``replicas`` does. At the end, or on
Ctrl-C, the learner (replica 0) saves its last checkpoint and summary, the actors are stopped
and, when this command started Ray itself, Ray is shut down: nothing is left running.

Without ADDRESS a local Ray is started and everything listens on 127.0.0.1. With ADDRESS the
learner listens on its node's address (the one Ray uses, not every interface). Either way it
needs a fresh random token, which Ray hands to the actors (Ray's own channel between nodes is
trusted, as Ray requires): other users of the machine cannot join.
"""

from __future__ import annotations

import logging
from pathlib import Path
from typing import Any

from rich.console import Console

from seedbed.errors import SeedbedError
from seedbed.launch.placement import Placement, actors_to_start, local_actors_per_replica
from seedbed.launch.single import learner_settings

__all__ = [
    "Placement",
    "actors_to_start",
    "launch",
    "learner_settings",
    "local_actors_per_replica",
    "resolve_run_dir",
]


def launch(
    layers: list[dict[str, Any]],
    ray_address: str | None,
    placement: Placement,
    console: Console | None = None,
) -> dict[str, Any]:
    """Train on Ray as ``layers`` (settings, as for ``resolve``) say; return the summary.

    Raises:
        SeedbedError: If Ray is missing, the cluster has no room for the learner (or replicas)
            and the actors, or the learner fails with a seedbed error.
    """
    try:
        import ray
    except ImportError:
        raise SeedbedError("seedbed launch --ray needs Ray: pip install 'seedbed[ray]'") from None
    from seedbed.launch.replicas import launch_replicas
    from seedbed.launch.single import launch_learner

    console = console or Console(stderr=True)
    started_here = not ray.is_initialized()
    ray.init(address=ray_address, include_dashboard=False, logging_level=logging.WARNING)
    start = launch_replicas if placement.replicas > 1 else launch_learner
    try:
        return start(layers, ray_address is not None, placement, console)
    finally:
        if started_here:
            ray.shutdown()


def resolve_run_dir(layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fix the run directory to an absolute path here, so the learner writes where we expect."""
    from seedbed.resolve import resolve
    from seedbed.runtime.rundir import check_run_dir
    from seedbed.runtime.train import default_run_dir

    config = resolve(layers)
    run_dir = Path(config.train.run_dir) if config.train.run_dir else default_run_dir(config)
    check_run_dir(run_dir)  # before Ray starts: a bad one is one line, not a remote traceback
    return [*layers, {"run_dir": str(run_dir.resolve())}]
