"""Where the learner's updates run: in the learner loop's own thread (``InlineUpdates``, the
default), or in a process of their own (``LearnerProcess``, ``--learner-process``).

In one process every torch op of an update releases and retakes the interpreter lock, which the
inference thread holds for its bookkeeping; a small network's update is hundreds of such ops, and
it then waits on the lock longer than it computes (docs/benchmarks.md). In a process of its own
the update has an interpreter of its own. The loop copies each batch into one of two shared-memory
slots (the next batch is copied in while the last is learned from); after each update the process
copies its parameters into the loop's network, which lives in shared memory, under a lock, and
the loop publishes them to inference as it always has. For replay, the priorities the update
set come back with it.

Both take ``submit(batch, frames)`` and hand each finished update, in order, to the loop's
``learned(Update)``, so the learner loop is one loop for both.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import signal
from collections.abc import Callable
from multiprocessing.connection import Connection
from typing import Any

import torch
import torch.multiprocessing

from seedbed.agents import make_agent
from seedbed.config import RunConfig
from seedbed.errors import SeedbedError
from seedbed.framestack import restack
from seedbed.inference.publish import PolicyPublisher
from seedbed.plugins import import_plugins
from seedbed.runtime.lr_schedule import LearningRates
from seedbed.telemetry import Stopwatch
from seedbed.types import Buffer, EnvSpec, ReplayInfo, Unrolls

SLOTS = 2  # batches in the learner process's hands: one learned from, the next copied in
JOIN_S = 10.0  # how long an orderly stop waits for the learner process to end


@dataclasses.dataclass
class Update:
    """One finished learner update: the agent's metrics (and ``lr_fraction``), and how many
    updates old the policy that acted the batch was, on average."""

    metrics: dict[str, float]
    policy_lag: float


def policy_lag(batch: Unrolls, version: int) -> float:
    """How many updates behind ``version`` (the update that learned from ``batch``) the policy
    that acted each of its unrolls was, on average."""
    return float((version - 1 - batch.policy_version).float().mean())


def learn_step(
    agent: Any, rates: LearningRates, batch: Unrolls, frames: int, device: torch.device
) -> tuple[Unrolls, dict[str, float]]:
    """One update from ``batch`` at the learning rates for ``frames``, wherever it runs: the
    batch as learned from and the agent's metrics with ``lr_fraction``."""
    # Frames stored once (--frame-stack-on learner) become stacks here, on the learner's
    # device, so no agent knows where the stacks were built.
    batch = restack(batch.to(device))
    fraction = rates.update(frames)
    return batch, {**agent.learn(batch), "lr_fraction": fraction}


class InlineUpdates:
    """Updates in the calling thread: learn, let replay take the priorities, publish."""

    def __init__(
        self,
        agent: Any,
        buffer: Buffer,
        publisher: PolicyPublisher,
        device: torch.device,
        learning_rates: LearningRates,
        steps: int,
        learned: Callable[[Update], None],
        stopwatch: Stopwatch,
    ) -> None:
        self.agent, self.buffer, self.publisher, self.device = agent, buffer, publisher, device
        self.learning_rates, self.steps, self.learned = learning_rates, steps, learned
        self.stopwatch = stopwatch  # the loop's: its thread is the learner's

    def ready(self) -> bool:
        return True

    def submit(self, batch: Unrolls, frames: int) -> None:
        """Learn from ``batch`` now, at the rates for ``frames``, and publish the result."""
        watch = self.stopwatch
        batch, metrics = learn_step(self.agent, self.learning_rates, batch, frames, self.device)
        watch.lap("learning")
        self.steps += 1
        self.publisher.publish(self.steps, batch)
        self.buffer.learned(batch)  # after publishing: in lockstep, acting resumes on it
        watch.lap("publishing")
        self.learned(Update(metrics, policy_lag(batch, self.steps)))

    def wait(self, timeout: float) -> None:
        """Nothing to wait for: every update finished in ``submit``."""

    def wait_all(self) -> None:
        """Nothing to wait for: every update finished in ``submit``."""

    def agent_state(self) -> dict[str, Any]:
        return self.agent.state_dict()

    def time_shares(self) -> dict[str, float]:
        return self.stopwatch.shares()

    def close(self) -> None:
        """Nothing runs apart from the caller."""


