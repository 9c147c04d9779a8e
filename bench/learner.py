"""Learner samples/s with 1 and N learner replicas: the replicated learner's scaling, and
what one learner batch costs each agent, torso and torso dtype.

Each replica runs an agent's learner (``agent.learn``, as ``seedbed train --learner-replicas``
does; V-trace unless ``--agent``) on its share of a fixed global batch of B unrolls of T steps,
with gradients averaged over replicas every step; no actors, so only learning and the gradient
all-reduce are timed. B and T are the agent's run defaults for the env unless given. Prints
JSON with the machine: per replica count, learner steps/s, samples/s (B x T env steps learned
per second) and frames/s (samples x the env's frame skip: the most frames/s a run whose learner
is its bound can reach), and the speed-up over the faster single replica (with one thread, or
with as many threads as cores: small networks run slower on more threads).

    python bench/learner.py                            # CartPole's MLP, then Atari's Nature CNN
    python bench/learner.py --env atari:Pong --batch 32 --unroll 20 --replicas 1 2
    python bench/learner.py --env atari:Pong --agent ppo --replicas 1 --torso-dtype float32
    python bench/learner.py --env atari:Pong --agent ppo --replicas 1 --torso a3c
    python bench/learner.py --env atari:Pong --agent ppo --replicas 1 --set epochs=3
    python bench/learner.py --env atari:Pong --agent ppo --replicas 1 --ops 8   # where time goes
"""

from __future__ import annotations

import argparse
import os
import time

import torch
from machine import machine
from results import add_out, emit

from seedbed.agents import make_agent
from seedbed.envs import make_spec
from seedbed.replicate import Replicator, spawn
from seedbed.resolve import resolve
from seedbed.types import Unrolls


def synthetic_batch(spec, num_actions: int, batch: int, unroll: int, seed: int) -> Unrolls:
    """B random unrolls of T+1 steps shaped as central inference builds them for V-trace."""
    gen = torch.Generator().manual_seed(seed)
    shape = (unroll + 1, batch)
    if spec.obs_dtype == "uint8":
        obs = torch.randint(0, 256, (*shape, *spec.obs_shape), dtype=torch.uint8, generator=gen)
    else:
        obs = torch.randn((*shape, *spec.obs_shape), generator=gen)
    actions = torch.randint(0, num_actions, shape, generator=gen)
    steps = {
        "obs": obs,
        "prev_action": actions.roll(1, 0),
        "reward": torch.randn(shape, generator=gen),
        "done": torch.rand(shape, generator=gen) < 0.01,
        "truncated": torch.zeros(shape, dtype=torch.bool),
        "action": actions,
        "logits": torch.randn((*shape, num_actions), generator=gen),
    }
    return Unrolls(steps, (), torch.zeros(batch, dtype=torch.int64))


def settings(env: str, agent: str, given: dict):
    """The run's settings: the agent's defaults for ``env``, with what the command gave
    (``given``: settings by name, None where not given)."""
    given = {**given, "queue_size": given.get("batch")}
    return resolve([{"env": env, "agent": agent, **{k: v for k, v in given.items() if v}}])


def measure(env: str, agent: str, given: dict, steps: int, warmup: int, ops: int = 0) -> dict:
    """One replica's part: learn ``steps`` times on its share of the batch; its steps/s, and
    with ``ops`` the ops that took the most of one more step's time (torch.profiler)."""
    with Replicator(device="cpu") as rep:
        config = settings(env, agent, given)
        batch, unroll = config.train.batch, config.train.unroll
        spec = make_spec(env, config.env_settings)
        torch.manual_seed(0)
        agent = make_agent(agent, spec, config.agent, rep.device, batch)
        rep.wrap_optimizer(agent.optimizer)
        share = batch // rep.num_replicas
        unrolls = synthetic_batch(spec, spec.num_actions, share, unroll, rep.replica_id)
        for _ in range(warmup):
            agent.learn(unrolls)
        rep.barrier()
        start = time.perf_counter()
        for _ in range(steps):
            agent.learn(unrolls)
        rep.barrier()
        seconds = time.perf_counter() - start
        dtype = str(getattr(agent.network, "torso_dtype", torch.float32))
        out = {"seconds": seconds, "threads": torch.get_num_threads(), "torso_dtype": dtype}
        if ops:
            out["top_ops"] = top_ops(agent, unrolls, ops)
        return out


