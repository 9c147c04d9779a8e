"""Launch a training run on a Ray cluster: the learner and N remote actors as Ray actors.

``seedbed launch --ray [ADDRESS] --actors N ...`` starts one learner (a ``TrainingRun`` that
listens for remote actors) and N actors that connect to it over gRPC, wherever Ray places them.
Ray restarts an actor whose process dies, and the new one rejoins under a new run id. At the end,
or on Ctrl-C, the learner saves its last checkpoint and summary, the actors are stopped and, when
this command started Ray itself, Ray is shut down: nothing is left running.

Before any Ray actor starts, the launcher checks that the cluster has the CPUs and GPUs for the
learner and every actor, and refuses if not (Ray would otherwise leave the extra actors waiting
for room, and the run would quietly train with fewer); ``Placement.fit_actors`` starts as many as
fit instead. The summary's ``launch`` entry says how many actors were asked for and how many Ray
placed.

Without ADDRESS a local Ray is started and the learner listens on 127.0.0.1. With ADDRESS the
learner listens on its node's address (the one Ray uses, not every interface). Either way it
needs a fresh random token, which Ray hands to the actors (Ray's own channel between nodes is
trusted, as Ray requires): other users of the machine cannot join.

With ``--learner-replicas N``, N ``ReplicaHost`` Ray actors, on distinct nodes where the
cluster has enough, each run a learner replica with its share of the actors as local processes
(``launch_replicas``), and form their process group through a store that replica 0 opens.
Where a node cannot hold a replica's share (``local_actors_per_replica``), the rest overflow:
they run as ``ActorHost`` Ray actors wherever Ray finds room and connect over gRPC to replica
0's gateway, the front door, which places each on a replica with a free slot. Only with
overflow do the replicas listen: on their nodes' addresses (127.0.0.1 with a local Ray), with
the run's own token.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import os
import secrets
import shutil
import tempfile
import threading
import time
from pathlib import Path
from typing import Any

from rich.console import Console

from seedbed.errors import SeedbedError
from seedbed.telemetry import write_json_atomic

log = logging.getLogger(__name__)

# How long a placement group may wait for room on the cluster before the launch is refused.
PLACEMENT_WAIT_S = 60.0
# How long a replica's collective waits for a missing peer: past it, the replicas stop.
REPLICA_TIMEOUT_S = 60.0


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
            f"the Ray cluster has {_many(gpus, 'GPU')} and the learner asks for "
            f"{placement.learner_gpus:g} (--device cuda); use --device cpu or a cluster with a GPU"
        )
    free = cpus - placement.learner_cpus
    if free < 0:
        raise SeedbedError(
            f"the Ray cluster has {_many(cpus, 'CPU')} and the learner asks for "
            f"{_many(placement.learner_cpus, 'CPU')}; lower --learner-cpus"
        )
    # Ray counts resources in steps of 1e-4, so a hair of float error must not cost an actor.
    fit = asked if each <= 0 else min(asked, int(free / each + 1e-6))
    if fit == asked:
        return asked
    total = placement.learner_cpus + asked * each
    there = (
        f"the Ray cluster has {_many(cpus, 'CPU')}; the learner "
        f"({_many(placement.learner_cpus, 'CPU')}) and {_many(asked, 'actor')} "
        f"({_many(each, 'CPU')} each) ask for {_many(total, 'CPU')}"
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


def _many(n: float, unit: str) -> str:
    """E.g. ``1 CPU``, ``0.5 CPUs``, ``2 actors``."""
    return f"{n:g} {unit}" if n == 1 else f"{n:g} {unit}s"


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

    def act(self, address: str, token: str) -> str:
        from seedbed.actor import run_remote_actor

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        return run_remote_actor(address, token.encode())


class ReplicaHost:
    """A Ray actor that runs one learner replica, with its share of the actors as local
    processes on its own node (and with overflow, remote slots for the rest); ``train``
    blocks, the other methods answer meanwhile."""

    def __init__(self, replica: int, replicas: int, cluster: bool) -> None:
        import ray

        logging.basicConfig(level=logging.INFO, format="%(levelname)s %(name)s: %(message)s")
        self.replica, self.replicas = replica, replicas
        # The group's store and gloo stay on loopback with a Ray this command started.
        self.ip = ray.util.get_node_ip_address() if cluster else "127.0.0.1"
        self.node_id = ray.get_runtime_context().get_node_id()
        self.run: Any = None  # the TrainingRun, once made
        self._ended = threading.Event()
        self._store: Any = None
        self._folder: str | None = None  # replica 0's, holding a local Ray's store file

    def node(self) -> str:
        return self.node_id

    def rendezvous(self, timeout_s: float) -> tuple[str, int | str]:
        """Replica 0: open the group's store; returns where the other replicas find it.

        On a cluster, a ``TCPStore`` on this node's address and a port the system picks (it
        listens on every interface of the node, as torch's store does). With a Ray that the
        launch started, every replica is on this machine: a file in a private folder, as
        ``replicate.spawn`` uses, so nothing listens at all.
        """
        import torch.distributed as dist

        if self.ip == "127.0.0.1":
            self._folder = tempfile.mkdtemp(prefix="seedbed-replicas-")  # mode 0700
            path = os.path.join(self._folder, "store")
            self._store = dist.FileStore(path, self.replicas)
            return "file", path
        wait = datetime.timedelta(seconds=timeout_s)
        self._store = dist.TCPStore(self.ip, 0, self.replicas, True, wait, wait_for_workers=False)
        return self.ip, self._store.port

    def train(
        self,
        layers: list[dict[str, Any]],
        store: tuple[str, int | str],
        timeout_s: float,
        listen: bool = False,
    ) -> dict[str, Any]:
        """Join the group through replica 0's store and train; returns replica 0's summary
        (None on the others), this node's id and how many local actors this replica ran.
        ``listen``: serve the remote slots the settings give (overflow actors) on this node's
        address, or loopback with a local Ray."""
        try:
            return self._train(layers, store, timeout_s, listen)
        finally:
            self._ended.set()  # front_door stops waiting

    def _train(
        self,
        layers: list[dict[str, Any]],
        store: tuple[str, int | str],
        timeout_s: float,
        listen: bool,
    ) -> dict[str, Any]:
        import torch
        import torch.distributed as dist

        from seedbed.replicate.spawn import TIMEOUT_ENV
        from seedbed.resolve import resolve
        from seedbed.runtime.train import train_replica

        env = {"RANK": self.replica, "WORLD_SIZE": self.replicas, "LOCAL_RANK": 0}
        os.environ.update({k: str(v) for k, v in env.items()}, LOCAL_WORLD_SIZE="1")
        os.environ[TIMEOUT_ENV] = str(timeout_s)
        if self.ip == "127.0.0.1":
            os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
        if listen:
            layers = [*layers, {"listen": f"{self.ip}:0"}]
        config = resolve(layers)
        cuda = config.train.device == "cuda"
        if cuda:
            torch.cuda.set_device(0)  # Ray shows this actor its own GPU alone
        wait = datetime.timedelta(seconds=timeout_s)
        if self._store is None and store[0] == "file":
            self._store = dist.FileStore(str(store[1]), self.replicas)
        elif self._store is None:
            self._store = dist.TCPStore(store[0], int(store[1]), self.replicas, False, wait)
        dist.init_process_group(
            "nccl" if cuda else "gloo",
            store=self._store,
            rank=self.replica,
            world_size=self.replicas,
            timeout=wait,
        )
        try:
            summary = train_replica(
                config, made=self._made, listen_host=self.ip if listen else None
            )
        except BaseException:
            # This process lives on: leave the group, so that the replicas waiting for this
            # one in a collective learn of it now rather than at the timeout.
            if dist.is_initialized():
                dist.destroy_process_group()
            raise
        finally:
            if self._folder is not None:
                shutil.rmtree(self._folder, ignore_errors=True)
        return {"summary": summary, "node_id": self.node_id, "actors": self.run.layout.actors}

    def _made(self, run: Any) -> None:
        self.run = run

    def front_door(self, timeout_s: float = 120.0) -> tuple[str, str] | None:
        """Replica 0, with ``listen``: where overflow actors connect and the run's token (in
        its run directory, on this node), once its gateway listens; None if it ended before."""
        from seedbed.transport.remote.wire import TOKEN_FILE

        deadline = time.monotonic() + timeout_s
        while self.run is None or self.run.gateway is None:
            if self._ended.is_set() or time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        token = (self.run.run_dir / TOKEN_FILE).read_text().strip()
        return self.run.gateway.address, token

    def status(self) -> dict[str, Any]:
        run = self.run
        if run is None:
            return {"frames": 0, "mean_return": None}
        return {"frames": run.frames, "mean_return": run.window.mean_return()}

    def stop(self) -> None:
        if self.run is not None:
            self.run.request_stop()

    def add_to_summary(self, extra: dict[str, Any]) -> None:
        """Add entries to the summary.json replica 0 wrote, here on its own node."""
        path = self.run.run_dir / "summary.json" if self.run else None
        if path is not None and path.is_file():
            write_json_atomic(path, {**json.loads(path.read_text()), **extra})


def launch(
    layers: list[dict[str, Any]],
    ray_address: str | None,
    placement: Placement,
    console: Console | None = None,
) -> dict[str, Any]:
    """Train on Ray as ``layers`` (settings, as for ``resolve``) say; return the summary.

    Raises:
        SeedbedError: If Ray is missing, the cluster has no room for the learner and the actors
            (see ``actors_to_start``), or the learner fails with a seedbed error.
    """
    try:
        import ray
    except ImportError:
        raise SeedbedError("seedbed launch --ray needs Ray: pip install 'seedbed[ray]'") from None
    console = console or Console(stderr=True)
    started_here = not ray.is_initialized()
    ray.init(address=ray_address, include_dashboard=False, logging_level=logging.WARNING)
    if placement.replicas > 1:
        try:
            return launch_replicas(layers, ray_address is not None, placement, console)
        finally:
            if started_here:
                ray.shutdown()
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
            .remote(layers, token, ray_address is not None)
        )
        result = learner.train.remote()
        address = ray.get(learner.address.remote())
        if address is None:
            return _get(result)  # the learner failed to start: raise its error
        console.print(f"learner listening on {address}; starting {_many(n, 'actor')}")
        actors = [_start_actor(placement.actor_cpus) for _ in range(n)]
        started = [actor.pid.remote() for actor in actors]  # each answers once Ray placed it
        acting = [actor.act.remote(address, token) for actor in actors]
        _follow(learner, result, started, placement.actors, console)
        summary = _get(result)
        ray.wait(acting, num_returns=len(acting), timeout=30.0)  # actors hear training is over
        summary["launch"] = _record(placement, n, _placed(started), resources)
        ray.get(learner.add_to_summary.remote({"launch": summary["launch"]}))
        return summary
    finally:
        for actor in actors:
            ray.kill(actor)
        if learner is not None:
            ray.kill(learner)
        if started_here:
            ray.shutdown()


def launch_replicas(
    layers: list[dict[str, Any]], cluster: bool, placement: Placement, console: Console
) -> dict[str, Any]:
    """Train as ``placement.replicas`` learner replicas, one Ray actor each with its share of
    the actors as local processes, on distinct nodes (a STRICT_SPREAD placement group) where the
    cluster has enough of them; return replica 0's summary. ``cluster``: Ray at an address.
    Actors that do not fit on their replica's node overflow (``local_actors_per_replica``).

    Replica 0 opens the group's store (a ``TCPStore`` on its node's address and a free port),
    Ray hands the address to the others, and torch.distributed forms the group from it.

    Raises:
        SeedbedError: The cluster has no room for the replicas or the overflow actors, or one
            line naming the replica that died or failed.
    """
    import ray
    from ray.util.placement_group import placement_group, remove_placement_group

    n = placement.replicas
    nodes = [node["Resources"] for node in ray.nodes() if node["Alive"]]
    local = local_actors_per_replica(placement, nodes)
    overflow = placement.actors // n - local  # per replica
    bundle = {"CPU": placement.learner_cpus + local * placement.actor_cpus}
    if placement.learner_gpus:
        bundle["GPU"] = placement.learner_gpus
    strategy = "STRICT_SPREAD" if len(nodes) >= n else "SPREAD"
    if len(nodes) < n:
        console.print(
            f"the Ray cluster has {_many(len(nodes), 'node')} for {n} replicas: some replicas "
            "share a node (placement SPREAD, not STRICT_SPREAD)"
        )
    layers = [*layers, {"progress": False}]  # the driver prints the progress
    if overflow:
        console.print(
            f"each replica's node holds {_many(local, 'actor')} of its {placement.actors // n}; "
            f"the other {_many(overflow * n, 'actor')} run wherever Ray finds room and connect "
            "over gRPC"
        )
        layers.append({"actors": local * n, "remote_actors": overflow * n})
    group = placement_group([bundle] * n, strategy=strategy)
    hosts: list[Any] = []
    actors: list[Any] = []
    try:
        if not ray.wait([group.ready()], timeout=PLACEMENT_WAIT_S)[0]:
            raise SeedbedError(
                f"the Ray cluster has no room for {n} learner replicas of {_amounts(bundle)} "
                f"each ({_amounts(ray.cluster_resources())} in all); lower --actors, "
                "--actor-cpus or --learner-cpus"
            )
        hosts = _start_replica_hosts(group, bundle, n, cluster)
        actors = [_start_actor(placement.actor_cpus) for _ in range(overflow * n)]
        _wait_for_overflow(actors)
        node_ids = ray.get([host.node.remote() for host in hosts])
        store = ray.get(hosts[0].rendezvous.remote(REPLICA_TIMEOUT_S))
        console.print(f"{n} learner replicas on {_many(len(set(node_ids)), 'node')}")
        results = [
            host.train.remote(layers, store, REPLICA_TIMEOUT_S, bool(actors)) for host in hosts
        ]
        acting = _act_at_front_door(hosts[0], actors)
        _follow_replicas(hosts[0], results, console)
        run_dir = next(layer["run_dir"] for layer in reversed(layers) if "run_dir" in layer)
        outcomes = _replica_outcomes(results, node_ids, run_dir)
        ray.wait(acting, num_returns=len(acting), timeout=30.0)  # actors hear training is over
        summary = outcomes[0]["summary"]
        summary["launch"] = _replicas_record(placement, strategy, bundle, outcomes, summary)
        summary["launch"]["cluster_nodes"] = len(nodes)
        ray.get(hosts[0].add_to_summary.remote({"launch": summary["launch"]}))
        return summary
    finally:
        for actor in [*actors, *hosts]:
            ray.kill(actor)
        remove_placement_group(group)


def _start_replica_hosts(group: Any, bundle: dict[str, float], n: int, cluster: bool) -> list[Any]:
    """One ``ReplicaHost`` in each of the group's ``n`` bundles, in replica order."""
    import ray
    from ray.util.scheduling_strategies import PlacementGroupSchedulingStrategy

    hosts = []
    for i in range(n):
        where = PlacementGroupSchedulingStrategy(group, placement_group_bundle_index=i)
        host = ray.remote(ReplicaHost).options(
            num_cpus=bundle["CPU"],
            num_gpus=bundle.get("GPU", 0),
            scheduling_strategy=where,
            max_concurrency=4,  # train() blocks; status and stop answer beside it
        )
        hosts.append(host.remote(i, n, cluster))
    return hosts


