"""What a remote actor's step costs in each of seedbed's own parts, each timed alone in a loop.

``bench/ingest.py`` measures the learner host's whole CPU per step; this splits out the parts
that are seedbed's code rather than the wire or the event loop, for newest-frame Atari steps
(uint8 1x84x84, ``atari1``) of E envs (``--envs``):

- ``decode_us``: a gateway turning a step message into arrays (``StepDecoder``), with the
  size and dtype checks;
- ``check_us``: ``check_step`` on those arrays, which the gateway and the inference server
  each run on every step (nothing to refuse: the common case);
- ``server_step_us_per_frame``: the inference server's ``step`` for ``--actors`` such actors in
  one call (the bench learner's network, as ``bench/ingest.py`` has it: V-trace, one unit, one
  torso), per frame: acting, the unroll rows and the answer, on an in-process transport;
  ``acting_us_per_frame`` the part its acting takes (the frames made float and the network).

Each figure is the best of ``--repeats`` timings (process CPU time for the server step), one
torch thread. Prints one JSON with the machine.

    python bench/step_parts.py
    python bench/step_parts.py --envs 8,32 --actors 8 --out ../docs/results/step-parts.json
"""

from __future__ import annotations

import argparse
import json
import time
import timeit

import numpy as np
import torch
from machine import machine

from seedbed.agents import make_agent
from seedbed.inference.server import InferenceServer
from seedbed.replay import UnrollQueue
from seedbed.resolve import resolve
from seedbed.transport.base import Request
from seedbed.transport.checks import check_step
from seedbed.transport.inprocess import InProcessServer
from seedbed.transport.proto import actor_pb2 as pb
from seedbed.transport.remote.wire import Assignment, StepDecoder, to_wire
from seedbed.types import EnvSpec

OBS = (1, 84, 84)
SPEC = EnvSpec("atari:Pong", OBS, "uint8", 6)
UNROLL = 16


def best_us(fn, number: int, repeats: int) -> float:
    return min(timeit.repeat(fn, number=number, repeat=repeats)) / number * 1e6


def wire_parts(envs: int, number: int, repeats: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    obs = rng.integers(0, 256, (envs, *OBS), np.uint8)
    reward, flags = np.zeros(envs, np.float32), np.zeros(envs, np.bool_)
    step = pb.Step(obs=to_wire(obs), reward=to_wire(reward), done=to_wire(flags))
    step.truncated.CopyFrom(to_wire(flags))
    decode = StepDecoder(Assignment("atari:Pong", envs, 0, None, 0, "|u1", OBS))
    arrays, _ = decode(step)
    return {
        "decode_us": round(best_us(lambda: decode(step), number, repeats), 2),
        "check_us": round(best_us(lambda: check_step(arrays[0], arrays[1]), number, repeats), 2),
    }


def server_parts(envs: int, actors: int, steps: int, repeats: int) -> dict[str, float]:
    settings = {"agent": "vtrace", "hidden_sizes": "1", "shared_torso": True}
    agent = make_agent("vtrace", SPEC, resolve([settings]).agent, "cpu")
    n = envs * actors
    transport = InProcessServer(num_actors=actors, envs_per_actor=envs)
    queue = UnrollQueue(10**6)
    server = InferenceServer(agent, transport, queue, n, (UNROLL, 1), n, 0.0, "cpu", num_actions=6)
    for a in range(actors):
        transport.connect(a)
    obs = np.random.default_rng(0).integers(0, 256, (n, *OBS), np.uint8)

    def request(t: int) -> Request:
        return Request(
            env_ids=np.arange(n),
            obs=obs,
            reward=np.zeros(n, np.float32),
            done=np.full(n, t == 0),
            truncated=np.zeros(n, np.bool_),
            run_id=np.ones(n, np.int64),
            route=[(a, 1) for a in range(actors)],
            acted=None,
        )

    def run(first: int) -> float:
        start = time.process_time()
        for t in range(first, first + steps):
            server.step(request(t))
            while len(queue):  # the learner's side: not timed as the server's
                stop = time.process_time()
                queue.get(1, timeout=0)
                start += time.process_time() - stop
        return (time.process_time() - start) / steps / n * 1e6

    run(0)  # the first step starts every episode; buffers are made
    step_us = min(run(1 + i * steps) for i in range(repeats))
    step_input, state = server.table.inputs(None, torch.from_numpy(obs), *_zeros(n))
    with torch.no_grad():
        act = best_us(lambda: agent.act(server.net, step_input, state), 20, repeats)
    return {
        "server_step_us_per_frame": round(step_us, 2),
        "acting_us_per_frame": round(act / n, 2),
    }


def _zeros(n: int) -> tuple[torch.Tensor, torch.Tensor]:
    return torch.zeros(n), torch.zeros(n, dtype=torch.bool)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--envs", default="8,32", help="envs per actor step, comma-separated")
    parser.add_argument("--actors", type=int, default=8, help="actors a server call answers")
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--out", help="also write the JSON here")
    args = parser.parse_args()
    torch.set_num_threads(1)
    points = []
    for envs in (int(e) for e in args.envs.split(",")):
        point = {"size": "atari1", "envs": envs, "actors_per_call": args.actors}
        point |= wire_parts(envs, 5000, args.repeats)
        point |= server_parts(envs, args.actors, 100, args.repeats)
        points.append(point)
    result = {"benchmark": "step_parts", "machine": machine(), "points": points}
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        with open(args.out, "w") as f:
            f.write(text + "\n")


if __name__ == "__main__":
    main()
