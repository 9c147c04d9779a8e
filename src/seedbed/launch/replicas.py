"""Learner replicas on a Ray cluster (``seedbed launch --ray --learner-replicas N``).

N ``ReplicaHost`` Ray actors, on distinct nodes where the cluster has enough (a placement
group), each run a learner replica with its share of the actors as local processes on its own
node, and form their process group through a store that replica 0 opens. Where a node cannot
hold a replica's share (``placement.local_actors_per_replica``), the rest overflow: they run as
``ActorHost`` Ray actors wherever Ray finds room and connect over gRPC to replica 0's gateway,
the front door, which places each on a replica with a free slot. Only with overflow do the
replicas listen: on their nodes' addresses (127.0.0.1 with a local Ray), with the run's own
token. A replica that dies stops the run in one line that names it and its node.
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import shutil
import tempfile
import threading
import time
from typing import Any

from rich.console import Console

from seedbed.errors import SeedbedError
from seedbed.launch.placement import Placement, amounts, local_actors_per_replica, many
from seedbed.launch.single import start_actor
from seedbed.telemetry import write_json_atomic

# How long a placement group may wait for room on the cluster before the launch is refused.
PLACEMENT_WAIT_S = 60.0
# How long a replica's collective waits for a missing peer: past it, the replicas stop.
REPLICA_TIMEOUT_S = 60.0


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

    def front_door(self, timeout_s: float = 120.0) -> tuple[str, str, str] | None:
        """Replica 0, with ``listen``: where overflow actors connect, the run's token (in its
        run directory, on this node) and its ``--wire``, once its gateway listens; None if it
        ended before."""
        from seedbed.transport.remote.wire import TOKEN_FILE

        deadline = time.monotonic() + timeout_s
        while self.run is None or self.run.gateway is None:
            if self._ended.is_set() or time.monotonic() > deadline:
                return None
            time.sleep(0.05)
        token = (self.run.run_dir / TOKEN_FILE).read_text().strip()
        return self.run.gateway.address, token, self.run.gateway.wire

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
            f"the Ray cluster has {many(len(nodes), 'node')} for {n} replicas: some replicas "
            "share a node (placement SPREAD, not STRICT_SPREAD)"
        )
    layers = [*layers, {"progress": False}]  # the driver prints the progress
    if overflow:
        console.print(
            f"each replica's node holds {many(local, 'actor')} of its {placement.actors // n}; "
            f"the other {many(overflow * n, 'actor')} run wherever Ray finds room and connect "
            "over gRPC"
        )
        layers.append({"actors": local * n, "remote_actors": overflow * n})
    group = placement_group([bundle] * n, strategy=strategy)
    hosts: list[Any] = []
    actors: list[Any] = []
    try:
        if not ray.wait([group.ready()], timeout=PLACEMENT_WAIT_S)[0]:
            raise SeedbedError(
                f"the Ray cluster has no room for {n} learner replicas of {amounts(bundle)} "
                f"each ({amounts(ray.cluster_resources())} in all); lower --actors, "
                "--actor-cpus or --learner-cpus"
            )
        hosts = _start_replica_hosts(group, bundle, n, cluster)
        actors = [start_actor(placement.actor_cpus) for _ in range(overflow * n)]
        _wait_for_overflow(actors)
        node_ids = ray.get([host.node.remote() for host in hosts])
        store = ray.get(hosts[0].rendezvous.remote(REPLICA_TIMEOUT_S))
        console.print(f"{n} learner replicas on {many(len(set(node_ids)), 'node')}")
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
            f"on their replicas' nodes ({amounts(ray.cluster_resources())} in all); lower "
            "--actors, --actor-cpus or --learner-cpus"
        )


def _act_at_front_door(primary: Any, actors: list[Any]) -> list[Any]:
    """Start the overflow actors acting at replica 0's gateway, with the run's token; none
    where replica 0 ended before it listened (its error follows from its result)."""
    import ray

    door = ray.get(primary.front_door.remote()) if actors else None
    if door is None:
        return []
    return [actor.act.remote(*door) for actor in actors]


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


def _follow_replicas(primary: Any, results: list[Any], console: Console) -> None:
    """Print replica 0's progress every 10 s until every replica has returned (progress stops
    where replica 0 died); on Ctrl-C, ask replica 0 to stop, which stops them all at the same
    learner step."""
    import ray

    pending = list(results)
    try:
        while pending:
            _, pending = ray.wait(pending, num_returns=len(pending), timeout=10.0)
            if pending and primary is not None:
                try:
                    s = ray.get(primary.status.remote())
                except ray.exceptions.RayActorError:
                    primary = None  # its result names the death; the others end on losing it
                    continue
                ret = "n/a" if s["mean_return"] is None else f"{s['mean_return']:.1f}"
                console.print(f"{s['frames']:,} frames, mean return {ret}")
    except KeyboardInterrupt:
        console.print("stopping: replica 0 saves its checkpoint and summary")
        if primary is not None:
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
