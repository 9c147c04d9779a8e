"""Launch a training run on a Ray cluster: the learner and N remote actors as Ray actors.

``seedbed launch --ray [ADDRESS] --actors N ...`` starts one learner (a ``TrainingRun`` that
listens for remote actors) and N actors that connect to it over gRPC, wherever Ray places them.
Ray restarts an actor whose process dies, and the new one rejoins under a new run id. At the end,
or on Ctrl-C, the learner saves its last checkpoint and summary, the actors are stopped and, when
this command started Ray itself, Ray is shut down: nothing is left running.

Without ADDRESS a local Ray is started and the learner listens on 127.0.0.1. With ADDRESS the
learner listens on all interfaces of its node with a fresh random token, which Ray hands to the
actors (Ray's own channel between nodes is trusted, as Ray requires).
"""

from __future__ import annotations

import dataclasses
import logging
import os
import secrets
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from seedbed.errors import SeedbedError

log = logging.getLogger(__name__)


@dataclasses.dataclass(frozen=True)
class Placement:
    """How many of the cluster's resources each part asks Ray for."""

    actors: int = 2
    actor_cpus: float = 1.0
    learner_cpus: float = 1.0
    learner_gpus: float = 0.0


class LearnerHost:
    """A Ray actor that runs the learner; ``train`` blocks, the other methods answer meanwhile."""

    def __init__(self, layers: list[dict[str, Any]], token: str | None) -> None:
        from seedbed.config import resolve
        from seedbed.runtime.train import TrainingRun

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        self._token_file = None
        extra: dict[str, Any] = {"progress": False}  # the launcher reports progress instead
        if token is not None:
            fd, self._token_file = tempfile.mkstemp(prefix="seedbed-token-")  # mode 0600
            os.write(fd, token.encode())
            os.close(fd)
            extra.update(listen="0.0.0.0:0", token_file=self._token_file)
        self.run = TrainingRun(resolve([*layers, extra]))
        self._ended = threading.Event()

    def train(self) -> dict[str, Any]:
        try:
            return self.run.run()
        finally:
            self._ended.set()
            if self._token_file:
                os.unlink(self._token_file)

    def address(self, timeout_s: float = 120.0) -> str | None:
        """Where actors connect, once the learner listens; None if it ended before."""
        import ray

        deadline = time.monotonic() + timeout_s
        while self.run.gateway is None:
            if self._ended.is_set() or time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        host, port = self.run.gateway.address.rsplit(":", 1)
        if host == "0.0.0.0":
            host = ray.util.get_node_ip_address()
        return f"{host}:{port}"

    def status(self) -> dict[str, Any]:
        gateway = self.run.gateway
        return {
            "frames": self.run.frames,
            "mean_return": self.run.window.mean_return(),
            "connections": gateway.connections if gateway else 0,
        }

    def stop(self) -> None:
        self.run.request_stop()


class ActorHost:
    """A Ray actor that runs one remote actor (``seedbed actor``) until training is over."""

    def pid(self) -> int:
        return os.getpid()

    def act(self, address: str, token: str | None) -> str:
        from seedbed.actor import run_remote_actor

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        return run_remote_actor(address, token.encode() if token else None)


def launch(
    layers: list[dict[str, Any]],
    ray_address: str | None,
    placement: Placement,
    console: Console | None = None,
) -> dict[str, Any]:
    """Train on Ray as ``layers`` (settings, as for ``resolve``) say; return the summary."""
    try:
        import ray
    except ImportError:
        raise SeedbedError("seedbed launch --ray needs Ray: pip install 'seedbed[ray]'") from None
    console = console or Console(stderr=True)
    started_here = not ray.is_initialized()
    ray.init(address=ray_address, include_dashboard=False, logging_level=logging.WARNING)
    token = secrets.token_hex(32) if ray_address else None  # other machines may connect
    learner, actors = None, []
    try:
        learner = (
            ray.remote(LearnerHost)
            .options(
                num_cpus=placement.learner_cpus,
                num_gpus=placement.learner_gpus,
                max_concurrency=4,  # train() blocks; address, status and stop answer beside it
            )
            .remote(layers, token)
        )
        result = learner.train.remote()
        address = ray.get(learner.address.remote())
        if address is None:
            return _get(result)  # the learner failed to start: raise its error
        console.print(f"learner listening on {address}; starting {placement.actors} actors")
        actors = [
            ray.remote(ActorHost)
            .options(
                num_cpus=placement.actor_cpus,
                max_restarts=-1,  # a dead actor process is started again...
                max_task_retries=-1,  # ...and resumes acting
                max_concurrency=2,
            )
            .remote()
            for _ in range(placement.actors)
        ]
        acting = [actor.act.remote(address, token) for actor in actors]
        try:
            while not ray.wait([result], timeout=10.0)[0]:
                s = ray.get(learner.status.remote())
                ret = "n/a" if s["mean_return"] is None else f"{s['mean_return']:.1f}"
                console.print(
                    f"{s['frames']:,} frames, mean return {ret}, "
                    f"{s['connections']} actor connections so far"
                )
        except KeyboardInterrupt:
            console.print("stopping: the learner saves its checkpoint and summary")
            learner.stop.remote()
        summary = _get(result)
        ray.wait(acting, num_returns=len(acting), timeout=30.0)  # actors hear training is over
        return summary
    finally:
        for actor in actors:
            ray.kill(actor)
        if learner is not None:
            ray.kill(learner)
        if started_here:
            ray.shutdown()


def _get(ref: Any) -> Any:
    """``ray.get`` that re-raises a seedbed error from the remote side as itself."""
    import ray

    try:
        return ray.get(ref)
    except ray.exceptions.RayTaskError as e:
        if isinstance(e.cause, SeedbedError):
            raise e.cause from None
        raise


def resolve_run_dir(layers: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Fix the run directory to an absolute path here, so the learner writes where we expect."""
    from seedbed.config import resolve
    from seedbed.runtime.train import default_run_dir

    config = resolve(layers)
    run_dir = Path(config.train.run_dir) if config.train.run_dir else default_run_dir(config)
    return [*layers, {"run_dir": str(run_dir.resolve())}]
