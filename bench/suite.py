"""The benchmark suite: does a default hold across a tier of tasks, not only where it was tuned?

Each tier lists tasks with a threshold and a budget taken from a published reference (the
Stable-Baselines3 zoo's PPO table, ``benchmark.md`` of DLR-RM/rl-baselines3-zoo, unless a task
says otherwise). For every task and seed it runs ``seedbed train --env ID`` as a user would, with
no flag but the task's budget and threshold (and what follows ``--``), and records whether the
100-episode mean reached the threshold within the budget, the seconds from the command's start
and the frames it took, the score at the end (the mean of the last 100 episodes) beside the
reference's, and whether any default was tuned on the task. It prints JSON (``--out`` also writes
it) and, with ``--table``, the Markdown table docs/defaults.md shows.

    python bench/suite.py --tier classic                      # seeds 0 1 2
    python bench/suite.py --tier classic --tasks Acrobot-v1 --seeds 1 -- --lr 5e-4
    python bench/suite.py --tier mujoco --seeds 0 --table --out docs/results/suite-mujoco.json
    python bench/suite.py --list
"""

from __future__ import annotations

import argparse
import csv
import dataclasses
import json
import os
import signal
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from machine import machine

ZOO = "SB3 zoo PPO"
# CleanRL's ppo_continuous_action.py on dm_control at its default 1 M steps (its PPO docs).
CLEANRL_DMC = "CleanRL PPO (dm_control/{}-v0), 1M steps"


@dataclasses.dataclass(frozen=True)
class Task:
    """One task of a tier: reach ``threshold`` within ``frames`` (or ``minutes``)."""

    env: str
    threshold: float
    frames: int  # the budget in environment frames (for Atari: agent steps x frame skip)
    reference: str  # who published the reference score, and at what budget
    reference_score: float | None
    tuned_on: bool = False  # whether any default was chosen on this task
    minutes: float | None = None  # a wall-clock budget as well (Atari)

    full_budget: bool = False  # run the whole budget, for the score at its end


# Thresholds: Gymnasium's reward_threshold where the env has one, else the reference's score
# less its standard deviation (Pendulum: -172 - 104), or the reference's score itself (MuJoCo
# and DM Control, where the goal is to match it at 1 M steps).
TIERS: dict[str, list[Task]] = {
    "classic": [
        Task("CartPole-v1", 475, 500_000, f"{ZOO}, 100k steps", 500.0, tuned_on=True),
        Task("Acrobot-v1", -100, 1_000_000, f"{ZOO}, 1M steps", -73.5, tuned_on=True),
        Task("MountainCar-v0", -110, 1_000_000, f"{ZOO}, 1M steps", -110.4, tuned_on=True),
        Task(
            "LunarLander-v3",
            200,
            1_000_000,
            f"{ZOO} (LunarLander-v2), 1M steps",
            242.1,
            tuned_on=True,
        ),
        Task(
            "LunarLanderContinuous-v3",
            200,
            1_000_000,
            f"{ZOO} (LunarLanderContinuous-v2), 1M steps",
            270.9,
            tuned_on=True,
        ),
        Task("Pendulum-v1", -276, 1_000_000, f"{ZOO}, 100k steps", -172.2, tuned_on=True),
    ],
    "mujoco": [
        Task(
            f"{name}-v5",
            round(score),
            1_000_000,
            f"{ZOO} ({name}-v3), 1M steps",
            score,
            tuned_on=tuned,
            full_budget=True,
        )
        for name, score, tuned in (
            # Every one tuned on since the bootstrap and the starting log-std were tried on all.
            ("HalfCheetah", 5819.1, True),
            ("Hopper", 2410.4, True),
            ("Walker2d", 3478.8, True),
            ("Ant", 1327.2, True),
        )
    ],
    "dmc": [
        Task(
            f"dmc:{name}",
            round(score),
            1_000_000,
            CLEANRL_DMC.format(name),
            score,
            tuned_on=tuned,
        )
        for name, score, tuned in (
            # Every one tuned on: the preset's layout and start were chosen on all three.
            ("cartpole-balance", 855.47, True),
            ("cartpole-swingup", 640.86, True),
            ("walker-stand", 564.46, True),
        )
    ],
    "atari": [
        Task("atari:Pong", 18, 200_000_000, f"{ZOO}, 10M steps", 21.0, tuned_on=True, minutes=60),
        *(
            Task(
                f"atari:{game}",
                threshold,
                200_000_000,
                f"{ZOO}, 10M steps",
                score,
                minutes=30,
                full_budget=True,
            )
            for game, threshold, score in (
                ("Breakout", 100, 398.0),
                ("Seaquest", 1000, 1783.6),
                ("Qbert", 5000, 15627.1),
                ("SpaceInvaders", 600, 960.3),
            )
        ),
    ],
}
STOP_GRACE_S = 120.0  # longest a run may take to stop once its wall-clock budget is over


def run_task(task: Task, seed: int, extra: list[str], run_dir: Path, frames: int | None) -> dict:
    """Run ``seedbed train`` on ``task`` once; what it reached, when, and its final score."""
    budget = frames or task.frames
    target = "none" if task.full_budget else str(task.threshold)
    command = [
        sys.executable,
        "-m",
        "seedbed",
        "train",
        "--env",
        task.env,
        "--seed",
        str(seed),
        "--total-frames",
        str(budget),
        "--target-return",
        target,
        "--run-dir",
        str(run_dir),
        "--no-progress",
        *extra,
    ]
    start = time.time()
    with open(run_dir.with_suffix(".log"), "w") as log:
        proc = subprocess.Popen(command, stdout=log, stderr=subprocess.STDOUT)
        try:
            proc.wait(timeout=None if task.minutes is None else task.minutes * 60)
        except subprocess.TimeoutExpired:
            proc.send_signal(signal.SIGINT)  # a clean stop: the summary is written
            proc.wait(timeout=STOP_GRACE_S)
    summary = json.loads((run_dir / "summary.json").read_text())
    frames_to, seconds_to = _first_reach(run_dir, task.threshold, summary, start)
    final = summary["mean_return_100"]
    return {
        "env": task.env,
        "seed": seed,
        "reached": frames_to is not None,
        "frames_to_threshold": frames_to,
        "seconds_to_threshold": seconds_to,
        "final_score": None if final is None else round(final, 2),
        "frames": summary["frames"],
        "command_s": round(time.time() - start, 2),
        "exit_code": proc.returncode,
    }


