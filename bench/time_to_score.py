"""Time to score on Atari: wall time from typing the command to each rung of a return ladder.

Runs ``seedbed train --env atari:GAME`` as a user would (a subprocess; the Atari defaults unless
flags follow ``--``) for ``--minutes`` of wall time, stopping it with SIGTERM at the budget (it
stops in order and writes summary.json) unless the 100-episode mean reached the top rung,
or the run its ``--total-frames``, first. From metrics.csv it takes the seconds from the
command's start (the run's own clock plus the gap between the command's start and
``session_started_at``) and the emulator frames at which the 100-episode mean first passed each
rung. A second ladder counts a rung only once 100 episodes have finished on that side, so no
rung is passed by the luck of a system's first few games.

With ``--peer sample-factory`` it then runs Sample Factory 2.1.1's APPO on the same game, after
seedbed and never beside it, with the Atari defaults of its own example
(``sf_examples.atari.train_atari``) and ``--num_workers`` set to this machine's cores, and
stops it with SIGINT at the same budget (SF 2.1.1 never advances the clock that
``--train_for_seconds`` reads, so that flag cannot stop it). Its env is GAMENoFrameskip-v4: no
sticky actions and up to 30 no-op starts, so the side-by-side runs seedbed with
``--sticky-actions 0 --noop-max 30``; ``--protocol sticky`` runs seedbed alone with its
default sticky-action protocol instead. SF's mean is the one it prints every 5 s (seedbed's
rows come every second), so its times may read up to 5 s late. On first use, before either
run, SF goes into a virtualenv of its own (``--peer-venv``): torch 2.13.0 first (the CPU
build this machine's pip finds), then SF and its Atari needs at the versions pinned below,
with the same ale-py (so the same ROM) as seedbed's; the ROM's sha256 is checked on both
sides and printed.

Prints one JSON on stdout: the machine, the ROM, and for each system its command, protocol,
wall budget, frames, final mean return and ladder (seconds from its command's start and
frames per rung, null where not reached), and seedbed's seconds over the peer's at each rung
both reached, on both ladders. ``--out`` gets the figure (return against minutes from each
command's start, rungs as lines), each run's metrics and logs. Progress goes to stderr.

    python bench/time_to_score.py --minutes 60 --peer sample-factory
    python bench/time_to_score.py --minutes 60 --protocol sticky
    python bench/time_to_score.py --game Breakout --peer sample-factory -- --lr 3e-4
    python bench/time_to_score.py --game Seaquest --ladder 200 500 1000 --minutes 30
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
from machine import machine
from results import add_out, emit

from seedbed.telemetry import read_metrics

LADDERS = {  # default rungs per game; others take --ladder
    "Pong": (-20.0, -15.0, -10.0, 0.0, 10.0, 18.0),
    "Breakout": (2.0, 5.0, 10.0, 20.0, 50.0, 100.0),
}
PROTOCOLS = {  # seedbed's flags for each protocol
    "noop30": ("--sticky-actions", "0", "--noop-max", "30"),  # GAMENoFrameskip-v4, as SF's
    "sticky": (),  # seedbed's default: Machado et al. (2018) sticky actions
}
PEER_VERSION = "2.1.1"
PEER_CONSTRAINTS = "torch==2.13.0\n"  # keeps SF's own torch requirement off a CUDA build
PEER_REQUIREMENTS = (
    f"sample-factory=={PEER_VERSION}",
    "gymnasium==0.29.1",  # SF 2.1.1 needs gymnasium<1.0
    "ale-py==0.12.1",  # seedbed's: the same emulator and ROMs
    "numpy==1.26.4",  # SF 2.1.1 needs numpy<2
    "opencv-python==4.11.0.86",  # the last one that takes numpy<2
    "tensorboard==2.21.0",
    "tensorboardX==2.6.5",
    "faster-fifo==1.5.2",
    "signal-slot-mp==1.0.5",
)
# ale-py 0.12 registers its Gymnasium ids only if its vector env imports, which needs
# gymnasium>=1.1; every process of the peer venv (SF's workers too) registers them here.
ALE_PTH = (
    'import gymnasium, ale_py.registration; "PongNoFrameskip-v4" in gymnasium.registry'
    " or ale_py.registration.register_v0_v4_envs()\n"
)
SF_TRUE_SCORE = "policy_stats/avg_RecordEpisodeStatistics_reward"
PRINTED_IS_SCORE = {"Pong"}  # no lives and only +-1 rewards: SF's training reward is the score
STOP_GRACE_S = 180.0  # longest a run may take to stop after its signal
WINDOW = 100  # episodes in each system's mean
FULL_WINDOW = (
    f"ladder_full_window and ratios_full_window count a rung only once {WINDOW} episodes have "
    f"finished, so every mean is over {WINDOW} of them: seedbed's mean_return from the row where "
    f"its episodes reach {WINDOW}, SF's true score (which it writes only from then). The plain "
    "ladder also takes the means of the first few games, which time luck at low rungs"
)
STATISTICS = {
    "seedbed": "mean_return in metrics.csv: mean score of the latest 100 finished episodes "
    "(of all of them before 100 have finished)",
    "printed": "'Avg episode reward' that SF prints every 5 s (taken as the line arrives, with "
    "the 'Total num frames' printed just before it): mean over its latest stats_avg=100 "
    "finished training episodes (all before 100 have finished) of the reward it trains on, "
    "per life (EpisodicLifeEnv) and clipped to its sign (ClipRewardEnv); for Pong, which has "
    "no lives and only +-1 rewards, that is the game score",
    "true_score": f"TensorBoard '{SF_TRUE_SCORE}': mean unclipped score of the latest 100 whole "
    "games (gymnasium's RecordEpisodeStatistics); SF 2.1.1 writes it only once 100 games have "
    "finished, so it starts late",
}


@dataclass
class Curve:
    """A mean-return curve: seconds from the command's start, frames, and the mean at each."""

    seconds: list[float] = field(default_factory=list)
    frames: list[float] = field(default_factory=list)
    returns: list[float] = field(default_factory=list)
    episodes: list[float] | None = None  # episodes finished by each point, where known

    def _keep(self, keep: list[int]) -> Curve:
        def pick(xs: list[float] | None) -> list[float] | None:
            return None if xs is None else [float(xs[i]) for i in keep]

        return Curve(*map(pick, (self.seconds, self.frames, self.returns, self.episodes)))

    def within(self, budget_s: float) -> Curve:
        """The points up to ``budget_s`` seconds, with a mean (nan ones dropped)."""
        return self._keep(
            [
                i
                for i, (s, r) in enumerate(zip(self.seconds, self.returns, strict=True))
                if s <= budget_s and np.isfinite(r)
            ]
        )

    def full_window(self, window: int = WINDOW) -> Curve:
        """The points whose mean is over a whole window of episodes, not the first few."""
        if self.episodes is None:
            raise ValueError("this curve does not know how many episodes each mean is over")
        return self._keep([i for i, n in enumerate(self.episodes) if n >= window])

    def final(self) -> float | None:
        return self.returns[-1] if self.returns else None