class LearnerProcess:
    """Updates in a process of their own (see the module docstring).

    ``agent`` is the loop's: its network moves to shared memory and becomes the mirror of the
    learner process's, which starts from ``agent``'s state (a resumed run's included). Raises
    ``SeedbedError`` from any call once that process has failed or died.
    """

    def __init__(
        self,
        config: RunConfig,
        spec: EnvSpec,
        agent: Any,
        buffer: Buffer,
        publisher: PolicyPublisher,
        steps: int,
        threads: int,
        learned: Callable[[Update], None],
    ) -> None:
        self.agent, self.buffer, self.publisher, self.learned = agent, buffer, publisher, learned
        ctx = torch.multiprocessing.get_context("spawn")
        agent.network.share_memory()
        mirror = [*agent.network.parameters(), *agent.network.buffers()]
        self._version = torch.full((), steps, dtype=torch.int64).share_memory_()
        self._published = steps
        self._lock = ctx.Lock()
        state = io.BytesIO()
        torch.save(agent.state_dict(), state)
        self._conn, child = ctx.Pipe()
        self._process = ctx.Process(
            target=_learner_main,
            args=(child, config, spec, mirror, self._lock, self._version, state.getvalue()),
            kwargs={"steps": steps, "threads": threads},
            name="seedbed-learner",
            daemon=True,  # never outlives the run, whatever ends it
        )
        self._process.start()
        child.close()
        self._slots: list[Unrolls] = []  # made for the first batch, when shapes are known
        self._submitted: dict[int, Unrolls] = {}  # slot -> the batch copied into it
        self._free = list(range(SLOTS))
        self._state: bytes | None = None
        self._seconds: dict[str, float] = {}  # the learner process's stopwatch, as last sent

    def ready(self) -> bool:
        """Whether a slot is free for the next batch."""
        return bool(self._free)

    def submit(self, batch: Unrolls, frames: int) -> None:
        """Copy ``batch`` into a free slot (``ready``) and have it learned from at the rates
        for ``frames``; ``learned`` gets the update when it is done."""
        if not self._slots:
            self._slots = [_shared_like(batch) for _ in range(SLOTS)]
            self._send(("slots", self._slots))
        slot = self._free.pop(0)
        torch._foreach_copy_(_tensors(self._slots[slot]), _tensors(batch))
        self._submitted[slot] = batch
        self._send(("learn", slot, frames))

    def wait(self, timeout: float) -> None:
        """Take the updates finished within ``timeout`` seconds (or already)."""
        if self._poll(timeout):
            while self._poll(0.0):
                pass

    def wait_all(self) -> None:
        """Take every update submitted so far, as each finishes."""
        while len(self._free) < SLOTS:
            self._poll(None)

    def agent_state(self) -> dict[str, Any]:
        """The learner process's agent state, after every update submitted so far."""
        self._send(("state",))
        while self._state is None:
            self._poll(None)
        state, self._state = self._state, None
        # Written by our own learner process a moment ago, through a pipe no one else holds.
        return torch.load(io.BytesIO(state), weights_only=False)

    def time_shares(self) -> dict[str, float]:
        """Where the learner process's time went, as of its last update."""
        total = sum(self._seconds.values())
        return {k: round(v / total, 3) for k, v in self._seconds.items()} if total else {}

    def close(self) -> None:
        """Stop the learner process; updates still in its hands are dropped."""
        if self._process.is_alive():
            with contextlib.suppress(OSError):  # it is ending anyway
                self._conn.send(("stop",))
            self._process.join(JOIN_S)
        if self._process.is_alive():
            self._process.kill()
            self._process.join(JOIN_S)
        self._conn.close()

    def _send(self, message: tuple) -> None:
        try:
            self._conn.send(message)
        except OSError:
            raise self._died() from None

    def _poll(self, timeout: float | None) -> bool:
        """Handle one message from the learner process, waiting up to ``timeout`` seconds
        (None: until one comes); False if none came."""
        try:
            if not self._conn.poll(timeout):
                return False
            message = self._conn.recv()
        except (EOFError, OSError):
            raise self._died() from None
        kind = message[0]
        if kind == "learned":
            self._learned(*message[1:])
        elif kind == "state":
            self._state = message[1]
        elif kind == "error":
            raise SeedbedError(f"the learner process failed: {message[1]}")
        return True

    def _learned(
        self,
        slot: int,
        metrics: dict[str, float],
        lag: float,
        priorities: Any,
        seconds: dict[str, float],
    ) -> None:
        batch = self._submitted.pop(slot)
        self._free.append(slot)
        self._seconds = seconds
        if priorities is not None:
            batch.replay.priorities = torch.from_numpy(priorities)
        # The mirror may hold a newer update than this one already: publish what it holds,
        # under its version, once.
        with self._lock:
            version = int(self._version)
            if version > self._published:
                probe = restack(batch) if self.publisher.measured else None
                self.publisher.publish(version, probe)
                self._published = version
        self.buffer.learned(batch)  # after publishing: in lockstep, acting resumes on it
        self.learned(Update(metrics, lag))

    def _died(self) -> SeedbedError:
        self._process.join(1.0)
        return SeedbedError(
            f"the learner process ended unexpectedly (exit code {self._process.exitcode}); the "
            "run's last checkpoint is whole: continue it with --resume --run-dir"
        )


