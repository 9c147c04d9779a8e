"""ActorQ: actors that act with a quantized policy copy (int8, fp16) against fp32 ones.

    python bench/actorq.py speed                          # E = 32, 64, 128; 1 and 2 threads
    python bench/actorq.py speed --envs 32 --threads 1 --kernels
    python bench/actorq.py runs --seeds 0 1 2             # DQN on CartPole: central vs local
    python bench/actorq.py runs --agent d4pg              # D4PG on dmc:cartpole-balance

``speed`` prints JSON. An actor steps E CartPole envs together and samples their actions from
a policy MLP of three 512-wide hidden layers, decoded from the learner's broadcast payload
(``decode_policy(encode_policy(...))``), as a local-inference actor does. Per precision, actor
batch E and torch thread count it reports the actor's env steps/s, the policy forward alone per
batch, and the ratios to fp32; per precision the payload bytes and encode/decode times. Each
figure is the best of ``--rounds`` runs taken in turn, since the machine may be shared.

Two env vectors are measured: ``numpy``, what ``seedbed.envs.make_vector_env`` gives actors
(Gymnasium's CartPole stepping all E envs in one numpy call, restarting episodes on the step they
end), and ``sync``, Gymnasium's SyncVectorEnv of E single envs (each step ~10 us per env). Env-only
steps/s (random actions, no policy) bounds what any policy speed-up can give: where stepping the
envs takes as long as the fp32 policy, even a free policy only doubles the rate. ``--kernels``
adds the int8 forward under each quantized engine, the fp16 forward computed three ways, and,
for reference, PyTorch's weight-only int8 kernel (float activations: not ActorQ's int8).

``runs`` trains with ``seedbed train`` (a subprocess per run, the same seeds for every setup):
central fp32 inference, then local actors at fp32, fp16 and int8: DQN on CartPole with the
3x512 MLP, or D4PG on DM Control's cartpole-balance. Per setup it prints, over seeds: how many
reached the target, the median wall time and frames to it, the final 100-episode return, actor
steps/s (env steps per second over the run), broadcast bytes, kWh and kg CO2e; and the same as
a Markdown table (QuaRL's layout).
"""

from __future__ import annotations

import argparse
import copy
import functools
import json
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

import gymnasium as gym
import numpy as np
import torch
from machine import machine
from results import add_out, emit
from torch import nn
from torch.ao.quantization import float16_dynamic_qconfig, quantize_dynamic

from seedbed.actor.local import LocalActing, LocalPolicy
from seedbed.agents import make_agent
from seedbed.agents.vtrace.learning import VTraceAgent
from seedbed.envs import make_vector_env
from seedbed.quantize import PRECISIONS, decode_policy, encode_policy
from seedbed.resolve import resolve
from seedbed.transport.board import SharedMemoryBoard
from seedbed.types import EnvSpec

SPEC = EnvSpec("CartPole-v1", (4,), "float32", 2)
HIDDEN = (512, 512, 512)
GOAL = "int8 actors reach >= 2x the fp32 actor steps/s at actor batch >= 32"
SKIP = VTraceAgent.acting_skips  # broadcasts carry the policy only, as in training


def make_envs(vector: str, num_envs: int):
    if vector == "numpy":
        return make_vector_env(SPEC.env_id, num_envs, seed=0)
    return gym.vector.SyncVectorEnv(
        [lambda: gym.make(SPEC.env_id) for _ in range(num_envs)],
        autoreset_mode=gym.vector.AutoresetMode.SAME_STEP,
    )


Run = Callable[[float], tuple[int, float]]  # seconds -> (count, elapsed seconds)


def best_rates(runs: dict[str, Run], seconds: float, rounds: int) -> dict[str, float]:
    """Each run's best rate (count per second) over ``rounds``; the runs take turns, so that a
    busy spell on a shared machine does not fall on one of them only."""
    best = dict.fromkeys(runs, 0.0)
    for _ in range(rounds):
        for name, run in runs.items():
            count, elapsed = run(seconds)
            best[name] = max(best[name], count / elapsed)
    return best


def act(policy: LocalPolicy | None, envs, seconds: float) -> tuple[int, float]:
    """Env steps an actor takes in about ``seconds``: a local-inference actor's own loop, its
    ``LocalPolicy`` acting (random actions where ``policy`` is None), and the time taken."""
    num_envs = envs.num_envs
    obs, _ = envs.reset(seed=0)
    reward = np.zeros(num_envs, np.float32)
    done = np.ones(num_envs, bool)
    rng = np.random.default_rng(0)
    steps, start = 0, time.perf_counter()
    end = start + seconds
    while time.perf_counter() < end:
        if policy is None:
            action = rng.integers(0, SPEC.num_actions, num_envs)
        else:
            action = policy.act(obs, reward, done)["action"]
        obs, reward, terminated, truncated, _ = envs.step(action)
        done = terminated | truncated
        steps += num_envs
    return steps, time.perf_counter() - start


