"""What a training run runs beside its learner loop: the learner's buffer, the transport, the
inference server and its thread, the policy publisher (and the policy board local actors read),
the actor processes and their supervisor, and the gateway for remote actors (with replicas,
one per replica, replica 0's the front door: ``front_door``).

``Services.start`` makes them, registering how to undo each on the caller's ``ExitStack`` as it
is made, so a failed start undoes what was made; ``Services.go`` starts the threads and
processes. torch's thread count belongs to each thread: the inference thread keeps the
process's, the learner's thread takes the count ``thread_budget`` gives it.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np
import torch
from rich.console import Console

from seedbed.actor import run_actor
from seedbed.actor.local import LocalActing, acted_fields
from seedbed.config import RunConfig, TrainConfig, to_dict
from seedbed.errors import ConfigError, SeedbedError
from seedbed.inference.publish import PolicyPublisher
from seedbed.inference.server import InferenceServer
from seedbed.quantize import encode_policy
from seedbed.replay import UnrollQueue
from seedbed.replicate import ReplicaContext
from seedbed.runtime.front_door import FrontDoor, shared_token
from seedbed.runtime.supervisor import ActorSupervisor
from seedbed.transport import backend
from seedbed.transport.base import Fields, ServerTransport, TransportSpec
from seedbed.transport.board import PolicyBoard
from seedbed.transport.remote import ActorGateway, Assignment, read_secret
from seedbed.transport.remote.gateway_process import GatewayProcesses
from seedbed.types import Buffer, EnvSpec

log = logging.getLogger(__name__)


def read_secrets(cfg: TrainConfig) -> tuple[bytes | None, tuple[bytes, bytes] | None]:
    """The remote actors' token and the TLS certificate and key, read before anything starts."""
    token = read_secret(cfg.token_file, "--token-file")
    if cfg.tls_cert is None:
        return token, None
    return token, (
        read_secret(cfg.tls_cert, "--tls-cert"),
        read_secret(cfg.tls_key, "--tls-key"),
    )


def thread_died(name: str, error: BaseException) -> SeedbedError:
    """The run's one-line error for thread ``name`` ended by ``error`` (its traceback is logged,
    shown with -v)."""
    log.debug("the %s thread failed", name, exc_info=error)
    what = str(error).strip().splitlines()[0] if str(error).strip() else ""
    return SeedbedError(
        f"the {name} thread failed ({type(error).__name__}{': ' + what if what else ''}); the "
        "run stopped with a final checkpoint: `seedbed -v train ...` shows the traceback; fix "
        "the cause, then --resume"
    )


def thread_budget(cfg: TrainConfig) -> dict[str, int]:
    """Set the process's torch threads (``--threads``, where set) and say how many each thread
    that computes gets: ``inference`` the process's, ``learner`` ``--learner-threads``."""
    if cfg.threads:
        torch.set_num_threads(cfg.threads)
    # torch's thread count is per thread. Inference keeps the process's; the learner's
    # updates leave a core to inference and the actors, since learner threads that share
    # every core with them wait on each other (docs/benchmarks.md).
    process = torch.get_num_threads()
    return {"inference": process, "learner": cfg.learner_threads or max(1, process - 1)}


