"""bench/ingest.py: its accounting of lost steps and unrolls, and a short run of it end to end."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "bench"))

from ingest import account  # noqa: E402

BENCH = Path(__file__).resolve().parents[1] / "bench" / "ingest.py"


def _books(answered: list[int], learner_steps: int, batch: int = 4, **kw) -> dict:
    """The accounting of streams that had ``answered`` steps each, with E = 4 and T = 3."""
    envs, unroll = 4, 3
    sent = kw.get("sent", answered)
    frames = kw.get("frames", envs * (sum(answered) - len(answered)))
    summary = {"frames": frames, "learner_steps": learner_steps, "remote_actors": {"refused": 0}}
    return account(sent, answered, envs, unroll, batch, summary)


def test_frames_lost_counts_what_the_books_miss():
    assert _books([7, 4], learner_steps=3)["frames_lost"] == 0
    assert _books([7, 4], learner_steps=2)["frames_lost"] == 4 * 3  # a batch of 4 unrolls of 3
    assert _books([7, 4], learner_steps=3, sent=[8, 4])["frames_lost"] == 4  # a step of 4 envs
    assert _books([7, 4], learner_steps=3, frames=35)["frames_lost"] == 1


def test_nothing_lost_when_every_frame_reached_the_learner():
    # Two streams of 7 and 4 steps: (7 - 1) / 3 = 2 and 1 unrolls per env, 4 envs: 12 unrolls,
    # 3 batches of 4; 4 x (6 + 3) = 36 frames, all learned (3 batches x 4 unrolls x 3 steps).
    books = _books([7, 4], learner_steps=3)
    assert books["unrolls_built"] == 12
    assert books["frames_expected"] == books["frames_learned"] == 36
    assert books["frames_sent"] == 44  # the first step of each stream is no frame
    assert books["nothing_lost"]


def test_a_lost_unroll_an_unanswered_step_or_a_missed_frame_shows():
    assert not _books([7, 4], learner_steps=2)["nothing_lost"]  # a batch never learned
    assert not _books([7, 4], learner_steps=3, sent=[8, 4])["nothing_lost"]  # no answer
    assert not _books([7, 4], learner_steps=3, frames=35)["nothing_lost"]  # a frame missed


def test_unfinished_unrolls_and_a_partial_batch_are_not_losses():
    # 8 steps: 2 unrolls per env and 1 step of a third; 8 unrolls built, 2 batches learned.
    books = _books([8], learner_steps=2)
    assert books["frames_in_unfinished_unrolls"] == 4
    assert books["frames_expected"] == books["frames_learned"] + 4
    assert books["nothing_lost"]
    # With B = 8, 4 steps build 4 unrolls: short of a batch, they wait in the queue.
    books = _books([4], learner_steps=0, batch=8)
    assert books["unrolls_waiting_for_a_batch"] == 4
    assert books["nothing_lost"]
    assert not _books([4, 4, 4, 4], learner_steps=1, batch=8)["nothing_lost"]  # 16 built


def test_four_actors_for_three_seconds_lose_nothing_with_either_gateway(no_leaks, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(BENCH), "--sizes", "cartpole", "--actors-list", "4"]
        + ["--seconds", "3", "--warmup-s", "0.5", "--sim-processes", "1"]
        + ["--gateways-list", "1,2", "--out", str(tmp_path / "ingest.json")],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    report = json.loads(proc.stdout)
    assert json.loads((tmp_path / "ingest.json").read_text()) == report  # what docs keep
    assert report["machine"]["cores"] >= 1
    assert report["nothing_lost"] is True
    in_process, processes = report["points"]
    assert (in_process["gateways"], processes["gateways"]) == (1, 2)
    for point in (in_process, processes):
        assert (point["size"], point["envs"], point["actors"]) == ("cartpole", 32, 4)
        assert point["lost"] == 0
        assert point["steps_per_s"] > 0
        assert abs(point["frames_per_s"] - 32 * point["steps_per_s"]) <= 32
        # The host's CPU holds the learner process's, and with processes the gateways' too.
        assert 0 < point["learner_cpu_us_per_frame"] <= point["us_per_frame"] < 1e5
        assert abs(sum(point["host_cpu_share"].values()) - 1) < 0.01
        # The host's CPU splits into the learner loop's learning and the ingest around it.
        assert 0 < point["learning_us_per_frame"] < point["us_per_frame"]
        split = point["learning_us_per_frame"] + point["ingest_us_per_frame"]
        assert abs(split - point["us_per_frame"]) < 0.05
        books = point["accounting"]
        assert books["steps_sent"] == books["steps_answered"] > 0
        assert books["streams"] == books["connections"] == 4
        assert books["frames_counted_by_learner"] == books["frames_expected"] > 0
        assert books["frames_learned"] == books["frames_counted_by_learner"]
        assert books["frames_in_unfinished_unrolls"] == books["unrolls_waiting_for_a_batch"] == 0
        assert not books["errors"]
        # CartPole's 32 envs of 4 float32 take 512 bytes, and the reward and flags some more.
        assert 512 < point["bytes_per_step"] < 1024
        assert point["obs"] == {"shape": [4], "dtype": "float32"}
        assert 0 < point["learner_cpu_us_per_step"] < 1e6
        assert 0 < point["learner_loop_thread_share"] < 1
        latency = point["latency_ms"]
        assert 0 < latency["p50"] <= latency["p90"] <= latency["p99"] and latency["samples"] > 0
        assert point["round_trip_alone_ms"] > 0
    assert in_process["host_cpu_share"]["gateways"] == 0
    assert processes["host_cpu_share"]["gateways"] > 0
    assert [e["gateways"] for e in report["estimates"]] == [1, 2]
    assert all(e["actor_machines_per_learner_core"] > 0 for e in report["estimates"])
