"""A training run on one machine: actors, central inference and the learner, wired together.

``train(config)`` and ``TrainingRun`` are the entry points; the runtime package is the only part
that knows about processes, threads and the run directory. The learner runs in the calling
thread (its updates, with ``--learner-process``, in a process of their own); the inference
server in a thread beside it; actors in spawned processes watched by the
supervisor. ``TrainingRun`` only wires and runs; each of its parts has a module of its own:
``services`` (transport, inference, actors, gateway), ``learner_loop``, ``stopping`` (the stop
rules), ``replica_stats`` (counters merged over replicas), ``progress`` (the counters and the
checkpoint that keeps them), ``rundir`` (the run directory's files) and ``summary``.

With ``--learner-replicas N`` there are N such learners, one process each (as SEED spreads its
learner over accelerator cores): each serves its share of the actors through its own inference
server and learns from its share of every batch; gradients are averaged over replicas before each
update (``seedbed.replicate``), so their parameters stay identical. The replicas meet only after
a learner step, where replica 0 says whether to log, checkpoint or stop; metrics are merged over
all replicas, and replica 0 alone writes files. ``train`` starts them on this machine; under
torchrun (or the Ray launcher) this process is one of them, wherever the others run
(``train_replica``), and replica 0 hands the others what they would read from the run directory
(``replica_group``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import logging
import multiprocessing
import signal
import threading
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
from rich.console import Console

from seedbed.agents import make_agent
from seedbed.config import RunConfig
from seedbed.energy import EnergyMeter
from seedbed.envs import make_spec
from seedbed.errors import ConfigError, SeedbedError
from seedbed.inference.server import InferenceServer
from seedbed.plugins import import_plugins
from seedbed.replicate import ReplicaContext, Replicator, launched_replicas, spawn
from seedbed.runtime.checkpoint import NonFiniteState, latest_checkpoint
from seedbed.runtime.learner_loop import LearnerLoop
from seedbed.runtime.progress import Progress, checkpoint_payload, restore
from seedbed.runtime.replica_group import (
    lost_replica_line,
    replica_device,
    share_config,
    share_resume,
)
from seedbed.runtime.replica_stats import replicas_in_sync
from seedbed.runtime.rundir import RunFiles, check_run_dir
from seedbed.runtime.services import Services, read_secrets, thread_budget
from seedbed.runtime.signals import StopNow, StopSignals
from seedbed.runtime.stopping import StopRules
from seedbed.runtime.summary import run_summary
from seedbed.runtime.supervisor import ActorSupervisor, actor_context
from seedbed.telemetry import EpisodeWindow, plot_curve
from seedbed.transport.address import on_host
from seedbed.transport.remote import ActorGateway
from seedbed.transport.remote.gateway_process import GatewayProcesses

log = logging.getLogger(__name__)

# How long an orderly stop (the final checkpoint, summary and plot) may take after the first
# Ctrl-C before the run is ended at once: far beyond a normal stop, it only bounds a hung one.
STOP_GRACE_S = 120.0


def default_run_dir(config: RunConfig) -> Path:
    stamp = time.strftime("%Y%m%d-%H%M%S")
    env = config.train.env.replace("/", "_").replace(":", "_")
    return Path("runs") / f"{env}-{config.train.agent}-{stamp}"


class TrainingRun:
    """One run: set up from a config (fresh or resumed), ``run()`` it, get its summary.

    It wires the parts and runs them: the ``Services`` beside the learner (transport, inference,
    actors, gateway), the ``LearnerLoop`` in the calling thread with the run's ``StopRules``,
    the run directory's files (``RunFiles``) and the counters they share (``Progress``).
    ``replica`` makes it one of a replicated learner's replicas (see the module docstring); by
    default it is the only one.
    """

    def __init__(
        self,
        config: RunConfig,
        console: Console | None = None,
        replica: ReplicaContext | None = None,
    ) -> None:
        self.config = config
        cfg = config.train
        self.console = console or Console(stderr=True)
        self.run_dir = Path(cfg.run_dir) if cfg.run_dir else default_run_dir(config)
        if cfg.device == "cuda" and not torch.cuda.is_available():
            raise SeedbedError("--device cuda: no CUDA device is available; use --device cpu")
        self.replica = replica or ReplicaContext(0, 1, torch.device(cfg.device), False)
        self.primary = self.replica.is_primary  # the replica that logs and writes files
        self.layout = cfg.replica_shard(self.replica.replica_id)  # this replica's actors, batch
        self.device = self.replica.device
        threads = thread_budget(cfg)
        self._context = actor_context()  # it loads while the agent is built
        self.spec = make_spec(cfg.env, config.env_settings)
        secrets = read_secrets(cfg)
        # Before the networks exist, and alike on every replica: the seed fixes their init too.
        torch.manual_seed(cfg.seed)
        self.agent = make_agent(
            cfg.agent, self.spec, config.agent, self.device, self.layout.num_envs
        )
        self.progress = Progress()
        self.files = RunFiles(self.run_dir, lambda: self.progress.frames)
        # Replica 0 alone reads and writes the run directory; the others may be on machines
        # without it, and get the checkpoint to resume from over the process group.
        resume_from = share_resume(self.replica, lambda: self.files.prepare(config))
        if resume_from is not None:
            restore(*resume_from, self.agent, self.progress)
        if self.replica.num_replicas > 1:
            for optimizer in self.agent.optimizers():
                self.replica.wrap_optimizer(optimizer)  # also copies replica 0's parameters
            torch.manual_seed(self.layout.seed)  # each replica samples its own actions
        self.services = Services(
            config=config,
            layout=self.layout,
            agent=self.agent,
            spec=self.spec,
            device=self.device,
            run_dir=self.run_dir,
            console=self.console,
            secrets=secrets,
            threads=threads,
            replica=self.replica,
        )
        self.stopping = StopRules(self.layout, self.progress)
        self.learner = LearnerLoop(
            self.services, self.progress, self.stopping, self.replica, self.files
        )
        self.started_at = time.time()
        self.energy: dict[str, Any] | None = None  # this session's, from EnergyMeter.stop()
        self._meter: EnergyMeter | None = None

    # What the Ray launcher (and tests) watch while the run goes on, from other threads.
    @property
    def frames(self) -> int:
        return self.progress.frames

    @property
    def window(self) -> EpisodeWindow:
        return self.progress.window

    @property
    def server(self) -> InferenceServer | None:
        return self.services.server

    @property
    def supervisor(self) -> ActorSupervisor | None:
        return self.services.supervisor

    @property
    def gateway(self) -> ActorGateway | GatewayProcesses | None:
        return self.services.gateway

    def request_stop(self) -> None:
        """Stop as Ctrl-C would (final checkpoint and summary), from any thread."""
        self.stopping.request()

    def run(self) -> dict[str, Any] | None:
        """Train until the target return, the frame budget, an error or Ctrl-C; return summary
        (None on replicas other than 0)."""
        ctx = self._context
        with contextlib.ExitStack() as metric_files:
            # Undone last to first, each step even when one before it fails or a third signal
            # interrupts it: shared memory and processes are released on every path.
            metric_files.callback(self.files.close_logger)
            metric_files.callback(self.learner.close)  # after the final checkpoint
            with contextlib.ExitStack() as processes:
                reason, error = "error", None
                start = self._start(ctx, processes)  # a failed start trains nothing
                try:
                    reason = self.learner.run(start, self._save)
                except StopNow:
                    raise  # a third signal: the newest complete checkpoint is what stays
                except KeyboardInterrupt:
                    reason = "interrupted"  # no StopSignals around us: Ctrl-C raised here
                except SeedbedError as e:
                    error = e  # still save what was learned, then report it
                elapsed = time.perf_counter() - start
            if error is not None and self.replica.num_replicas > 1:
                raise error  # the other replicas wait in a collective: the launcher stops them
            summary = None if self.files.failed else self._finish(reason, elapsed)
            if error is not None:
                raise error
            return summary

    def _start(self, ctx: Any, processes: contextlib.ExitStack) -> float:
        """Make the services and start them, with the metric files and the energy meter;
        ``processes`` stops them. Returns the session's ``perf_counter`` start."""
        cfg = self.layout
        processes.callback(self._energy_stop)  # undone last, after the services
        self.services.start(ctx, processes, self.progress.learner_steps)
        self.learner.start()
        if self.primary:
            self.files.open_logger(self.config, self.console)
        # Replica 0 measures for all: CodeCarbon's machine mode counts the whole machine.
        self._meter = EnergyMeter(cfg.country, enabled=cfg.energy and self.primary)
        self._meter.start()  # this session only; returns at once, CodeCarbon starts meanwhile
        start = time.perf_counter()
        self.started_at = time.time()
        self.services.go()
        return start

    def _energy_stop(self) -> None:
        if self._meter is not None:
            self.energy = self._meter.stop()

    def _save(self, elapsed: float) -> Path:
        wall_s = self.progress.wall_offset + elapsed
        agent_state = self.learner.agent_state()  # after every update so far
        payload = checkpoint_payload(agent_state, self.progress, wall_s, self.config)
        keep = self.config.train.keep_checkpoints + 1
        return self.files.save_checkpoint(self.progress.frames, payload, keep)

    def _finish(self, reason: str, elapsed: float) -> dict[str, Any] | None:
        """The final row, checkpoint and summary (replica 0's); None on the other replicas."""
        self.learner.updates.wait_all()  # a learner process's last updates count in the row
        self.learner.log_row(elapsed)  # the last row: the checkpoint's counters
        in_sync = replicas_in_sync(self.replica, self.agent.network)
        if self.services.front_door is not None:
            self.services.front_door.tally()  # a collective: what each replica's gateway served
        if not self.primary:
            return None
        self.files.close_logger()
        refused = None
        try:
            checkpoint = self._save(elapsed)
        except NonFiniteState as e:  # the newest finite checkpoint stays the run's last
            refused, checkpoint = e, latest_checkpoint(self.run_dir)
            reason = "error"
        wall_s = self.progress.wall_offset + elapsed
        summary = run_summary(self, reason, wall_s, in_sync, checkpoint)
        self.files.write_summary(summary)
        if refused is not None:
            raise refused
        try:
            summary["curve"] = str(plot_curve(self.run_dir, self.config.train.target_return))
        except Exception as e:  # a plot must never lose a finished run
            log.warning("could not draw the learning curve: %s", e)
        return summary


