"""The acting table: what a caller of ``agent.act`` keeps for each environment between steps.

An agent acts on a ``StepInput`` (each env's observation, the reward that came with it, whether
an episode starts, and the env's previous action) and on each env's recurrent state, and returns
the next state. Whoever steps environments keeps the previous action and the state from one call
to the next: central inference for every env of the run, a local actor for its own, evaluation
for its one env, the standard agent test for a few. They all keep them here, in tensors made
once and addressed by slot, so no Python object exists per env. The call loop::

    table = ActingTable(agent.initial_state, num_slots, action_shape, action_dtype, device)
    table.reset(slots)                                    # these envs start anew
    step, state = table.inputs(slots, obs, reward, done)  # on ``device``
    out = agent.act(net, step, state)
    table.record(slots, out.action, out.state)

``slots`` is an int64 tensor of slots, each at most once, or None for every slot in order. With
slots, ``inputs`` gathers copies of the rows and ``record`` writes into the tables. With None,
``inputs`` hands out the tables themselves and ``record`` takes the agent's tensors as the new
tables, so acting for all envs at once (a local actor, evaluation) copies nothing. Either way,
what ``inputs`` returned is never written by ``record``: a caller may keep the state it acted
from (to record it with the step) until the next ``reset``.

An episode start needs nothing here: ``done`` is in the step, and the agent's network resets its
state and ignores the previous action and reward there (``nets.LSTMCore``). ``reset`` is for envs
whose past is gone: an actor that restarted, a new evaluation episode.

With ``frame_stack`` k > 1 (``EnvSpec.learner_stack``: actors send one frame per step), the table
also keeps each env's last k frames (``FrameStacks``), and ``inputs`` hands the agent the stacks:
``obs`` is then each env's newest frame, and a step with ``done`` starts its stack afresh, so a
restarted env needs ``done`` on its next step (central inference forces it).
"""

from __future__ import annotations

import threading
from collections.abc import Callable

import numpy as np
import torch

from seedbed.types import State, StepInput

_CPU = torch.device("cpu")


class FrameStacks:
    """Each env's last ``depth`` frames, on the acting device, as the actor-side wrappers would
    have stacked them (``seedbed.framestack`` says how; its tests hold the two to the wrappers).

    A ring per env, made once (at the first push, which gives the frame's shape): a step writes
    each env's newest frame over its oldest, one indexed write for the batch, then reads the
    stacks out oldest first into a buffer made once per calling thread (threads that push for
    different envs, as central inference's serving threads do, each read into their own). A
    frame that starts an episode is not copied k times: the env's count of frames in its
    episode (``_age``) clamps the read to it, which gives the wrappers' reset padding (the
    first frame repeated).
    """

    def __init__(self, depth: int, num_slots: int, device: torch.device) -> None:
        self.depth, self.num_slots, self.device = depth, num_slots, device
        self._frames: torch.Tensor | None = None  # [num_slots * depth, *frame]: slot-major rings
        self._local = threading.local()  # .out, [num_slots * depth, *frame]: the stacks read out
        self._making = threading.Lock()
        self._pos = torch.zeros(num_slots, dtype=torch.int64, device=device)  # newest frame's
        self._age = torch.zeros(num_slots, dtype=torch.int64, device=device)  # 1 .. depth
        self._back = torch.arange(depth - 1, -1, -1, device=device)  # stack slot -> steps back

    def push(self, slots: torch.Tensor, frames: torch.Tensor, starts: torch.Tensor) -> torch.Tensor:
        """Add ``frames`` [k, c, ...] of ``slots`` [k] (``starts`` [k] bool: they begin an
        episode), all on ``device``; return their stacks [k, depth * c, ...], a view of a buffer
        that the calling thread's next push overwrites."""
        if self._frames is None:
            with self._making:
                if self._frames is None:
                    shape = (self.num_slots * self.depth, *frames.shape[1:])
                    self._frames = torch.zeros(shape, dtype=frames.dtype, device=self.device)
        buffer = getattr(self._local, "out", None)
        if buffer is None:
            buffer = self._local.out = torch.empty_like(self._frames)
        depth = self.depth
        pos = (self._pos[slots] + 1) % depth
        age = torch.where(starts, 1, (self._age[slots] + 1).clamp(max=depth))
        self._pos[slots], self._age[slots] = pos, age
        self._frames[slots * depth + pos] = frames
        back = torch.minimum(self._back, age[:, None] - 1)  # [k, depth]: not past the start
        rows = (slots[:, None] * depth + (pos[:, None] - back) % depth).flatten()
        out = buffer[: rows.numel()]
        torch.index_select(self._frames, 0, rows, out=out)
        return out.view(len(slots), -1, *frames.shape[2:])


