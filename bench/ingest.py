"""Ingest: what one remote actor's step costs the learner's host, with N simulated remote actors.

A real learner (``seedbed train --listen 127.0.0.1:0 --actors 0 --remote-actors N --gateways
K``: the gRPC gateway, in the learner's process with K = 1 or in K processes, central
inference, unroll building and a learner taking batches) serves N simulated
remote actors: one or two processes (``--sim-processes``) holding N streams, each a
``GrpcActorClient`` as ``seedbed actor --connect`` has (the token, the hello, the assignment),
sending pre-built steps of the assigned shape and waiting for each step's actions, as actors do.
Nothing steps an environment: the actors' CPU is theirs and is not counted.

For each size (``--sizes``), E (``--envs-per-actor``, by default the size's own list), wire
(``--wires``: ``grpc``, ``socket``), K (``--gateways-list``) and N (``--actors-list``) it
prints, as one JSON on stdout (a line per point), over a window of ``--seconds`` after
``--warmup-s``:

- ``size``, ``envs``, ``actors``, ``gateways``, ``wire``;
- ``steps_per_s`` (a step is one actor's message: one step of its E envs) and ``frames_per_s``
  (E x steps; frames are env steps here, no frame skip);
- ``us_per_frame``: the CPU of the learner's host per frame: the learner process and every
  process under it (gateway processes, an update process, multiprocessing's helpers), user and
  system time from ``/proc``, the simulated actors (the bench's own processes) left out;
  ``host_cpu_us_per_step`` and ``host_cpu_cores`` the same per step and in cores, and
  ``host_cpu_share`` how it splits (``learner``, ``gateways``, ``other``);
- ``learning_us_per_frame``: the part of it the learner loop's thread took (learning from the
  unrolls, on the CPU here; on a GPU learner the device's), and ``ingest_us_per_frame`` the rest:
  what taking the steps in and answering them costs the host;
- ``lost``: 0 when nothing was lost (the accounting below), else how many frames were;
- ``bytes_per_step`` and ``bytes_per_reply``: the protobuf messages with gRPC's 5-byte prefix
  (HTTP/2 and TCP framing not counted; the socket wire's prefix is 4 bytes);
- the learner process's own CPU (all its threads) per step and per frame, and the share of it
  its main thread (the learner loop) took; the rest (``ingest_cpu_us_per_step``) is the
  in-process gateway, gRPC and the inference thread (acting and unroll building);
- the round trip of a step as a simulated actor sees it (``latency_ms``: p50, p90, p99), which
  includes that actor's own process sharing the interpreter among its N / P streams;
- ``accounting``: whether anything was lost (below);
- ``actor_machines_per_learner_core``: how many actor machines of E envs one learner core could
  serve at this point's CPU per step. A machine is one actor process stepping its E envs and
  then waiting for their actions, as seedbed's actor does: it sends one step per
  E / ``actor_steps_per_s`` seconds of stepping (the raw rate of one core, from
  docs/benchmarks.md: CartPole 126,550 env steps/s at 32 envs, Atari 2,982 agent steps/s at 8
  envs with EnvPool) plus one round trip without load (``round_trip_alone_ms``: the median of
  one actor stepping alone for ``--probe-s`` before the others start). Machines =
  (1e6 / host us per step) x (E / actor_steps_per_s + round trip alone). ``estimates`` gives
  it for each size, E and K at its largest N, with its inputs; stderr says it in words.

Sizes: ``cartpole`` (CartPole-v1's spec: 4 float32), ``atari`` (uint8 4x84x84, the 4 stacked
frames seedbed's Atari sends) and ``atari1`` (uint8 1x84x84: the bytes ``--frame-stack-on
learner`` sends; the learner here keeps no stacks, so this measures the wire and ingest, not
the stack table). The Atari sizes are ``bench/ingest_envs.py``'s ids: the learner reads only
the spec.
The learner is V-trace on the smallest MLP seedbed builds (``--hidden-sizes 1``: one unit, some
28k multiply-adds per Atari frame, which a real learner would spend on its accelerator) with one
torso for policy and value, as seedbed's Atari presets have (``--shared-torso``), one torch
thread for inference and one for learning; flags after ``--`` go to ``seedbed train``.

Accounting ("nothing lost"). Each stream counts the steps it sent and the actions it got. When
the window closes, each actor stops at the end of its envs' current unrolls (its step count
``s`` with ``(s - 1) % T == 0``); the learner is stopped (SIGINT: its summary.json) once it
has been idle for a moment. Then, with E envs per actor, T steps per unroll, B unrolls a batch:

- every step was answered: steps sent == steps answered;
- the learner counted every frame: its ``frames`` == E x (steps answered - streams), since a
  stream's first step only starts its envs' episodes (seedbed counts no frame for it);
- every unroll was delivered: a stream with ``s`` steps completes E x floor((s - 1) / T)
  unrolls (consecutive unrolls share a step); the learner must have learned from all of them
  but the fewer than B that wait for a full batch: learner steps x B == B x floor(built / B).
  With the stops above there are no unfinished unrolls, and B divides E (the default B is the
  largest divisor of E up to 32), so built is a whole number of batches: the learner's frames
  == learner steps x B x T exactly, and a single lost unroll shows.

    python bench/ingest.py                    # every size, N = 8, 32, 128, 256, K = 1 and 4
    python bench/ingest.py --sizes atari1 --actors-list 256 --gateways-list 1,8
    python bench/ingest.py --sizes cartpole --actors-list 4 --seconds 3
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import multiprocessing
import os
import queue
import secrets
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

import numpy as np
from ingest_actors import ABORT, FINISH, MEASURE, PROBE, RUN, Shared, simulate, split
from ingest_envs import NEWEST_ID, STACKED_ID
from machine import machine
from results import add_out, emit

BENCH = Path(__file__).resolve().parent
CLOCK_TICKS = os.sysconf("SC_CLK_TCK")


@dataclasses.dataclass(frozen=True)
class Size:
    """What the actors send: the learner's env id gives the observation's shape and dtype."""

    env: str
    envs_per_actor: tuple[int, ...]  # seedbed's default for that env family first
    actor_steps_per_s: float  # one actor core's raw env steps/s at the first (benchmarks.md)
    what: str


SIZES = {
    "cartpole": Size("CartPole-v1", (32,), 126_550, "float32 [4]"),
    "atari": Size(f"ingest_envs:{STACKED_ID}", (8,), 2_982, "uint8 [4, 84, 84], 4 stacked frames"),
    "atari1": Size(
        f"ingest_envs:{NEWEST_ID}", (8, 32), 2_982, "uint8 [1, 84, 84], --frame-stack 1"
    ),
}


@dataclasses.dataclass(frozen=True)
class Point:
    """One measurement: a size, N actors of E envs, K gateways, the learner's T and B."""

    name: str
    size: Size
    actors: int
    envs: int
    unroll: int
    batch: int
    gateways: int = 1
    wire: str = "grpc"