def _first_reach(
    run_dir: Path, threshold: float, summary: dict, start: float
) -> tuple[int | None, float | None]:
    """Frames and seconds from the command's start to the first 100-episode mean at or above
    ``threshold`` (the run's own record where it stopped there, else its metrics.csv)."""
    offset = summary["session_started_at"] - start
    if summary.get("target_reached_frames") is not None:
        return summary["target_reached_frames"], round(offset + summary["target_reached_wall_s"], 2)
    with open(run_dir / "metrics.csv", newline="") as f:
        for row in csv.DictReader(f):
            mean, episodes = row.get("mean_return"), int(row.get("episodes") or 0)
            if mean and episodes >= 100 and float(mean) >= threshold:
                return int(row["frames"]), round(offset + float(row["wall_s"]), 2)
    return None, None


def summarize(task: Task, runs: list[dict]) -> dict:
    """One task's row: how many seeds reached, the median and worst time, the scores."""
    times = [r["seconds_to_threshold"] for r in runs if r["reached"]]
    finals = [r["final_score"] for r in runs if r["final_score"] is not None]
    return {
        "env": task.env,
        "threshold": task.threshold,
        "budget_frames": task.frames,
        "budget_minutes": task.minutes,
        "reference": task.reference,
        "reference_score": task.reference_score,
        "tuned_on": task.tuned_on,
        "reached": f"{len(times)}/{len(runs)}",
        "median_seconds_to_threshold": statistics.median(times) if times else None,
        "worst_seconds_to_threshold": max(times) if len(times) == len(runs) else None,
        "frames_to_threshold": [r["frames_to_threshold"] for r in runs],
        "median_final_score": statistics.median(finals) if finals else None,
        "runs": runs,
    }


def table(rows: list[dict]) -> str:
    """The Markdown table of a tier's results."""
    lines = [
        "| task | threshold | budget | reached | median s | worst s | frames to threshold "
        "| final score (median) | reference | tuned on |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        budget = f"{r['budget_minutes']} min" if r["budget_minutes"] else f"{r['budget_frames']:,}"
        frames = ", ".join("-" if f is None else f"{f:,}" for f in r["frames_to_threshold"])
        ref = r["reference"] + (
            "" if r["reference_score"] is None else f": {r['reference_score']:g}"
        )
        times = (
            f"{_num(r['median_seconds_to_threshold'])} | {_num(r['worst_seconds_to_threshold'])}"
        )
        tuned = "yes" if r["tuned_on"] else "no"
        lines.append(
            f"| {r['env']} | {r['threshold']:g} | {budget} | {r['reached']} | {times} "
            f"| {frames} | {_num(r['median_final_score'])} | {ref} | {tuned} |"
        )
    return "\n".join(lines)


def _num(x: float | None) -> str:
    return "-" if x is None else f"{x:g}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--tier", choices=sorted(TIERS), default="classic")
    p.add_argument("--tasks", nargs="+", metavar="ENV", help="only these tasks of the tier")
    p.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    p.add_argument("--frames", type=int, default=None, help="override every task's frame budget")
    p.add_argument("--out", type=Path, default=None, help="also write the JSON here")
    p.add_argument("--table", action="store_true", help="print the Markdown table to stderr")
    p.add_argument("--list", action="store_true", help="print the tiers and their tasks, and exit")
    p.add_argument("extra", nargs="*", help="flags passed to seedbed train (after --)")
    args = p.parse_args()
    if args.list:
        for name, tasks in TIERS.items():
            print(f"{name}: " + ", ".join(f"{t.env} ({t.threshold:g})" for t in tasks))
        return
    tasks = [t for t in TIERS[args.tier] if not args.tasks or t.env in args.tasks]
    unknown = set(args.tasks or ()) - {t.env for t in tasks}
    if unknown:
        p.error(f"not in tier {args.tier}: {', '.join(sorted(unknown))}")
    started = time.time()
    rows = []
    with tempfile.TemporaryDirectory() as tmp:
        for task in tasks:
            runs = []
            for seed in args.seeds:
                run_dir = Path(tmp) / f"{task.env.replace(':', '_').replace('/', '_')}-s{seed}"
                runs.append(run_task(task, seed, args.extra, run_dir, args.frames))
                print(json.dumps(runs[-1]), file=sys.stderr, flush=True)
            rows.append(summarize(task, runs))
    result = {
        "benchmark": "suite",
        "tier": args.tier,
        "machine": machine(),
        "command": "seedbed train --env ENV " + " ".join(args.extra),
        "seeds": args.seeds,
        "frames_override": args.frames,
        "wall_s": round(time.time() - started, 1),
        "all_reached": all(r["reached"].split("/")[0] == r["reached"].split("/")[1] for r in rows),
        "tasks": rows,
    }
    text = json.dumps(result, indent=2)
    print(text)
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(text + "\n")
    if args.table:
        print(table(rows), file=sys.stderr)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    main()