class ActingTable:
    """Each env's recurrent state (on ``device``) and previous action (on the CPU, where steps
    are recorded), for ``num_slots`` envs.

    Args:
        initial_state: the agent's ``initial_state``; an env's initial state is the same for every
            env (an LSTM's is zeros), so ``reset`` copies one row of it.
        num_slots: how many envs the table holds.
        action_shape: one env's action, as ``EnvSpec.action_shape`` gives it.
        action_dtype: its numpy dtype name, as ``EnvSpec.action_dtype`` gives it.
        device: where the agent acts: the state lives there, and ``inputs`` moves the step there.
        frame_stack: frames the table stacks into each observation (1: obs are whole already).
    """

    def __init__(
        self,
        initial_state: Callable[[int], State],
        num_slots: int,
        action_shape: tuple[int, ...] = (),
        action_dtype: str = "int64",
        device: torch.device | str = _CPU,
        frame_stack: int = 1,
    ) -> None:
        self.device = torch.device(device)
        self.stacks = FrameStacks(frame_stack, num_slots, self.device) if frame_stack > 1 else None
        self.state: State = tuple(s.to(self.device) for s in initial_state(num_slots))
        self._initial = tuple(s.to(self.device) for s in initial_state(1))
        dtype = torch.from_numpy(np.zeros(0, action_dtype)).dtype
        # Fed back to the agent and recorded in unrolls: int64 scalars when discrete, float32
        # vectors when continuous.
        self.prev_action = torch.zeros((num_slots, *action_shape), dtype=dtype)
        self._every = torch.arange(num_slots, device=self.device)  # env ids when slots is None

    def reset(self, slots: torch.Tensor | None = None) -> None:
        """Give ``slots`` (int64, on the CPU) the initial state and a zero previous action."""
        rows = slice(None) if slots is None else slots
        if self.state:
            at = rows if slots is None else slots.to(self.device)
            for table, initial in zip(self.state, self._initial, strict=True):
                table[at] = initial
        self.prev_action[rows] = 0

    def inputs(
        self,
        slots: torch.Tensor | None,
        obs: torch.Tensor,
        reward: torch.Tensor,
        done: torch.Tensor,
        env_ids: torch.Tensor | None = None,
    ) -> tuple[StepInput, State]:
        """The agent's input for ``slots`` and the state they act from, both on ``device``.

        Args:
            slots: [k] int64 slots on the CPU, or None for all of them.
            obs: [k, *obs_shape] in the env's dtype; with ``frame_stack``, one frame per env
                ([k, *sent_obs_shape]), and the step holds the stacks, valid until the next call.
            reward: [k] float32, the reward that came with ``obs``.
            done: [k] bool, where ``obs`` starts an episode.
            env_ids: [k] int64, the ids the agent knows the envs by (its per-env exploration);
                the slots where None.
        """
        if slots is None:
            prev_action, state, here = self.prev_action, self.state, self._every
        else:
            here = self._here(slots)
            # Gathered by numpy: a torch call would let another thread take the interpreter.
            prev_action = torch.from_numpy(self.prev_action.numpy()[slots.numpy()])
            state = tuple(table[here] for table in self.state)
        obs, done = self._here(obs, non_blocking=True), self._here(done)
        if self.stacks is not None:
            obs = self.stacks.push(here, obs, done)
        step = StepInput(
            obs=obs,
            prev_action=self._here(prev_action),
            reward=self._here(reward),
            done=done,
            env_ids=here if env_ids is None else self._here(env_ids),
        )
        return step, state

    def _here(self, tensor: torch.Tensor, non_blocking: bool = False) -> torch.Tensor:
        """``tensor`` on the acting device (itself if it is there already)."""
        if tensor.device == self.device:
            return tensor
        return tensor.to(self.device, non_blocking=non_blocking)

    def record(
        self, slots: torch.Tensor | None, action: torch.Tensor, state: State | None = None
    ) -> None:
        """Keep what ``slots`` acted: ``action`` [k, *action_shape] and, unless None, the next
        ``state`` (each [k, ...] on ``device``)."""
        if slots is None:
            self.prev_action = action.to(_CPU)
            if state is not None:
                self.state = tuple(state)
            return
        action = action if action.device == _CPU else action.cpu()
        self.prev_action.numpy()[slots.numpy()] = action.numpy()
        if state:
            here = self._here(slots)
            for table, rows in zip(self.state, state, strict=True):
                table[here] = rows