# --- the learner (a `seedbed train` process) --------------------------------------------------


def _stat_fields(stat: str) -> list[str]:
    """A ``/proc/.../stat`` file's fields after the command name (which may hold spaces)."""
    with open(stat) as f:
        text = f.read()
    return text[text.rindex(")") + 2 :].split()


def _cpu_s(stat: str) -> float:
    """User + system CPU seconds from a ``/proc/.../stat`` file."""
    fields = _stat_fields(stat)
    return (int(fields[11]) + int(fields[12])) / CLOCK_TICKS


def descendants(pid: int) -> list[int]:
    """Every live process under ``pid``, from ``/proc``'s parent ids."""
    children: dict[int, list[int]] = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                parent = int(_stat_fields(f"/proc/{name}/stat")[1])
            except (OSError, ValueError, IndexError):
                continue  # ended meanwhile
            children.setdefault(parent, []).append(int(name))
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _part(pid: int, learner: int) -> str:
    """Which part of the learner's host ``pid`` is: its gateway processes name themselves."""
    if pid == learner:
        return "learner"
    try:
        with open(f"/proc/{pid}/comm") as f:
            name = f.read().strip()
    except OSError:
        return "other"
    return "gateways" if name.startswith("seedbed-gw") else "other"  # gateway_process's name