def top_ops(agent, unrolls: Unrolls, count: int) -> list[dict]:
    """The ``count`` ops (by name and input shapes) with the most self CPU time in one
    ``agent.learn``: milliseconds and calls."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU], record_shapes=True) as prof:
        agent.learn(unrolls)
    events = sorted(
        prof.key_averages(group_by_input_shape=True), key=lambda e: -e.self_cpu_time_total
    )
    return [
        {
            "op": e.key,
            "shapes": str(e.input_shapes),
            "ms": round(e.self_cpu_time_total / 1e3, 1),
            "calls": e.count,
        }
        for e in events[:count]
    ]


def run(args: argparse.Namespace, env: str, replicas: int, steps: int, threads: int = 1) -> dict:
    given = {k: getattr(args, k) for k in ("batch", "unroll", "torso", "torso_dtype")}
    given.update(args.set)
    config = settings(env, args.agent, given)
    batch, unroll = config.train.batch, config.train.unroll
    spec = (env, args.agent, given, steps, args.warmup)
    if replicas == 1:
        torch.set_num_threads(threads)
        results = [measure(*spec, args.ops)]
    else:  # spawn gives each replica its share of the cores
        results = spawn(replicas, measure, *spec)
    seconds = max(r["seconds"] for r in results)
    samples = steps * batch * unroll / seconds
    return {
        "replicas": replicas,
        "threads_per_replica": results[0]["threads"],
        "batch": batch,
        "unroll": unroll,
        "torso_dtype": results[0]["torso_dtype"].removeprefix("torch."),
        "seconds_per_learner_step": round(seconds / steps, 3),
        "learner_steps_per_s": round(steps / seconds, 2),
        "samples_per_s": round(samples, 1),
        "frames_per_s": round(samples * (4 if env.startswith("atari:") else 1), 1),
        **({"top_ops": results[0]["top_ops"]} if "top_ops" in results[0] else {}),
    }


def setting_value(text: str) -> tuple[str, str]:
    """``NAME=VALUE`` as (name, value), with the flag's dashes as the setting's underscores."""
    name, sep, value = text.partition("=")
    if not sep or not name or not value:
        raise argparse.ArgumentTypeError(f"expected NAME=VALUE, got {text!r}")
    return name.removeprefix("--").replace("-", "_"), value


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--env", nargs="+", default=["CartPole-v1", "atari:Pong"])
    parser.add_argument("--replicas", type=int, nargs="+", default=[1, 2])
    parser.add_argument("--agent", default="vtrace", help="the agent whose learner is timed")
    parser.add_argument("--batch", type=int, help="global batch B (unrolls; default: the agent's)")
    parser.add_argument("--unroll", type=int, help="steps T per unroll (default: the agent's)")
    parser.add_argument("--torso", help="the network torso (default: the agent's)")
    parser.add_argument("--torso-dtype", choices=["float32", "bfloat16", "auto"])
    parser.add_argument("--steps", type=int, default=None, help="timed learner steps")
    parser.add_argument("--warmup", type=int, default=3)
    parser.add_argument(
        "--ops", type=int, default=0, help="with one replica, the N ops that took the most time"
    )
    parser.add_argument(
        "--set",
        type=setting_value,
        action="append",
        default=[],
        metavar="NAME=VALUE",
        help="any other setting, as `seedbed train` names it (epochs=3, minibatches=2)",
    )
    add_out(parser)
    args = parser.parse_args()
    report = {"machine": machine(), "agent": args.agent, "set": dict(args.set), "results": []}
    for env in args.env:
        steps = args.steps or (200 if not env.startswith("atari:") else 20)
        rows = [
            run(args, env, n, steps, threads)
            for n in args.replicas
            for threads in ({1, os.cpu_count() or 1} if n == 1 else {0})
        ]
        base = max(r["samples_per_s"] for r in rows if r["replicas"] == 1)
        for row in rows:
            row["speedup"] = round(row["samples_per_s"] / base, 2)
        report["results"].append({"env": env, "steps": steps, "rows": rows})
    emit(report, args.out)


if __name__ == "__main__":
    main()