def ladder(curve: Curve, rungs: Sequence[float]) -> list[dict]:
    """When and at how many frames the mean first reached each rung (None where it did not).

    Args:
        curve: The curve, in time order.
        rungs: Returns to reach.

    Returns:
        One ``{"rung", "seconds_from_command_start", "frames"}`` per rung, in order.
    """
    out = []
    for rung in rungs:
        hit = next((i for i, r in enumerate(curve.returns) if r >= rung), None)
        out.append(
            {
                "rung": rung,
                "seconds_from_command_start": None if hit is None else round(curve.seconds[hit], 1),
                "frames": None if hit is None else int(curve.frames[hit]),
            }
        )
    return out


def ratios(ours: list[dict], peer: list[dict]) -> list[dict]:
    """seedbed's seconds over the peer's at each rung that both reached."""
    return [
        {
            "rung": a["rung"],
            "seedbed_seconds_over_peer_seconds": round(
                a["seconds_from_command_start"] / b["seconds_from_command_start"], 3
            ),
        }
        for a, b in zip(ours, peer, strict=True)
        if a["seconds_from_command_start"] is not None
        and b["seconds_from_command_start"] is not None
    ]


class SampleFactoryLog:
    """Reads Sample Factory's report lines, as they arrive, into a curve of its printed mean."""

    ANSI = re.compile(r"\x1b\[[0-9;]*m")
    FRAMES = re.compile(r"Total num frames: (\d+)|Collected \{0: (\d+)\}")
    REWARD = re.compile(r"Avg episode reward: \[\(0, '([-+\d.eE]+|nan)'\)\]")

    def __init__(self) -> None:
        self.frames = 0
        self.times: list[float] = []  # unix time each mean arrived
        self.points: list[tuple[float, float]] = []  # (frames, mean) as printed

    def feed(self, t: float, line: str) -> None:
        """Takes one line of output that arrived at unix time ``t``."""
        line = self.ANSI.sub("", line)
        if m := self.FRAMES.search(line):
            self.frames = int(m.group(1) or m.group(2))
        elif m := self.REWARD.search(line):
            self.times.append(t)
            self.points.append((self.frames, float(m.group(1))))

    def curve(self, start: float) -> Curve:
        """The printed means, seconds counted from unix time ``start``."""
        return Curve(
            [t - start for t in self.times],
            [p[0] for p in self.points],
            [p[1] for p in self.points],
        )