class Learner:
    """A ``seedbed train`` process serving remote actors only; its log goes to a file."""

    def __init__(self, flags: list[str], run_dir: Path) -> None:
        self.run_dir = run_dir
        self.log_path = run_dir.parent / "learner.log"
        path = os.pathsep.join(p for p in (str(BENCH), os.environ.get("PYTHONPATH")) if p)
        with open(self.log_path, "w") as log:
            self.proc = subprocess.Popen(
                [sys.executable, "-m", "seedbed", "train", *flags, "--run-dir", str(run_dir)],
                stdout=log,
                stderr=subprocess.STDOUT,
                env={**os.environ, "PYTHONPATH": path},
            )

    def address(self, timeout_s: float = 120.0) -> str:
        """Where it listens, once it does."""
        path, deadline = self.run_dir / "listen_address", time.monotonic() + timeout_s
        while not path.is_file():
            self.check_alive()
            if time.monotonic() > deadline:
                raise SystemExit(f"the learner did not listen within {timeout_s:.0f} s")
            time.sleep(0.05)
        return path.read_text().strip()

    def check_alive(self) -> None:
        if self.proc.poll() is not None:
            raise SystemExit(f"the learner stopped (exit {self.proc.returncode}):\n{self.tail()}")

    def cpu(self) -> tuple[float, float]:
        """CPU seconds so far: the whole process's (every thread), and its main thread's."""
        pid = self.proc.pid
        return _cpu_s(f"/proc/{pid}/stat"), _cpu_s(f"/proc/{pid}/task/{pid}/stat")

    def host_cpu(self) -> dict[str, float]:
        """CPU seconds so far of the learner and every process under it, by part (``_part``);
        the simulated actors are the bench's children, not the learner's."""
        seconds = {"learner": 0.0, "gateways": 0.0, "other": 0.0}
        for pid in [self.proc.pid, *descendants(self.proc.pid)]:
            try:
                seconds[_part(pid, self.proc.pid)] += _cpu_s(f"/proc/{pid}/stat")
            except OSError:
                continue  # ended meanwhile
        return seconds

    def runnable_threads(self) -> int:
        """How many of its threads run or wait for a core now (state R)."""
        tasks, count = f"/proc/{self.proc.pid}/task", 0
        for tid in os.listdir(tasks):
            try:
                with open(f"{tasks}/{tid}/stat") as f:
                    text = f.read()
            except OSError:  # the thread ended meanwhile
                continue
            count += text[text.rindex(")") + 2] == "R"
        return count

    def wait_idle(self, min_s: float = 0.5, max_s: float = 60.0) -> None:
        """Wait until it has learned what it can: for 0.75 s, under 5 % of a core and no thread
        waiting for one (a learner starved of CPU by other work is not idle)."""
        start = last_t = time.monotonic()
        last_cpu, quiet = self.cpu()[0], 0
        while time.monotonic() - start < max_s:
            time.sleep(0.25)
            self.check_alive()
            now, cpu = time.monotonic(), self.cpu()[0]
            idle = (cpu - last_cpu) / (now - last_t) < 0.05 and not self.runnable_threads()
            quiet = quiet + 1 if idle else 0
            last_t, last_cpu = now, cpu
            if quiet >= 3 and now - start >= min_s:
                return

    def stop(self, timeout_s: float = 120.0) -> dict:
        """Stop it as Ctrl-C does and return its summary."""
        self.proc.send_signal(signal.SIGINT)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            raise SystemExit(f"the learner did not stop within {timeout_s:.0f} s") from None
        try:
            return json.loads((self.run_dir / "summary.json").read_text())
        except OSError:
            raise SystemExit(f"the learner wrote no summary:\n{self.tail()}") from None

    def kill(self) -> None:
        if self.proc.poll() is None:
            self.proc.kill()
            self.proc.wait()

    def tail(self, chars: int = 3000) -> str:
        return self.log_path.read_text()[-chars:]


