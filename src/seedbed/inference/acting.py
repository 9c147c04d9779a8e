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
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import torch

from seedbed.types import State, StepInput

_CPU = torch.device("cpu")


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
    """

    def __init__(
        self,
        initial_state: Callable[[int], State],
        num_slots: int,
        action_shape: tuple[int, ...] = (),
        action_dtype: str = "int64",
        device: torch.device | str = _CPU,
    ) -> None:
        self.device = torch.device(device)
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
            obs: [k, *obs_shape] in the env's dtype.
            reward: [k] float32, the reward that came with ``obs``.
            done: [k] bool, where ``obs`` starts an episode.
            env_ids: [k] int64, the ids the agent knows the envs by (its per-env exploration);
                the slots where None.
        """
        if slots is None:
            prev_action, state, here = self.prev_action, self.state, self._every
        else:
            here = slots.to(self.device)
            prev_action = self.prev_action[slots]
            state = tuple(table[here] for table in self.state)
        step = StepInput(
            obs=obs.to(self.device, non_blocking=True),
            prev_action=prev_action.to(self.device),
            reward=reward.to(self.device),
            done=done.to(self.device),
            env_ids=here if env_ids is None else env_ids.to(self.device),
        )
        return step, state

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
        self.prev_action[slots] = action.to(_CPU)
        if state:
            here = slots.to(self.device)
            for table, rows in zip(self.state, state, strict=True):
                table[here] = rows
