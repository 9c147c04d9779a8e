"""What each part of a Ray launch asks the cluster for, and how many actors fit where.

Plain arithmetic on the cluster's totals (``ray.cluster_resources()``, ``ray.nodes()``), so the
launcher can refuse or size a launch before any Ray actor starts, and tests can check it without
a cluster.
"""

from __future__ import annotations

import dataclasses

from seedbed.errors import SeedbedError


@dataclasses.dataclass(frozen=True)
class Placement:
    """How many of the cluster's resources each part asks Ray for, and what if they do not fit."""

    actors: int = 2
    actor_cpus: float = 1.0
    learner_cpus: float = 1.0
    learner_gpus: float = 0.0
    fit_actors: bool = False  # start as many actors as fit, rather than refuse to start
    replicas: int = 1  # learner replicas: above 1, one Ray actor each, with local actors


def actors_to_start(placement: Placement, resources: dict[str, float]) -> int:
    """How many actors to start on a cluster with these total resources.

    Args:
        placement: What the learner and each actor ask for.
        resources: The cluster's totals, as ``ray.cluster_resources()`` gives them.

    Returns:
        ``placement.actors`` when the learner and all actors fit; with ``fit_actors``, the
        number that fit when that is fewer (at least one).

    Raises:
        SeedbedError: When the learner does not fit, no actor does, or not all actors do and
            ``fit_actors`` is off. The message says what is there, what was asked and what to do.
    """
    cpus, gpus = resources.get("CPU", 0.0), resources.get("GPU", 0.0)
    asked, each = placement.actors, placement.actor_cpus
    if placement.learner_gpus > gpus:
        raise SeedbedError(
            f"the Ray cluster has {many(gpus, 'GPU')} and the learner asks for "
            f"{placement.learner_gpus:g} (--device cuda); use --device cpu or a cluster with a GPU"
        )
    free = cpus - placement.learner_cpus
    if free < 0:
        raise SeedbedError(
            f"the Ray cluster has {many(cpus, 'CPU')} and the learner asks for "
            f"{many(placement.learner_cpus, 'CPU')}; lower --learner-cpus"
        )
    # Ray counts resources in steps of 1e-4, so a hair of float error must not cost an actor.
    fit = asked if each <= 0 else min(asked, int(free / each + 1e-6))
    if fit == asked:
        return asked
    total = placement.learner_cpus + asked * each
    there = (
        f"the Ray cluster has {many(cpus, 'CPU')}; the learner "
        f"({many(placement.learner_cpus, 'CPU')}) and {many(asked, 'actor')} "
        f"({many(each, 'CPU')} each) ask for {many(total, 'CPU')}"
    )
    if fit == 0:
        raise SeedbedError(f"{there}, and not one actor fits; lower --actor-cpus or --learner-cpus")
    if not placement.fit_actors:
        raise SeedbedError(
            f"{there}; lower --actors or --actor-cpus, or pass --fit-actors to start {fit} of them"
        )
    return fit


def local_actors_per_replica(placement: Placement, nodes: list[dict[str, float]]) -> int:
    """How many of each replica's actors run as local processes on its node: its whole share
    where the ``placement.replicas`` roomiest nodes hold it beside the learner, else as many as
    the least roomy of them holds. The rest of each share overflow to Ray actors elsewhere.

    Every replica takes the same number, since the settings split ``--actors`` and the remote
    slots evenly over the replicas: a replica on a roomier node sends the same number over gRPC.
    Sizing from the nodes' totals is known at once, where trying the whole share and falling
    back would spend the placement wait on every launch that overflows; a cluster busy with
    other work still gets that wait, and the refusal after it.

    Args:
        placement: What each learner replica and each actor ask for.
        nodes: Each live node's total resources, as ``ray.nodes()`` gives them.

    Returns:
        Local actors per replica: ``placement.actors // placement.replicas`` where fewer nodes
        than replicas hold a learner (replicas then share nodes, as before), else at most that.
    """
    n, each = placement.replicas, placement.actor_cpus
    share = placement.actors // n
    rooms = sorted(
        (node.get("CPU", 0.0) - placement.learner_cpus)
        for node in nodes
        if node.get("GPU", 0.0) >= placement.learner_gpus
    )[::-1]
    if len(rooms) < n or each <= 0:
        return share
    # Ray counts resources in steps of 1e-4, so a hair of float error must not cost an actor.
    return max(0, min(share, int(rooms[n - 1] / each + 1e-6)))


def many(n: float, unit: str) -> str:
    """E.g. ``1 CPU``, ``0.5 CPUs``, ``2 actors``."""
    return f"{n:g} {unit}" if n == 1 else f"{n:g} {unit}s"


def amounts(resources: dict[str, float]) -> str:
    """E.g. ``2 CPUs, 1 GPU``."""
    shown = [many(resources.get(k, 0.0), k) for k in ("CPU", "GPU") if resources.get(k)]
    return ", ".join(shown) or "nothing"