def learner_flags(point: Point, args: Any, tmp: Path) -> list[str]:
    """``seedbed train`` flags for one point: remote actors only, a tiny network, no stop rule
    but the bench's SIGINT."""
    return [
        *("--env", point.size.env, "--agent", "vtrace", "--hidden-sizes", args.hidden_sizes),
        "--shared-torso",
        *("--actors", "0", "--listen", "127.0.0.1:0", "--remote-actors", str(point.actors)),
        *("--gateways", str(point.gateways), "--wire", point.wire),
        *("--token-file", str(tmp / "token"), "--envs-per-actor", str(point.envs)),
        *("--unroll", str(point.unroll), "--batch", str(point.batch)),
        *("--threads", "1", "--learner-threads", "1"),
        *("--target-return", "none", "--total-frames", str(10**15)),
        *("--checkpoint-every-s", "1e9", "--log-every-s", "1", "--no-progress", "--no-energy"),
        *args.train_flags,
    ]


# --- one point: a learner, N actors, a window ------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Snapshot:
    """The clock, the learner's CPU and the actors' answered steps at one moment."""

    t: float
    cpu_s: float
    main_thread_s: float
    answered: int
    host_s: dict[str, float]  # ``Learner.host_cpu``

    @classmethod
    def take(cls, learner: Learner, shared: Shared) -> Snapshot:
        # The learner's share comes from the same reading as the host's, so it never exceeds it.
        host = learner.host_cpu()
        main = learner.cpu()[1]
        return cls(time.perf_counter(), host["learner"], main, sum(shared.answered), host)


def largest_divisor(n: int, at_most: int) -> int:
    return max(d for d in range(1, min(n, at_most) + 1) if n % d == 0)


def _wait_connected(shared: Shared, sims: list, learner: Learner, timeout_s: float) -> None:
    deadline = time.monotonic() + timeout_s
    while sum(shared.connected) < len(shared.connected):
        learner.check_alive()
        if not all(p.is_alive() for p in sims) or time.monotonic() > deadline:
            raise SystemExit(f"only {sum(shared.connected)} of {len(shared.connected)} connected")
        time.sleep(0.05)


def _collect(results: Any, sims: list, shared: Shared, timeout_s: float) -> list[dict]:
    """The simulated processes' reports; after ``timeout_s`` the rest are told to abort."""
    outs, deadline = [], time.monotonic() + timeout_s
    while len(outs) < len(sims) and time.monotonic() < deadline:
        try:
            outs.append(results.get(timeout=0.5))
        except queue.Empty:
            continue
    if len(outs) < len(sims):
        shared.phase.value = ABORT  # a stream waits for an answer that never comes
        print("simulated actors still waiting for answers: aborting them", file=sys.stderr)
    for p in sims:
        p.join(5)
        if p.is_alive():
            p.kill()
    return outs


def run_point(point: Point, args: Any) -> dict:
    """Measure one point: a fresh learner, N simulated actors, one window."""
    ctx = multiprocessing.get_context("spawn")
    with tempfile.TemporaryDirectory(prefix="ingest-") as tmp:
        token = secrets.token_hex(16)
        (Path(tmp) / "token").write_text(token + "\n")
        learner = Learner(learner_flags(point, args, Path(tmp)), Path(tmp, "run"))
        shared, sims = Shared.make(ctx, point.actors), []
        try:
            address, results = learner.address(), ctx.Queue()
            for part in split(point.actors, args.sim_processes):
                sim_args = (address, token.encode(), part, point.unroll, shared, results)
                sim_args += (point.wire,)
                sims.append(ctx.Process(target=simulate, args=sim_args, daemon=True))
                sims[-1].start()
            _wait_connected(shared, sims, learner, timeout_s=120.0)
            shared.phase.value = PROBE  # one actor alone: the round trip without load
            time.sleep(args.probe_s)
            shared.phase.value = RUN
            time.sleep(args.warmup_s)
            before = Snapshot.take(learner, shared)
            shared.phase.value = MEASURE
            time.sleep(args.seconds)
            after = Snapshot.take(learner, shared)
            shared.phase.value = FINISH
            outs = _collect(results, sims, shared, timeout_s=120.0)
            learner.wait_idle()
            summary = learner.stop()
        finally:
            shared.phase.value = ABORT
            for p in sims:
                if p.is_alive():
                    p.kill()
            learner.kill()
    books = account(
        list(shared.sent), list(shared.answered), point.envs, point.unroll, point.batch, summary
    )
    books["errors"] = [e for out in outs for e in out["errors"]][:5]
    books["every_actor_reported"] = len(outs) == len(sims)
    books["nothing_lost"] &= books["every_actor_reported"] and not books["errors"]
    if not books["nothing_lost"]:  # an actor that never reported lost what it did not say
        books["frames_lost"] = max(books["frames_lost"], 1)
    return row(point, before, after, outs, books)