@dataclass
class Finished:
    """How a command ended."""

    start: float  # unix time just before it started
    wall_s: float  # from its start to its exit
    returncode: int
    signalled_s: float | None  # when the budget's stop signal went, from its start


def say(text: str) -> None:
    print(f"[time_to_score {time.strftime('%H:%M:%S')}] {text}", file=sys.stderr, flush=True)


def _default_sigint() -> None:
    # A background shell starts us with SIGINT ignored, which children inherit; SF stops at it.
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def run_for(
    name: str,
    command: list[str],
    budget_s: float,
    stop: signal.Signals,
    log: Path,
    status: Callable[[], str],
    on_line: Callable[[float, str], None] | None = None,
) -> Finished:
    """Runs ``command`` (in its own process group, output to ``log``), signals ``stop`` at the
    budget, and kills the group if it has not stopped ``STOP_GRACE_S`` later."""
    start = time.time()
    proc = subprocess.Popen(
        command,
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        bufsize=1,
        env=dict(os.environ, PYTHONUNBUFFERED="1"),
        start_new_session=True,
        preexec_fn=_default_sigint,
    )
    reader = threading.Thread(target=_pump, args=(proc.stdout, log, on_line), daemon=True)
    reader.start()
    tick = min(60.0, max(10.0, budget_s / 12))
    signalled, next_say = None, start + tick
    try:
        while proc.poll() is None:
            time.sleep(0.5)
            now = time.time()
            if signalled is None and now - start >= budget_s:
                say(f"budget spent: {stop.name} to {name}")
                proc.send_signal(stop)
                signalled = now
            elif signalled is not None and now - signalled > STOP_GRACE_S:
                say(f"{name} did not stop in {STOP_GRACE_S:.0f} s: killing it")
                _kill_group(proc.pid)
            if now >= next_say:
                say(f"{_clock(now - start)} of {_clock(budget_s)}: {status()}")
                next_say += tick
    except KeyboardInterrupt:
        say(f"interrupted: {stop.name} to {name}, waiting for it to stop")
        proc.send_signal(stop)
        try:
            proc.wait(STOP_GRACE_S)
        finally:
            _kill_group(proc.pid)
        raise
    wall_s = time.time() - start
    reader.join(10)
    _kill_group(proc.pid)  # workers left behind would hold the pipe open
    reader.join()
    return Finished(
        start, wall_s, proc.returncode, None if signalled is None else signalled - start
    )


def _pump(stream, log: Path, on_line: Callable[[float, str], None] | None) -> None:
    with open(log, "w", encoding="utf-8") as f:
        for line in stream:
            f.write(line)
            if on_line is not None:
                on_line(time.time(), line)


def _kill_group(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError):
        os.killpg(pgid, signal.SIGKILL)


def _clock(seconds: float) -> str:
    return f"{int(seconds // 60)}:{int(seconds % 60):02d}"


def _check(done: Finished, name: str, log: Path) -> None:
    if done.signalled_s is None and done.returncode != 0:
        tail = "".join(log.read_text(encoding="utf-8", errors="replace").splitlines(True)[-20:])
        raise SystemExit(f"{name} exited with {done.returncode} (log: {log}):\n{tail}")


