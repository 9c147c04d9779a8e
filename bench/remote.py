"""Remote actors against shared-memory actors: the same run, the same machine.

Trains the same setup several ways and prints JSON with each one's steady-state frames/s: local
actor processes on shared memory; then for each wire (``--wires``: gRPC, the socket wire)
``seedbed actor`` processes connected on 127.0.0.1 (``WIRE_tcp``), and with ``--unix`` the same
over a Unix socket (``WIRE_unix``). The ratio of each remote run to the shared-memory one
(``ratio_to_shared_memory``) is the cost of the network path (serialisation, the stream, the
gateway's relay). Flags after ``--`` go to ``seedbed train`` unchanged.

    python bench/remote.py                                   # the default CartPole settings
    python bench/remote.py --env atari:Pong -- --env-backend envpool
"""

from __future__ import annotations

import argparse
import functools
import os
import subprocess
import sys
import tempfile
import threading
import time

from machine import machine
from results import add_out, emit
from throughput import steady_fps, train_flags, training_fps

from seedbed.envs.atari import is_atari
from seedbed.resolve import resolve


def remote_training_fps(settings: dict, listen: str, wire: str) -> tuple[float, dict]:
    """Like ``training_fps``, with every actor a ``seedbed actor`` process on ``listen``,
    speaking ``wire``."""
    from seedbed.runtime.train import train

    config = resolve([settings])
    remote = {
        **settings,
        "actors": 0,
        "remote_actors": config.train.actors,
        "listen": listen,
        "wire": wire,
    }
    result: dict = {}
    learner = threading.Thread(target=lambda: result.update(summary=train(resolve([remote]))))
    learner.start()
    address_file = os.path.join(settings["run_dir"], "listen_address")
    while not os.path.exists(address_file):
        if not learner.is_alive():
            raise SystemExit("the learner stopped before it listened")
        time.sleep(0.05)
    with open(address_file) as f:
        address = f.read().strip()
    actors = [
        subprocess.Popen(
            [sys.executable, "-m", "seedbed", "actor", "--connect", address]
            + ["--token-file", os.path.join(settings["run_dir"], "actor-token")]
            + ["--wire", wire],
            stdout=subprocess.DEVNULL,  # this script's stdout is its JSON
        )
        for _ in range(config.train.actors)
    ]
    learner.join()
    for actor in actors:
        actor.wait(60)
    return steady_fps(settings["run_dir"]), result["summary"]


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--env", default="CartPole-v1")
    p.add_argument("--frames", type=int, default=None, help="training frames per run")
    p.add_argument("--wires", default="grpc,socket", help="the remote runs' --wire, a list")
    p.add_argument("--unix", action="store_true", help="also each wire over a Unix socket")
    add_out(p)
    p.add_argument("train_flags", nargs="*", help="flags for seedbed train, after --")
    args = p.parse_args()

    frames = args.frames or (1_000_000 if is_atari(args.env) else 600_000)
    results = {}
    with tempfile.TemporaryDirectory() as tmp:
        base = {
            "env": args.env,
            "total_frames": frames,
            "target_return": None,
            "progress": False,
            "log_every_s": 0.5,
            "checkpoint_every_s": 1e9,
            **train_flags(args.train_flags),
        }
        runs = {"shared_memory": training_fps}
        for wire in args.wires.split(","):
            remote = functools.partial(remote_training_fps, wire=wire)
            runs[f"{wire}_tcp"] = functools.partial(remote, listen="127.0.0.1:0")
            if args.unix:
                runs[f"{wire}_unix"] = functools.partial(remote, listen=f"unix:{tmp}/{wire}.sock")
        for name, run in runs.items():
            fps, summary = run({**base, "run_dir": os.path.join(tmp, name)})
            results[name] = {"train_frames_per_s": round(fps), "frames": summary["frames"]}
    config = resolve([base])
    shm = results["shared_memory"]["train_frames_per_s"]
    report = {
        "benchmark": "remote_actors",
        "machine": machine(),
        "setup": {
            **base,
            "actors": config.train.actors,
            "envs_per_actor": config.train.envs_per_actor,
            "batch": config.train.batch,
            "unroll": config.train.unroll,
        },
        "runs": results,
        "ratio_to_shared_memory": {
            name: round(run["train_frames_per_s"] / shm, 3)
            for name, run in results.items()
            if name != "shared_memory"
        },
    }
    emit(report, args.out)


if __name__ == "__main__":
    main()