def _tensors(batch: Unrolls) -> list[torch.Tensor]:
    """Every tensor of ``batch`` an update reads, in one fixed order."""
    out = [*batch.steps.values(), *batch.initial_state, batch.policy_version]
    if batch.obs_context is not None:
        out.append(batch.obs_context)
    if batch.replay is not None:
        out += [batch.replay.indices, batch.replay.weights, batch.replay.generations]
    return out


def _shared_like(batch: Unrolls) -> Unrolls:
    """An ``Unrolls`` shaped as ``batch``, in shared memory."""

    def like(x: torch.Tensor) -> torch.Tensor:
        return torch.empty_like(x, device="cpu").share_memory_()

    replay = batch.replay
    return Unrolls(
        {k: like(v) for k, v in batch.steps.items()},
        tuple(like(s) for s in batch.initial_state),
        like(batch.policy_version),
        None
        if replay is None
        else ReplayInfo(like(replay.indices), like(replay.weights), like(replay.generations)),
        None if batch.obs_context is None else like(batch.obs_context),
    )


def _learner_main(
    conn: Connection,
    config: RunConfig,
    spec: EnvSpec,
    mirror: list[torch.Tensor],
    lock: Any,
    version: torch.Tensor,
    state: bytes,
    steps: int,
    threads: int,
) -> None:
    """The learner process: build the agent from ``state``, then learn from each slot it is
    told to, copying its parameters into ``mirror`` (``version``: the update they are from)."""
    # Ctrl-C and SIGTERM reach the whole process group; the run's main process stops us in order.
    for sig in (signal.SIGINT, signal.SIGTERM):
        signal.signal(sig, signal.SIG_IGN)
    try:
        cfg = config.train
        import_plugins(cfg.plugins)  # a spawned process: their registrations are not here
        torch.set_num_threads(threads)
        device = torch.device(cfg.device)
        agent = make_agent(cfg.agent, spec, config.agent, device, cfg.num_envs)
        agent.load_state_dict(torch.load(io.BytesIO(state), weights_only=False))
        rates = LearningRates(
            agent.optimizers(), cfg.lr_schedule, cfg.total_frames, cfg.lr_hold_frames
        )
        own = [*agent.network.parameters(), *agent.network.buffers()]
        watch, slots = Stopwatch(), []
        while True:
            try:
                message = conn.recv()
            except EOFError:
                return  # the run's main process is gone
            watch.lap("waiting_for_batch")
            kind = message[0]
            if kind == "slots":
                slots = message[1]
            elif kind == "learn":
                _, slot, frames = message
                batch, metrics = learn_step(agent, rates, slots[slot], frames, device)
                steps += 1
                watch.lap("learning")
                with lock, torch.no_grad():
                    torch._foreach_copy_(mirror, own)
                    version.fill_(steps)
                watch.lap("publishing")
                replay = batch.replay
                priorities = None if replay is None else replay.priorities
                if priorities is not None:  # as plain bytes: no shared memory per update
                    priorities = priorities.detach().to("cpu", torch.float32).numpy()
                lag = policy_lag(batch, steps)
                conn.send(("learned", slot, metrics, lag, priorities, dict(watch.seconds)))
            elif kind == "state":
                out = io.BytesIO()
                torch.save(agent.state_dict(), out)
                conn.send(("state", out.getvalue()))
            elif kind == "stop":
                return
    except Exception as e:
        conn.send(("error", f"{type(e).__name__}: {e}".splitlines()[0]))
        raise