def train(config: RunConfig, console: Console | None = None) -> dict[str, Any] | None:
    """Run training as configured and return its summary (also saved as summary.json).

    In the main thread, SIGINT and SIGTERM stop the run in order (see ``StopSignals``). In a
    process that torchrun started, it is one replica of a learner spread over its processes
    (``replica_group``), and returns the summary on replica 0 alone (None on the others).
    """
    if launched_replicas() > 1:
        return train_replica(config, console)
    replicas = config.train.learner_replicas
    if replicas == 1:
        run = TrainingRun(config, console)
        with StopSignals(run.request_stop, STOP_GRACE_S):
            return run.run()
    if config.train.device == "cuda" and torch.cuda.device_count() < replicas:
        raise SeedbedError(
            f"--device cuda with --learner-replicas {replicas} needs {replicas} GPUs, one per "
            f"replica; this machine has {torch.cuda.device_count()}"
        )
    # One folder for every replica, checked before they start.
    run_dir = Path(config.train.run_dir) if config.train.run_dir else default_run_dir(config)
    config = dataclasses.replace(
        config, train=dataclasses.replace(config.train, run_dir=str(run_dir))
    )
    check_run_dir(run_dir)
    # A lock-free flag: an Event's set() waits for its sleepers, and a replica killed while
    # waiting on one would hang the launcher.
    stop = multiprocessing.get_context("spawn").RawValue("b", 0)
    with StopSignals(functools.partial(setattr, stop, "value", 1), STOP_GRACE_S):
        return spawn(replicas, _run_replica, config, stop)[0]