def local_policies(net: nn.Module, config, num_envs: int) -> tuple[dict, list[SharedMemoryBoard]]:
    """An actor's ``LocalPolicy`` per precision, each reading its own board with ``net`` on it."""
    policies, boards = {}, []
    for precision in PRECISIONS:
        board = SharedMemoryBoard(len(encode_policy(net, "fp32", 0, SKIP)) + 64)
        board.post(encode_policy(net, precision, 1, SKIP), 1)
        acting = LocalActing("vtrace", config, SPEC, num_envs, board.handle)
        policies[precision] = LocalPolicy(acting, 0, num_envs, seed=0)
        boards.append(board)
    return policies, boards


def forwards(net: nn.Module, num_envs: int, engine: str | None = None) -> Run:
    """A run of acting forwards (the policy only, as ``act`` runs it) on one batch of E
    observations (no envs), under the quantized ``engine`` where one is given."""
    g = torch.Generator().manual_seed(0)
    args = (
        torch.randn(1, num_envs, 4, generator=g),
        torch.zeros(1, num_envs, dtype=torch.int64),
        torch.zeros(1, num_envs),
        torch.zeros(1, num_envs, dtype=torch.bool),
        (),
    )

    def run(seconds: float) -> tuple[int, float]:
        if engine is not None:
            torch.backends.quantized.engine = engine
        with torch.inference_mode():
            for _ in range(10):
                net(*args, values=False)
            calls, start = 0, time.perf_counter()
            while time.perf_counter() - start < seconds:
                for _ in range(20):
                    net(*args, values=False)
                calls += 20
        return calls, time.perf_counter() - start

    return run


def timed(fn: Callable[[], object], repeat: int = 5) -> tuple[object, float]:
    """``fn()``'s result and its best time in ms over ``repeat`` calls."""
    best, result = float("inf"), None
    for _ in range(repeat):
        start = time.perf_counter()
        result = fn()
        best = min(best, time.perf_counter() - start)
    return result, round(best * 1e3, 2)


def broadcast_costs(net: nn.Module) -> tuple[dict, dict[str, nn.Module]]:
    """Payload bytes, encode and decode ms per precision (decoding afresh, and into the policy
    an actor already holds, as it does from its second broadcast on), and the decoded nets."""
    costs, nets = {}, {}
    for precision in PRECISIONS:
        payload, encode_ms = timed(lambda p=precision: encode_policy(net, p, 1, SKIP))
        (nets[precision], _), decode_ms = timed(lambda b=payload: decode_policy(b, net, SKIP))
        _, into_ms = timed(lambda b=payload, n=nets[precision]: decode_policy(b, net, SKIP, n))
        costs[precision] = {
            "bytes": len(payload),
            "encode_ms": encode_ms,
            "decode_ms": decode_ms,
            "decode_into_held_ms": into_ms,
        }
    for precision in PRECISIONS:
        costs[precision]["of_fp32"] = round(costs[precision]["bytes"] / costs["fp32"]["bytes"], 3)
    return costs, nets


def measure(nets: dict[str, nn.Module], config, num_envs: int, args: argparse.Namespace) -> dict:
    """One actor batch size's figures, at the current thread count."""
    threads = torch.get_num_threads()
    policies, boards = local_policies(nets["fp32"], config, num_envs)
    torch.set_num_threads(threads)  # a LocalPolicy sets one thread, as actors run
    forward = best_rates(
        {p: forwards(n, num_envs) for p, n in nets.items()}, args.seconds / 2, args.rounds
    )
    row: dict = {"envs": num_envs, "forward_us": {p: round(1e6 / r, 1) for p, r in forward.items()}}
    row["int8_forward_speedup"] = round(forward["int8"] / forward["fp32"], 2)
    for vector in args.vectors:
        envs = make_envs(vector, num_envs)
        runs = {p: functools.partial(act, policy, envs) for p, policy in policies.items()}
        runs["env_only"] = functools.partial(act, None, envs)
        rates = best_rates(runs, args.seconds, args.rounds)
        envs.close()
        row[vector] = {
            "env_only_steps_per_s": round(rates.pop("env_only")),
            "steps_per_s": {p: round(r) for p, r in rates.items()},
            "int8_over_fp32": round(rates["int8"] / rates["fp32"], 2),
            "fp16_over_fp32": round(rates["fp16"] / rates["fp32"], 2),
        }
    for board in boards:
        board.close()
    return row


