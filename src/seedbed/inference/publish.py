"""Hands the learner's newest policy to whoever acts, and measures what a broadcast costs.

Central inference at full precision takes the parameters after every update (a copy in place).
An int8 central copy, and local actors, take a broadcast every ``--broadcast-every`` updates:
quantized once by the learner (``seedbed.quantize``), and for local actors posted as bytes to
their ``PolicyBoard``, without the parts acting never reads (the agent's ``acting_skips``).
The quantization error, the largest change of the acting outputs (the agent's
``acting_outputs``: logits, Q-value advantages or noiseless actions, and the recurrent state) on
the inputs of the batch just learned from, is measured on the first quantized broadcast after
each metrics row: measuring needs a decode and two forwards, which on every broadcast would cost
a small learner as much as its update.
"""

from __future__ import annotations

from typing import Any

import torch

from seedbed.agents.base import Agent
from seedbed.inference.server import InferenceServer
from seedbed.quantize import decode_policy, encode_policy, policy_error
from seedbed.transport.board import PolicyBoard
from seedbed.types import State, StepInput, Unrolls

_PROBE_ENVS = 64  # environments of a learned batch that the quantization error is measured on


class PolicyPublisher:
    """Publishes ``agent``'s network after learner updates: to ``server``, or to local actors'
    ``board`` (without the agent's ``acting_skips``)."""

    def __init__(
        self,
        agent: Agent,
        server: InferenceServer,
        board: PolicyBoard | None,
        precision: str,
        every: int,
    ) -> None:
        self.agent = agent
        self.network = agent.network
        self.skip = agent.acting_skips
        self.server = server
        self.board = board
        self.precision = precision  # the actors' (local) or central inference's
        self.every = every
        self.broadcast_bytes: int | None = None  # of the last post to local actors
        self._error: float | None = None  # measured on the first broadcast after each row
        self._error_max = 0.0

    @property
    def measured(self) -> bool:
        """Whether broadcasts have a size or an error to report."""
        return self.board is not None or self.precision != "fp32"

    def publish(self, version: int, batch: Unrolls | None = None, force: bool = False) -> None:
        """After update ``version``: broadcast if one is due (or ``force``); ``batch`` is what
        was just learned from, whose inputs measure the quantization error."""
        if self.board is None and self.precision == "fp32":
            self.server.publish(self.network, version)  # a plain copy: every update
            return
        if version % self.every and not force:
            return
        payload = None
        if self.board is None:
            self.server.publish(self.network, version)  # the int8 central copy
        else:
            payload = encode_policy(self.network, self.precision, version, self.skip)
            self.board.post(payload, version)
            self.broadcast_bytes = len(payload)
        if self.precision != "fp32" and batch is not None and self._error is None:
            acting, probe = self._acting(payload), _probe(batch)
            self._error = policy_error(self.network, acting, self.agent.acting_outputs, probe)
            self._error_max = max(self._error_max, self._error)

    def _acting(self, payload: bytes | None) -> torch.nn.Module:
        """What acts at the broadcast precision: the central copy, or ``payload`` decoded as the
        actors decode it."""
        if payload is None:
            return self.server.net
        return decode_policy(payload, self.network, self.skip)[0]

    def take(self) -> dict[str, Any]:
        """Metrics since the last call: broadcast bytes and the quantization error measured."""
        error, self._error = self._error, None
        return {"broadcast_bytes": self.broadcast_bytes, "quantization_error": error}

    def summary(self) -> dict[str, Any]:
        return {
            "broadcast_every": self.every,
            "broadcast_bytes": self.broadcast_bytes,
            "quantization_error_max": self._error_max if self.precision != "fp32" else None,
        }


def _probe(batch: Unrolls) -> tuple[StepInput, State]:
    """The agent's ``acting_outputs`` inputs for the first step of up to ``_PROBE_ENVS``
    unrolls of ``batch``: that step, and the recurrent state it was acted from."""
    envs = slice(0, _PROBE_ENVS)
    obs, prev_action, reward, done = (
        batch.steps[k][0, envs] for k in ("obs", "prev_action", "reward", "done")
    )
    env_ids = torch.arange(len(obs), device=obs.device)  # unread: acting_outputs never explores
    state = tuple(s[envs] for s in batch.initial_state)
    return StepInput(obs, prev_action, reward, done, env_ids), state
