"""Training throughput against the limit set by the environments themselves.

Prints JSON: training env frames/s for a setup (steady state, after warm-up), the raw env steps/s
of the same number of actor processes stepping the same envs with random actions and no learning,
and their ratio. ``--noop`` uses a trivial env and a tiny network to measure framework overhead.

    python bench/throughput.py                      # the default CartPole run's settings
    python bench/throughput.py --noop
    python bench/throughput.py --env Acrobot-v1 --actors 2 --envs-per-actor 32 --frames 400000
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import os
import tempfile
import time

import numpy as np
from machine import machine

from seedbed.config import resolve


def _raw_worker(env_id: str, num_envs: int, seconds: float, out) -> None:
    from seedbed.envs import make_vector_env

    envs = make_vector_env(env_id, num_envs)
    envs.reset(seed=0)
    steps, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        envs.step(envs.action_space.sample())
        steps += num_envs
    out.put(steps)


def raw_env_fps(env_id: str, actors: int, num_envs: int, seconds: float) -> float:
    """Env steps/s of ``actors`` processes stepping ``num_envs`` envs each, nothing else."""
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(target=_raw_worker, args=(env_id, num_envs, seconds, out))
        for _ in range(actors)
    ]
    for p in procs:
        p.start()
    total = sum(out.get() for _ in procs)
    for p in procs:
        p.join()
    return total / seconds


def training_fps(settings: dict) -> tuple[float, dict]:
    """Steady-state env frames/s of a training run (the first 20% of frames are warm-up)."""
    from seedbed.config import resolve
    from seedbed.runtime.train import train
    from seedbed.telemetry import read_metrics

    summary = train(resolve([settings]))
    m = read_metrics(settings["run_dir"])
    frames, wall = m["frames"], m["wall_s"]
    start = int(np.searchsorted(frames, 0.2 * frames[-1]))
    start = min(start, len(frames) - 2)
    fps = (frames[-1] - frames[start]) / (wall[-1] - wall[start])
    return float(fps), summary


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--noop", action="store_true", help="trivial env and tiny network")
    # Unset layout flags keep seedbed's own defaults, so the default measures the default run.
    for name in ("actors", "envs-per-actor", "inference-batch", "unroll", "batch"):
        p.add_argument(f"--{name}", type=int, default=None)
    p.add_argument("--frames", type=int, default=600_000, help="training frames to measure")
    p.add_argument("--raw-seconds", type=float, default=5.0)
    p.add_argument("--device", default="cpu")
    args = p.parse_args()

    env_id = "seedbed/Noop-v0" if args.noop else args.env
    with tempfile.TemporaryDirectory() as tmp:
        layout = {
            k: v
            for k, v in vars(args).items()
            if k in ("actors", "envs_per_actor", "inference_batch", "unroll", "batch") and v
        }
        settings = {
            "env": env_id,
            **layout,
            "total_frames": args.frames,
            "target_return": None,
            "device": args.device,
            "run_dir": os.path.join(tmp, "run"),
            "progress": False,
            "log_every_s": 0.5,
            "checkpoint_every_s": 1e9,
        }
        if args.noop:
            settings["hidden_sizes"] = "8"
        train_fps, summary = training_fps(settings)
    train = resolve([settings]).train
    raw = raw_env_fps(env_id, train.actors, train.envs_per_actor, args.raw_seconds)
    settings.pop("run_dir")
    print(
        json.dumps(
            {
                "benchmark": "throughput",
                "machine": machine(),
                "setup": {
                    **settings,
                    "actors": train.actors,
                    "envs_per_actor": train.envs_per_actor,
                },
                "train_env_frames_per_s": round(train_fps),
                "raw_env_frames_per_s": round(raw),
                "ratio": round(train_fps / raw, 3),
                "frames_counted_as": "environment steps",
                "run": {k: summary[k] for k in ("frames", "wall_s", "mean_fps", "learner_steps")},
            },
            indent=2,
        )
    )


if __name__ == "__main__":
    main()