def account(
    sent: list[int], answered: list[int], envs: int, unroll: int, batch: int, summary: dict
) -> dict:
    """Whether every step was answered and every unroll delivered (the module's docstring)."""
    streams = sum(1 for a in answered if a > 0)
    built = envs * sum((a - 1) // unroll for a in answered if a > 0)
    unfinished = envs * sum((a - 1) % unroll for a in answered if a > 0)
    waiting = built % batch  # complete unrolls short of a batch: the learner takes whole ones
    books = {
        "steps_sent": sum(sent),
        "steps_answered": sum(answered),
        "frames_sent": envs * sum(sent),
        "frames_counted_by_learner": summary["frames"],
        "frames_expected": envs * (sum(answered) - streams),
        "unrolls_built": built,
        "unrolls_learned": summary["learner_steps"] * batch,
        "unrolls_waiting_for_a_batch": waiting,
        "frames_in_unfinished_unrolls": unfinished,
        "frames_learned": summary["learner_steps"] * batch * unroll,
        "streams": streams,
        "connections": (summary.get("remote_actors") or {}).get("connections"),
        "refused": (summary.get("remote_actors") or {}).get("refused"),
    }
    books["nothing_lost"] = (
        books["steps_sent"] == books["steps_answered"]
        and books["frames_counted_by_learner"] == books["frames_expected"]
        and books["unrolls_learned"] == built - waiting
    )
    books["frames_lost"] = (
        envs * abs(books["steps_sent"] - books["steps_answered"])
        + abs(books["frames_expected"] - books["frames_counted_by_learner"])
        + unroll * abs(books["unrolls_learned"] - (built - waiting))
    )
    return books


def percentiles_ms(latencies: np.ndarray) -> dict:
    """p50, p90 and p99 of round trips in seconds, in milliseconds."""
    if not len(latencies):
        return {"p50": None, "p90": None, "p99": None, "samples": 0}
    p50, p90, p99 = (round(float(x), 2) for x in np.percentile(latencies, [50, 90, 99]) * 1e3)
    return {"p50": p50, "p90": p90, "p99": p99, "samples": len(latencies)}


def row(point: Point, before: Snapshot, after: Snapshot, outs: list[dict], books: dict) -> dict:
    """One point's line of the report."""
    seconds = after.t - before.t
    steps = max(after.answered - before.answered, 1)
    cpu = after.cpu_s - before.cpu_s
    loop_s = after.main_thread_s - before.main_thread_s
    wire = next((out["wire"] for out in outs if out.get("wire")), None) or {}
    latencies = np.concatenate([out["latencies"] for out in outs] or [np.zeros(0)])
    alone = np.concatenate([out["alone"] for out in outs] or [np.zeros(0)])
    us_per_step = 1e6 * cpu / steps
    host = {k: max(0.0, after.host_s[k] - before.host_s.get(k, 0.0)) for k in after.host_s}
    host_cpu = sum(host.values())
    host_us_per_step = 1e6 * host_cpu / steps
    learning_us_per_step = 1e6 * loop_s / steps
    alone_ms = round(float(np.median(alone)) * 1e3, 2) if len(alone) else None
    return {
        "size": point.name,
        "envs": point.envs,
        "actors": point.actors,
        "gateways": point.gateways,
        "wire": point.wire,
        "steps_per_s": round(steps / seconds, 1),
        "frames_per_s": round(steps * point.envs / seconds),
        "us_per_frame": round(host_us_per_step / point.envs, 2),
        "learning_us_per_frame": round(learning_us_per_step / point.envs, 2),
        "ingest_us_per_frame": round((host_us_per_step - learning_us_per_step) / point.envs, 2),
        "lost": books["frames_lost"],
        "host_cpu_us_per_step": round(host_us_per_step, 1),
        "host_cpu_cores": round(host_cpu / seconds, 3),
        "host_cpu_share": {
            k: round(v / host_cpu, 3) if host_cpu else None for k, v in host.items()
        },
        "envs_per_actor": point.envs,
        "obs": wire.get("obs"),
        "batch": point.batch,
        "seconds": round(seconds, 2),
        "bytes_per_step": wire.get("request"),
        "bytes_per_reply": wire.get("reply"),
        "learner_cpu_cores": round(cpu / seconds, 3),
        "learner_cpu_us_per_step": round(us_per_step, 1),
        "learner_cpu_us_per_frame": round(us_per_step / point.envs, 2),
        "learner_loop_thread_share": round(loop_s / cpu, 3) if cpu else None,
        "ingest_cpu_us_per_step": round(1e6 * (cpu - loop_s) / steps, 1),
        "latency_ms": percentiles_ms(latencies),
        "round_trip_alone_ms": alone_ms,
        "actor_machines_per_learner_core": machines_per_core(point, host_us_per_step, alone_ms),
        "accounting": books,
    }


def machines_per_core(
    point: Point, us_per_step: float, round_trip_ms: float | None
) -> float | None:
    """Actor machines of E envs one learner core serves at ``us_per_step``: each sends a step
    per E / ``actor_steps_per_s`` seconds of stepping plus a round trip."""
    if not us_per_step or round_trip_ms is None:
        return None
    stepping_s = point.envs / point.size.actor_steps_per_s
    return round(1e6 / us_per_step * (stepping_s + round_trip_ms / 1e3), 1)


def estimates(points: list[dict]) -> list[dict]:
    """For each size, E, K and wire, the estimate at its largest N, with what it assumed (CPU
    of the learner's whole host)."""

    def key(p: dict) -> tuple:
        return p["size"], p["envs"], p["gateways"], p["wire"]

    out = []
    for group in dict.fromkeys(key(p) for p in points):
        name, envs, gateways, wire = group
        same = [p for p in points if key(p) == group]
        p, size = max(same, key=lambda p: p["actors"]), SIZES[name]
        out.append(
            {
                "wire": wire,
                "size": name,
                "at_actors": p["actors"],
                "envs_per_actor": envs,
                "gateways": gateways,
                "host_cpu_us_per_step": p["host_cpu_us_per_step"],
                "steps_per_s_per_learner_core": round(1e6 / max(p["host_cpu_us_per_step"], 1e-3)),
                "frames_per_s_per_learner_core": round(1e6 / max(p["us_per_frame"], 1e-3)),
                "actor_steps_per_s_assumed": size.actor_steps_per_s,
                "actor_stepping_ms": round(1e3 * envs / size.actor_steps_per_s, 3),
                "round_trip_alone_ms": p["round_trip_alone_ms"],
                "actor_machines_per_learner_core": p["actor_machines_per_learner_core"],
            }
        )
    return out


def render(report: dict) -> str:
    """The report as JSON, one line per key, and one per point or estimate."""
    parts = []
    for key, value in report.items():
        if isinstance(value, list) and value:
            items = ",\n".join(f"    {json.dumps(v)}" for v in value)
            value_text = f"[\n{items}\n  ]"
        else:
            value_text = json.dumps(value)
        parts.append(f"  {json.dumps(key)}: {value_text}")
    return "{\n" + ",\n".join(parts) + "\n}"


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--actors-list", default="8,32,128,256", help="N: simulated remote actors")
    p.add_argument("--sizes", default="cartpole,atari,atari1", help=", ".join(SIZES))
    p.add_argument("--seconds", type=float, default=10.0, help="measured window per point")
    p.add_argument("--probe-s", type=float, default=1.0, help="one actor alone, first")
    p.add_argument("--warmup-s", type=float, default=2.0, help="all actors, before the window")
    p.add_argument("--envs-per-actor", default=None, help="E, a list (default: per size)")
    p.add_argument("--gateways-list", default="1,4", help="K: --gateways (1: in the learner)")
    p.add_argument("--wires", default="grpc", help="--wire: grpc, socket, or both")
    p.add_argument("--batch", type=int, default=None, help="B; must divide E")
    p.add_argument("--unroll", type=int, default=16, help="T")
    p.add_argument("--hidden-sizes", default="1", help="the learner's MLP")
    p.add_argument("--sim-processes", type=int, default=2, help="processes holding the streams")
    p.add_argument("--actor-steps-per-s", type=float, default=None, help="for the estimate")
    add_out(p)
    p.add_argument("train_flags", nargs="*", help="flags for seedbed train, after --")
    args = p.parse_args()
    sizes = [s.strip() for s in args.sizes.split(",") if s.strip()]
    unknown = [s for s in sizes if s not in SIZES]
    if unknown:
        p.error(f"unknown sizes {unknown}; known: {', '.join(SIZES)}")
    if args.actor_steps_per_s:
        for s in sizes:
            SIZES[s] = dataclasses.replace(SIZES[s], actor_steps_per_s=args.actor_steps_per_s)
    plan = []
    for name in sizes:
        given = args.envs_per_actor
        for envs in [int(e) for e in given.split(",")] if given else SIZES[name].envs_per_actor:
            batch = args.batch or largest_divisor(envs, 32)
            if envs % batch:
                p.error(f"--batch {batch} must divide E = {envs} (the accounting needs it)")
            for wire in args.wires.split(","):
                for k in args.gateways_list.split(","):
                    for n in args.actors_list.split(","):
                        plan.append(
                            Point(name, SIZES[name], int(n), envs, args.unroll, batch, int(k), wire)
                        )
    points = []
    for point in plan:
        print(
            f"{point.name}, {point.wire}, E={point.envs}, K={point.gateways}, N={point.actors}: "
            f"measuring {args.seconds:g} s",
            file=sys.stderr,
        )
        points.append(run_point(point, args))
        _progress(points[-1])
    estimated = estimates(points)
    for e in estimated:
        print(
            f"{e['size']}, {e['wire']}, E={e['envs_per_actor']}, K={e['gateways']}: one "
            "learner-host core "
            f"takes {e['steps_per_s_per_learner_core']:,} steps/s "
            f"({e['frames_per_s_per_learner_core']:,} frames/s) at N={e['at_actors']}: "
            f"{e['actor_machines_per_learner_core']} actor machines of {e['envs_per_actor']} envs",
            file=sys.stderr,
        )
    report = {
        "benchmark": "ingest",
        "machine": machine(),
        "setup": {
            **{
                k: v
                for k, v in vars(args).items()
                if k
                not in ("sizes", "actors_list", "gateways_list", "wires", "envs_per_actor", "out")
            },
            "sizes": {s: dataclasses.asdict(SIZES[s]) for s in sizes},
            "agent": "vtrace",
            "shared_torso": True,
            "threads": {"inference": 1, "learner": 1},
        },
        "points": points,
        "estimates": estimated,
        "nothing_lost": all(pt["accounting"]["nothing_lost"] for pt in points),
    }
    emit(render(report), args.out)
    sys.exit(0 if report["nothing_lost"] else 1)


def _progress(pt: dict) -> None:
    books, lat = pt["accounting"], pt["latency_ms"]
    print(
        f"  {pt['frames_per_s']:,} frames/s, {pt['steps_per_s']:,} steps/s, "
        f"{pt['us_per_frame']} us/frame of learner-host CPU ({pt['host_cpu_cores']} cores; the "
        f"learner process alone {pt['learner_cpu_us_per_frame']}; learning "
        f"{pt['learning_us_per_frame']}, ingest {pt['ingest_us_per_frame']}), round trip "
        f"p50/p90/p99 {lat['p50']}/{lat['p90']}/{lat['p99']} ms; lost: {books['frames_lost']}",
        file=sys.stderr,
    )


if __name__ == "__main__":
    main()