def run_seedbed(game: str, args: argparse.Namespace, rungs: Sequence[float], tmp: Path) -> dict:
    """Trains with ``seedbed train`` for the budget; its result and its curve."""
    run, out, budget_s = tmp / "seedbed", Path(args.out), args.minutes * 60
    flags = PROTOCOLS[args.protocol]
    command = [
        *("seedbed", "train", "--env", f"atari:{game}", "--run-dir", str(run)),
        *("--seed", str(args.seed), "--target-return", str(max(rungs))),
        "--no-progress",  # the defaults' --total-frames: their rate schedule ends there
        *flags,
        *args.train_flags,
    ]

    def status() -> str:
        try:
            m = read_metrics(run)
        except FileNotFoundError:
            return "starting"
        if not len(m.get("frames", [])):
            return "starting"
        return f"{m['frames'][-1]:,.0f} frames, mean return {m['mean_return'][-1]:.2f}"

    say(f"seedbed: {' '.join(command)}")
    log = out / "seedbed.log"
    done = run_for(
        "seedbed", [sys.executable, "-m", *command], budget_s, signal.SIGTERM, log, status
    )
    _check(done, "seedbed", log)
    summary = json.loads((run / "summary.json").read_text())
    metrics = read_metrics(run)
    offset = summary["session_started_at"] - done.start
    curve = Curve(
        list(metrics["wall_s"] + offset),
        list(metrics["frames"]),
        list(metrics["mean_return"]),
        list(metrics["episodes"]),
    ).within(budget_s)
    for name in ("metrics.csv", "summary.json", "curve.png"):
        if (run / name).exists():
            shutil.copy(run / name, out / f"seedbed-{name}")
    return {
        "system": "seedbed",
        "command": " ".join(command),
        "protocol": {
            "name": args.protocol,
            "flags": list(flags),
            "env_protocol": summary["env_protocol"],
        },
        "wall_budget_s": budget_s,
        "command_s": round(done.wall_s, 1),
        "stop": "wall budget (SIGTERM)" if done.signalled_s is not None else summary["stop_reason"],
        "frames": summary["frames"],
        "frames_counted_as": summary["frames_counted_as"],
        "mean_fps": summary["mean_fps"],
        "episodes": summary["episodes"],
        "final_mean_return_100": summary["mean_return_100"],
        "statistic": STATISTICS["seedbed"],
        "ladder": ladder(curve, rungs),
        "ladder_full_window": ladder(curve.full_window(), rungs),
        "_curves": {"seedbed": curve},
    }


