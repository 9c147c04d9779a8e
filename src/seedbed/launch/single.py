"""One learner and N remote actors as Ray actors (``seedbed launch --ray`` without replicas).

The learner (``LearnerHost``, a ``TrainingRun`` that listens for remote actors) starts first;
once it listens, N ``ActorHost`` actors connect to it over gRPC wherever Ray places them. Ray
restarts an actor whose process dies, and the new one rejoins under a new run id. The summary's
``launch`` entry says how many actors were asked for and how many Ray placed.
"""

from __future__ import annotations

import json
import logging
import os
import secrets
import tempfile
import threading
import time
from typing import Any

from rich.console import Console

from seedbed.errors import SeedbedError
from seedbed.launch.placement import Placement, actors_to_start, many
from seedbed.telemetry import write_json_atomic


def learner_settings(token_file: str, node_ip: str | None) -> dict[str, Any]:
    """What the launcher adds to the learner's settings: the token's file, and on a cluster
    (``node_ip``: the learner node's address as Ray knows it) where to listen."""
    extra: dict[str, Any] = {"progress": False, "token_file": token_file}  # progress: ours
    if node_ip is not None:
        extra["listen"] = f"{node_ip}:0"
    return extra


class LearnerHost:
    """A Ray actor that runs the learner; ``train`` blocks, the other methods answer meanwhile."""

    def __init__(self, layers: list[dict[str, Any]], token: str, cluster: bool) -> None:
        import ray

        from seedbed.resolve import resolve
        from seedbed.runtime.train import TrainingRun

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        fd, self._token_file = tempfile.mkstemp(prefix="seedbed-token-")  # mode 0600
        os.write(fd, token.encode())
        os.close(fd)
        node_ip = ray.util.get_node_ip_address() if cluster else None
        self.run = TrainingRun(resolve([*layers, learner_settings(self._token_file, node_ip)]))
        self._ended = threading.Event()

    def train(self) -> dict[str, Any]:
        try:
            return self.run.run()
        finally:
            self._ended.set()
            os.unlink(self._token_file)

    def address(self, timeout_s: float = 120.0) -> str | None:
        """Where actors connect, once the learner listens; None if it ended before."""
        deadline = time.monotonic() + timeout_s
        while self.run.gateway is None:
            if self._ended.is_set() or time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        return self.run.gateway.address

    def wire(self) -> str:
        """How its actors' messages travel (``--wire``), once it listens."""
        return self.run.gateway.wire

    def status(self) -> dict[str, Any]:
        gateway = self.run.gateway
        return {
            "frames": self.run.frames,
            "mean_return": self.run.window.mean_return(),
            "connections": gateway.connections if gateway else 0,
        }

    def stop(self) -> None:
        self.run.request_stop()

    def add_to_summary(self, extra: dict[str, Any]) -> None:
        """Add entries to the summary.json the learner wrote, here on the learner's own node."""
        path = self.run.run_dir / "summary.json"
        if path.is_file():  # a learner that failed before its summary has none to add to
            write_json_atomic(path, {**json.loads(path.read_text()), **extra})


class ActorHost:
    """A Ray actor that runs one remote actor (``seedbed actor``) until training is over."""

    def pid(self) -> int:
        return os.getpid()

    def act(self, address: str, token: str, wire: str = "grpc") -> str:
        from seedbed.actor import run_remote_actor

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        return run_remote_actor(address, token.encode(), wire=wire)


def launch_learner(
    layers: list[dict[str, Any]], cluster: bool, placement: Placement, console: Console
) -> dict[str, Any]:
    """Train as one learner with ``placement.actors`` remote actors; return its summary.
    ``cluster``: Ray at an address (the learner then listens on its node's address).

    Raises:
        SeedbedError: The cluster has no room for the learner and the actors (see
            ``actors_to_start``), or the learner fails with a seedbed error.
    """
    import ray

    token = secrets.token_hex(32)  # other machines, or other users of this one, may connect
    learner, actors = None, []
    try:
        resources = ray.cluster_resources()
        n = actors_to_start(placement, resources)  # before any Ray actor: a refusal leaves none
        if n < placement.actors:
            console.print(
                f"the cluster has room for {n} of {placement.actors} actors; starting {n}"
            )
            layers = [*layers, {"remote_actors": n}]  # the learner's slots: one per actor
        learner = (
            ray.remote(LearnerHost)
            .options(
                num_cpus=placement.learner_cpus,
                num_gpus=placement.learner_gpus,
                max_concurrency=4,  # train() blocks; address, status and stop answer beside it
            )
            .remote(layers, token, cluster)
        )
        result = learner.train.remote()
        address = ray.get(learner.address.remote())
        if address is None:
            return ray_get(result)  # the learner failed to start: raise its error
        console.print(f"learner listening on {address}; starting {many(n, 'actor')}")
        actors = [start_actor(placement.actor_cpus) for _ in range(n)]
        started = [actor.pid.remote() for actor in actors]  # each answers once Ray placed it
        wire = ray.get(learner.wire.remote())
        acting = [actor.act.remote(address, token, wire) for actor in actors]
        _follow(learner, result, started, placement.actors, console)
        summary = ray_get(result)
        ray.wait(acting, num_returns=len(acting), timeout=30.0)  # actors hear training is over
        summary["launch"] = _record(placement, n, _placed(started), resources)
        ray.get(learner.add_to_summary.remote({"launch": summary["launch"]}))
        return summary
    finally:
        for actor in actors:
            ray.kill(actor)
        if learner is not None:
            ray.kill(learner)


def _record(
    placement: Placement, started: int, placed: int, resources: dict[str, float]
) -> dict[str, Any]:
    """The summary's ``launch`` section: what was asked, what the cluster had and gave."""
    return {
        "actors_asked": placement.actors,
        "actors_started": started,
        "actors_placed": placed,
        "actor_cpus": placement.actor_cpus,
        "learner_cpus": placement.learner_cpus,
        "learner_gpus": placement.learner_gpus,
        "cluster_cpus": resources.get("CPU", 0.0),
        "cluster_gpus": resources.get("GPU", 0.0),
    }


def start_actor(cpus: float) -> Any:
    import ray

    return (
        ray.remote(ActorHost)
        .options(
            num_cpus=cpus,
            max_restarts=-1,  # a dead actor process is started again...
            max_task_retries=-1,  # ...and resumes acting
            max_concurrency=2,  # pid() answers while act() runs
        )
        .remote()
    )


def _follow(learner: Any, result: Any, started: list[Any], asked: int, console: Console) -> None:
    """Print progress every 10 s until the learner returns; on Ctrl-C, ask it to stop."""
    import ray

    try:
        while not ray.wait([result], timeout=10.0)[0]:
            s = ray.get(learner.status.remote())
            ret = "n/a" if s["mean_return"] is None else f"{s['mean_return']:.1f}"
            console.print(
                f"{s['frames']:,} frames, mean return {ret}, {_placed(started)} of {asked} "
                f"actors placed, {s['connections']} actor connections so far"
            )
    except KeyboardInterrupt:
        console.print("stopping: the learner saves its checkpoint and summary")
        learner.stop.remote()


def _placed(started: list[Any]) -> int:
    """How many actors Ray has placed: those whose ``pid()`` call has answered."""
    import ray

    if not started:
        return 0
    return len(ray.wait(started, num_returns=len(started), timeout=0)[0])


def ray_get(ref: Any) -> Any:
    """``ray.get`` that re-raises a seedbed error from the remote side as itself."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, SeedbedError):
            raise e.cause from None
        raise
