"""The central inference server: one batched ``agent.act`` for the requests of many actors.

It runs in the learner process, on the learner's device, always with the newest parameters the
learner published (or an int8 copy of them: ``precision``). For each environment it keeps the
recurrent state and the previous action (an ``ActingTable``), the run id of the actor that owns
it and the running episode return; it turns every step into unrolls for the learner. All of this
is indexed by environment id, so no Python object exists per env. With local inference the
actors act themselves and send what they acted (``Request.acted``); the server then only records.

With ``frame_stack`` k > 1 (``EnvSpec.learner_stack``) actors send one frame per env and step:
the acting table keeps each env's stack on the acting device and the agent acts on the stacks,
while unrolls keep the frames once (``seedbed.framestack``). A restarted actor's envs start over
as at an episode start, since the server forces ``done`` for them.

Several threads may ``serve`` at once (``--inference-threads``): one receives while another
acts or answers. Each takes whole requests, and an actor sends its next step only once its last
is answered, so an env is only ever in one thread's hands, and the per-env tables and unroll
rows each thread writes are its own; acting holds the parameters' lock, so the threads act one
at a time on parameters that no publish is writing.
"""

from __future__ import annotations

import dataclasses
import threading

import numpy as np
import torch

from seedbed.agents.base import Agent, copy_parameters
from seedbed.inference.acting import ActingTable
from seedbed.inference.unrolls import UnrollBuilder, env_rows
from seedbed.quantize import quantize_for_inference
from seedbed.telemetry import Stopwatch, combined_shares
from seedbed.transport.base import Request, ServerTransport
from seedbed.types import Buffer


@dataclasses.dataclass
class InferenceStats:
    """Counters the server adds to; the training loop reads and resets the window fields."""

    # Frames answered since the run began: env steps x frames per step (emulator frames for
    # Atari); restarted envs' first steps are excluded.
    frames: int = 0
    batches: int = 0  # inference calls in this window
    batch_envs: int = 0  # envs served in this window (batch_envs / batches = mean batch size)
    episode_returns: list[float] = dataclasses.field(default_factory=list)
    episode_lengths: list[int] = dataclasses.field(default_factory=list)
    resets: int = 0  # envs whose actor restarted


def _acted(
    acted: dict[str, np.ndarray], state_size: int
) -> tuple[torch.Tensor, dict[str, torch.Tensor], tuple[torch.Tensor, ...], torch.Tensor]:
    """What local actors acted, as ``_act`` returns it (versions per env)."""
    extras = {k: torch.from_numpy(v) for k, v in acted.items()}
    action, version = extras.pop("action"), extras.pop("version")
    state = tuple(extras.pop(f"state{i}") for i in range(state_size))
    return action, extras, state, version


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``array``'s memory (copied only where numpy may not be written)."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


