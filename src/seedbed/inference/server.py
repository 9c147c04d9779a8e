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

Steps are checked before use (``seedbed.transport.checks``): an env whose step carries a NaN or
inf (obs, reward, or what a local actor acted), an absurd reward or an action outside the action
space is refused. Its step is acted on and recorded blanked, then dropped, as a restarted actor's
partial unroll is: the env starts over at its next step. Refusals are counted per env
(``refused_steps``) and logged at most once per ``_LOG_EVERY_S``; episode returns that are not
finite or absurd (``refused_returns``) never reach the statistics.

Several threads may ``serve`` at once (``--inference-threads``): one receives while another
acts or answers. Each takes whole requests, and an actor sends its next step only once its last
is answered, so an env is only ever in one thread's hands, and the per-env tables and unroll
rows each thread writes are its own; acting holds the parameters' lock, so the threads act one
at a time on parameters that no publish is writing.
"""

from __future__ import annotations

import dataclasses
import logging
import math
import threading
import time
from collections.abc import Callable

import numpy as np
import torch

from seedbed.agents.base import Agent, copy_parameters
from seedbed.inference.acting import ActingTable
from seedbed.inference.unrolls import UnrollBuilder, env_rows
from seedbed.quantize import quantize_for_inference
from seedbed.telemetry import Stopwatch, combined_shares
from seedbed.transport.base import Request, ServerTransport
from seedbed.transport.checks import MAX_ABS_REWARD, check_step
from seedbed.types import Buffer

log = logging.getLogger(__name__)

_LOG_EVERY_S = 10.0  # one warning of refused steps in this time, then a count
_REFUSED = -2  # an env's run id after a refused step (-1: no actor yet): it starts over next


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


def _blanked(
    bad: np.ndarray, obs: np.ndarray, reward: np.ndarray, acted: dict[str, np.ndarray] | None
) -> tuple[np.ndarray, np.ndarray, dict[str, np.ndarray] | None]:
    """Copies of a step's fields with the refused envs' rows zeroed (an action of 0 is valid)."""

    def blank(array: np.ndarray) -> np.ndarray:
        array = np.array(array)  # a copy: the request's rows may be the actor's shared memory
        array[bad] = 0
        return array

    blanked = None if acted is None else {name: blank(value) for name, value in acted.items()}
    return blank(obs), blank(reward), blanked


def _tensor(array: np.ndarray) -> torch.Tensor:
    """A tensor sharing ``array``'s memory (copied only where numpy may not be written)."""
    return torch.from_numpy(array if array.flags.writeable else array.copy())


class InferenceServer:
    """Serve actions for requests from ``transport`` and feed full unrolls into ``queue``.

    ``action_shape`` and ``action_dtype`` are one env's action as the env spec gives them (the
    defaults: a discrete action, one int64); ``frame_stack`` is its ``learner_stack``;
    ``num_actions`` its discrete action count, which local actors' actions are checked against
    (0: not checked). ``acting_gate(timeout)``, where given, says whether acting may go on,
    waiting up to ``timeout`` seconds (``--lockstep``).
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
        num_actions: int = 0,
        acting_gate: Callable[[float], bool] | None = None,
    ) -> None:
        self.agent = agent
        self.acting_gate = acting_gate  # --lockstep: ``UnrollQueue.may_act``
        self.num_actions = num_actions
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
        # Refusals (see the module's docstring): steps per env, returns, and the log's pace.
        self.refused_steps = np.zeros(num_envs, np.int64)
        self.refused_returns = 0
        self._refusals_unlogged = 0
        self._refusals_logged_at = -math.inf
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
        # In lockstep, nothing acts while a batch waits for or is in the learner (the check is
        # here, not after a put, so that every serving thread waits).
        if self.acting_gate is not None:
            while not self.acting_gate(0.1):
                if stop is None or stop.is_set():
                    return
            self.stopwatch.lap("waiting_for_learner")
        ids, rows = env_rows(request.env_ids)
        run_id = np.asarray(request.run_id, np.int64)
        restarted = self._run_id[rows] != run_id
        # Actors that restarted, for the counts: not envs starting over after a refused step.
        restarts = int((restarted & (self._run_id[rows] != _REFUSED)).sum())
        done = np.asarray(request.done, np.bool_)
        truncated = np.asarray(request.truncated, np.bool_)
        reward = np.asarray(request.reward, np.float32)
        obs, acted = request.obs, request.acted
        bad, why = check_step(obs, reward, acted, self.num_actions)
        if why is not None:
            obs, reward, acted = _blanked(bad, obs, reward, acted)
            restarted = restarted | bad
            self._refused(ids[bad], why)
        if restarted.any():
            done, truncated = done | restarted, truncated & ~restarted
            self._reset(ids[restarted], run_id[restarted], restarts)
            self._count_episodes(ids[~restarted], reward[~restarted], done[~restarted], len(ids))
        else:
            self._count_episodes(rows, reward, done, len(ids))
        if why is not None:
            self._run_id[ids[bad]] = _REFUSED  # their next step restarts them: this one is dropped
        prev_action = self.table.prev_action.numpy()[ids]  # a copy: acting replaces the table's
        if acted is None:
            action, extras, state, version = self._act(ids, obs, reward, done)
        else:
            action, extras, state, version = _acted(acted, len(self.table.state))
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

    def _reset(self, env_ids: np.ndarray, run_ids: np.ndarray, restarts: int) -> None:
        """Envs begin anew, with no state and no partial unroll: their actor (re)started
        (``restarts`` of them) or their step was refused."""
        self._run_id[env_ids] = run_ids
        self.table.reset(torch.from_numpy(env_ids))
        self.builder.reset(env_ids)
        self._ep_return[env_ids] = 0.0
        self._ep_length[env_ids] = 0
        with self._stats_lock:
            self.stats.resets += restarts

    def _refused(self, env_ids: np.ndarray, why: str) -> None:
        """Count refused steps; warn of them unless a warning was given lately."""
        self.refused_steps[env_ids] += 1
        now = time.monotonic()
        if now - self._refusals_logged_at < _LOG_EVERY_S:
            self._refusals_unlogged += len(env_ids)
            return
        more, self._refusals_unlogged = self._refusals_unlogged, 0
        self._refusals_logged_at = now
        log.warning(
            "refused the step of env %s: %s; it starts a new episode%s",
            ", ".join(map(str, env_ids[:8].tolist())) + (", ..." if len(env_ids) > 8 else ""),
            why,
            f" ({more} more refused since the last such warning)" if more else "",
        )

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
                returns = self._ep_return[ended]
                kept = np.abs(returns) <= MAX_ABS_REWARD  # never NaN, inf or absurd
                self.refused_returns += int(len(ended) - kept.sum())
                self.stats.episode_returns.extend(returns[kept].tolist())
                self.stats.episode_lengths.extend(self._ep_length[ended][kept].tolist())
        if ended is not None:
            self._ep_return[ended] = 0.0
            self._ep_length[ended] = 0
