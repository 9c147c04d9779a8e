"""Wall time from typing the command to reaching the target return, over several seeds.

Runs ``seedbed train`` as a user would (a subprocess, the embedded defaults unless flags are
given) once per seed, and prints JSON: for each seed the frames and the seconds from the
command's start to the moment the 100-episode mean first reached the target, and the command's
whole wall time; then the median and worst.

    python bench/time_to_target.py                       # the default CartPole run, seeds 0-4
    python bench/time_to_target.py --seeds 0 1 2 -- --lr 1e-3
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine
from results import add_out, emit


def one_run(seed: int, extra: list[str], run_dir: Path) -> dict:
    start = time.time()
    subprocess.run(
        [
            sys.executable,
            "-m",
            "seedbed",
            "train",
            "--seed",
            str(seed),
            "--run-dir",
            str(run_dir),
            "--no-progress",
            *extra,
        ],
        check=True,
        capture_output=True,
    )
    command_s = time.time() - start
    summary = json.loads((run_dir / "summary.json").read_text())
    reached = summary["target_reached_wall_s"]
    return {
        "seed": seed,
        "frames_to_target": summary["target_reached_frames"],
        "seconds_to_target": None
        if reached is None
        else round(summary["session_started_at"] + reached - start, 2),
        "command_s": round(command_s, 2),
        "mean_fps": summary["mean_fps"],
    }


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2, 3, 4])
    add_out(p)
    p.add_argument("extra", nargs="*", help="flags passed to seedbed train (after --)")
    args = p.parse_args()
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for seed in args.seeds:
            runs.append(one_run(seed, args.extra, Path(tmp) / f"seed{seed}"))
    times = [r["seconds_to_target"] for r in runs if r["seconds_to_target"] is not None]
    emit(
        {
            "benchmark": "time_to_target",
            "machine": machine(),
            "command": "seedbed train " + " ".join(args.extra),
            "runs": runs,
            "reached": f"{len(times)}/{len(runs)}",
            "median_seconds_to_target": statistics.median(times) if times else None,
            "worst_seconds_to_target": max(times) if len(times) == len(runs) else None,
        },
        args.out,
    )


if __name__ == "__main__":
    main()
