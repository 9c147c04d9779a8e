"""The simulated remote actors of ``bench/ingest.py``: processes holding many gRPC streams.

Each stream is a thread with its own ``GrpcActorClient``, the client ``seedbed actor --connect``
uses: it says hello with the learner's token, reads its assignment and then sends pre-built
steps of the assigned shape and dtype, waiting for each step's actions as a real actor does (a
real one steps its envs in between; these step none). The bench tells them through ``Shared``
when to measure and when to stop; they count their steps there, where the bench reads them.
"""

from __future__ import annotations

import dataclasses
import random
import signal
import threading
import time
from typing import Any

import numpy as np

GRPC_PREFIX = 5  # bytes gRPC puts before each message: a flag and the length
EPISODE = 100  # every env ends an episode every this many steps
# What the simulated actors are told to do: wait once connected; stream 0 alone steps (the
# round trip without load); all step; all step and measure; stop at an unroll's end; stop now.
CONNECT, PROBE, RUN, MEASURE, FINISH, ABORT = range(6)
# Streams of one process saying hello at once: two processes stay under the gateway's cap on
# streams awaiting their hello (MAX_PENDING_HELLOS, 64), past which it refuses new ones.
CONNECTING = 16


@dataclasses.dataclass
class Shared:
    """What the bench and its simulated actors share: the phase, and per stream whether it is
    connected, how many steps it sent and how many were answered."""

    phase: Any
    connected: Any
    sent: Any
    answered: Any

    @classmethod
    def make(cls, ctx: Any, streams: int) -> Shared:
        raw = ctx.RawArray
        return cls(
            ctx.RawValue("i", CONNECT), raw("b", streams), raw("q", streams), raw("q", streams)
        )


class PrebuiltSteps:
    """One actor's steps, made once from its assignment: random observations of the assigned
    shape and dtype; every env starts an episode at the first step and every EPISODE steps."""

    def __init__(self, job: Any) -> None:
        rng = np.random.default_rng(job.slot)
        shape, dtype = (job.num_envs, *job.obs_shape), np.dtype(job.obs_dtype)
        if dtype.kind == "u":
            self.obs = rng.integers(0, 256, shape, dtype=dtype)
        else:
            self.obs = rng.standard_normal(shape).astype(dtype)
        self.reward = np.ones(job.num_envs, np.float32)
        self.ends = np.ones(job.num_envs, np.bool_)
        self.goes_on = np.zeros(job.num_envs, np.bool_)

    def step(self, n: int) -> tuple[np.ndarray, ...]:
        """The arrays of step ``n``: obs, reward, done, truncated."""
        done = self.ends if n % EPISODE == 0 else self.goes_on
        return self.obs, self.reward, done, self.goes_on

    def wire(self, actions: np.ndarray) -> dict[str, Any]:
        """A step's and its reply's bytes, built as the client and the gateway build them."""
        from seedbed.transport.proto import actor_pb2 as pb
        from seedbed.transport.remote import to_wire

        step = pb.Step(
            obs=to_wire(self.obs),
            reward=to_wire(self.reward),
            done=to_wire(self.goes_on),
            truncated=to_wire(self.goes_on),
        )
        return {
            "obs": {"shape": list(self.obs.shape[1:]), "dtype": self.obs.dtype.name},
            "request": pb.ActorMessage(step=step).ByteSize() + GRPC_PREFIX,
            "reply": pb.LearnerMessage(actions=to_wire(actions)).ByteSize() + GRPC_PREFIX,
        }


def _finished(phase: int, steps: int, unroll: int) -> bool:
    """Whether an actor that has had ``steps`` answered stops now: at once on ABORT, at the end
    of its envs' current unrolls on FINISH."""
    return phase == ABORT or (phase == FINISH and steps >= 1 and (steps - 1) % unroll == 0)


def _connect(address: str, token: bytes, index: int, gate: threading.Semaphore, wire: str) -> Any:
    """Stream ``index``'s client on ``wire``, past at most ``CONNECTING`` hellos at once; a
    refusal to connect (the gateway busy with hellos) is retried for a minute, as ``seedbed
    actor`` does."""
    from seedbed.transport.remote import open_client

    deadline = time.monotonic() + 60.0
    while True:
        with gate:
            try:
                name = f"ingest-{index}"
                return open_client(address, wire, token=token, name=name, timeout_s=60.0)
            except ConnectionError:
                if time.monotonic() > deadline:
                    raise
        time.sleep(random.uniform(0.1, 0.5))


def _act(
    address: str,
    token: bytes,
    index: int,
    unroll: int,
    shared: Shared,
    gate: threading.Semaphore,
    out: dict,
    wire: str,
) -> None:
    """One simulated actor: a stream, steps until told to stop, the round trips measured."""
    from seedbed.errors import SeedbedError

    out["latencies"], out["alone"] = [], []
    try:
        client = _connect(address, token, index, gate, wire)
    except (ConnectionError, SeedbedError) as e:
        out["error"] = f"stream {index}: {e}"
        return
    try:
        shared.connected[index] = 1
        _step(client, index, unroll, shared, out)
    except (ConnectionError, SeedbedError) as e:
        out["error"] = f"stream {index}: {e}"
    finally:
        client.close()


def _step(client: Any, index: int, unroll: int, shared: Shared, out: dict) -> None:
    """Send steps and wait for their actions as the phases say: stream 0 alone in PROBE, every
    stream from RUN on; keep the round trips of PROBE and MEASURE."""
    steps = PrebuiltSteps(client.assignment)
    n = 0
    while not _finished(phase := shared.phase.value, n, unroll):
        if phase == CONNECT or (phase == PROBE and index != 0):
            time.sleep(0.005)
            continue
        shared.sent[index] = n + 1
        start = time.perf_counter()
        actions = client.call(*steps.step(n))
        latency = time.perf_counter() - start
        n += 1
        shared.answered[index] = n
        if phase in (PROBE, MEASURE):
            out["alone" if phase == PROBE else "latencies"].append(latency)
        if n == 1:
            out["wire"] = steps.wire(actions)


def simulate(
    address: str,
    token: bytes,
    indices: list[int],
    unroll: int,
    shared: Shared,
    results: Any,
    wire: str = "grpc",
) -> None:
    """A process of simulated actors, a thread and a stream each; puts what they measured."""
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the bench stops them through ``shared``
    outs: list[dict] = [{} for _ in indices]
    gate = threading.Semaphore(CONNECTING)
    threads = [
        threading.Thread(
            target=_act, args=(address, token, i, unroll, shared, gate, out, wire), daemon=True
        )
        for i, out in zip(indices, outs, strict=True)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    results.put(
        {
            "latencies": np.array([x for out in outs for x in out["latencies"]]),
            "alone": np.array([x for out in outs for x in out["alone"]]),
            "errors": [out["error"] for out in outs if "error" in out],
            "wire": next((out["wire"] for out in outs if "wire" in out), None),
        }
    )


def split(streams: int, processes: int) -> list[list[int]]:
    """Stream indices dealt to at most ``processes`` processes."""
    return [list(range(p, streams, processes)) for p in range(min(processes, streams))]