def ensure_peer(venv: Path, out: Path) -> Path:
    """The peer venv's python, after creating it and installing Sample Factory if needed."""
    python, stamp = venv / "bin" / "python", venv / "seedbed-bench-requirements.txt"
    wanted = PEER_CONSTRAINTS + "\n".join(PEER_REQUIREMENTS) + "\n"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return python
    say(f"installing Sample Factory {PEER_VERSION} into {venv} (first use)")
    if not python.exists():
        subprocess.run([sys.executable, "-m", "venv", str(venv)], check=True)
    constraints = venv / "seedbed-bench-constraints.txt"
    constraints.write_text(PEER_CONSTRAINTS)
    pip = [str(python), "-m", "pip", "install", "-c", str(constraints)]
    with open(out / "peer-install.log", "w", encoding="utf-8") as log:
        for step in ([PEER_CONSTRAINTS.strip()], list(PEER_REQUIREMENTS)):
            say(f"pip install {' '.join(step)}")
            subprocess.run([*pip, *step], check=True, stdout=log, stderr=subprocess.STDOUT)
    site = subprocess.run(
        [str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
        check=True,
        capture_output=True,
        text=True,
    ).stdout.strip()
    (Path(site) / "seedbed_bench_ale_envs.pth").write_text(ALE_PTH)
    stamp.write_text(wanted)
    return python


def rom_path(python: str | Path, rom: str) -> Path:
    """Where the ale-py that ``python`` imports keeps ROM ``rom`` (the file may be absent).

    Found without ``ale_py.roms.get_rom_path``, which raises on a missing or unexpected file.
    """
    code = "import ale_py.roms as r, pathlib; print(pathlib.Path(r.__file__).parent)"
    folder = subprocess.run(
        [str(python), "-c", code], check=True, capture_output=True, text=True
    ).stdout.split()[-1]
    return Path(folder) / f"{rom}.bin"


def same_rom(game: str, peer_python: Path) -> dict:
    """Makes the peer's ROM for ``game`` the very file seedbed's ale-py ships; their sha256."""
    import hashlib

    rom = re.sub(r"(?<!^)(?=[A-Z])", "_", game).lower()  # SpaceInvaders -> space_invaders

    def sha(path: Path) -> str | None:
        return hashlib.sha256(path.read_bytes()).hexdigest() if path.is_file() else None

    ours, theirs = rom_path(sys.executable, rom), rom_path(peer_python, rom)
    if sha(ours) is None:
        raise SystemExit(f"seedbed's ale-py has no ROM {ours}")
    found = sha(theirs)
    if found != sha(ours):
        shutil.copyfile(ours, theirs)
        say(f"copied seedbed's ROM {ours} over the peer's {theirs} (sha256 {found})")
    return {
        "rom": rom,
        "seedbed_file": str(ours),
        "sha256": sha(ours),
        "peer_file": str(theirs),
        "peer_sha256_found": found,
        "peer_sha256": sha(theirs),
        "copied": found != sha(ours),
    }


def run_peer(
    game: str, args: argparse.Namespace, rungs: Sequence[float], python: Path, tmp: Path
) -> dict:
    """Trains Sample Factory's APPO (``python``'s) on the same game for the budget; its result
    and curves."""
    out, budget_s = Path(args.out), args.minutes * 60
    experiment, train_dir = f"{game.lower()}-time-to-score", tmp / "sample-factory"
    command = [
        *(str(python), "-m", "sf_examples.atari.train_atari", f"--env=atari_{game.lower()}"),
        *("--experiment", experiment, "--train_dir", str(train_dir)),
        *("--num_workers", str(os.cpu_count()), "--device", "cpu", "--seed", str(args.seed)),
        *("--with_wandb", "False", *shlex.split(args.peer_flags)),
    ]
    printed = SampleFactoryLog()

    def status() -> str:
        last = f"printed mean {printed.points[-1][1]:.2f}" if printed.points else "no episode yet"
        return f"{printed.frames:,} frames, {last}"

    say(f"sample-factory: {' '.join(command)}")
    log = out / "sample-factory.log"
    done = run_for("sample-factory", command, budget_s, signal.SIGINT, log, status, printed.feed)
    _check(done, "sample-factory", log)
    summaries = train_dir / experiment / ".summary" / "0"
    true_score = tensorboard_curve(summaries, SF_TRUE_SCORE, done.start).within(budget_s)
    curve = printed.curve(done.start).within(budget_s)
    if summaries.is_dir():
        shutil.copytree(summaries, out / "sample-factory-summary", dirs_exist_ok=True)
    stats = {"printed": curve, "true_score": true_score}
    main, other = ("printed", "true_score")[:: 1 if game in PRINTED_IS_SCORE else -1]
    return {
        "system": f"sample-factory {PEER_VERSION} APPO (sf_examples.atari defaults)",
        "command": " ".join(command),
        "protocol": {
            "name": "noop30",
            "env": f"{game}NoFrameskip-v4 (ale-py 0.12.1): repeat_action_probability 0, up to 30 "
            "no-op starts, frame skip 4 with max-pool, 108000-frame episodes; trains on "
            "EpisodicLifeEnv + FireResetEnv + ClipRewardEnv",
        },
        "wall_budget_s": budget_s,
        "command_s": round(done.wall_s, 1),
        "stop": "wall budget (SIGINT)" if done.signalled_s is not None else "its own end",
        "frames": printed.frames,
        "frames_counted_as": "emulator frames trained on (agent steps x frame skip 4)",
        "final_mean_return_100": stats[main].final(),
        "statistic": STATISTICS[main],
        "ladder": ladder(stats[main], rungs),
        "other_statistic": STATISTICS[other],
        "other_final_mean_return_100": stats[other].final(),
        "other_ladder": ladder(stats[other], rungs),
        "ladder_full_window": ladder(true_score, rungs),
        "_curves": {"sample-factory (printed)": curve, "sample-factory (true score)": true_score},
    }


def tensorboard_curve(folder: Path, tag: str, start: float) -> Curve:
    """One TensorBoard scalar as a curve, seconds from ``start`` (empty if never written)."""
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    if not folder.is_dir():
        return Curve()
    events = EventAccumulator(str(folder), size_guidance={"scalars": 0})
    events.Reload()
    if tag not in events.Tags()["scalars"]:
        return Curve()
    rows = events.Scalars(tag)
    return Curve(
        [e.wall_time - start for e in rows], [e.step for e in rows], [e.value for e in rows]
    )


def plot(
    curves: dict[str, Curve], rungs: Sequence[float], budget_s: float, title: str, path: Path
) -> None:
    """Return against minutes from each command's start, rungs as horizontal lines."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(9, 5))
    for label, c in curves.items():
        if c.returns:
            ax.plot(np.asarray(c.seconds) / 60, c.returns, label=label, drawstyle="steps-post")
    for rung in rungs:
        ax.axhline(rung, color="grey", linestyle=":", linewidth=0.8)
    ax.set_xlim(0, budget_s / 60)
    ax.set_xlabel("minutes from the command's start")
    ax.set_ylabel("mean return (latest 100 episodes)")
    ax.set_title(f"Time to score: {title}, {os.cpu_count()} cores")
    ax.legend(loc="upper left")
    fig.tight_layout()
    fig.savefig(path, dpi=120)
    plt.close(fig)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--game", default="Pong", help="Atari game, as in atari:GAME")
    p.add_argument("--minutes", type=float, default=60.0, help="wall budget of each run")
    p.add_argument("--ladder", type=float, nargs="+", help="returns to time (default: per game)")
    p.add_argument(
        "--protocol",
        choices=sorted(PROTOCOLS),
        default="noop30",
        help=(
            "noop30: no sticky actions, up to 30 no-op starts (as SF's NoFrameskip-v4); "
            "sticky: seedbed's default sticky actions (seedbed alone)"
        ),
    )
    p.add_argument("--peer", choices=["sample-factory"], help="also run this, after seedbed")
    p.add_argument(
        "--peer-venv",
        default="~/.cache/seedbed-bench/sf-venv",
        help="the peer's virtualenv (made on first use)",
    )
    p.add_argument("--peer-flags", default="", help="more flags for the peer (one string)")
    p.add_argument("--seed", type=int, default=0, help="seed for both")
    p.add_argument("--out", default="runs/time-to-score", help="where the figure and logs go")
    add_out(p, "--json")
    p.add_argument("train_flags", nargs="*", help="flags for seedbed train, after --")
    args = p.parse_args()
    rungs = args.ladder or LADDERS.get(args.game)
    if rungs is None:
        p.error(f"no default ladder for {args.game}: give --ladder")
    if args.peer and args.protocol == "sticky":
        p.error(
            "--protocol sticky runs seedbed alone: the peer's NoFrameskip-v4 has no sticky actions"
        )
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    rungs = sorted(rungs)

    peer_python, rom = None, None
    if args.peer:  # installed and checked first: a failure here costs no run
        peer_python = ensure_peer(Path(args.peer_venv).expanduser(), out)
        rom = same_rom(args.game, peer_python)
    with tempfile.TemporaryDirectory() as tmp:
        say(f"phase 1: seedbed on {args.game} for {args.minutes:g} min ({args.protocol})")
        systems = [run_seedbed(args.game, args, rungs, Path(tmp))]
        if peer_python is not None:
            say(f"phase 2: Sample Factory on {args.game} for {args.minutes:g} min")
            systems.append(run_peer(args.game, args, rungs, peer_python, Path(tmp)))
    curves = {k: v for s in systems for k, v in s.pop("_curves").items()}
    figure = out / "time-to-score.png"
    plot(curves, rungs, args.minutes * 60, f"{args.game}, {args.protocol}", figure)
    for label, c in curves.items():
        slug = re.sub(r"[^a-z0-9]+", "-", label.lower()).strip("-")
        rows = zip(c.seconds, c.frames, c.returns, strict=True)
        (out / f"{slug}-curve.csv").write_text(
            "seconds_from_command_start,frames,mean_return\n"
            + "".join(f"{s:.2f},{f:.0f},{r:.4f}\n" for s, f, r in rows)
        )
    result = {
        "benchmark": "time_to_score",
        "machine": machine(),
        "game": args.game,
        "wall_budget_s": args.minutes * 60,
        "rungs": rungs,
        "rom": rom,
        "systems": systems,
        "ratios": ratios(systems[0]["ladder"], systems[1]["ladder"]) if args.peer else None,
        "ratios_full_window": (
            ratios(systems[0]["ladder_full_window"], systems[1]["ladder_full_window"])
            if args.peer
            else None
        ),
        "full_window": FULL_WINDOW,
        "figure": str(figure),
        "out": str(out),
    }
    emit(result, args.json)


if __name__ == "__main__":
    main()
