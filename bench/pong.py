"""Learning evidence on Pong: train with ``seedbed train`` and record the curve it draws.

Runs the CLI as a user would (a subprocess; Atari defaults unless flags follow ``--``), then
prints JSON: the machine, the command, frames and wall time, the final 100-episode mean return,
and the emulator frames and seconds at which that mean first passed each milestone. The curve
(``curve.png``) and ``metrics.csv`` are copied to ``--out``. Given a ``--run-dir`` that already
holds a run, it resumes that run up to ``--frames`` and reports the whole of it.

    python bench/pong.py --frames 10000000 --out docs/figures -- --env-backend envpool
    python bench/pong.py --frames 30000000 --run-dir runs/pong    # continue a run
"""

from __future__ import annotations

import argparse
import json
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

import numpy as np
from machine import machine
from results import add_out, emit

from seedbed.telemetry import read_metrics

MILESTONES = (-20.0, -15.0, -10.0, 0.0, 10.0, 18.0)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--frames", type=int, default=10_000_000, help="emulator frames to train")
    p.add_argument("--out", default="runs/pong-evidence", help="where the curve and CSV go")
    p.add_argument("--run-dir", default=None, help="keep the run here (default: a temp dir)")
    add_out(p, "--json")
    p.add_argument("train_flags", nargs="*", help="flags for seedbed train, after --")
    args = p.parse_args()

    with tempfile.TemporaryDirectory() as tmp:
        run = Path(args.run_dir or Path(tmp) / "run")
        resume = ["--resume"] if (run / "checkpoints").is_dir() else []
        command = [
            *("seedbed", "train", "--env", "atari:Pong", *resume),
            *("--total-frames", str(args.frames), "--run-dir", str(run)),
            *("--log-every-s", "5", "--no-progress", *args.train_flags),
        ]
        subprocess.run([sys.executable, "-m", *command], check=True)
        summary = json.loads((run / "summary.json").read_text())
        metrics = read_metrics(run)
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        shutil.copy(run / "curve.png", out / "pong-curve.png")
        shutil.copy(run / "metrics.csv", out / "pong-metrics.csv")

    mean = metrics["mean_return"]
    passed = {}
    for level in MILESTONES:
        hits = np.flatnonzero(np.nan_to_num(mean, nan=-np.inf) >= level)
        passed[str(level)] = (
            {"frames": int(metrics["frames"][hits[0]]), "wall_s": float(metrics["wall_s"][hits[0]])}
            if len(hits)
            else None
        )
    emit(
        {
            "benchmark": "pong_learning",
            "machine": machine(),
            "command": " ".join(command),
            "frames": summary["frames"],
            "frames_counted_as": summary["frames_counted_as"],
            "wall_s": summary["wall_s"],
            "mean_fps": summary["mean_fps"],
            "final_mean_return_100": summary["mean_return_100"],
            "best_mean_return_100": float(np.nanmax(mean)),
            "first_passed": passed,
            "env_protocol": summary["env_protocol"],
            "curve": str(out / "pong-curve.png"),
        },
        args.json,
    )


if __name__ == "__main__":
    main()
