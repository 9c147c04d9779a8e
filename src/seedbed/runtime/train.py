"""A training run on one machine: actors, central inference and the learner, wired together.

``train(config)`` is the only function that knows about processes, threads and the run directory.
The learner runs in the calling thread; the inference server in a thread beside it; actors in
spawned processes watched by the supervisor.

With ``--learner-replicas N`` there are N such learners, one process each (as SEED spreads its
learner over accelerator cores): each serves its share of the actors through its own inference
server and learns from its share of every batch; gradients are averaged over replicas before each
update (``seedbed.replicate``), so their parameters stay identical. The replicas meet only after
a learner step, where replica 0 says whether to log, checkpoint or stop; metrics are merged over
all replicas, and replica 0 alone writes files.
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
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import numpy as np
import torch
import yaml
from rich.console import Console

from seedbed.actor import run_actor
from seedbed.agents import make_agent
from seedbed.config import RunConfig, TrainConfig, to_dict
from seedbed.energy import EnergyMeter
from seedbed.envs import make_spec
from seedbed.errors import SeedbedError
from seedbed.inference.local import LocalActing, acted_fields
from seedbed.inference.publish import PolicyPublisher
from seedbed.inference.server import InferenceServer, InferenceStats
from seedbed.loggers import DEFAULT_LOGGERS, RunLogger
from seedbed.quantize import encode_policy
from seedbed.replicate import ReplicaContext, Replicator, spawn
from seedbed.runtime.checkpoint import latest_checkpoint, load_latest, save_checkpoint
from seedbed.runtime.rundir import check_run_dir
from seedbed.runtime.signals import StopNow, StopSignals
from seedbed.runtime.supervisor import ActorSupervisor
from seedbed.telemetry import EpisodeWindow, Stopwatch, plot_curve, write_json_atomic
from seedbed.transport import backend
from seedbed.transport.base import Fields, ServerTransport, TransportSpec
from seedbed.transport.board import PolicyBoard
from seedbed.transport.remote import ActorGateway, Assignment, read_secret
from seedbed.types import Buffer

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
        if cfg.threads:
            torch.set_num_threads(cfg.threads)
        # torch's thread count is per thread. Inference keeps the process's; the learner's
        # updates leave a core to inference and the actors: on 2 cores, two learner threads
        # shared with them spent about a third of each step waiting on each other (a step took
        # 465 ms of CPU in a run, 300 alone; benchmarks.md).
        process = torch.get_num_threads()
        self.threads = {"inference": process, "learner": cfg.learner_threads or max(1, process - 1)}
        self.spec = make_spec(cfg.env, config.env_settings)
        self.secrets = self._read_secrets()
        # Before the networks exist, and alike on every replica: the seed fixes their init too.
        torch.manual_seed(cfg.seed)
        self.agent = make_agent(
            cfg.agent, self.spec, config.agent, self.device, self.layout.num_envs
        )
        self.window = EpisodeWindow(100)
        self.frames = self.learner_steps = 0
        self.wall_offset = 0.0
        self.target_reached: dict[str, float] | None = None
        self.energy: dict[str, Any] | None = None  # this session's, from EnergyMeter.stop()
        resume_from = self._prepare_run_dir()
        if resume_from is not None:
            self._restore(*resume_from)
        if self.replica.num_replicas > 1:
            for optimizer in _optimizers(self.agent):
                self.replica.wrap_optimizer(optimizer)  # also copies replica 0's parameters
            torch.manual_seed(self.layout.seed)  # each replica samples its own actions
        self.actor_restarts = 0  # over all replicas
        self.checkpoints = self.run_dir / "checkpoints"
        self.supervisor: ActorSupervisor | None = None  # set while running
        self.server: InferenceServer | None = None
        self.publisher: PolicyPublisher | None = None
        self.buffer: Buffer | None = None
        self.gateway: ActorGateway | None = None
        self.actor_times = np.zeros((0, 2))  # per actor slot: stepping envs, waiting
        self.threads_used: dict[str, int] = {}  # torch threads, as each thread ended the run
        self.stopwatch = Stopwatch()  # the learner thread's time
        self._stop_requested = threading.Event()
        self.started_at = time.time()
        self._logger: RunLogger | None = None  # replica 0's, while running
        self._meter: EnergyMeter | None = None
        self._acc: _Window | None = None  # the learner metrics of the row being gathered
        # The frame count of the last metrics row: a resumed run's rows go on after its
        # checkpoint's, which holds that row's counters.
        self._row_frames = self.frames
        self._row_batches = np.zeros(2, np.int64)  # inference batches and envs since that row
        self._write_failed = False  # the run directory failed: nothing more is written

    def _read_secrets(self) -> tuple[bytes | None, tuple[bytes, bytes] | None]:
        """The remote actors' token and the TLS certificate and key, read before anything starts."""
        cfg = self.config.train
        token = read_secret(cfg.token_file, "--token-file")
        if cfg.tls_cert is None:
            return token, None
        return token, (
            read_secret(cfg.tls_cert, "--tls-cert"),
            read_secret(cfg.tls_key, "--tls-key"),
        )

    def _prepare_run_dir(self) -> tuple[Path, dict[str, Any]] | None:
        """Check the run directory and save the config; with --resume, the checkpoint to resume
        from (the newest that loads) and its contents."""
        cfg = self.config.train
        # Replica 0 alone sets damaged checkpoints aside; the others skip the same ones.
        found = load_latest(self.run_dir, set_aside=self.primary) if cfg.resume else None
        if cfg.resume and found is None:
            raise SeedbedError(f"--resume: {self.run_dir} has no checkpoint to resume from")
        if not cfg.resume and latest_checkpoint(self.run_dir) is not None:
            raise SeedbedError(
                f"{self.run_dir} already holds a run; pass --resume to continue it or choose "
                "another --run-dir"
            )
        if self.primary:
            check_run_dir(self.run_dir)
            saved = dict(self.config.to_dict(), run_dir=str(self.run_dir), resume=False)
            try:
                (self.run_dir / "config.yaml").write_text(yaml.safe_dump(saved, sort_keys=False))
            except OSError as e:
                raise SeedbedError(
                    f"--run-dir {self.run_dir}: cannot save config.yaml ({e})"
                ) from None
        return found

    def _restore(self, path: Path, state: dict[str, Any]) -> None:
        try:
            self.agent.load_state_dict(state["agent"])
            self.frames, self.learner_steps = int(state["frames"]), int(state["learner_steps"])
            self.wall_offset = float(state["wall_s"])
            self.window.load_state_dict(state["episodes"])
            self.target_reached = state.get("target_reached")
            torch.set_rng_state(state["torch_rng"])
        except (KeyError, RuntimeError, ValueError) as e:
            raise SeedbedError(
                f"checkpoint {path} does not fit this run's settings ({str(e).splitlines()[0]})"
            ) from None
        log.info("resumed from %s at %d frames", path, self.frames)

    def _payload(self, wall_s: float) -> dict[str, Any]:
        return {
            "agent": self.agent.state_dict(),
            "frames": self.frames,
            "learner_steps": self.learner_steps,
            "wall_s": wall_s,
            "episodes": self.window.state_dict(),
            "target_reached": self.target_reached,
            "torch_rng": torch.get_rng_state(),
            "config": self.config.to_dict(),
        }

    def request_stop(self) -> None:
        """Stop as Ctrl-C would (final checkpoint and summary), from any thread."""
        self._stop_requested.set()

    def run(self) -> dict[str, Any] | None:
        """Train until the target return, the frame budget, an error or Ctrl-C; return summary
        (None on replicas other than 0)."""
        cfg = self.layout
        ctx = multiprocessing.get_context("spawn")
        with contextlib.ExitStack() as files:
            # Undone last to first, each step even when one before it fails or a third signal
            # interrupts it: shared memory and processes are released on every path.
            files.callback(self._close_logger)
            with contextlib.ExitStack() as processes:
                reason, error = "error", None
                start = self._start(cfg, ctx, processes)  # a failed start trains nothing
                try:
                    reason = self._loop(self.buffer, self.server, self.supervisor, start)
                except StopNow:
                    raise  # a third signal: the newest complete checkpoint is what stays
                except KeyboardInterrupt:
                    reason = "interrupted"  # no StopSignals around us: Ctrl-C raised here
                except SeedbedError as e:
                    error = e  # still save what was learned, then report it
                elapsed = time.perf_counter() - start
            if error is not None and self.replica.num_replicas > 1:
                raise error  # the other replicas wait in a collective: the launcher stops them
            summary = None if self._write_failed else self._finish(reason, elapsed)
            if error is not None:
                raise error
            return summary

    def _start(self, cfg: RunConfig, ctx: Any, processes: contextlib.ExitStack) -> float:
        """Make the transport, servers and actors and start them; ``processes`` stops them."""
        queue = self.agent.make_buffer(cfg.unroll, cfg.queue_size, cfg.batch, cfg.seed)
        local = cfg.inference == "local"
        transports = backend(cfg.transport)  # --transport: how actor processes reach us
        acted = acted_fields(self.agent, self.spec) if local else ()
        transport = transports.make_server(self._transport_spec(cfg, acted), ctx)
        # ``processes`` undoes these last to first: the inference thread, the actors, the
        # transport (remote actors' streams are told that training is over), the gateway and
        # the policy board, then the energy meter. A failed start undoes what was made.
        processes.callback(self._energy_stop)
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
        )
        self._frames_base = self.frames  # the servers count this session's frames
        self.publisher = PolicyPublisher(
            self.agent,
            server,
            board,
            cfg.actor_precision if local else cfg.precision,
            cfg.broadcast_every,
        )
        self.publisher.publish(self.learner_steps, force=True)
        acting = (
            LocalActing(cfg.agent, self.config.agent, self.spec, cfg.num_envs, board.handle)
            if board is not None
            else None
        )
        supervisor = ActorSupervisor(
            cfg.actors,
            transport.connect,
            run_actor,
            (cfg.env, cfg.envs_per_actor, self.config.env_settings, acting),
            cfg.seed,
            ctx,
            cfg.max_actor_restarts,
        )
        self.gateway = self._gateway(transport, acted) if cfg.listen else None
        if self.gateway is not None:
            processes.callback(self.gateway.stop)
        processes.callback(transport.close)  # before the gateway's stop (closing twice is fine)
        processes.callback(self._keep_actor_times, transport)
        stop = threading.Event()
        serving = threading.Thread(
            target=self._serve, args=(server, stop), name="inference", daemon=True
        )
        self.supervisor, self.server, self.buffer = supervisor, server, queue
        processes.callback(supervisor.stop)
        processes.callback(self._stop_serving, stop, queue, serving)
        if self.primary:
            with self._writing():
                self._logger = RunLogger(
                    self.run_dir,
                    total_frames=cfg.total_frames,
                    resume_frames=self.frames if cfg.resume else None,
                    progress=cfg.progress,
                    console=self.console,
                    loggers=(*DEFAULT_LOGGERS, "wandb") if cfg.wandb else DEFAULT_LOGGERS,
                    config=self.config,
                )
        self._acc = _Window(self.wall_offset, self.agent.metric_names)
        # Replica 0 measures for all: CodeCarbon's machine mode counts the whole machine.
        self._meter = EnergyMeter(cfg.country, enabled=cfg.energy and self.primary)
        self._meter.start()  # this session only; returns at once, CodeCarbon starts meanwhile
        start = time.perf_counter()
        self.started_at = time.time()
        supervisor.start()
        serving.start()
        if self.gateway is not None:
            self.gateway.start()
        torch.set_num_threads(self.threads["learner"])  # this thread's, not inference's
        return start

    def _transport_spec(self, cfg: TrainConfig, acted: Fields) -> TransportSpec:
        """What the server carries: every actor slot's envs, as the env spec shapes them."""
        spec = self.spec
        return TransportSpec(
            cfg.num_slots,
            cfg.envs_per_actor,
            tuple(spec.obs_shape),
            spec.obs_dtype,
            tuple(spec.action_shape),
            spec.action_dtype,
            acted,
        )

    def _stop_serving(
        self, stop: threading.Event, queue: Buffer, serving: threading.Thread
    ) -> None:
        self.threads_used["learner"] = torch.get_num_threads()
        torch.set_num_threads(self.threads["inference"])  # the caller's thread as it was
        stop.set()
        queue.close()
        if serving.ident is not None:  # not started when an actor could not be launched
            serving.join(timeout=10)

    def _keep_actor_times(self, transport: ServerTransport) -> None:
        self.actor_times = transport.actor_times()

    def _energy_stop(self) -> None:
        if self._meter is not None:
            self.energy = self._meter.stop()

    def _close_logger(self) -> None:
        """Close the metric files; a failure to is the run directory's, said in one line."""
        if self._logger is None:
            return
        logger, self._logger = self._logger, None
        try:
            logger.close()
        except OSError as e:
            if not self._write_failed:
                raise self._unwritable(e) from None

    @contextlib.contextmanager
    def _writing(self) -> Iterator[None]:
        """Around a write to the run directory: its OSError becomes ``_unwritable``'s line."""
        try:
            yield
        except OSError as e:
            raise self._unwritable(e) from None

    def _unwritable(self, e: OSError) -> SeedbedError:
        """The one-line error for a run directory that failed mid-run (unwritable, full)."""
        self._write_failed = True
        where = f": {e.filename}" if e.filename else ""
        newest = latest_checkpoint(self.run_dir)
        kept = f"its newest complete checkpoint, {newest}, is kept" if newest else "it has none"
        return SeedbedError(
            f"cannot write to the run directory {self.run_dir} ({e.strerror or e}{where}); "
            f"the run stopped at {self.frames:,} frames and {kept}; summary.json was not "
            "written: free space or make the directory writable, then --resume"
        )

    def _serve(self, server: InferenceServer, stop: threading.Event) -> None:
        """The inference thread, with its own torch thread count, not the learner's."""
        # torch sets a thread's count up at its first use, to the count set last in any thread,
        # and that would undo a count set before it: use it first.
        torch.get_num_threads()
        torch.set_num_threads(self.threads["inference"])
        try:
            server.serve(stop)
        finally:
            self.threads_used["inference"] = torch.get_num_threads()

    def _policy_board(self, make_board: Callable[[int], PolicyBoard]) -> PolicyBoard:
        """Where local actors find the newest policy; fp32 is the largest payload there is (the
        slack is for its header, whose version number grows)."""
        fp32 = encode_policy(self.agent.network, "fp32", 0, self.agent.acting_skips)
        return make_board(len(fp32) + 64)

    def _gateway(self, transport: ServerTransport, acted: Fields) -> ActorGateway:
        """The listener for remote actors; they take the slots after the local actors'."""
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
                obs_shape=tuple(self.spec.obs_shape),
                action_dtype=self.spec.action_dtype,
                action_shape=tuple(self.spec.action_shape),
                local=None if local is None else {**local, "first_env": slot * cfg.envs_per_actor},
            )

        token, tls = self.secrets
        gateway = ActorGateway(
            cfg.listen,
            list(range(cfg.actors, cfg.num_slots)),
            functools.partial(transport.connect, in_process=True),
            assign,
            token=token,
            tls=tls,
            board=None if self.publisher.board is None else self.publisher.board.handle,
        )
        # Port 0 picks a free port: say which, for people and for scripts that start actors.
        (self.run_dir / "listen_address").write_text(gateway.address + "\n")
        self.console.print(
            f"[bold]remote actors:[/] seedbed actor --connect {gateway.address}"
            + (" --token-file FILE" if cfg.token_file else "")
            + (" --tls-ca CERT" if cfg.tls_cert else "")
        )
        return gateway

    def _loop(self, queue: Buffer, server, supervisor, start: float) -> str:
        cfg = self.layout
        replicated = self.replica.num_replicas > 1
        acc = self._acc
        next_log = next_ckpt = time.perf_counter()
        next_log += cfg.log_every_s
        next_ckpt += cfg.checkpoint_every_s
        watch = self.stopwatch
        while True:
            batch = queue.get(cfg.batch, timeout=0.05)
            watch.lap("waiting_for_batch")
            if batch is not None:
                batch = batch.to(self.device)
                metrics = self.agent.learn(batch)
                queue.learned(batch)
                watch.lap("learning")
                self.learner_steps += 1
                self.publisher.publish(self.learner_steps, batch)
                watch.lap("publishing")
                acc.add(metrics, (self.learner_steps - 1 - batch.policy_version).float().mean())
            if supervisor.error is not None:
                raise supervisor.error
            if replicated and batch is None:
                continue  # replicas meet only after a step, so all make the same collectives
            now = time.perf_counter()
            # Replica 0's clock and stop request decide for every replica.
            flags = (now >= next_log, now >= next_ckpt, self._stop_requested.is_set())
            log_now, checkpoint_now, stop_now = self.replica.broadcast(
                torch.tensor(flags, dtype=torch.int32)
            ).tolist()
            if stop_now:
                return "interrupted"
            row_frames = self._row_frames
            if log_now or checkpoint_now:  # a checkpoint keeps the counters of its row
                next_log = now + cfg.log_every_s
                reason = self._log(server, supervisor, now - start)
                if reason:
                    return reason
            # With no new row (no frames came), a due checkpoint waits for the next one.
            if checkpoint_now and self._row_frames > row_frames:
                next_ckpt = now + cfg.checkpoint_every_s
                if self.primary:
                    self._save(now - start)
            watch.lap("logging_and_checkpoints")

    def _log(self, server, supervisor, elapsed: float) -> str | None:
        """Take every replica's counters, log one row (replica 0), and say whether to stop.

        Every replica gets the same merged counters, so all reach the same decision. A row is
        logged only when frames moved on: a resumed run's first seconds, before its actors
        step, would repeat the checkpoint's row.
        """
        cfg = self.layout
        stats = self._take_stats(server, supervisor)
        self._row_batches += (stats.batches, stats.batch_envs)
        wall_s = self.wall_offset + elapsed
        mean_return = self.window.mean_return()
        if self.frames > self._row_frames:
            acc, (batches, batch_envs) = self._acc, self._row_batches
            row = {
                "frames": self.frames,
                "wall_s": round(wall_s, 3),
                "fps": acc.fps(self.frames - self._row_frames, wall_s),
                "mean_return": mean_return,
                "episodes": self.window.count,
                **self.replica.all_reduce(acc.take(), "mean"),
                "learner_steps": self.learner_steps,
                "inference_batch": batch_envs / batches if batches else None,
                "actor_restarts": self.actor_restarts,
                **(self.publisher.take() if self.publisher.measured else {}),
            }
            self._row_frames, self._row_batches = self.frames, np.zeros(2, np.int64)
            if self._logger is not None:
                with self._writing():
                    self._logger.log(row)
        reached = (
            cfg.target_return is not None
            and mean_return is not None
            and mean_return >= cfg.target_return
            and self.window.count >= cfg.target_episodes
        )
        if reached and self.target_reached is None:
            self.target_reached = {
                "frames": self.frames,
                "wall_s": round(wall_s, 3),
                "mean_return": mean_return,
            }
        if reached:
            return "target_return"
        if self.frames >= cfg.total_frames:
            return "total_frames"
        return None

    def _take_stats(self, server: InferenceServer, supervisor: ActorSupervisor) -> InferenceStats:
        """The inference counters of every replica since the last call, merged; updates the
        episode window, the frame count and the actor restarts with them."""
        stats = server.take_stats()
        returns = torch.tensor(stats.episode_returns, dtype=torch.float64)
        lengths = torch.tensor(stats.episode_lengths, dtype=torch.int64)
        counts = self.replica.all_gather(torch.tensor(len(returns)))
        width = max(1, int(counts.max()))  # padded to the most any replica has
        totals = torch.tensor(
            [stats.frames, stats.batches, stats.batch_envs, stats.resets, supervisor.restarts]
        )
        all_returns, all_lengths, all_totals = self.replica.all_gather(
            (_pad(returns, width), _pad(lengths, width), totals)
        )
        counts = counts.tolist()
        frames, batches, batch_envs, resets, restarts = all_totals.sum(0).tolist()
        merged = InferenceStats(
            frames=frames,
            batches=batches,
            batch_envs=batch_envs,
            episode_returns=[
                x for r, n in zip(all_returns, counts, strict=True) for x in r[:n].tolist()
            ],
            episode_lengths=[
                x for r, n in zip(all_lengths, counts, strict=True) for x in r[:n].tolist()
            ],
            resets=resets,
        )
        self.window.add(merged.episode_returns, merged.episode_lengths)
        self.frames = self._frames_base + merged.frames
        self.actor_restarts = restarts
        return merged

    def _save(self, elapsed: float) -> Path:
        with self._writing():
            return save_checkpoint(
                self.checkpoints,
                self.frames,
                self._payload(self.wall_offset + elapsed),
                self.config.train.keep_checkpoints + 1,
            )

    def _finish(self, reason: str, elapsed: float) -> dict[str, Any] | None:
        cfg = self.config.train
        self._log(self.server, self.supervisor, elapsed)  # the last row: the checkpoint's counters
        in_sync = self._replicas_in_sync()
        if not self.primary:
            return None
        self._close_logger()
        checkpoint = self._save(elapsed)
        wall_s = self.wall_offset + elapsed
        dtype = getattr(self.agent.network, "torso_dtype", None)
        summary = {
            "env": cfg.env,
            "agent": cfg.agent,
            "stop_reason": reason,
            "frames": self.frames,
            "frames_counted_as": (
                f"emulator frames (agent steps x frame skip {self.spec.frame_skip})"
                if self.spec.frame_skip > 1
                else "environment steps (agent steps)"
            ),
            "env_protocol": self.spec.protocol,
            "wall_s": round(wall_s, 3),
            "session_started_at": self.started_at,  # unix time this session's wall clock began
            "mean_fps": round(self.frames / wall_s, 1) if wall_s > 0 else None,
            "mean_return_100": self.window.mean_return(),
            "episodes": self.window.count,
            "learner_steps": self.learner_steps,
            "actor_restarts": self.actor_restarts,
            "learner_replicas": self.replica.num_replicas,
            "replicas_in_sync": in_sync,
            "remote_actors": self._remote_summary(),
            # Replay's items stored, inserted and sampled (not checkpointed); None for the FIFO.
            "replay": self.buffer.stats(),
            "target_return": cfg.target_return,
            "target_episodes": cfg.target_episodes,
            "target_reached_frames": (self.target_reached or {}).get("frames"),
            "target_reached_wall_s": (self.target_reached or {}).get("wall_s"),
            # The window at the stop decision: the final one also holds the episodes that
            # ended while the actors were stopping, and may sit a little lower.
            "target_reached_mean_return": (self.target_reached or {}).get("mean_return"),
            "inference": {
                "mode": cfg.inference,
                "precision": cfg.actor_precision if cfg.inference == "local" else cfg.precision,
                **self.publisher.summary(),
            },
            "device": str(self.device),
            "torso_dtype": None if dtype is None else str(dtype).removeprefix("torch."),
            "torch_threads": self.threads_used,  # as each thread had it when the run ended
            "time_shares": self._time_shares(),
            "energy": self.energy,  # this session's; None with --energy off
            "checkpoint": str(checkpoint),
            "run_dir": str(self.run_dir),
        }
        with self._writing():
            write_json_atomic(self.run_dir / "summary.json", summary)
        try:
            summary["curve"] = str(plot_curve(self.run_dir, cfg.target_return))
        except Exception as e:  # a plot must never lose a finished run
            log.warning("could not draw the learning curve: %s", e)
        return summary

    def _replicas_in_sync(self) -> bool | None:
        """Whether every replica ends with exactly replica 0's parameters and statistics (an
        observation normalizer's, PopArt's), None with one replica."""
        if self.replica.num_replicas == 1:
            return None
        state = self.agent.network.state_dict().values()
        values = [t.detach().reshape(-1).double() for t in state if t.is_floating_point()]
        gathered = self.replica.all_gather(torch.cat(values))
        in_sync = bool((gathered == gathered[0]).all())
        if not in_sync:
            log.warning("the learner replicas' parameters differ; this is a bug, please report it")
        return in_sync

    def _remote_summary(self) -> dict[str, Any] | None:
        if self.gateway is None:
            return None
        return {
            "address": self.gateway.address,
            "connections": self.gateway.connections,
            "refused": self.gateway.rejected_total,
        }

    def _time_shares(self) -> dict[str, dict[str, float]]:
        """Where each part's time went this session, as fractions of that part's time."""
        work, wait = self.actor_times.sum(axis=0) if len(self.actor_times) else (0.0, 0.0)
        total = work + wait
        actors = (
            {"stepping_envs": round(work / total, 3), "waiting_for_actions": round(wait / total, 3)}
            if total
            else {}
        )
        inference = self.server.stopwatch.shares() if self.server else {}
        return {"actors": actors, "inference": inference, "learner": self.stopwatch.shares()}