def train_replica(
    config: RunConfig,
    console: Console | None = None,
    made: Callable[[TrainingRun], None] | None = None,
    listen_host: str | None = None,
) -> dict[str, Any] | None:
    """Run as one replica of the learner a launcher started (torchrun; ``launched_replicas``).

    Joins the process group (env://; gloo on CPU, NCCL with ``--device cuda`` on the GPU of
    this process's ``LOCAL_RANK``), takes replica 0's settings, and trains. Returns the summary
    on replica 0, None on the others. SIGINT and SIGTERM stop the run in order: any replica's
    stop request stops all of them at the same learner step. ``made`` is handed the run once
    it is made (the Ray launcher follows and stops it from other threads). ``listen_host``:
    with --listen, the host this replica listens on in place of replica 0's, which the shared
    settings carry (the Ray launcher's replicas each listen on their own node's address).

    A launcher that formed the process group itself (the Ray launcher) leaves it to this one.
    """
    world = launched_replicas()
    if config.train.learner_replicas != world:
        raise ConfigError(
            f"--learner-replicas {config.train.learner_replicas} does not match the "
            f"{world} processes the launcher started (WORLD_SIZE), one replica each"
        )
    stop = _ReplicaStop()
    # Outermost, so that it also covers the lost-replica report: when one replica dies,
    # torchrun SIGTERMs the others, and that signal must not replace the line that names it.
    with (
        StopSignals(stop, STOP_GRACE_S),  # in the main thread only
        Replicator(device=replica_device(config)) as replica,
        lost_replica_line(replica, config),
    ):
        if replica.is_primary and not config.train.run_dir:  # one folder, replica 0's
            run_dir = str(default_run_dir(config))
            config = dataclasses.replace(
                config, train=dataclasses.replace(config.train, run_dir=run_dir)
            )
        config = share_config(replica, config)
        listen = config.train.listen
        if listen_host is not None and listen and not listen.startswith("unix:"):
            train = dataclasses.replace(config.train, listen=on_host(listen, listen_host))
            config = dataclasses.replace(config, train=train)
        run = stop.run = TrainingRun(config, console, replica=replica)
        if made is not None:
            made(run)
        return run.run()


class _ReplicaStop:
    """The first Ctrl-C or SIGTERM to a launched replica: before its run is made, stop at once
    (there is nothing to save); from then on, stop the run in order, which a run that already
    ended, or failed, ignores."""

    def __init__(self) -> None:
        self.run: TrainingRun | None = None

    def __call__(self) -> None:
        if self.run is None:
            raise StopNow
        self.run.request_stop()


def _run_replica(config: RunConfig, stop: Any) -> dict[str, Any] | None:
    """One learner replica (a process of its own); ``stop`` is the launcher's Ctrl-C flag."""
    # Ctrl-C and a scheduler's SIGTERM may reach the whole process group; the launcher alone
    # acts on them and passes them on as ``stop``, so every replica ends at the same step.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    import_plugins(config.train.plugins)  # a spawned process: their registrations are not here
    with Replicator(device="cpu" if config.train.device == "cpu" else None) as replica:
        run = TrainingRun(config, replica=replica)

        def watch() -> None:
            while not stop.value:
                time.sleep(0.1)
            run.request_stop()

        threading.Thread(target=watch, name="stop-watch", daemon=True).start()
        return run.run()