def speed(args: argparse.Namespace) -> dict:
    torch.manual_seed(0)
    torch.set_num_threads(1)  # as an actor decodes (the learner encodes alongside its training)
    config = resolve([{"hidden_sizes": ",".join(map(str, HIDDEN))}]).agent
    net = make_agent("vtrace", SPEC, config, "cpu", 1).network.requires_grad_(False)
    costs, nets = broadcast_costs(net)
    load_before = os.getloadavg()
    results = []
    for threads in args.threads:
        torch.set_num_threads(threads)
        results += [{"threads": threads, **measure(nets, config, e, args)} for e in args.envs]
    report = {
        "benchmark": "actorq-speed",
        "machine": machine(),
        "load_average_1min": {"before": load_before[0], "after": os.getloadavg()[0]},
        "setup": {
            "env": SPEC.env_id,
            "policy": f"MLP {HIDDEN}, ActorCriticNet, actions sampled from the logits",
            "quantized_engine": torch.backends.quantized.engine,
            "seconds": args.seconds,
            "rounds": args.rounds,
        },
        "goal": GOAL,
        "payload": costs,
        "results": results,
        # at every E >= 32 measured; and the E (with threads) where int8 makes 2x
        "goal_met": {
            v: all(r[v]["int8_over_fp32"] >= 2 for r in results if r["envs"] >= 32)
            for v in args.vectors
        },
        "int8_2x_at": {
            v: [[r["envs"], r["threads"]] for r in results if r[v]["int8_over_fp32"] >= 2]
            for v in args.vectors
        },
    }
    if args.kernels:
        report["int8_forward_us_by_engine"] = engines(net, args)
        report["fp16_forward_us_by_compute"] = fp16_computes(net, nets["fp16"], args)
    return report


def engines(net: nn.Module, args: argparse.Namespace) -> dict:
    """Int8 forward per batch under each quantized engine, 1 thread, and the weight-only
    int8 kernel's (float32 activations) for reference."""
    torch.set_num_threads(1)
    payload = encode_policy(net, "int8", 1, SKIP)
    default = torch.backends.quantized.engine
    policies = {}
    for engine in ("x86", "fbgemm", "onednn"):
        if engine in torch.backends.quantized.supported_engines:
            torch.backends.quantized.engine = engine  # decode packs weights for the engine
            policies[engine] = decode_policy(payload, net, SKIP)[0]
    out: dict = {}
    for e in args.envs:
        runs = {name: forwards(policy, e, name) for name, policy in policies.items()}
        for name, rate in best_rates(runs, args.seconds / 2, args.rounds).items():
            out.setdefault(name, {})[e] = round(1e6 / rate, 1)
    torch.backends.quantized.engine = default
    weight_only = WeightOnlyInt8(net)
    out["weight_only_int8pack_mm (not ActorQ int8)"] = {
        e: round(1e6 / best_rates({"w": forwards(weight_only, e)}, args.seconds / 2, 1)["w"], 1)
        for e in args.envs
    }
    return out


def fp16_computes(net: nn.Module, upcast: nn.Module, args: argparse.Namespace) -> dict:
    """The fp16 actor's forward per batch, 1 thread: as decoded (weights upcast to float32),
    with the torso under float16 autocast, and with fbgemm's fp16-weight linear kernel."""
    torch.set_num_threads(1)
    autocast = copy.deepcopy(upcast)
    autocast.torso_dtype = torch.float16  # ActorCriticNet runs its torso under autocast
    fbgemm = quantize_dynamic(copy.deepcopy(net), {nn.Linear: float16_dynamic_qconfig})
    policies = {"upcast (decode_policy)": upcast, "autocast": autocast, "fbgemm_fp16": fbgemm}
    out: dict = {}
    for e in args.envs:
        runs = {name: forwards(policy, e) for name, policy in policies.items()}
        for name, rate in best_rates(runs, args.seconds / 2, args.rounds).items():
            out.setdefault(name, {})[e] = round(1e6 / rate, 1)
    return out


class WeightOnlyInt8(nn.Module):
    """The policy of ``net`` (an MLP ActorCriticNet) with every Linear computed by
    ``_weight_int8pack_mm``: int8 weights, float32 activations."""

    def __init__(self, net: nn.Module) -> None:
        super().__init__()
        self.packed = []
        for linear in [*net.torso.modules(), net.policy]:
            if not isinstance(linear, nn.Linear):
                continue
            scale = linear.weight.abs().amax(1).clamp_min(1e-8) / 127
            weight = (linear.weight / scale[:, None]).round().clamp(-128, 127).to(torch.int8)
            self.packed.append((weight, scale, linear.bias))

    def forward(self, obs, prev_action, reward, done, state, values=False):
        x = obs.flatten(0, 1)
        *hidden, (w, s, b) = self.packed
        for weight, scale, bias in hidden:
            x = torch.relu(torch._weight_int8pack_mm(x, weight, scale) + bias)
        return (torch._weight_int8pack_mm(x, w, s) + b)[None], None, state