@dataclasses.dataclass(eq=False)
class Services:
    """The parts a run starts beside its learner loop, and what they are made from."""

    config: RunConfig
    layout: TrainConfig  # this replica's share of the run (``TrainConfig.replica_shard``)
    agent: Any  # a ``seedbed.agents.base.Agent``
    spec: EnvSpec
    device: torch.device  # where inference acts
    run_dir: Path  # where the gateway writes ``listen_address``
    console: Console  # where the gateway says how remote actors connect
    secrets: tuple[bytes | None, tuple[bytes, bytes] | None]  # ``read_secrets``'s
    threads: dict[str, int]  # ``thread_budget``'s
    replica: ReplicaContext  # which replica this is, and the collectives the replicas meet with
    # Made by ``start``: None before.
    buffer: Buffer | None = dataclasses.field(default=None, init=False)
    server: InferenceServer | None = dataclasses.field(default=None, init=False)
    publisher: PolicyPublisher | None = dataclasses.field(default=None, init=False)
    supervisor: ActorSupervisor | None = dataclasses.field(default=None, init=False)
    gateway: ActorGateway | GatewayProcesses | None = dataclasses.field(default=None, init=False)
    # With --listen and several replicas: how they place remote actors and count them.
    front_door: FrontDoor | None = dataclasses.field(default=None, init=False)
    # Per actor slot: seconds stepping envs and waiting for actions, as the transport closed.
    actor_times: np.ndarray = dataclasses.field(
        default_factory=lambda: np.zeros((0, 2)), init=False
    )
    threads_used: dict[str, int] = dataclasses.field(default_factory=dict, init=False)
    _serving: list[threading.Thread] = dataclasses.field(default_factory=list, init=False)
    # The first error of an inference or gateway thread, which the learner loop raises: a dead
    # thread must stop the run rather than leave it idle.
    error: SeedbedError | None = dataclasses.field(default=None, init=False)

    def start(self, ctx: Any, processes: contextlib.ExitStack, learner_steps: int) -> None:
        """Make the buffer, transport, servers and actors (``go`` starts them), the policy
        published at ``learner_steps``; ``processes`` stops them."""
        cfg = self.layout
        queue = self.agent.make_buffer(cfg.unroll, cfg.queue_size, cfg.batch, cfg.seed)
        if cfg.lockstep:
            if not isinstance(queue, UnrollQueue):
                raise ConfigError(
                    f"--lockstep is for agents that learn each unroll once (ppo, vtrace); "
                    f"{cfg.agent} learns from a replay buffer: leave --lockstep off"
                )
            queue.hold_acting(cfg.batch)
        local = cfg.inference == "local"
        transports = backend(cfg.transport)  # --transport: how actor processes reach us
        acted = acted_fields(self.agent, self.spec) if local else ()
        transport = transports.make_server(self._transport_spec(acted), ctx)
        # ``processes`` undoes these last to first: the inference thread, the actors, the
        # transport (remote actors' streams are told that training is over), the gateway and
        # the policy board. A failed start undoes what was made.
        processes.callback(transport.close)
        board = self._policy_board(transports.make_board) if local else None
        if board is not None:
            processes.callback(board.close)
        server = InferenceServer(
            self.agent,
            transport,
            queue,
            cfg.num_envs,
            self.agent.unroll_layout(cfg.unroll),
            cfg.inference_batch,
            cfg.inference_timeout_ms / 1000.0,
            self.device,
            frames_per_step=self.spec.frame_skip,
            action_shape=self.spec.action_shape,
            action_dtype=self.spec.action_dtype,
            precision=cfg.precision,
            frame_stack=self.spec.learner_stack,
            num_actions=self.spec.num_actions,  # local actors' actions are checked against it
            acting_gate=queue.may_act if cfg.lockstep else None,
        )
        self.publisher = PolicyPublisher(
            self.agent,
            server,
            board,
            cfg.actor_precision if local else cfg.precision,
            cfg.broadcast_every,
        )
        self.publisher.publish(learner_steps, force=True)
        supervisor = self._supervisor(ctx, transport, board)
        self.gateway = self._gateway(transport, acted) if cfg.listen else None
        if self.gateway is not None:
            processes.callback(self.gateway.stop)
        processes.callback(transport.close)  # before the gateway's stop (closing twice is fine)
        processes.callback(self._keep_actor_times, transport)
        stop = threading.Event()
        serving = [
            threading.Thread(
                target=self._serve,
                args=(server, stop),
                name="inference" if i == 0 else f"inference-{i}",
                daemon=True,
            )
            for i in range(cfg.inference_threads)
        ]
        self.supervisor, self.server, self.buffer = supervisor, server, queue
        processes.callback(supervisor.stop)
        processes.callback(self._stop_serving, stop, queue, serving)
        self._serving = serving

    def go(self) -> None:
        """Start the actors, the inference threads and the gateway; the calling thread, the
        learner's, takes its own torch thread count."""
        self.supervisor.start()
        for thread in self._serving:
            thread.start()
        if self.gateway is not None:
            self.gateway.start()
        torch.set_num_threads(self.threads["learner"])  # this thread's, not inference's

    def _supervisor(
        self, ctx: Any, transport: ServerTransport, board: PolicyBoard | None
    ) -> ActorSupervisor:
        """The local actors' supervisor; with a ``board``, the actors act themselves."""
        cfg = self.layout
        acting = (
            LocalActing(cfg.agent, self.config.agent, self.spec, cfg.num_envs, board.handle)
            if board is not None
            else None
        )
        return ActorSupervisor(
            cfg.actors,
            transport.connect,
            run_actor,
            (cfg.env, cfg.envs_per_actor, self.config.env_settings, acting, cfg.plugins),
            cfg.seed,
            ctx,
            cfg.max_actor_restarts,
        )

    def _stop_serving(
        self, stop: threading.Event, queue: Buffer, serving: list[threading.Thread]
    ) -> None:
        self.threads_used["learner"] = torch.get_num_threads()
        torch.set_num_threads(self.threads["inference"])  # the caller's thread as it was
        stop.set()
        queue.close()
        for thread in serving:
            if thread.ident is not None:  # not started when an actor could not be launched
                thread.join(timeout=10)

    def _transport_spec(self, acted: Fields) -> TransportSpec:
        """What the server carries: every actor slot's envs, as actors send them (one frame
        each where the learner stacks them)."""
        cfg, spec = self.layout, self.spec
        return TransportSpec(
            cfg.num_slots,
            cfg.envs_per_actor,
            spec.sent_obs_shape,
            spec.obs_dtype,
            tuple(spec.action_shape),
            spec.action_dtype,
            acted,
        )

    def _keep_actor_times(self, transport: ServerTransport) -> None:
        self.actor_times = transport.actor_times()

    def _serve(self, server: InferenceServer, stop: threading.Event) -> None:
        """An inference thread, with its own torch thread count, not the learner's."""
        # torch sets a thread's count up at its first use, to the count set last in any thread,
        # and that would undo a count set before it: use it first.
        torch.get_num_threads()
        torch.set_num_threads(self.threads["inference"])
        try:
            server.serve(stop)
        except BaseException as e:  # its traceback, shown as the run's one line, not raised
            self._died(threading.current_thread().name, e)
        finally:
            self.threads_used["inference"] = torch.get_num_threads()

    def _died(self, name: str, error: BaseException) -> None:
        """Thread ``name`` ended by ``error``: the first such is the run's error."""
        if self.error is None:
            self.error = thread_died(name, error)

    def _gateway_died(self, error: BaseException) -> None:
        """A gateway process died or failed: the run's one line names it."""
        if self.error is None:
            self.error = SeedbedError(
                f"{error}; the run stopped with a final checkpoint: fix the cause, then --resume"
            )

    def _policy_board(self, make_board: Callable[[int], PolicyBoard]) -> PolicyBoard:
        """Where local actors find the newest policy; fp32 is the largest payload there is (the
        slack is for its header, whose version number grows)."""
        fp32 = encode_policy(self.agent.network, "fp32", 0, self.agent.acting_skips)
        return make_board(len(fp32) + 64)

    def _gateway(
        self, transport: ServerTransport, acted: Fields
    ) -> ActorGateway | GatewayProcesses:
        """The listener for remote actors (in this process, or ``--gateways`` processes);
        they take the slots after the local actors'."""
        cfg = self.layout
        settings = to_dict(self.config.env_settings)  # plain values: JSON to remote actors

        local = None
        if cfg.inference == "local":
            local = {
                "agent": cfg.agent,
                "agent_config": to_dict(self.config.agent),
                "num_envs": cfg.num_envs,
                "acted": [list(field) for field in acted],
            }

        def assign(slot: int, connection: int) -> Assignment:
            return Assignment(
                env_id=cfg.env,
                num_envs=cfg.envs_per_actor,
                seed=cfg.seed + 1_000_003 * (connection + 1) + slot,  # new episodes each time
                settings=settings,
                slot=slot,
                obs_dtype=self.spec.obs_dtype,
                obs_shape=self.spec.sent_obs_shape,  # what the actor sends
                action_dtype=self.spec.action_dtype,
                action_shape=tuple(self.spec.action_shape),
                local=None if local is None else {**local, "first_env": slot * cfg.envs_per_actor},
                plugins=cfg.plugins,
            )

        token, tls = self.secrets
        token_file = cfg.token_file
        if token is None:  # every listener has a token: this run's own, in its directory
            token, path = shared_token(self.replica, self.run_dir)
            token_file = str(path)  # the console line below says where
        slots = list(range(cfg.actors, cfg.num_slots))
        board = None if self.publisher.board is None else self.publisher.board.handle
        if cfg.gateways > 1:
            gateway = GatewayProcesses(
                cfg.gateways,
                cfg.listen,
                slots,
                transport,
                assign,
                token=token,
                tls=tls,
                board=board,
                on_failure=self._gateway_died,
                wire=cfg.wire,
            )
        else:
            gateway = ActorGateway(
                cfg.listen,
                slots,
                functools.partial(transport.connect, in_process=True),
                assign,
                token=token,
                tls=tls,
                board=board,
                on_failure=functools.partial(self._died, "actor-gateway"),
                wire=cfg.wire,
            )
        if self.replica.num_replicas > 1:
            try:  # before the gateway serves, so that replica 0 places its very first actor
                shares = [
                    self.config.train.replica_shard(i).remote_actors
                    for i in range(self.replica.num_replicas)
                ]
                self.front_door = FrontDoor(self.replica, gateway, shares)
            except BaseException:
                gateway.stop(0)
                raise
        if not self.replica.is_primary:
            return gateway  # actors are told of the front door alone
        # Port 0 picks a free port: say which, for people and for scripts that start actors.
        (self.run_dir / "listen_address").write_text(gateway.address + "\n")
        self.console.print(
            f"[bold]remote actors:[/] seedbed actor --connect {gateway.address}"
            + f" --token-file {token_file}"
            + (" --tls-ca CERT" if cfg.tls_cert else "")
            + (f" --wire {cfg.wire}" if cfg.wire != "grpc" else "")
        )
        return gateway