def _wait_for_overflow(actors: list[Any]) -> None:
    """Refuse, before any replica trains, where Ray has not placed every overflow actor in
    time: the run would otherwise quietly train with fewer."""
    import ray

    started = [actor.pid.remote() for actor in actors]  # each answers once Ray placed it
    placed = len(ray.wait(started, num_returns=len(started), timeout=PLACEMENT_WAIT_S)[0])
    if started and placed < len(started):
        raise SeedbedError(
            f"the Ray cluster has room for {placed} of the {len(started)} actors that do not fit "
            f"on their replicas' nodes ({_amounts(ray.cluster_resources())} in all); lower "
            "--actors, --actor-cpus or --learner-cpus"
        )


def _act_at_front_door(primary: Any, actors: list[Any]) -> list[Any]:
    """Start the overflow actors acting at replica 0's gateway, with the run's token; none
    where replica 0 ended before it listened (its error follows from its result)."""
    import ray

    door = ray.get(primary.front_door.remote()) if actors else None
    if door is None:
        return []
    address, token = door
    return [actor.act.remote(address, token) for actor in actors]


def _replicas_record(
    placement: Placement,
    strategy: str,
    bundle: dict[str, float],
    outcomes: list[dict[str, Any]],
    summary: dict[str, Any],
) -> dict[str, Any]:
    """The summary's ``launch`` section with replicas: the placement, and per replica its node,
    its local actors and the overflow actors its gateway served (connections, reconnects
    included), with their totals."""
    remote = summary.get("remote_actors") or {}
    served = [r["connections"] for r in remote.get("replicas", [])] or [0] * len(outcomes)
    replicas = [
        {"replica": i, "node_id": o["node_id"], "actors": o["actors"], "overflow_served": s}
        for i, (o, s) in enumerate(zip(outcomes, served, strict=True))
    ]
    return {
        "learner_replicas": placement.replicas,
        "placement_strategy": strategy,
        "replica_cpus": bundle["CPU"],
        "replica_gpus": bundle.get("GPU", 0.0),
        "actors_asked": placement.actors,
        "local_actors": sum(r["actors"] for r in replicas),
        "overflow_actors": placement.actors - sum(r["actors"] for r in replicas),
        "overflow_served": sum(served),
        "replicas": replicas,
    }