SETUPS = {
    "central fp32": ["--inference", "central"],
    "local fp32": ["--inference", "local", "--actor-precision", "fp32"],
    "local fp16": ["--inference", "local", "--actor-precision", "fp16"],
    "local int8": ["--inference", "local", "--actor-precision", "int8"],
}
RUN_DEFAULTS = {
    # ActorQ's DQN policy: three 512-wide layers; CartPole counts as solved at 195 here.
    "dqn": ["--hidden-sizes", "512,512,512", "--target-return", "195", "--total-frames", "500000"],
    # Balance: random actions score ~370, a policy that holds the pole up ~1,000.
    "d4pg": ["--env", "dmc:cartpole-balance", "--target-return", "600", "--total-frames", "150000"],
}


def train_once(flags: list[str], run_dir: Path) -> dict:
    command = [sys.executable, "-m", "seedbed", "train", "--run-dir", str(run_dir), "--no-progress"]
    subprocess.run([*command, *flags], check=True, capture_output=True)
    summary = json.loads((run_dir / "summary.json").read_text())
    energy = summary["energy"] or {}
    return {
        "wall_s_to_target": summary["target_reached_wall_s"],
        "frames_to_target": summary["target_reached_frames"],
        "final_return": summary["mean_return_100"],
        "actor_steps_per_s": summary["mean_fps"],
        "broadcast_bytes": summary["inference"]["broadcast_bytes"],
        "quantization_error_max": summary["inference"]["quantization_error_max"],
        "kwh": energy.get("energy_kwh"),
        "kg_co2e": energy.get("emissions_kg_co2e"),
    }


def _median(values: list) -> float | None:
    values = [v for v in values if v is not None]
    return round(statistics.median(values), 6) if values else None


def runs(args: argparse.Namespace) -> dict:
    extra = ["--agent", args.agent, *RUN_DEFAULTS[args.agent], *args.extra]
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        for name, flags in SETUPS.items():
            per_seed = [
                train_once([*extra, *flags, "--seed", str(seed)], Path(tmp) / f"{name}-{seed}")
                for seed in args.seeds
            ]
            row = {key: _median([r[key] for r in per_seed]) for key in per_seed[0]}
            reached = sum(r["frames_to_target"] is not None for r in per_seed)
            results[name] = {"reached": f"{reached}/{len(per_seed)}", **row, "seeds": per_seed}
    head = "| setup | reached | s to target | frames to target | final return | steps/s | "
    head += "broadcast bytes | kWh | kg CO2e |"
    table = [head, "|" + "---|" * 9]
    for name, r in results.items():
        cells = [name, r["reached"], r["wall_s_to_target"], r["frames_to_target"]]
        cells += [r["final_return"], r["actor_steps_per_s"], r["broadcast_bytes"]]
        cells += [r["kwh"], r["kg_co2e"]]
        table.append("| " + " | ".join("-" if c is None else str(c) for c in cells) + " |")
    return {
        "benchmark": "actorq runs",
        "machine": machine(),
        "command": "seedbed train " + " ".join(extra),
        "setups": SETUPS,
        "seeds": args.seeds,
        "results": results,
        "table": table,
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    sub = p.add_subparsers(dest="command", required=True)
    s = sub.add_parser("speed", help="actor steps/s with fp32, fp16 and int8 policies")
    s.add_argument("--envs", type=int, nargs="+", default=[32, 64, 128], help="actor batch E")
    s.add_argument("--threads", type=int, nargs="+", default=[1, 2], help="torch threads")
    s.add_argument("--vectors", nargs="+", default=["numpy", "sync"], choices=["numpy", "sync"])
    s.add_argument("--seconds", type=float, default=0.5, help="per measured run")
    s.add_argument("--rounds", type=int, default=5, help="runs per figure, best kept")
    s.add_argument("--kernels", action="store_true", help="int8 and fp16 kernel alternatives")
    add_out(s)
    s.set_defaults(run=speed)
    r = sub.add_parser("runs", help="training runs: central, and local fp32, fp16 and int8 actors")
    r.add_argument("--agent", choices=sorted(RUN_DEFAULTS), default="dqn")
    r.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    r.add_argument("extra", nargs="*", help="flags for seedbed train (after --); they win")
    add_out(r)
    r.set_defaults(run=runs)
    args = p.parse_args()
    emit(args.run(args), args.out)


if __name__ == "__main__":
    main()
