"""Local inference (ActorQ, IMPALA's actors): an actor picks its own actions with a policy copy.

The learner posts its policy to a ``PolicyBoard`` every ``--broadcast-every`` updates, encoded at
``--actor-precision`` (``seedbed.quantize``); each actor decodes the newest post into the module
it acts with and calls the agent's own ``act`` on it, exactly as central inference does for all
actors. The actor then sends its step together with what it acted (``acted_fields`` names them:
the action, the policy version, the agent's extras and the recurrent state it acted from), and
the learner's inference server only records it into unrolls.
"""

from __future__ import annotations

import dataclasses
import time
from typing import Any

import numpy as np
import torch

from seedbed.agents import make_agent
from seedbed.inference.acting import ActingTable
from seedbed.quantize import decode_policy
from seedbed.transport.base import Fields
from seedbed.transport.board import BoardHandle
from seedbed.types import EnvSpec


@dataclasses.dataclass(frozen=True)
class LocalActing:
    """What an actor process needs to act for itself (plain data, picklable for spawn)."""

    agent: str
    agent_config: Any
    env_spec: EnvSpec
    num_envs: int  # all environments of the run: the agent's per-env tables (e.g. epsilons)
    board: BoardHandle  # picklable where actors are processes (the shared-memory one is)


def acted_fields(agent: Any, env_spec: EnvSpec) -> Fields:
    """The fields an actor sends besides its step, found by acting once on a dummy input."""
    table = ActingTable(
        agent.initial_state, 1, env_spec.action_shape, env_spec.action_dtype, agent.device
    )
    obs = torch.zeros((1, *env_spec.obs_shape), dtype=getattr(torch, env_spec.obs_dtype))
    step, state = table.inputs(None, obs, torch.zeros(1), torch.ones(1, dtype=torch.bool))
    out = agent.act(agent.acting_network(), step, state)
    fields = [
        ("action", tuple(env_spec.action_shape), env_spec.action_dtype),
        ("version", (), "int64"),
    ]
    for name, value in out.extras.items():
        fields.append((name, tuple(value.shape[1:]), _numpy_dtype(value)))
    for i, value in enumerate(out.state):
        fields.append((f"state{i}", tuple(value.shape[1:]), _numpy_dtype(value)))
    return tuple(fields)


class LocalPolicy:
    """One actor's policy copy: acts for its E environments, env ids ``first_env`` onwards."""

    def __init__(self, acting: LocalActing, first_env: int, num_envs: int, seed: int) -> None:
        torch.set_num_threads(1)  # an actor is one process among many on the machine's cores
        torch.manual_seed(seed)  # spawned processes all start from torch's one default seed
        self.agent = make_agent(
            acting.agent, acting.env_spec, acting.agent_config, torch.device("cpu"), acting.num_envs
        )
        self._template = self.agent.network
        self._board = acting.board.open()
        self.net: torch.nn.Module | None = None
        self.version = -1
        self._env_ids = torch.arange(first_env, first_env + num_envs)  # the agent's ids for them
        spec = acting.env_spec
        self.table = ActingTable(
            self.agent.initial_state, num_envs, spec.action_shape, spec.action_dtype
        )

    def refresh(self, wait_s: float = 60.0) -> None:
        """Take the newest broadcast, if there is one; wait for the first."""
        deadline = time.monotonic() + wait_s
        while True:
            post = self._board.read(self.version)
            if post is not None:
                self.net, self.version = decode_policy(
                    post[0], self._template, self.agent.acting_skips, into=self.net
                )
                return
            if self.net is not None:
                return
            if time.monotonic() > deadline:
                raise ConnectionError("no policy was broadcast to this actor")
            time.sleep(0.01)

    @torch.inference_mode()  # not no_grad: no version counters or view tracking
    def act(self, obs: np.ndarray, reward: np.ndarray, done: np.ndarray) -> dict[str, np.ndarray]:
        """Actions for this step, and everything the learner records with them."""
        self.refresh()
        step, state = self.table.inputs(
            None,
            torch.from_numpy(obs),
            torch.from_numpy(np.asarray(reward, np.float32)),
            torch.from_numpy(np.asarray(done, np.bool_)),
            env_ids=self._env_ids,
        )
        out = self.agent.act(self.net, step, state)
        self.table.record(None, out.action, out.state)  # takes the new tensors: `state` stays
        acted = {
            "action": out.action.numpy(),
            "version": np.full(len(self._env_ids), self.version, np.int64),
            **{name: value.numpy() for name, value in out.extras.items()},
            **{f"state{i}": value.numpy() for i, value in enumerate(state)},
        }
        return acted

    def close(self) -> None:
        self._board.close()


def _numpy_dtype(value: torch.Tensor) -> str:
    return str(value.dtype).removeprefix("torch.")