class InferenceServer:
    """Serve actions for requests from ``transport`` and feed full unrolls into ``queue``.

    ``action_shape`` and ``action_dtype`` are one env's action as the env spec gives them (the
    defaults: a discrete action, one int64); ``frame_stack`` is its ``learner_stack``.
    """

    def __init__(
        self,
        agent: Agent,
        transport: ServerTransport,
        queue: Buffer,
        num_envs: int,
        unroll_layout: tuple[int, int],
        max_batch: int,
        timeout_s: float,
        device: torch.device,
        frames_per_step: int = 1,
        action_shape: tuple[int, ...] = (),
        action_dtype: str = "int64",
        precision: str = "fp32",
        frame_stack: int = 1,
    ) -> None:
        self.agent = agent
        self.precision = precision  # what central inference acts in (seedbed.quantize)
        self.frames_per_step = frames_per_step
        self.transport = transport
        self.queue = queue
        self.max_batch = min(max_batch, num_envs)
        self.timeout_s = timeout_s
        self.device = torch.device(device)
        # unroll_layout: steps per unroll, steps consecutive unrolls share
        self.builder = UnrollBuilder(num_envs, *unroll_layout, frame_stack=frame_stack)
        self.net = agent.acting_network()
        self.version = 0
        self.stats = InferenceStats()
        self._watches: list[Stopwatch] = []  # one per serving thread: ``stopwatch``
        self._local = threading.local()
        self.table = ActingTable(
            agent.initial_state, num_envs, action_shape, action_dtype, self.device, frame_stack
        )
        self._run_id = np.full(num_envs, -1, np.int64)
        self._ep_return = np.zeros(num_envs, np.float64)
        self._ep_length = np.zeros(num_envs, np.int64)
        self._env_ids = np.arange(num_envs)
        self._params_lock = threading.Lock()
        self._stats_lock = threading.Lock()
        self._recv_lock = threading.Lock()  # one serving thread receives at a time

    def publish(self, network: torch.nn.Module, version: int) -> None:
        """Act with ``network``'s parameters from now on (called by the learner)."""
        if self.precision != "fp32":
            net = quantize_for_inference(network, self.precision)  # before the lock: acting goes on
            with self._params_lock:
                self.net, self.version = net, version
            return
        with self._params_lock:
            copy_parameters(network, self.net)
            self.version = version

    def take_stats(self) -> InferenceStats:
        """The counters so far; episode lists and batch counts restart."""
        with self._stats_lock:
            stats, self.stats = self.stats, InferenceStats(frames=self.stats.frames)
        return stats

    @property
    def stopwatch(self) -> Stopwatch:
        """Where the calling thread's time goes ("bookkeeping" is inputs, unrolls and
        replies): each serving thread books into its own."""
        watch = getattr(self._local, "watch", None)
        if watch is None:
            watch = self._local.watch = Stopwatch()
            with self._stats_lock:
                self._watches.append(watch)
        return watch

    def time_shares(self) -> dict[str, float]:
        """Where the serving threads' time went, all of them together."""
        with self._stats_lock:
            watches = list(self._watches)
        return combined_shares(watches)

    def serve(self, stop: threading.Event) -> None:
        """Answer requests until ``stop`` is set; several threads may serve at once."""
        watch = self.stopwatch
        while not stop.is_set():
            with self._recv_lock:  # waiting for the lock is waiting for requests too
                request = self.transport.recv(self.max_batch, self.timeout_s)
            watch.lap("waiting_for_requests")
            if request is not None:
                self.step(request, stop)

    def step(self, request: Request, stop: threading.Event | None = None) -> None:
        """Act for one batched request, record it into unrolls, then answer it.

        The bookkeeping is numpy on views of the request's rows (an actor's envs are one
        slice of every table); torch appears only where the agent acts. Everything the step
        reads from the request is copied into the unroll buffers before the answer, since an
        answered actor overwrites its rows.
        """
        ids, rows = env_rows(request.env_ids)
        run_id = np.asarray(request.run_id, np.int64)
        restarted = self._run_id[rows] != run_id
        done = np.asarray(request.done, np.bool_)
        truncated = np.asarray(request.truncated, np.bool_)
        reward = np.asarray(request.reward, np.float32)
        if restarted.any():
            done, truncated = done | restarted, truncated & ~restarted
            self._reset(ids[restarted], run_id[restarted])
            self._count_episodes(ids[~restarted], reward[~restarted], done[~restarted], len(ids))
        else:
            self._count_episodes(rows, reward, done, len(ids))
        obs = request.obs
        prev_action = self.table.prev_action.numpy()[ids]  # a copy: acting replaces the table's
        if request.acted is None:
            action, extras, state, version = self._act(ids, obs, reward, done)
        else:
            action, extras, state, version = _acted(request.acted, len(self.table.state))
            self.table.record(torch.from_numpy(ids), action)  # actors keep their own state
        record = {
            # Copied into the unroll buffers before the actor may overwrite it; with frame_stack,
            # only the newest frame, which is all the actor sent.
            "obs": obs,
            "prev_action": prev_action,
            "reward": reward,
            "done": done,
            "truncated": truncated,
            "action": action,
            **extras,
        }
        unrolls = self.builder.append(ids, record, state, version)
        self.transport.send(request, action.numpy())
        watch = self.stopwatch
        watch.lap("bookkeeping")
        if unrolls is not None:
            while not self.queue.put(unrolls, timeout=0.1):
                if stop is None or stop.is_set():
                    return
            watch.lap("waiting_for_queue_space")

    def _act(
        self, ids: np.ndarray, obs: np.ndarray, reward: np.ndarray, done: np.ndarray
    ) -> tuple[torch.Tensor, dict[str, torch.Tensor], tuple[torch.Tensor, ...], int]:
        """Central inference for these envs: their actions, the agent's extras and the state
        they acted from (on the CPU), and the parameter version that acted. The acting table
        keeps their actions and next state."""
        slots, watch = torch.from_numpy(ids), self.stopwatch
        step, state = self.table.inputs(slots, _tensor(obs), _tensor(reward), _tensor(done))
        watch.lap("bookkeeping")
        with self._params_lock:
            watch.lap("waiting_for_parameters")
            out = self.agent.act(self.net, step, state)
            version = self.version
        action = out.action.cpu()
        watch.lap("acting")
        self.table.record(slots, action, out.state)
        extras = {k: v.cpu() for k, v in out.extras.items()}
        return action, extras, tuple(s.cpu() for s in state), version

    def _reset(self, env_ids: np.ndarray, run_ids: np.ndarray) -> None:
        """An actor (re)started: its envs begin anew, with no state and no partial unroll."""
        self._run_id[env_ids] = run_ids
        self.table.reset(torch.from_numpy(env_ids))
        self.builder.reset(env_ids)
        self._ep_return[env_ids] = 0.0
        self._ep_length[env_ids] = 0
        with self._stats_lock:
            self.stats.resets += len(env_ids)

    def _count_episodes(
        self, rows: slice | np.ndarray, reward: np.ndarray, done: np.ndarray, served: int
    ) -> None:
        """Raw (unclipped) returns of the episodes that ended with this step, for the envs at
        ``rows`` (a restarted env's first step counts for nothing); ``served``: all envs."""
        self._ep_return[rows] += reward
        self._ep_length[rows] += 1
        counted = len(reward)
        ended = None
        if done.any():
            ended = self._env_ids[rows][done]
        with self._stats_lock:
            self.stats.frames += counted * self.frames_per_step
            self.stats.batches += 1
            self.stats.batch_envs += served
            if ended is not None:
                self.stats.episode_returns.extend(self._ep_return[ended].tolist())
                self.stats.episode_lengths.extend(self._ep_length[ended].tolist())
        if ended is not None:
            self._ep_return[ended] = 0.0
            self._ep_length[ended] = 0