def _amounts(resources: dict[str, float]) -> str:
    """E.g. ``2 CPUs, 1 GPU``."""
    shown = [_many(resources.get(k, 0.0), k) for k in ("CPU", "GPU") if resources.get(k)]
    return ", ".join(shown) or "nothing"


def _follow_replicas(primary: Any, results: list[Any], console: Console) -> None:
    """Print replica 0's progress every 10 s until every replica has returned; on Ctrl-C, ask
    replica 0 to stop, which stops them all at the same learner step."""
    import ray

    pending = list(results)
    try:
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=10.0)
            if pending:
                s = ray.get(primary.status.remote())
                ret = "n/a" if s["mean_return"] is None else f"{s['mean_return']:.1f}"
                console.print(f"{s['frames']:,} frames, mean return {ret}")
    except KeyboardInterrupt:
        console.print("stopping: replica 0 saves its checkpoint and summary")
        primary.stop.remote()
        ray.wait(results, num_returns=len(results))


def _replica_outcomes(
    results: list[Any], node_ids: list[str], run_dir: str
) -> list[dict[str, Any]]:
    """Every replica's outcome, or one line for the first that died (its process or node lost)
    or else failed; the others only report that they lost it."""
    import ray

    from seedbed.runtime.replica_group import ReplicaLost

    n, outcomes, errors = len(results), [], []
    for i, ref in enumerate(results):
        try:
            outcomes.append(ray.get(ref))
        except ray.exceptions.RayActorError as e:
            why = (str(e).strip().splitlines() or ["no reason given"])[0][:200]
            errors.append(
                (0, SeedbedError(f"replica {i} of {n} on Ray node {node_ids[i]} died ({why})"))
            )
        except ray.exceptions.RayTaskError as e:
            cause = e.cause if isinstance(e.cause, SeedbedError) else None
            if cause is None:
                line = (str(e.cause or e).strip().splitlines() or [""])[-1][:300]
                cause = SeedbedError(f"replica {i} of {n} failed: {line}")
            errors.append((2 if isinstance(cause, ReplicaLost) else 1, cause))
    if not errors:
        return outcomes
    rank, error = min(errors, key=lambda x: x[0])
    if rank == 0:  # died: its own line said nothing
        raise SeedbedError(
            f"{error}; the run stopped, and its newest complete checkpoint stays in {run_dir} "
            "on replica 0's node: launch it again with --resume"
        )
    raise error


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


def _start_actor(cpus: float) -> Any:
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
    from seedbed.resolve import resolve
    from seedbed.runtime.rundir import check_run_dir
    from seedbed.runtime.train import default_run_dir

    config = resolve(layers)
    run_dir = Path(config.train.run_dir) if config.train.run_dir else default_run_dir(config)
    check_run_dir(run_dir)  # before Ray starts: a bad one is one line, not a remote traceback
    return [*layers, {"run_dir": str(run_dir.resolve())}]
