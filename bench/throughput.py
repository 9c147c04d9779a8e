"""Training throughput against the limit set by the environments themselves.

Prints JSON: training frames/s for a setup (steady state, after warm-up), the raw frames/s of the
same number of actor processes stepping the same envs with random actions and no learning, and
their ratio. Atari ids count emulator frames (agent steps x frame skip) everywhere, and measure
the raw rate of both backends, so the ratio to the fastest one is printed too. ``--profile``
adds where each part's time went: actors (stepping envs or waiting for actions), the inference
thread and the learner thread. ``--noop`` uses a trivial env and a tiny network to measure
framework overhead. Flags after ``--`` go to ``seedbed train`` unchanged.

    python bench/throughput.py                      # the default CartPole run's settings
    python bench/throughput.py --noop
    python bench/throughput.py --env atari:Pong --profile -- --env-backend envpool
"""

from __future__ import annotations

import argparse
import dataclasses
import multiprocessing
import os
import tempfile
import time

import numpy as np
from machine import machine
from results import add_out, emit

from seedbed.cli import build_parser
from seedbed.config import RunConfig, to_dict
from seedbed.envs.atari import is_atari
from seedbed.resolve import resolve


def _raw_worker(env_id: str, num_envs: int, settings, seconds: float, out) -> None:
    from seedbed.envs import make_vector_env

    envs = make_vector_env(env_id, num_envs, 0, settings)
    envs.reset(seed=0)
    actions = envs.single_action_space.n
    rng = np.random.default_rng(0)
    steps, end = 0, time.perf_counter() + seconds
    while time.perf_counter() < end:
        envs.step(rng.integers(0, actions, num_envs))
        steps += num_envs
    out.put(steps)


def raw_env_fps(config: RunConfig, seconds: float, backend: str | None = None) -> float:
    """Frames/s of the run's actor processes stepping their envs, nothing else."""
    train = config.train
    settings = config.env_settings
    if backend is not None:
        settings = dataclasses.replace(settings, env_backend=backend)
    ctx = multiprocessing.get_context("spawn")
    out = ctx.Queue()
    procs = [
        ctx.Process(
            target=_raw_worker, args=(train.env, train.envs_per_actor, settings, seconds, out)
        )
        for _ in range(train.actors)
    ]
    for p in procs:
        p.start()
    total = sum(out.get() for _ in procs)
    for p in procs:
        p.join()
    frame_skip = settings.frame_skip if is_atari(train.env) else 1
    return total * frame_skip / seconds


def steady_fps(run_dir: str) -> float:
    """Frames/s of a finished run after warm-up (its first 20% of frames)."""
    from seedbed.telemetry import read_metrics

    m = read_metrics(run_dir)
    frames, wall = m["frames"], m["wall_s"]
    start = int(np.searchsorted(frames, 0.2 * frames[-1]))
    start = min(start, len(frames) - 2)
    return float((frames[-1] - frames[start]) / (wall[-1] - wall[start]))


def training_fps(settings: dict) -> tuple[float, dict]:
    """Steady-state frames/s of a training run, and its summary."""
    from seedbed.runtime.train import train

    summary = train(resolve([settings]))
    return steady_fps(settings["run_dir"]), summary


def train_flags(extra: list[str]) -> dict:
    """``seedbed train`` flags as a settings layer, parsed by seedbed's own parser."""
    args = build_parser().parse_args(["train", *extra])
    own = ("command", "config", "verbose", "print_config")  # the command's, not settings
    return {k: v for k, v in vars(args).items() if k not in own}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--noop", action="store_true", help="trivial env and tiny network")
    p.add_argument("--profile", action="store_true", help="print where time went")
    p.add_argument("--frames", type=int, default=None, help="training frames to measure")
    p.add_argument("--raw-seconds", type=float, default=5.0)
    p.add_argument("--device", default="cpu")
    add_out(p)
    p.add_argument("train_flags", nargs="*", help="flags for seedbed train, after --")
    args = p.parse_args()

    env_id = "seedbed/Noop-v0" if args.noop else args.env
    atari = is_atari(env_id)
    frames = args.frames or (2_000_000 if atari else 600_000)
    with tempfile.TemporaryDirectory() as tmp:
        settings = {
            "env": env_id,
            "total_frames": frames,
            "target_return": None,
            "device": args.device,
            "progress": False,
            "log_every_s": 0.5,
            "checkpoint_every_s": 1e9,
            **({"hidden_sizes": "8"} if args.noop else {}),
            **train_flags(args.train_flags),
            "run_dir": os.path.join(tmp, "run"),
        }
        train_fps, summary = training_fps(settings)
    config = resolve([settings])
    own_backend = getattr(config.env_settings, "env_backend", "gymnasium")
    raw = {own_backend: raw_env_fps(config, args.raw_seconds)}
    if atari:  # the goal compares with the fastest backend
        for backend in ("gymnasium", "envpool"):
            if backend not in raw:
                raw[backend] = raw_env_fps(config, args.raw_seconds, backend)
    own = raw[own_backend]
    settings.pop("run_dir")
    report = {
        "benchmark": "throughput",
        "machine": machine(),
        "setup": {
            **settings,
            **{k: v for k, v in to_dict(config.train).items() if k in _SHOWN},
            **{k: v for k, v in to_dict(config.agent).items() if k in _SHOWN},
            **{k: v for k, v in to_dict(config.env_settings).items() if k in _SHOWN},
        },
        "train_frames_per_s": round(train_fps),
        "raw_env_frames_per_s": round(own),
        "ratio": round(train_fps / own, 3),
        "frames_counted_as": summary["frames_counted_as"],
        "run": {
            k: summary[k]
            for k in ("frames", "wall_s", "mean_fps", "learner_steps", "torch_threads")
        },
    }
    if atari:
        fastest = max(raw, key=raw.get)
        report["raw_env_frames_per_s_by_backend"] = {k: round(v) for k, v in raw.items()}
        report["ratio_to_fastest_backend"] = round(train_fps / raw[fastest], 3)
    if args.profile:
        report["time_shares"] = summary["time_shares"]
    emit(report, args.out)


_SHOWN = (
    *("actors", "envs_per_actor", "env_backend", "threads", "unroll", "batch"),
    *("inference_batch", "torso", "torso_dtype", "lstm"),
)

if __name__ == "__main__":
    main()