class _Window:
    """Learner metrics averaged over one logging interval."""

    def __init__(self, wall_s: float, keys: tuple[str, ...]) -> None:
        self._keys = (*keys, "policy_lag")  # fixed up front: they are the CSV's columns
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


def _optimizers(agent: Any) -> list[torch.optim.Optimizer]:
    """The optimizers an agent keeps as attributes (a replicated learner averages their
    gradients)."""
    return [v for v in vars(agent).values() if isinstance(v, torch.optim.Optimizer)]


def _pad(values: torch.Tensor, width: int) -> torch.Tensor:
    return torch.cat([values, values.new_zeros(width - len(values))])


def train(config: RunConfig, console: Console | None = None) -> dict[str, Any]:
    """Run training as configured and return its summary (also saved as summary.json).

    In the main thread, SIGINT and SIGTERM stop the run in order (see ``StopSignals``).
    """
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


def _run_replica(config: RunConfig, stop: Any) -> dict[str, Any] | None:
    """One learner replica (a process of its own); ``stop`` is the launcher's Ctrl-C flag."""
    # Ctrl-C and a scheduler's SIGTERM may reach the whole process group; the launcher alone
    # acts on them and passes them on as ``stop``, so every replica ends at the same step.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    with Replicator(device="cpu" if config.train.device == "cpu" else None) as replica:
        run = TrainingRun(config, replica=replica)

        def watch() -> None:
            while not stop.value:
                time.sleep(0.1)
            run.request_stop()

        threading.Thread(target=watch, name="stop-watch", daemon=True).start()
        return run.run()
